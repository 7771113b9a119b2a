from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent import config, kernel_headers
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.bpf.program import RingProgram
from lens_ebpf.agent.events import EventBus, Subscription
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.net.identity import NO_IDENTITY
from lens_ebpf.agent.net.policy import load_policy
from lens_ebpf.agent.tcp import decode
from lens_ebpf.agent.tcp.tcp_flows import VAL_FIELDS, TcpFlows
from tests.conftest import hang_guard, netns_unavailable, wait_for
from tests.netlab import Lab

TEST_POLICY = """\
k8sPod: [10.244.0.0/16]
k8sSvc: [10.96.0.0/12]
dns: [10.53.0.0/24]
docker: [172.17.0.0/16]
localhost: [127.0.0.0/8, "::1"]
internal_hosts: [192.168.0.0/16, "fd00::/8"]
"""


@contextlib.contextmanager
def polling(program: RingProgram, loader: BpfLoader) -> Iterator[None]:
    """Deliver the program's ring buffer in a thread while the block runs, then detach."""
    stop = threading.Event()
    t = threading.Thread(target=program.poll_until, args=(stop, 100), daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(5)
        loader.close()


class FlowRig:
    """The tcp_flows program loaded with the test policy, its ring buffer polled; early is
    a connected TCP pair (client, server side) opened before the program attached."""

    def __init__(
        self,
        flows: TcpFlows,
        cache: MetricCache,
        bus: EventBus,
        early: tuple[socket.socket, socket.socket],
    ) -> None:
        self.flows, self.cache, self.bus, self.early = flows, cache, bus, early

    def value(self, name: str, *labels: str) -> float:
        self.flows.read()
        if name.startswith("lens_tcp_"):  # standalone: the remote's identity labels are empty
            labels = (*labels, *NO_IDENTITY)
        v = self.cache.get(name, tuple(labels))
        return 0.0 if v is None else float(v)

    def explain(self, *labels: str) -> str:
        """For a count that is off: each flows-map key with these labels as the kernel
        holds it (its bytes, its values) beside what the reader last took of it, and the
        program's stats. One key with doubled values is the kernel's (or two flows that
        share the labels: opened says), one whose reader values trail the cache is ours."""
        assert self.flows.bpf is not None
        rows = [
            f"{bytes(key).hex()}: {tuple(getattr(val, f) for f in VAL_FIELDS)} "
            f"(reader {self.flows.flows_reader.last(bytes(key))})"
            for key, val in self.flows.bpf[b"flows"].items_lookup_batch()
            if decode.flow_key_labels(key) == labels
        ]
        return f"{labels}: kernel {rows or 'none'}; stats {self.flows.kernel_stats}"

    def wait_value(self, name: str, *labels: str, want: float, timeout: float = 10) -> float:
        """value() once it equals want: the last transitions of a close can land in a
        softirq after the call that caused them returned."""
        wait_for(
            lambda: self.value(name, *labels) == want,
            lambda: f"{name}{labels} == {want} (it is {self.value(name, *labels)})",
            timeout,
        )
        return want

    def wait_events(
        self, sub: Subscription, want: int, timeout: float = 15, reconcile: bool = False
    ) -> list[dict]:
        """The first want events; a hang-guard failure if they do not come. reconcile:
        sweep for sockets whose CLOSE the kernel skipped meanwhile, as the agent's reader
        loop does every bpf.reconcile_interval_seconds."""
        got: list[dict] = []
        guard = hang_guard(timeout)
        deadline = time.monotonic() + guard
        swept = time.monotonic()
        while len(got) < want:
            if time.monotonic() > deadline:
                self.flows.read()  # the kernel's counters as they are now, not when last read
                raise AssertionError(
                    f"hang guard: {len(got)} of {want} events after {guard:.0f} s "
                    f"(kernel {self.flows.kernel_stats}, dropped {sub.dropped})"
                )
            if reconcile and time.monotonic() - swept > 1:
                self.flows.reconcile()
                swept = time.monotonic()
            ev = sub.get(timeout=0.2)
            if ev is not None:
                got.append(ev)
        return got


@pytest.fixture(scope="session")
def policy_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("policy") / "policy.yaml"
    p.write_text(TEST_POLICY)
    return p


@pytest.fixture(scope="session")
def rig(policy_file: Path) -> Iterator[FlowRig]:
    kernel_headers.resolve(link=True)
    # the sweep may look at sockets of any age: tests call it when traffic is done
    # the ring holds a whole burst (test_ten_thousand_short_connections_none_lost's 20,000
    # records, 2.4 MB): the kernel matrix's guests, booting beside these tests, starve the
    # reader for seconds, and a 1 MB ring overflowed (counted, 2,111 lost) on a fresh machine
    cfg = config.load(
        None, env={"LENS_BPF__RECONCILE_GRACE_SECONDS": "0", "LENS_BPF__RINGBUF_PAGES": "2048"}
    )
    cache = MetricCache(ttl_seconds=3600, max_series=200000)
    bus = EventBus(queue_size=100000)
    loader = BpfLoader()
    flows = TcpFlows(cfg.bpf, cfg.events, cache, bus, loader)
    srv = socket.create_server(("127.0.0.64", 0))
    early_cli = socket.create_connection(srv.getsockname())
    early_srv, _ = srv.accept()
    srv.close()
    assert flows.start(load_policy(policy_file)), loader.status
    with polling(flows, loader), early_cli, early_srv:
        yield FlowRig(flows, cache, bus, (early_cli, early_srv))


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    tag = str(os.getpid())  # the owner's pid: a later run reaps it once this one is gone
    lab = Lab(
        tag,
        host_v4="192.168.77.1",
        peer_v4="192.168.77.2",
        host_v6="fd00:77::1",
        peer_v6="fd00:77::2",
        extra=["10.244.7.2", "10.96.7.2", "10.53.0.53", "198.51.100.7"],
    ).up()
    yield lab
    lab.down()
