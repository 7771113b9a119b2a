"""Connect latency (SYN sent to ESTABLISHED) binned in the kernel: one sample per active
open, exactly, on the flows program the session already loaded."""

from __future__ import annotations

import pytest

from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.tcp.connect_latency import LENS
from tests.conftest import wait_for
from tests.netlab import Lab, exchange, listener

from .conftest import FlowRig

pytestmark = pytest.mark.bpf

ADDR = "10.53.0.53"  # dns by the test policy, in the lab's namespace


def samples(rig: FlowRig) -> tuple[int, float, list[int]]:
    rig.flows.read()
    got = rig.cache.get(LENS, ("egress", "dns", ADDR, *NO_IDENTITY))
    if got is None:
        return 0, 0.0, []
    bins, total = got
    return int(sum(bins)), float(total), list(bins)


def test_each_active_open_is_one_connect_sample(rig: FlowRig, lab: Lab) -> None:
    before, before_sum, _ = samples(rig)
    srv = listener(ADDR, ns=lab.ns)
    try:
        for _ in range(6):
            exchange(srv, ADDR, 10, 10)
    finally:
        srv.close()
    wait_for(lambda: samples(rig)[0] >= before + 6, lambda: f"6 samples ({samples(rig)})")
    count, total, bins = samples(rig)
    assert count == before + 6
    # a real handshake over a veth: more than nothing, less than a second each
    assert 0 < total - before_sum < 6.0
    assert bins[-1] == 0  # none above the last bound (10 s)
