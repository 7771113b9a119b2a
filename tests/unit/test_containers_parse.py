import json
from pathlib import Path

import pytest

from lens_ebpf.agent import config
from lens_ebpf.agent.bpf.loader import BpfLoader
from lens_ebpf.agent.containers.cgroups import (
    CgroupIndex,
    cgroup2_root,
    cgroup_path,
    kernel_path,
    parse_cgroup,
)
from lens_ebpf.agent.containers.pods import container_event, pods_view
from lens_ebpf.agent.containers.resolver import ContainerResolver, identity, systemd_cgroup_path
from lens_ebpf.agent.containers.runtime import ContainerdState, device_group, parse_spec
from lens_ebpf.agent.enrich import Enrichment
from lens_ebpf.agent.events import EventBus, ProcessEvent
from lens_ebpf.agent.metrics.cache import MetricCache
from lens_ebpf.agent.pods.index import ClusterIndex
from lens_ebpf.agent.processes.proc_events import (
    _PROC_EVENT,
    EV_EXEC,
    EV_EXIT,
    EXECS,
    EXITS,
    PF_OOM_VICTIM,
    ProcEvents,
    exit_class,
)
from tests.k8slab import pod

CID = "3b2f" + "a" * 60
UID = "6d0c3f2e-8a41-4b7e-9c55-0e1f2a3b4c5d"


@pytest.mark.parametrize(
    ("path", "cid", "runtime", "uid", "qos"),
    [
        (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID.replace('-', '_')}"
            f".slice/cri-containerd-{CID}.scope",
            CID,
            "containerd",
            UID,
            "burstable",
        ),
        (
            f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope",
            CID,
            "cri-o",
            UID,
            "guaranteed",
        ),
        (f"/kubepods/besteffort/pod{UID}/{CID}", CID, "", UID, "besteffort"),
        (f"/kubepods/pod{UID}/{CID}", CID, "", UID, "guaranteed"),
        # a kubelet with cgroupRoot (the real node lab's /lens-node)
        (f"/lens-node/kubepods/pod{UID}/{CID}", CID, "", UID, "guaranteed"),
        (f"/lens-node/kubepods/burstable/pod{UID}/{CID}", CID, "", UID, "burstable"),
        (f"/docker/{CID}", CID, "docker", "", ""),
        (f"/system.slice/docker-{CID}.scope", CID, "docker", "", ""),
        ("/default/test1", "test1", "", "", ""),
        ("/user.slice/user-0.slice/session-3.scope", "", "", "", ""),
        ("/", "", "", "", ""),
        (
            "/kubepods.slice/kubepods-burstable.slice/"
            f"kubepods-burstable-pod{UID.replace('-', '_')}"
            f".slice/crio-conmon-{CID}.scope",
            "",
            "",
            UID,
            "burstable",
        ),
    ],
)
def test_cgroup_layouts(path: str, cid: str, runtime: str, uid: str, qos: str) -> None:
    ref = parse_cgroup(path)
    assert (ref.container_id, ref.runtime, ref.pod_uid, ref.qos) == (cid, runtime, uid, qos)


def test_ctr_layout_carries_its_namespace() -> None:
    assert parse_cgroup("/default/test1").runtime_namespace == "default"


def test_proc_cgroup_v2_first_then_v1() -> None:
    hybrid = "9:name=systemd:/default/a\n4:memory:/default/a\n0::/default/a\n"
    assert cgroup_path(hybrid) == "/default/a"
    v1_only = "9:name=systemd:/docker/abc\n4:memory:/docker/abc\n0::/\n"
    assert cgroup_path(v1_only) == "/docker/abc"
    assert cgroup_path("0::/\n") == "/"


