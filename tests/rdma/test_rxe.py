"""A real RDMA device: Soft-RoCE (rdma_rxe) on a veth, driven by rdma-core's
ibv_rc_pingpong, read by the RDMA collector with the real `rdma` tool and sysfs.

Runs where rdma_rxe loads: the kernel matrix's guests (Debian's 5.10, 6.1 and 6.12); the
host kernel here has no rxe module, so there it skips. Exact counts: 300 round trips of
4096 bytes are 600 sends and 600 receives on the device (each side sends 300). Queue
pairs are attributed to the process, and to a real containerd container given
/dev/infiniband/uverbs0 (its rootfs the host's, so the verbs program and its provider
library are there), with the pod from the container's labels and the workload from the
cluster index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from lens_ebpf.agent.containers.cgroups import CgroupIndex
from lens_ebpf.agent.containers.pods import pods_view
from lens_ebpf.agent.containers.resolver import ContainerResolver
from lens_ebpf.agent.containers.runtime import ContainerdState
from lens_ebpf.agent.devices.rdma import resources
from lens_ebpf.agent.devices.rdma.collector import RdmaCollector
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.pods.index import ClusterIndex
from tests.conftest import hang_guard, wait_for
from tests.containerlab import Containerd, private_containerd
from tests.k8slab import pod

DEV, NETDEV, PEER, ADDR = "lensrxe0", "lensrx0", "lensrx1", "10.77.0.1"
PINGPONG = ["ibv_rc_pingpong", "-d", DEV, "-g", "1", "-s", "4096"]


def _sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, check=check, timeout=hang_guard(15))


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "creating an rxe device needs root"
    for tool in ("rdma", "ibv_rc_pingpong", "modprobe"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (scripts/setup.sh test installs rdma-core and ibverbs-utils)"
    _sh("modprobe", "crc32_generic", check=False)  # rxe fails to init crc32 without it
    res = _sh("modprobe", "rdma_rxe", check=False)
    if res.returncode != 0:
        return (
            f"rdma_rxe does not load on {os.uname().release} ({res.stderr.strip()[:80]}); "
            "the kernel matrix's guests run this"
        )
    return None


@pytest.fixture(scope="module")
def rxe() -> Iterator[RdmaCollector]:
    if reason := _why_not():
        pytest.skip(reason)
    _sh("ip", "link", "add", NETDEV, "type", "veth", "peer", "name", PEER)
    try:
        _sh("ip", "addr", "add", f"{ADDR}/24", "dev", NETDEV)
        _sh("ip", "link", "set", NETDEV, "up")
        _sh("ip", "link", "set", PEER, "up")
        _sh("rdma", "link", "add", DEV, "type", "rxe", "netdev", NETDEV)
        rdma = shutil.which("rdma")
        assert rdma is not None
        yield RdmaCollector(
            1,
            Path("/sys"),
            runner=lambda: resources.run_rdma(rdma, hang_guard(5), "statistic", "show"),
            rdma=lambda *args: resources.run_rdma(rdma, hang_guard(5), *args),
        )
    finally:
        # a device still open is not deleted until its users close it (5.10 waits for ever)
        pattern = f"ibv_rc_pingpong -d {DEV}"
        _sh("pkill", "-KILL", "-f", pattern, check=False)
        wait_for(
            lambda: _sh("pgrep", "-f", pattern, check=False).returncode == 1, "the pingpongs gone"
        )
        _sh("rdma", "link", "delete", DEV, check=False)
        _sh("ip", "link", "del", NETDEV, check=False)


def values(c: RdmaCollector) -> dict[tuple[str, tuple], float]:
    c.run_once()
    assert c.success and c.errors == {}, c.errors
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value for m in c.snapshot() for s in m.samples
    }


def counters(c: RdmaCollector) -> dict[str, float]:
    v = values(c)
    port = (("device", DEV), ("port", "1"))
    return {
        "stat_sends": v[("rdma_stat_rdma_sends", port)],
        "stat_recvs": v[("rdma_stat_rdma_recvs", port)],
        "hw_sends": v[("lens_rdma_port_hw_counter_total", (("counter", "rdma_sends"), *port))],
        "hw_recvs": v[("lens_rdma_port_hw_counter_total", (("counter", "rdma_recvs"), *port))],
    }


def listening(port: int = 18515) -> bool:
    """Whether a socket listens on the TCP port (ibv_rc_pingpong's server takes the first
    connection as its client, so no probe may connect)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            if state == "0A" and int(local.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def pingpong(
    iters: int, server: list[str] | None = None
) -> tuple[subprocess.Popen, subprocess.Popen]:
    """A server (PINGPONG, or the given command), then, once it listens, a client
    connecting to the veth's own address (rxe serves both ends)."""
    srv = subprocess.Popen(
        server or [*PINGPONG, "-n", str(iters)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + hang_guard(15)
    while not listening():
        if srv.poll() is not None or time.monotonic() > deadline:
            srv.kill()
            raise AssertionError(
                f"hang guard: the server did not listen (exit {srv.poll()}): "
                + (srv.stdout.read() if srv.stdout else "")
            )
        time.sleep(0.2)
    cli = subprocess.Popen(
        [*PINGPONG, "-n", str(iters), ADDR],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return srv, cli


def test_300_round_trips_are_600_sends_and_receives_in_both_families(
    rxe: RdmaCollector,
) -> None:
    before = counters(rxe)
    srv, cli = pingpong(300)
    try:
        assert cli.wait(hang_guard(30)) == 0, cli.stdout.read() if cli.stdout else ""
        assert srv.wait(hang_guard(10)) == 0, srv.stdout.read() if srv.stdout else ""
    finally:
        stop(srv, cli)
    after = counters(rxe)
    assert {k: after[k] - before[k] for k in after} == {
        "stat_sends": 600,
        "stat_recvs": 600,
        "hw_sends": 600,
        "hw_recvs": 600,
    }
    # /rdma: the netdev from `rdma link` (rxe's sysfs has none), the device's QPs
    (row,) = (r for r in rxe.views["rdma"] if r["if_name"] == DEV)
    assert (row["netdev"], row["port"], row["state"]) == (NETDEV, 1, "ACTIVE")
    assert [q["type"] for q in row["queue_pairs"]] == ["GSI"]  # the kernel's, nothing else
    info = next(
        dict(lbl)
        for (n, lbl) in values(rxe)
        if n == "lens_rdma_device_info" and dict(lbl)["device"] == DEV
    )
    assert (info["netdev"], info["node_type"]) == (NETDEV, "CA")


def qps(v: dict, **want: str) -> float | None:
    for (name, lbl), n in v.items():
        labels = dict(lbl)
        if name == "lens_rdma_queue_pairs" and all(labels.get(k, "") == x for k, x in want.items()):
            return n
    return None


def wait_qps(c: RdmaCollector, want: float, **labels: str) -> dict:
    """The values once the QPs of these labels number want."""
    got: list[dict] = [{}]

    def check() -> bool:
        got[0] = values(c)
        return qps(got[0], **labels) == want

    wait_for(
        check,
        lambda: f"{want} queue pairs of {labels} ({qps(got[0], **labels)})",
        timeout=15,
        every=0.5,
    )
    return got[0]


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
    for p in procs:
        p.wait(hang_guard(10))


def test_a_long_pingpong_holds_two_rc_queue_pairs_then_none(rxe: RdmaCollector) -> None:
    srv, cli = pingpong(10**7)
    try:
        v = wait_qps(rxe, 2, device=DEV, type="RC", comm="ibv_rc_pingpong")
        assert qps(v, device=DEV, type="RC", comm="ibv_rc_pingpong", pod="") == 2
        assert qps(v, device=DEV, type="GSI", comm="ib_core") == 1
        pids = sorted(
            q["pid"]
            for r in rxe.views["rdma"]
            if r["if_name"] == DEV
            for q in r["queue_pairs"]
            if q["type"] == "RC"
        )
        assert pids == sorted([srv.pid, cli.pid])
    finally:
        stop(srv, cli)
    # absent (not zero) once the kernel has freed them
    wait_for(lambda: qps(values(rxe), device=DEV, type="RC") is None, "the RC QPs gone")


@pytest.fixture
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("rdma-")


def test_a_containers_queue_pairs_are_its_pods(rxe: RdmaCollector, ctd: Containerd) -> None:
    """ibv_rc_pingpong's server in a containerd container given /dev/infiniband/uverbs0
    (host network: rxe's GIDs are the veth's); the client on the host."""
    uverbs = next(
        f"/dev/infiniband/{p.name}"
        for p in Path("/dev/infiniband").iterdir()
        if p.name.startswith("uverbs")
    )
    root = ctd.base / "hostroot"
    root.mkdir()
    _sh("mount", "--bind", "/", str(root))
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    uid = str(uuid.uuid4())
    resolver = ContainerResolver(CgroupIndex.for_host(), ContainerdState(ctd.state))
    enrich = Enrichment(resolver)
    index = ClusterIndex()
    index.replace_pods([pod("rdma-0", uid, "ml", owner=("Job", "train"))])
    enrich.index = index
    rxe.identify = enrich.pid
    events: list = []
    rxe.publish = events.append
    labels = {
        "io.kubernetes.pod.name": "rdma-0",
        "io.kubernetes.pod.namespace": "ml",
        "io.kubernetes.pod.uid": uid,
        "io.kubernetes.container.name": "trainer",
    }
    server = [
        "ctr",
        "--address",
        str(ctd.sock),
        "run",
        "--rm",
        "--net-host",
        "--device",
        uverbs,
        "--cgroup",
        f"/kubepods/besteffort/pod{uid}/{cid}",
    ]
    for k, v in labels.items():
        server += ["--label", f"{k}={v}"]
    verbs = shutil.which(PINGPONG[0]) or PINGPONG[0]  # the container has no PATH
    server += ["--rootfs", str(root), cid, verbs, *PINGPONG[1:], "-n", str(10**7)]
    srv = cli = None
    try:
        srv, cli = pingpong(10**7, server)
        resolver.refresh()
        who = {"device": DEV, "type": "RC", "comm": "ibv_rc_pingpong"}
        v = wait_qps(rxe, 1, **who, namespace="ml", pod="rdma-0")
        got = [dict(lbl) for (n, lbl) in v if n == "lens_rdma_queue_pairs"]
        assert (
            qps(v, **who, namespace="ml", pod="rdma-0", container="trainer", workload="train") == 1
        ), (got, rxe.views["rdma"])
        assert qps(v, **who, pod="") == 1  # the client, a host process
        assert [
            (e.kind, e.device, e.queue_pairs, e.pod, e.container, e.workload) for e in events
        ] == [("rdma_open", DEV, 1, "rdma-0", "trainer", "train")]
        # /pods: the container, and the RDMA device behind its uverbs node
        (entry,) = (
            p for p in pods_view(resolver.containers, {}, rxe.views["devices"]) if p["id"] == cid
        )
        assert [(d["name"], d["path"]) for d in entry["devices"]["infiniband"]] == [(DEV, uverbs)]
    finally:
        stop(*[p for p in (cli, srv) if p is not None])
        ctd.remove(cid)
        _sh("umount", str(root), check=False)
    wait_for(lambda: values(rxe) and len(events) >= 2, "the container's rdma_close")
    assert [e.kind for e in events] == ["rdma_open", "rdma_close"]


def test_rxe_takes_per_qp_binding_but_keeps_no_counters(rxe: RdmaCollector) -> None:
    """collectors.rdma.qp_counters on Soft-RoCE: iproute2 accepts `auto type on`, rxe binds
    no counter, so there are no per-QP series (absent, never zero)."""
    rdma = shutil.which("rdma")
    assert rdma is not None
    from lens_ebpf.agent.devices.rdma import qp_counters

    rxe.bind = lambda device, port: qp_counters.bind_auto(rdma, device, port, 10)
    srv, cli = pingpong(10**7)
    try:
        v = wait_qps(rxe, 2, device=DEV, type="RC", comm="ibv_rc_pingpong")
        assert not any(n == "lens_rdma_qp_counter_total" for (n, _) in v)
        assert (rxe.bound[(DEV, 1)] == "") == (
            v[("lens_rdma_qp_counters_bound", (("device", DEV), ("port", "1")))] == 1
        )
    finally:
        stop(srv, cli)
        rxe.bind = None
