import subprocess
from pathlib import Path

import pytest

from lens_ebpf.devices.rdma import statistic, sysfs
from lens_ebpf.devices.rdma.collector import RdmaCollector
from lens_ebpf.metrics.exposition import render_metrics
from tests.golden import check_golden

FIX = Path(__file__).parent.parent / "fixtures" / "rdma"
SYS = FIX / "sys"


def by_name(devices: list[sysfs.RdmaDevice]) -> dict[str, sysfs.RdmaDevice]:
    return {d.name: d for d in devices}


def samples(c: RdmaCollector) -> dict[tuple[str, tuple], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def test_devices_found_by_directory_whatever_their_names() -> None:
    devs = by_name(sysfs.read_devices(SYS))
    assert sorted(devs) == ["iwp1s0f0", "mlx4_0", "mlx5_0", "mlx5_1", "rocep8s0f0"]
    mlx = devs["mlx5_0"]
    assert (mlx.node_guid, mlx.fw_ver, mlx.hca_type, mlx.board_id, mlx.netdev) == (
        "0c42:a103:0065:2a3c",
        "20.31.1014",
        "MT4123",
        "MT_0000000223",
        "ib0",
    )
    p = mlx.ports[0]
    assert (p.state, p.state_name, p.phys_state, p.link_layer) == (4, "ACTIVE", 5, "InfiniBand")
    assert p.rate_bytes == 25e9
    assert p.port_guid == "0c42:a103:0065:2a3c"
    assert p.saturated == ["port_rcv_data"]
    assert "port_rcv_data" not in p.counters
    assert p.counters["port_xmit_data"] == 1234567
    assert p.hw_counters["out_of_buffer"] == 135


def test_counters_ext_is_kept_apart_from_counters() -> None:
    roce = by_name(sysfs.read_devices(SYS))["rocep8s0f0"].ports[0]
    # counters/ stuck at the 32-bit maximum is withheld, not replaced by counters_ext/
    assert roce.saturated == ["port_rcv_data", "port_xmit_data"]
    assert "port_rcv_data" not in roce.counters and roce.counters["port_rcv_packets"] == 9
    assert roce.legacy == {"port_rcv_data_64": 20_000_000_000, "port_xmit_data_64": 10_000_000_000}
    assert roce.link_layer == "Ethernet" and roce.rate_bytes == 12.5e9
    mlx4 = by_name(sysfs.read_devices(SYS))["mlx4_0"].ports
    # counters/ says 6,825,908,347 packets where the legacy twin says 0: counters/ counts
    assert mlx4[0].counters["port_rcv_packets"] == 6_825_908_347
    assert mlx4[0].legacy["port_rcv_packets_64"] == 0
    # and where counters/ reads 0 but the legacy twin has traffic, counters/ still counts
    assert mlx4[1].counters["port_rcv_packets"] == 0 and mlx4[1].legacy["port_rcv_packets_64"] == 70
    assert mlx4[1].saturated == ["port_xmit_wait"]


def test_iwarp_no_pma_and_unreadable_files_are_skipped() -> None:
    iw = by_name(sysfs.read_devices(SYS))["iwp1s0f0"]
    assert iw.node_type == "4: RNIC" and iw.hca_type == ""
    assert iw.ports[0].counters == {}
    assert iw.ports[0].hw_counters == {"ip4InReceives": 1000, "tcpInSegs": 900}


def test_uverbs_index_to_device() -> None:
    assert sysfs.uverbs_map(SYS) == {0: "mlx5_0", 1: "mlx5_1", 2: "rocep8s0f0", 3: "iwp1s0f0"}


@pytest.mark.parametrize(("text", "want"), [
    ("200 Gb/sec (4X HDR)", 25e9), ("2.5 Gb/sec (1X SDR)", 312.5e6), ("garbage", None),
])  # fmt: skip
def test_rate(text: str, want: float | None) -> None:
    assert sysfs.parse_rate(text) == want


def test_statistic_text_and_json_agree() -> None:
    text = statistic.parse_text((FIX / "statistic.txt").read_text())
    js = statistic.parse_json((FIX / "statistic.json").read_text())
    assert [(s.device, s.port) for s in text] == [("mlx5_0", 1), ("mlx5_1", 1), ("rocep8s0f0", 1)]
    assert text[0].counters["out_of_buffer"] == 135
    assert text[2].counters["np_cnp_sent"] == 4
    for t, j in zip(text, js, strict=True):
        for name, value in j.counters.items():
            assert t.counters[name] == value
    assert [s.ifindex for s in js] == [0, 1, 2]


@pytest.mark.parametrize("garbage", [
    "Segmentation fault\n", "link mlx5_0/1 rx_write_requests\n", "link mlx5_0/x a 1\n",
    "link mlx5_0/1 rx_write_requests lots\n",
])  # fmt: skip
def test_statistic_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(statistic.StatParseError):
        statistic.parse_text(garbage)


@pytest.mark.parametrize("garbage", ["[{", '{"a": 1}', '[{"port": 1}]'])
def test_statistic_json_garbage_is_refused(garbage: str) -> None:
    with pytest.raises(statistic.StatParseError):
        statistic.parse_json(garbage)


def test_collector_exact_values_and_golden_exposition() -> None:
    c = RdmaCollector(5, SYS, runner=lambda: (FIX / "statistic.json").read_text())
    c.run_once()
    assert c.success and c.errors == {}
    got = samples(c)
    mlx = (("device", "mlx5_0"), ("port", "1"))
    assert got[("lens_rdma_port_transmit_bytes_total", mlx)] == 1234567 * 4
    assert ("lens_rdma_port_receive_bytes_total", mlx) not in got
    sat = tuple(sorted((*mlx, ("counter", "port_rcv_data"))))
    assert got[("lens_rdma_port_counter_saturated", sat)] == 1
    roce = (("device", "rocep8s0f0"), ("port", "1"))
    assert ("lens_rdma_port_receive_bytes_total", roce) not in got  # saturated in counters/
    assert got[("lens_rdma_port_legacy_receive_bytes_total", roce)] == 20_000_000_000 * 4
    assert got[("lens_rdma_port_hw_counter_total", (("counter", "np_cnp_sent"), *roce))] == 4
    assert got[("lens_rdma_port_up", (("device", "mlx5_1"), ("port", "1")))] == 0
    assert got[("rdma_stat_out_of_buffer", mlx)] == 135
    assert got[("rdma_stat_local_ack_timeout_err", roce)] == 6
    rows = {r["if_name"]: r for r in c.views["rdma"]}
    assert rows["mlx5_0"] == {
        "if_index": 0,
        "if_name": "mlx5_0",
        "port": 1,
        # eight bytes, as the node exporter writes GUIDs (sysfs: 0c42:a103:0065:2a3c)
        "node_guid": "0c:42:a1:03:00:65:2a:3c",
        "sys_image_guid": "0c:42:a1:03:00:65:2a:3c",
        "port_guid": "0c:42:a1:03:00:65:2a:3c",
        "link_layer": "InfiniBand",
        "state": "ACTIVE",
        "netdev": "ib0",
    }
    # not in rdma statistic: its position by name, or the next index no device holds
    assert rows["iwp1s0f0"]["if_index"] == 3  # position 0 is taken: the next free index
    check_golden("rdma.prom", render_metrics(c.snapshot()))


def test_garbage_tool_output_is_a_counted_parse_error() -> None:
    c = RdmaCollector(5, SYS, runner=lambda: "Segmentation fault (core dumped)\n")
    c.run_once()
    assert c.errors == {"parse": 1}
    got = samples(c)
    assert not any(name.startswith("rdma_stat_") for name, _ in got)
    assert got[("lens_rdma_port_up", (("device", "mlx5_0"), ("port", "1")))] == 1


def test_tool_timeout_is_counted() -> None:
    def hang() -> str:
        raise subprocess.TimeoutExpired(["rdma"], 5)

    c = RdmaCollector(5, SYS, runner=hang)
    c.run_once()
    assert c.errors == {"timeout": 1} and c.success


def test_no_rdma_hardware_exports_nothing(tmp_path: Path) -> None:
    c = RdmaCollector(5, tmp_path, runner=lambda: "")
    c.run_once()
    assert c.snapshot() == [] and c.errors == {} and c.success
    assert c.views["rdma"] == []