def test_cgroup2_mount_from_mountinfo() -> None:
    text = (
        "35 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
        "36 25 0:31 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    )
    assert cgroup2_root(text) == "/sys/fs/cgroup/unified"
    assert cgroup2_root("1 2 0:3 / /proc rw - proc proc rw\n") is None


def test_systemd_cgroups_path() -> None:
    got = systemd_cgroup_path(
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice:cri-containerd:{CID}"
    )
    assert got == (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
    )
    assert systemd_cgroup_path("/default/test1") == "/default/test1"


SPEC = {
    "ociVersion": "1.1.0",
    "process": {"env": ["PATH=/bin", "SECRET_TOKEN=hunter2"], "args": ["/bin/sleep", "30"]},
    "mounts": [
        {
            "destination": "/var/run/secrets/kubernetes.io/serviceaccount",
            "source": "/var/lib/kubelet/pods/x/volumes/token",
            "type": "bind",
        }
    ],
    "annotations": {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-name": "train-0",
        "io.kubernetes.cri.sandbox-namespace": "ml",
        "io.kubernetes.cri.sandbox-uid": UID,
        "io.kubernetes.cri.container-name": "trainer",
    },
    "linux": {
        "cgroupsPath": f"kubepods-pod{UID.replace('-', '_')}.slice:cri-containerd:{CID}",
        "devices": [
            {"path": "/dev/dri/card1", "type": "c", "major": 226, "minor": 1},
            {"path": "/dev/dri/renderD129", "type": "c", "major": 226, "minor": 129},
            {"path": "/dev/kfd", "type": "c", "major": 235, "minor": 0},
            {"path": "/dev/infiniband/uverbs3", "type": "c", "major": 231, "minor": 195},
            {"path": "/dev/fuse", "type": "c", "major": 10, "minor": 229},
            {"path": "/dev/broken", "type": "c"},
        ],
    },
}


def test_spec_identity_and_devices_but_never_env_or_mounts(tmp_path) -> None:
    info = parse_spec(SPEC, CID, "k8s.io", sysfs=tmp_path)
    assert (info.pod_name, info.pod_namespace, info.pod_uid, info.name) == (
        "train-0",
        "ml",
        UID,
        "trainer",
    )
    assert [d.group for d in info.devices] == ["gpu", "gpu", "gpu", "infiniband", "other"]
    view = json.dumps(pods_view({CID: info}))
    for secret in ("hunter2", "SECRET_TOKEN", "serviceaccount", "/var/lib/kubelet"):
        assert secret not in view and secret not in repr(info)
    row = pods_view({CID: info})[0]
    # GPU device nodes no GPU reading explains keep id -1; /dev/kfd is a shared node
    assert [(d["path"], d["id"]) for d in row["devices"]["gpu"]] == [
        ("/dev/dri/card1", -1),
        ("/dev/dri/renderD129", -1),
    ]
    assert row["control_devices"] == ["/dev/kfd"]


def test_sandbox_containers_are_not_listed(tmp_path) -> None:
    spec = json.loads(json.dumps(SPEC))
    spec["annotations"]["io.kubernetes.cri.container-type"] = "sandbox"
    assert pods_view({CID: parse_spec(spec, CID, "k8s.io", sysfs=tmp_path)}) == []


def test_a_sandbox_is_the_kubelets_pod_container_in_labels_and_events(tmp_path) -> None:
    """The pause container's processes (its exec, its exit) count under container="POD",
    as the kubelet names a sandbox, never under its 64-digit id (seen on the real node)."""
    spec = json.loads(json.dumps(SPEC))
    spec["annotations"]["io.kubernetes.cri.container-type"] = "sandbox"
    del spec["annotations"]["io.kubernetes.cri.container-name"]
    info = parse_spec(spec, CID, "k8s.io", sysfs=tmp_path)
    assert info.label == "POD"
    ref = parse_cgroup(f"/lens-node/kubepods/besteffort/pod{UID}/{CID}")
    assert identity(ref, info)["container"] == "POD"
    assert container_event("container_start", info).container == "POD"
    plain = json.loads(json.dumps(SPEC))
    del plain["annotations"]["io.kubernetes.cri.container-name"]
    assert parse_spec(plain, CID, "k8s.io", sysfs=tmp_path).label == CID  # no name known


def test_host_device_path_from_sysfs(tmp_path) -> None:
    d = tmp_path / "dev" / "char" / "226:1"
    d.mkdir(parents=True)
    (d / "uevent").write_text("MAJOR=226\nMINOR=1\nDEVNAME=dri/card1\n")
    info = parse_spec(SPEC, CID, "k8s.io", sysfs=tmp_path)
    assert info.devices[0].host_path == "/dev/dri/card1"


@pytest.mark.parametrize(
    ("path", "group"),
    [
        ("/dev/nvidia0", "gpu"),
        ("/dev/nvidiactl", "gpu"),
        ("/dev/nvidia-uvm", "gpu"),
        ("/dev/nvidia-caps", "other"),
        ("/dev/infiniband/rdma_cm", "infiniband"),
    ],
)
def test_device_groups(path: str, group: str) -> None:
    assert device_group(path) == group


def test_exit_classes() -> None:
    assert [exit_class(0, 0), exit_class(3, 0), exit_class(-1, 9), exit_class(-1, 0)] == [
        "success",
        "error",
        "signal",
        "unknown",
    ]


def pod_container(tmp_path: Path) -> tuple[Path, str, Path]:
    """A cgroup v2 tree with SPEC's container's cgroup, and containerd's task directory for
    it: (cgroup root, the container's cgroup path, its task directory)."""
    cgroups = tmp_path / "cgroup"
    path = f"/kubepods/pod{UID}/{CID}"
    (cgroups / path.lstrip("/")).mkdir(parents=True)
    task = tmp_path / "state" / "io.containerd.runtime.v2.task" / "k8s.io" / CID
    task.mkdir(parents=True)
    spec = json.loads(json.dumps(SPEC))
    spec["linux"]["cgroupsPath"] = path
    (task / "config.json").write_text(json.dumps(spec))
    return cgroups, path, task


def test_an_exited_container_names_its_late_records_for_a_while(tmp_path) -> None:
    """Records a program held back for a batch arrive after the runtime let the container
    go: the resolver answers with it for keep_exited seconds, then forgets it."""
    cgroups, path, task = pod_container(tmp_path)
    now = [100.0]
    index = CgroupIndex(cgroups, min_rescan=0)
    resolver = ContainerResolver(
        index, ContainerdState(tmp_path / "state", tmp_path), clock=lambda: now[0], keep_exited=60
    )
    cgroup_id = (cgroups / path.lstrip("/")).stat().st_ino
    ref, info = resolver.resolve(cgroup_id)
    assert info is not None and info.name == "trainer"
    assert resolver.settled(cgroup_id, ref, info)
    # an unknown cgroup, and a container cgroup the runtime does not list, are not final
    ref0, info0 = resolver.resolve(987654321)
    assert (ref0.path, info0) == ("/", None) and not resolver.settled(987654321, ref0, info0)
    other = f"/kubepods/pod{UID}/{'e' * 64}"
    (cgroups / other.lstrip("/")).mkdir()
    other_id = (cgroups / other.lstrip("/")).stat().st_ino
    ref1, info1 = resolver.resolve(other_id)
    assert ref1.container_id == "e" * 64 and info1 is None
    assert not resolver.settled(other_id, ref1, info1)

    (task / "config.json").unlink()
    task.rmdir()
    (cgroups / path.lstrip("/")).rmdir()
    now[0] += 1
    assert resolver.refresh() == ([], [info])
    assert resolver.containers == {}
    ref, late = resolver.resolve(cgroup_id)
    assert late == info and ref.path == path
    now[0] += 60
    resolver.refresh()
    assert resolver.resolve(cgroup_id)[1] == info  # 60 s after its exit: still kept
    now[0] += 0.5
    resolver.refresh()
    assert resolver.resolve(cgroup_id)[1] is None


def slots(*names: bytes, size: int = 16, depth: int = 8) -> list[bytes]:
    """proc_events.c's cgroup_paths names: each NUL-ended in a slot of size bytes."""
    return [n.ljust(size, b"\0") for n in names] + [b"\x7f" * size] * (depth - len(names))


def test_the_kernels_cgroup_path() -> None:
    """Leaf first up to the root (whose name is empty); anything short of that is no path."""
    assert kernel_path(slots(b"c1", b"pod-a", b"kubepods", b""), 4, True) == "/kubepods/pod-a/c1"
    assert kernel_path(slots(b""), 1, True) == "/"
    assert kernel_path(slots(b"c1", b"kubepods", b""), 3, False) is None  # deeper than 8
    assert kernel_path(slots(b"c1", b"kubepods"), 2, True) is None  # the last is no root
    assert kernel_path(slots(b"c1", b""), 0, True) is None
    assert kernel_path(slots(b"c1", b""), 9, True) is None
    # a name that filled its slot may have been cut short: not a path to trust
    assert kernel_path(slots(b"x" * 15, b""), 2, True) is None
    assert kernel_path(slots(b"x" * 14, b""), 2, True) == "/" + "x" * 14


def test_a_cgroup_gone_before_it_was_indexed_is_named_by_the_kernels_path(tmp_path) -> None:
    """The kernel recorded the path of a pod's cgroup that no longer exists: the resolver
    indexes it, the container id and pod uid come from it, and the cluster index names
    the pod by its uid."""
    cgroups = tmp_path / "cgroup"
    cgroups.mkdir()
    gone = f"/kubepods/besteffort/pod{UID}/{CID}"
    recorded = {4242: gone}
    resolver = ContainerResolver(
        CgroupIndex(cgroups, min_rescan=0), ContainerdState(tmp_path / "state", tmp_path)
    )
    resolver.kernel_path = recorded.get
    enrich = Enrichment(resolver)
    path, who, settled = enrich.cgroup(4242)
    assert (path, who["container_id"], who["pod_uid"], who["pod"]) == (gone, CID, UID, "")
    assert not settled  # its container may yet be listed
    assert resolver.index.path(4242, rescan=False) == gone
    obj = pod("web-0", "", "team-a", owner=("StatefulSet", "web"))
    obj["metadata"]["uid"] = UID
    enrich.index = ClusterIndex()
    enrich.index.replace_pods([obj])
    _, who, _ = enrich.cgroup(4242)
    assert (who["namespace"], who["pod"], who["workload_kind"], who["workload"]) == (
        "team-a",
        "web-0",
        "StatefulSet",
        "web",
    )
    assert who["container"] == ""  # the runtime's state alone has its name
    assert enrich.cgroup(4343)[0] == "/"  # nothing recorded, nothing indexed: the host


def test_the_cluster_index_finds_pods_by_uid() -> None:
    index = ClusterIndex()
    a, b = pod("a-0", "10.0.0.1", "ns"), pod("b-0", "10.0.0.2", "ns")
    index.replace_pods([a, b])
    assert index.pod_by_uid("uid-a-0").name == "a-0" and index.pod_by_uid("nope") is None
    again = pod("a-0", "10.0.0.1", "ns")
    again["metadata"]["uid"] = "uid-a-1"  # the same name, a new pod
    index.pod_event("MODIFIED", again)
    assert index.pod_by_uid("uid-a-0") is None and index.pod_by_uid("uid-a-1").name == "a-0"
    index.pod_event("DELETED", b)
    assert index.pod_by_uid("uid-b-0") is None


def test_process_records_become_the_events_the_constructor_makes(tmp_path) -> None:
    """proc_events records (bytes as the ring hands them over) -> events made through
    their slots equal to ProcessEvent's own; a cgroup's settled identity is kept and
    the owner workload joined from the index as it is at each record."""
    cgroups, path, _task = pod_container(tmp_path)
    resolver = ContainerResolver(
        CgroupIndex(cgroups, min_rescan=0), ContainerdState(tmp_path / "state", tmp_path)
    )
    enrich = Enrichment(resolver)
    cache, bus = MetricCache(3600, 1000), EventBus(100)
    procs = ProcEvents(config.load(None, env={}).bpf, cache, bus, BpfLoader(), enrich)
    sub = bus.subscribe("t", maxsize=100)
    cgroup_id = (cgroups / path.lstrip("/")).stat().st_ino
    index = ClusterIndex()
    index.replace_pods([pod("train-0", "", "ml", owner=("Job", "train"))])
    enrich.index = index
    procs._on_event(
        _PROC_EVENT.pack(
            10, cgroup_id, EV_EXEC, 42, 1, -1, 0, 0, b"python\0x", b"/usr/bin/python3\0"
        )
    )
    enrich.index = None
    procs._on_event(
        _PROC_EVENT.pack(20, cgroup_id, EV_EXIT, 42, 1, 0, 9, PF_OOM_VICTIM, b"python", b"")
    )
    procs._on_event(_PROC_EVENT.pack(30, cgroup_id, 77, 42, 1, 0, 0, 0, b"x", b""))  # no kind
    got = [sub.get(0), sub.get(0), sub.get(0)]
    who = dict(
        container_id=CID,
        container="trainer",
        pod="train-0",
        namespace="ml",
        pod_uid=UID,
        pid=42,
        ppid=1,
        cgroup_id=cgroup_id,
        cgroup=path,
        comm="python",
    )
    assert got == [
        ProcessEvent(
            kind="process_exec",
            seq=1,
            ts_unix_nano=got[0].ts_unix_nano,
            ts_ns=10,
            filename="/usr/bin/python3",
            workload_kind="Job",
            workload="train",
            **who,
        ),
        ProcessEvent(
            kind="process_exit",
            seq=2,
            ts_unix_nano=got[1].ts_unix_nano,
            ts_ns=20,
            exit_code=0,
            signal=9,
            oom_killed=True,
            **who,
        ),
        None,
    ]
    assert procs.events_received == 3
    assert cache.get(EXECS, ("ml", "train-0", "trainer")) == 1
    assert cache.get(EXITS, ("ml", "train-0", "trainer", "signal")) == 1
    assert enrich.cgroup(cgroup_id) == (
        path,
        {k: who[k] for k in ("container_id", "container", "pod", "namespace", "pod_uid")},
        True,
    )
