"""The profiler traces' discovery (agent/profiler/discovery.py) on a directory tree laid
out as a container's root, and the viewer's and the analysis's checks of a trace
(recorder/profiler): pure parts, no containers."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import pytest

from lens_ebpf.agent.profiler import discovery
from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.profiler.analysis import precheck
from lens_ebpf.recorder.profiler.sessions import for_viewer


def test_the_directories_arguments_and_environment_name() -> None:
    argv = [
        "python",
        "train.py",
        "--profile-dir",
        "prof",
        "--trace_dir=/t",
        "--lr",
        "0.1",
        "--profiler-output-path",
        "/o",
        "--output",
        "/not-this",
        "--tensorboard-dir",
    ]
    assert discovery.flagged_dirs(argv, "/work") == ["/work/prof", "/t", "/o"]
    env = b"\0".join(
        [
            b"TORCH_PROFILER_DIR=/tp",
            b"HF_TOKEN=s3cret",
            b"MY_PROFILE_DIR=rel",
            b"KINETO_TRACE_PATH=/k",
            b"PATH=/usr/bin",
            b"PROFILE=x",
        ]
    )
    assert discovery.environment_dirs(env, "/work") == ["/tp", "/work/rel", "/k"]


@pytest.mark.parametrize(
    "name, head, rank",
    [
        ("cpu_only_rank-34.Jul_15.pt.trace.json.gz", b"", 34),
        ("worker_rank_7.pt.trace.json", b"", 7),
        (
            "node-a_4037.1682725898236.pt.trace.json.gz",
            b'{"distributedInfo": {"backend": "nccl", ' b'"rank": 3, "world_size": 8}}',
            3,
        ),
        ("mi250.pt.trace.json", b'{"schemaVersion": 1}', -1),
    ],
)
def test_a_traces_rank_from_its_name_or_its_distributed_info(
    name: str, head: bytes, rank: int
) -> None:
    assert discovery.rank_of(name, head) == rank


def test_traces_are_found_below_the_root_and_no_link_is_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "work" / "prof" / "step1").mkdir(parents=True)
    (root / "work" / "prof" / "step1" / "a.pt.trace.json").write_text("{}")
    (root / "work" / "other.json").write_text("{}")  # not a trace's name
    (root / "out").mkdir()
    (root / "out" / "x.json.gz").write_bytes(gzip.compress(b'{"distributedInfo": {"rank": 5}}'))
    os.symlink("/etc/hostname", root / "work" / "prof" / "escape.pt.trace.json")
    os.symlink("/etc", root / "work" / "prof" / "etc")  # a directory link: not walked
    budget = [1000]
    got = dict(discovery.walk(root, "/work", discovery.NAMES, 3, budget))
    assert list(got) == ["/work/prof/step1/a.pt.trace.json"]
    assert list(dict(discovery.glob_files(root, ["/out/*.json.gz"], budget))) == ["/out/x.json.gz"]
    for bad in (
        "/work/prof/escape.pt.trace.json",
        "/work/prof/etc/hostname",
        "/work/../etc",
        "relative",
    ):
        with pytest.raises((discovery.UnsafePathError, FileNotFoundError)):
            discovery.open_trace(root, bad)
    fd, st = discovery.open_trace(root, "/work/prof/step1/a.pt.trace.json")
    os.close(fd)
    assert st.st_size == 2


def test_the_viewers_trace_numbers_string_threads_and_keeps_their_names() -> None:
    trace = {
        "traceEvents": [
            {"ph": "X", "name": "aten::mm", "pid": 7, "tid": 7, "ts": 1, "dur": 2},
            {"ph": "X", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 2, "dur": 1},
            {"ph": "X", "name": "nccl", "pid": "gpu 1", "tid": "stream 9", "ts": 3, "dur": 1},
        ]
    }
    out = json.loads(for_viewer(json.dumps(trace).encode()))["traceEvents"]
    assert [(e["name"], type(e["pid"]), type(e["tid"])) for e in out[:3]] == [
        ("aten::mm", int, int),
        ("gemm", int, int),
        ("nccl", int, int),
    ]
    names = {(e["name"], e["args"]["name"]) for e in out[3:]}
    assert names == {
        ("thread_name", "stream 7"),
        ("thread_name", "stream 9"),
        ("process_name", "gpu 1"),
    }
    assert out[1]["tid"] != out[2]["tid"]
    with pytest.raises(BadRequest, match="not JSON"):
        for_viewer(b'{"traceEvents": [')


# ids by what is wrong: a gzip's bytes hold the time it was made, and make test's two
# workers must collect the same ids
@pytest.mark.parametrize(
    "data, why",
    [
        (b'{"traceEvents": [{"ph": ', "not JSON"),
        (gzip.compress(b'{"schemaVersion": 1}', mtime=0), "no traceEvents"),
        (b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x"}]}', "no GPU kernels"),
        (b"\x1f\x8bnot gzip", "not gzip"),
    ],
    ids=["not-json", "no-trace-events", "no-gpu-kernels", "not-gzip"],
)
def test_a_trace_hta_cannot_break_down_is_refused_before_it_starts(data: bytes, why: str) -> None:
    with pytest.raises(BadRequest, match=why):
        precheck("t.json", data)
    precheck("ok.json", b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k"}]}')
