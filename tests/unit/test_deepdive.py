"""The deep dive's pure parts: /proc's status and stat, the GPU files a process holds,
who may call DeepDiveService, and which rank's stack is apart at a stall."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from lens_ebpf.agent.deepdive import procs
from lens_ebpf.agent.deepdive.pyspy import PySpy, RefusalError
from lens_ebpf.agent.deepdive.service import allowed
from lens_ebpf.recorder.deepdive.stacks import compare, main_stack

# a comm with a space and a parenthesis: the fields start after the last ')'
STAT = (
    "4242 (py thon) x) S 4200 4242 4200 0 -1 4194560 1 0 0 0 150 50 0 0 20 0 7 0 "
    "123456 1048576 2560 18446744073709551615 1 1 0 0 0 0 0 16781312 2 0 0 0 17 3 0 0 "
    "0 0 0"
)


def test_stat_and_status() -> None:
    st = procs.parse_stat(STAT)
    assert (
        st["state"],
        st["ppid"],
        st["utime"],
        st["stime"],
        st["num_threads"],
        st["starttime"],
        st["vsize"],
        st["rss"],
    ) == ("S", 4200, 150, 50, 7, 123456, 1048576, 2560)
    status = procs.parse_status("Name:\tpython3\nNSpid:\t4242\t1\nThreads:\t7\n")
    assert status["NSpid"].split() == ["4242", "1"] and status["Name"] == "python3"
    assert procs.boot_time("cpu 1 2 3\nbtime 1700000000\n") == 1700000000.0


def test_python_and_gpu_files() -> None:
    assert procs.is_python("python3.11", "/usr/bin/python3.11")
    assert procs.is_python("torchrun", "/opt/conda/bin/python3")  # the exe says it
    assert procs.is_python("launcher", "/opt/app/launcher", "7f00 r-xp libpython3.11.so")
    assert not procs.is_python("sleep", "/bin/sleep")
    assert procs.held_device("/dev/dri/renderD130") == procs.HeldDevice(
        "/dev/dri/renderD130", 2, "amd"
    )
    assert procs.held_device("/dev/nvidia3") == procs.HeldDevice("/dev/nvidia3", 3, "nvidia")
    assert procs.held_device("/dev/kfd") == procs.HeldDevice("/dev/kfd", -1, "amd")
    assert procs.held_device("/dev/dri/card0") is None and procs.held_device("/tmp/x") is None


def test_only_the_callers_named() -> None:
    callers = ["lens-ebpf-recorder", "ops/auditor"]
    assert allowed("lens-ebpf/lens-ebpf-recorder", callers)  # a ServiceAccount, any namespace
    assert allowed("lens-ebpf-recorder", callers)  # a tokens_file line
    assert allowed("ops/auditor", callers) and not allowed("dev/auditor", callers)
    assert not allowed("anonymous", [*callers, "anonymous"])
    assert not allowed("lens-ebpf/someone", callers)


def rank(pod: str, *frames: str) -> dict[str, object]:
    return {"pod": pod, "stack": list(frames), "error": ""}


def test_the_rank_apart() -> None:
    wait = ("wait_in_barrier (rank.py:3)", "main (rank.py:13)")
    other = ("load_next_batch (rank.py:5)", "main (rank.py:13)")
    got = compare(
        [
            rank("w-0", *wait),
            rank("w-1", *other),
            rank("w-2", "wait_in_barrier (rank.py:4)", "main (rank.py:13)"),
            rank("w-3"),
        ],
        "training_stalled",
        "t",
    )
    # another line of the same function agrees; the majority is the job's
    assert got["different"] == ["w-1"] and got["unread"] == ["w-3"]
    # two ranks apart from each other: rank 0's is taken as the job's
    tie = compare([rank("w-0", "a (x.py:1)"), rank("w-1", "b (x.py:1)")], "x", "t")
    assert tie["different"] == ["w-1"]
    assert compare([], "x", "t")["different"] == []


def test_the_main_threads_stack() -> None:
    dump = [
        {
            "thread_name": "pt_autograd_0",
            "frames": [{"name": "run", "short_filename": "t.py", "line": 1}],
        },
        {
            "thread_name": "MainThread",
            "frames": [
                {"name": "wait", "filename": "/app/x.py", "short_filename": "x.py", "line": 9},
                {"name": "<module>", "short_filename": "x.py", "line": 20},
            ],
        },
    ]
    assert main_stack(json.dumps(dump).encode()) == ["wait (x.py:9)", "<module> (x.py:20)"]
    assert main_stack(b"not json") == [] and main_stack(b"[]") == []


def test_a_dump_waits_for_a_free_run_a_record_is_refused(tmp_path: Path) -> None:
    """max_running runs at once: a stall's dumps of every rank of a node wait for one
    (dump_timeout); a record asked while they run is refused, saying why. py-spy here is
    echo: its output is its arguments."""
    spy = PySpy("/bin/echo", tmp_path, 300, 1 << 20, 1, 30.0)

    async def go() -> tuple[bytes, str]:
        spy.busy.add(1)
        dump = asyncio.ensure_future(spy.run(2, "dump"))
        await asyncio.sleep(0)
        try:
            await spy.run(3, "record", duration=1)
        except RefusalError as r:
            refused = f"{r.code}: {r.why}"
        assert not dump.done()
        spy.busy.discard(1)  # the run before it ends
        return (await dump).output, refused

    out, refused = asyncio.run(go())
    assert out == b"dump --pid 2 --json\n"
    assert refused == (
        "RESOURCE_EXHAUSTED: 1 py-spy runs on this node already "
        "(collectors.deepdive.max_running)"
    )
