"""Per-QP counters (`rdma statistic qp show`, mlx5's): the text form as iproute2's
rdma-statistic(8) prints it, and the JSON form, agree; garbage is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lens_ebpf.agent.devices.rdma import qp_counters

FIX = Path(__file__).parent.parent / "fixtures" / "rdma"


def as_json(text: str) -> str:
    """The same counters as `rdma -j statistic qp show` writes them."""
    out = []
    for c in qp_counters.parse_text(text):
        out.append(
            {
                "ifindex": 2,
                "ifname": c.device,
                "port": c.port,
                "cntn": c.cntn,
                "qp-type": c.qp_type,
                "pid": c.pid,
                "comm": c.comm,
                **c.counters,
                "lqpn": list(c.lqpns),
            }
        )
    return json.dumps(out)


def test_text_and_json_agree() -> None:
    text = (FIX / "statistic-qp.txt").read_text()
    a, b = qp_counters.parse(text)
    assert (a.device, a.port, a.cntn, a.qp_type, a.pid, a.comm, a.lqpns) == (
        "mlx5_2",
        1,
        4,
        "RC",
        30892,
        "ib_send_bw",
        (178,),
    )
    assert (a.counters["out_of_sequence"], a.counters["local_ack_timeout_err"]) == (7, 2)
    assert len(a.counters) == 18
    assert (b.pid, b.lqpns, b.counters["rx_write_requests"]) == (30893, (180, 181), 41)
    assert qp_counters.parse(as_json(text)) == [a, b]


@pytest.mark.parametrize(
    "garbage",
    [
        "link mlx5_0/1 rx 1",
        "link mlx5_0 cntn 1",
        "qp mlx5_0/1 cntn 1",
        "link mlx5_0/1 cntn 1 x -3",
        "[{}]",
        "{}",
        "[1",
    ],
)
def test_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(qp_counters.QpCounterParseError):
        qp_counters.parse(garbage)


def test_no_counters_bound_is_empty() -> None:
    assert qp_counters.parse("") == [] and qp_counters.parse("[]") == []
