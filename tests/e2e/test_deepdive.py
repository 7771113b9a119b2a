"""The agent's DeepDiveService against Python processes in real containerd containers: the
pod's process tree with its exact pids, py-spy dump and record (the real py-spy) naming
the rank's functions, and what is refused: a caller other than the recorder, a pod not on
this node, a pid not of the pod, a non-Python process, one that exits mid-sample."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from lens_ebpf.agent.deepdive.pyspy import find_pyspy
from lens_ebpf.protocol.gen import deepdive_pb2 as pb
from lens_ebpf.protocol.gen import deepdive_pb2_grpc
from tests.containerlab import Containerd
from tests.deepdivelab import (
    OTHER_TOKEN,
    RECORDER_TOKEN,
    agent_for,
    children,
    containerd_with_python,
    start_rank,
)

NO_PYSPY = "py-spy is not installed (scripts/setup.sh test installs .[dev], which has it)"
pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not find_pyspy(""), reason=NO_PYSPY)]
AS_RECORDER = (("authorization", f"Bearer {RECORDER_TOKEN}"),)


@pytest.fixture(scope="module")
def ctd() -> Iterator[Containerd]:
    yield from containerd_with_python("dd-")


@pytest.fixture(scope="module")
def lab(ctd: Containerd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    rank = start_rank(ctd, "train-0", "spin")
    agent, address = agent_for(ctd, tmp_path_factory.mktemp("dd"))
    channel = grpc.insecure_channel(address)
    try:
        yield rank, agent, deepdive_pb2_grpc.DeepDiveServiceStub(channel)
    finally:
        channel.close()
        ctd.remove(rank.cid)
        agent.stop()


def test_the_pods_process_tree_has_its_exact_pids(lab: Any) -> None:
    rank, agent, stub = lab
    tree = stub.ProcessTree(pb.ProcessTreeRequest(pod_uid=rank.pod_uid), metadata=AS_RECORDER)
    assert (tree.pod_name, tree.pod_namespace, tree.node_name) == ("train-0", "team-a", "node-a")
    [c] = tree.containers
    assert (c.id, c.name) == (rank.cid, "trainer")
    sleep, helper = children(rank.pid)
    got = {p.host_pid: p for p in c.processes}
    assert sorted(got) == sorted([rank.pid, sleep, helper])
    main = got[rank.pid]
    assert (main.container_pid, main.container_ppid, main.is_python) == (1, 0, True)
    assert main.cmdline == "/usr/bin/python3 /app/rank.py spin"
    assert main.host_ppid == int(Path(f"/proc/{rank.pid}/stat").read_text().split()[3])
    assert (got[sleep].is_python, got[sleep].comm, got[sleep].container_ppid) == (False, "sleep", 1)
    assert got[helper].is_python and got[helper].container_pid > 1
    assert main.threads >= 1 and main.rss_bytes > 0 and main.start_time > 1.6e9
    assert main.state in ("R", "S")


def test_pyspy_dump_and_record_name_the_ranks_functions(lab: Any) -> None:
    rank, agent, stub = lab
    got = stub.PySpy(
        pb.PySpyRequest(pod_uid=rank.pod_uid, pid=rank.pid, action="dump"), metadata=AS_RECORDER
    )
    threads = json.loads(got.output)
    names = [f["name"] for t in threads for f in t["frames"]]
    assert names[:2] == ["spin_in_train_step", "main"], names
    rec = stub.PySpy(
        pb.PySpyRequest(
            pod_uid=rank.pod_uid,
            pid=rank.pid,
            action="record",
            duration_seconds=1,
            rate=50,
            format="speedscope",
        ),
        metadata=AS_RECORDER,
    )
    doc = json.loads(rec.output)
    assert rec.format == "speedscope" and doc["profiles"][0]["samples"]
    frames = {f["name"] for f in doc["shared"]["frames"]}
    assert {"spin_in_train_step", "main"} <= frames
    svg = stub.PySpy(
        pb.PySpyRequest(
            pod_uid=rank.pod_uid,
            pid=rank.pid,
            action="record",
            duration_seconds=1,
            format="flamegraph",
        ),
        metadata=AS_RECORDER,
    )
    assert svg.output.startswith(b"<?xml") and b"spin_in_train_step" in svg.output
    assert agent.sample("lens_agent_pyspy_runs_total", {"outcome": "ok"}) == 3


def code_of(call: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def test_only_the_recorder_may_call(lab: Any) -> None:
    rank, agent, stub = lab
    req = pb.ProcessTreeRequest(pod_uid=rank.pod_uid)
    code, why = code_of(lambda: stub.ProcessTree(req))  # no token: loopback takes it,
    assert code == grpc.StatusCode.PERMISSION_DENIED and "recorder only" in why  # not this
    other = (("authorization", f"Bearer {OTHER_TOKEN}"),)
    code, why = code_of(
        lambda: stub.PySpy(
            pb.PySpyRequest(pod_uid=rank.pod_uid, pid=rank.pid, action="dump"), metadata=other
        )
    )
    assert code == grpc.StatusCode.PERMISSION_DENIED and "someone-else may not" in why
    code, _ = code_of(lambda: stub.ProcessTree(req, metadata=(("authorization", "Bearer x"),)))
    assert code == grpc.StatusCode.UNAUTHENTICATED
    assert (
        agent.sample("lens_agent_deepdive_calls_refused_total", {"code": "permission_denied"}) == 2
    )
    assert agent.sample("lens_agent_deepdive_calls_refused_total", {"code": "unauthenticated"}) == 1


def test_bad_requests_are_refused_with_their_reason(lab: Any) -> None:
    rank, agent, stub = lab
    sleep, helper = children(rank.pid)

    def spy(**kw: Any) -> Any:
        return lambda: stub.PySpy(pb.PySpyRequest(**kw), metadata=AS_RECORDER)

    code, why = code_of(
        lambda: stub.ProcessTree(pb.ProcessTreeRequest(pod_uid="not-here"), metadata=AS_RECORDER)
    )
    assert code == grpc.StatusCode.NOT_FOUND and "no running container on node node-a" in why
    code, why = code_of(spy(pod_uid=rank.pod_uid, pid=os.getpid(), action="dump"))
    assert code == grpc.StatusCode.NOT_FOUND and "not a process of pod" in why
    code, why = code_of(spy(pod_uid=rank.pod_uid, pid=sleep, action="dump"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "not a Python process" in why
    code, why = code_of(
        spy(pod_uid=rank.pod_uid, pid=rank.pid, action="record", duration_seconds=100000)
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "max_duration_seconds" in why
    # the helper is killed while a 30 s record samples it
    out: dict[str, Any] = {}

    def record() -> None:
        try:
            spy(pod_uid=rank.pod_uid, pid=helper, action="record", duration_seconds=30)()
        except grpc.RpcError as exc:
            out["err"] = exc

    t = threading.Thread(target=record)
    t.start()
    agent.wait_sample("lens_agent_pyspy_running", {}, 1)
    os.kill(helper, signal.SIGKILL)
    t.join(timeout=60)
    assert out["err"].code() == grpc.StatusCode.ABORTED, out["err"].details()
    assert f"process {helper} exited" in out["err"].details()


def test_pyspy_missing_is_said(ctd: Containerd, lab: Any, tmp_path: Path) -> None:
    rank = lab[0]
    agent, address = agent_for(
        ctd, tmp_path, env={"LENS_COLLECTORS__DEEPDIVE__PYSPY": str(tmp_path / "no-py-spy")}
    )
    try:
        with grpc.insecure_channel(address) as ch:
            stub = deepdive_pb2_grpc.DeepDiveServiceStub(ch)
            code, why = code_of(
                lambda: stub.PySpy(
                    pb.PySpyRequest(pod_uid=rank.pod_uid, pid=rank.pid, action="dump"),
                    metadata=AS_RECORDER,
                )
            )
        assert code == grpc.StatusCode.FAILED_PRECONDITION and "py-spy is not installed" in why
        assert agent.json("/readyz")[1]["features"]["deepdive"]["reason"] == "py-spy not found"
    finally:
        agent.stop()
