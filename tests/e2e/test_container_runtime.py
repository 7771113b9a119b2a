"""The container view without BPF: with the processes program off (as where BPF cannot
load), the agent still lists a real containerd container with its devices on /pods,
without its environment, and container_start / container_exit reach a Subscribe client."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import grpc
import pytest

from lens_ebpf.protocol.gen import lens_pb2 as pb
from lens_ebpf.protocol.gen import lens_pb2_grpc
from tests.agentproc import AgentProc, free_port
from tests.conftest import wait_for
from tests.containerlab import Containerd, gpu_and_rdma_nodes, private_containerd
from tests.e2e.test_grpc import Reader, wait_subscribers

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ctd() -> Iterator[Containerd]:
    yield from private_containerd("cr-")


@pytest.fixture(scope="module")
def devices() -> Iterator[tuple[str, str]]:
    yield from gpu_and_rdma_nodes()


def test_pods_and_container_events_without_bpf(ctd: Containerd, devices) -> None:
    grpc_port = free_port()
    env = {
        "LENS_CONTAINERS__CONTAINERD_STATE": str(ctd.state),
        "LENS_GRPC__LISTEN": f"127.0.0.1:{grpc_port}",
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    uid = str(uuid.uuid4())
    labels = {
        "io.kubernetes.pod.name": "train-0",
        "io.kubernetes.pod.namespace": "team-a",
        "io.kubernetes.pod.uid": uid,
        "io.kubernetes.container.name": "trainer",
    }
    try:
        agent.wait_ready()
        ready = agent.json("/readyz")[1]["features"]
        assert ready["processes"]["state"] == "off"
        assert ready["container_runtime"] == {"state": "running", "reason": ""}
        stub = lens_pb2_grpc.EventServiceStub(grpc.insecure_channel(f"127.0.0.1:{grpc_port}"))
        reader = Reader(
            stub, pb.SubscribeRequest(kinds=["container_start", "container_exit"], container=cid)
        )
        wait_subscribers(agent, 1)
        res = ctd.run(
            cid,
            "/bin/sleep",
            "60",
            labels=labels,
            devices=devices,
            env={"SECRET_TOKEN": "hunter2"},
            detach=True,
            cgroup=f"/kubepods/pod{uid}/{cid}",
        )
        assert res.returncode == 0, res.stderr
        pods = wait_for(
            lambda: [p for p in agent.json("/pods")[1] if p["id"] == cid],
            f"container {cid} on /pods",
            every=0.3,
        )
        row = pods[0]
        assert (row["pod_name"], row["pod_namespace"], row["pod_uuid"], row["container_name"]) == (
            "train-0",
            "team-a",
            uid,
            "trainer",
        )
        assert [(d["path"], d["major"], d["minor"]) for d in row["devices"]["gpu"]] == [
            ("/dev/dri/renderD128", 226, 128)
        ]
        assert [d["path"] for d in row["devices"]["infiniband"]] == ["/dev/infiniband/uverbs0"]
        text = json.dumps(agent.json("/pods")[1])
        assert "hunter2" not in text and "SECRET_TOKEN" not in text
        assert agent.sample("lens_containers_running") == 1
        ctd.remove(cid)
        wait_for(lambda: len(reader.events) >= 2, "container_start and container_exit")
        got = reader.close()
    finally:
        ctd.remove(cid)
        assert agent.stop() == 0
    assert [e.WhichOneof("payload") for e in got] == ["container_start", "container_exit"]
    start = got[0].container_start
    assert (start.identity.pod, start.identity.namespace) == ("train-0", "team-a")
    assert "/dev/dri/renderD128" in start.devices
