"""The agent's ProfilerService against a real containerd container that wrote PyTorch
profiler traces (the HolisticTraceAnalysis fixtures, real torch.profiler output): found
through the process's cwd, its --profile-dir, its TORCH_PROFILER_DIR and a configured glob,
with their ranks; sent byte for byte; a 2 GiB trace refused by the cap, a link out of the
container never listed, a caller other than the recorder refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from lens_ebpf.protocol.gen import profiler_pb2 as pb
from lens_ebpf.protocol.gen import profiler_pb2_grpc
from tests.deepdivelab import OTHER_TOKEN, RECORDER_TOKEN, agent_for, containerd_with_python
from tests.profilerlab import (
    FIXTURES,
    GLOBS,
    HUGE,
    HUGE_BYTES,
    LINK,
    MALFORMED,
    clear,
    start_trainer,
)

pytestmark = [pytest.mark.e2e, pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no {FIXTURES}")]
AS_RECORDER = (("authorization", f"Bearer {RECORDER_TOKEN}"),)


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    for ctd in containerd_with_python("pf-"):
        t = start_trainer(ctd)
        agent, address = agent_for(
            ctd, tmp_path_factory.mktemp("pf"), env={"LENS_COLLECTORS__PROFILER__GLOBS": GLOBS}
        )
        channel = grpc.insecure_channel(address)
        try:
            yield t, agent, profiler_pb2_grpc.ProfilerServiceStub(channel), ctd
        finally:
            channel.close()
            ctd.remove(t.cid)
            clear(ctd.rootfs)
            agent.stop()


def fetch(stub: Any, t: Any, path: str, **kw: Any) -> bytes:
    chunks = list(
        stub.FetchProfilerFile(
            pb.FetchProfilerFileRequest(pod_uid=t.pod_uid, container_id=t.cid, path=path, **kw),
            metadata=AS_RECORDER,
        )
    )
    assert [c.offset for c in chunks] == sorted(c.offset for c in chunks)
    return b"".join(c.data for c in chunks)


def test_the_traces_are_found_with_their_ranks_and_sent_byte_for_byte(lab: Any) -> None:
    t, agent, stub, ctd = lab
    got = stub.ListProfilerFiles(
        pb.ListProfilerFilesRequest(pod_uid=t.pod_uid), metadata=AS_RECORDER
    )
    assert (got.pod_name, got.pod_namespace, got.node_name) == ("train-0", "team-a", "node-a")
    files = {f.path: f for f in got.files}
    assert set(files) == {*t.files, MALFORMED, HUGE}  # the link out is not one
    assert LINK not in files
    ranks = {p: files[p].rank for p in t.files}
    assert ranks == {
        "/prof/step5/node-a_4037.1682725898236.pt.trace.json.gz": 0,
        "/prof/step5/node-a_4045.1682725898079.pt.trace.json.gz": 1,
        "/work/mi250.pt.trace.json": -1,
        "/torchprof/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": 34,
        "/out/nccl_data.json.gz": 0,  # its distributedInfo's
    }
    assert {p: files[p].found_by for p in t.files} == {
        "/prof/step5/node-a_4037.1682725898236.pt.trace.json.gz": "argument",
        "/prof/step5/node-a_4045.1682725898079.pt.trace.json.gz": "argument",
        "/work/mi250.pt.trace.json": "cwd",
        "/out/nccl_data.json.gz": "glob",
        "/torchprof/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz": "environment",
    }
    for p, data in t.files.items():
        f = files[p]
        assert (f.size_bytes, f.container_id, f.container, f.host_pid) == (
            len(data),
            t.cid,
            "trainer",
            t.pid,
        )
        assert fetch(stub, t, p) == data, p
    assert files[HUGE].size_bytes == HUGE_BYTES


def test_what_is_refused(lab: Any) -> None:
    t, agent, stub, ctd = lab
    with pytest.raises(grpc.RpcError) as err:  # over the cap: before a byte is sent
        fetch(stub, t, HUGE)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"{HUGE_BYTES} bytes, over the cap" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:  # the caller's own cap holds too
        fetch(stub, t, "/work/mi250.pt.trace.json", max_bytes=1000)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    for path in (LINK, "/etc/hostname", "/prof/../etc/hostname"):
        with pytest.raises(grpc.RpcError) as err:
            fetch(stub, t, path)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND, path
    with pytest.raises(grpc.RpcError) as err:  # a pod not on this node
        stub.ListProfilerFiles(
            pb.ListProfilerFilesRequest(pod_uid="not-here"), metadata=AS_RECORDER
        )
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "node-a" in err.value.details()
    for meta in ((), (("authorization", f"Bearer {OTHER_TOKEN}"),)):
        with pytest.raises(grpc.RpcError) as err:
            stub.ListProfilerFiles(pb.ListProfilerFilesRequest(pod_uid=t.pod_uid), metadata=meta)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    # the agent kept serving, and counted each refusal
    assert stub.ListProfilerFiles(
        pb.ListProfilerFilesRequest(pod_uid=t.pod_uid), metadata=AS_RECORDER
    ).files
    text = agent.metrics_text()
    for code, n in (("resource_exhausted", 2), ("not_found", 3), ("permission_denied", 2)):
        assert f'lens_agent_profiler_calls_refused_total{{code="{code}"}} {n}.0' in text, code
