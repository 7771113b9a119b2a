"""The kernel matrix: the real-kernel suite inside Debian's 5.10, 6.1 and 6.12 kernels.

Each kernel boots once in QEMU over this machine's root (tests/vm/qemu.py) and runs the
BPF suite (exact bytes both ways, opens, closes, failed connects, resets,
retransmits, RTT buckets, exec/exit codes and signals, OOM, policy classes), the RDMA
suite on a Soft-RoCE device (tests/rdma: exact sends/receives, queue pairs attributed
to a process and to a containerd container's pod) and the agent's own start, /readyz
and clean SIGTERM, with the kernel's matching headers; then, in the same guest with
those headers taken away, an agent start and a flow with the agent's fallback header
tree (another kernel's). The host kernel runs the same suite as the rest of
`make test`.

Under `make test` the guests boot during the setup, before pytest starts
(tests/vm/background.py); otherwise as soon as pytest has collected this file
(tests/conftest.py). Two run at a
time (TCG is one host thread per guest CPU), and run while the host's tests run; the
tests here wait for them. Under pytest-xdist (`make test` runs two workers) the
controller starts them once, when a worker reports it collected this file, and the
worker that runs these tests reads each guest's result from the share it wrote
(`result.json` beside its junit files). A guest that is
merely slow passes; one that stops making progress is stopped and fails with its
console's tail (qemu.boot). The end of `make test` prints one line per guest.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import xml.etree.ElementTree as ET
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lens_ebpf.agent import kernel_headers
from tests.conftest import bpf_unavailable, wait_for
from tests.vm import kernels, qemu

ROOT = Path(__file__).resolve().parents[2]
# a hang guard per test inside a guest; the guest as a whole is watched by qemu.boot
# and no plugin the guest's tests do not use: hypothesis' alone is most of a
# collection's imports, and a guest's emulated CPU runs imports ~50 times slower
PY = (
    ".venv/bin/python -m pytest -v -rs -o timeout=1800 -p no:cacheprovider "
    "-p no:hypothesispytest -p no:anyio"
)
AGENT = "tests/e2e/test_agent.py::test_"
# the agent: /readyz ready with each feature's path, a flow counted exactly, a clean
# SIGTERM; and what check says. The agent's other e2e tests (config errors, flags,
# SIGINT, reloads) do not depend on the kernel and run on the host only.
FALLBACK = f"{AGENT}serves_metrics_counts_a_flow_and_stops_cleanly"
# and a real RDMA device: Soft-RoCE on a veth, ibv_rc_pingpong, QPs per process and pod
SUITE = f"tests/bpf tests/rdma {AGENT}check_json_reports_tracepoints_and_kprobes"
HEADERS = ("matching", "fallback")


def _guest_command(fallback: bool) -> str:
    """The suite with the kernel's own headers, then (fallback) the agent with the build
    and source links gone, so it finds its fallback tree itself. The whole agent runs
    once per kernel: with the fallback tree where the kernel has one apart from its own
    headers (the harder case; tests/bpf load each program with the kernel's own), else
    with its own headers in the first run. A guest's CPU is the suite's scarcest."""
    steps = [
        f"{PY} --junitxml=$KMATRIX_OUT/junit-matching.xml {SUITE}"
        f"{'' if fallback else ' ' + FALLBACK}; echo $? > $KMATRIX_OUT/rc-matching"
    ]
    if fallback:
        steps.append("rm -f /lib/modules/$KMATRIX_KERNEL/build /lib/modules/$KMATRIX_KERNEL/source")
        steps.append(
            f"{PY} --junitxml=$KMATRIX_OUT/junit-fallback.xml {FALLBACK}; "
            "echo $? > $KMATRIX_OUT/rc-fallback"
        )
    return "; ".join(steps)


def why_not() -> str | None:
    if os.environ.get("KMATRIX_KERNEL"):
        return "already inside a matrix guest"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 missing: scripts/setup.sh test installs qemu-system-x86"
    if not kernels.cached():
        err = kernels.CACHE / "fetch-error"
        why = err.read_text().strip() if err.exists() else "not run"
        return f"no kernels fetched (python -m tests.vm.kernels fetch: {why})"
    return bpf_unavailable()


# The directory the guests write into, named to xdist's workers by the controller that
# starts them (tests/conftest.py sets it before the workers start).
OUT_ENV = "PYTEST_KMATRIX_DIR"  # not LENS_*: the agents a test starts refuse those they do not know
PLAN = "plan.json"  # in that directory: {"covers": {series: [headers]}, "skip": reason}
RESULT = "result.json"  # in each guest's directory once it has stopped


@dataclass
class Matrix:
    """Every guest run: one boot per kernel, which headers runs it covers."""

    runs: dict[str, Future] = field(default_factory=dict)  # series -> qemu.Result
    covers: dict[str, tuple[str, ...]] = field(default_factory=dict)  # series -> headers
    skip: str = ""
    root: Path | None = None

    def result(self, series: str) -> qemu.Result:
        """The guest's result: from its future here, or from the share when another
        process (xdist's controller) started it."""
        future = self.runs.get(series)
        if future is not None:
            res: qemu.Result = future.result()
            return res
        assert self.root is not None
        out = self.root / f"vm-{series}"
        done = out / RESULT
        # qemu.boot stops a guest that stops making progress, and the controller writes
        # this file either way; the test's own timeout is the last guard
        while not done.exists():
            time.sleep(2)
        got = json.loads(done.read_text())
        return qemu.Result(
            got["rc"],
            _read(out / "console.log"),
            _read(out / "serial.log"),
            got["seconds"],
            out,
            got["hung"],
            got.get("cpu_seconds", 0.0),
        )


def _read(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _record(out: Path, future: Future) -> None:
    """A guest's result into its share, for a worker that did not start it."""
    try:
        res: qemu.Result = future.result()
        got = {
            "rc": res.rc,
            "seconds": res.seconds,
            "hung": res.hung,
            "cpu_seconds": res.cpu_seconds,
        }
    except Exception as e:  # the boot itself failed: the worker's test says so
        got = {"rc": -1, "seconds": 0.0, "hung": f"the guest did not run: {e!r}"}
    tmp = out / (RESULT + ".tmp")
    tmp.write_text(json.dumps(got))
    tmp.replace(out / RESULT)


_started: Matrix | None = None
_lock = threading.Lock()


def precompile() -> None:
    """The guests' bytecode written on the host first. The checkout reaches a guest
    read-only, so a module without its .pyc here is compiled in every guest process that
    imports it, on an emulated CPU (imports run ~50 times slower there); and nothing may
    have compiled them here yet: `make test` boots the guests before pytest runs, and
    PYTHONDONTWRITEBYTECODE, where set, keeps any run here from writing them. The
    package's and the tests' modules, and the guest's test files as pytest rewrites them."""
    py = str(ROOT / ".venv" / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    quiet = {"cwd": ROOT, "env": env, "stdout": subprocess.DEVNULL, "check": False}
    subprocess.run([py, "-m", "compileall", "-q", "lens_ebpf", "tests"], **quiet)
    files = sorted({p.split("::")[0] for p in SUITE.split()})
    collect = [py, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *files]
    subprocess.run(collect, **quiet)


def start(out_root: Path) -> Matrix:
    """Boot every kernel (two at a time) in the background; once per session."""
    global _started
    with _lock:
        if _started is not None:
            return _started
        reason = why_not()
        if reason:
            _started = Matrix(skip=reason, root=out_root)
            _plan(out_root, _started)
            return _started
        precompile()
        pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="kmatrix")
        matrix = Matrix(root=out_root)
        fallback = kernel_headers.find_fallback()
        # the slowest kernel first, so the two workers finish about together
        for k in sorted(kernels.cached(), key=lambda k: k.series != "5.10"):
            # the fallback tree is this kernel's own: the matching run covers it
            own = fallback is not None and fallback.name == f"linux-headers-{k.abi}"
            matrix.covers[k.series] = ("matching",) if own else HEADERS
            out = out_root / f"vm-{k.series}"
            out.mkdir(parents=True, exist_ok=True)
            matrix.runs[k.series] = pool.submit(
                qemu.boot, k, _guest_command(not own), workdir=ROOT, out=out
            )
            matrix.runs[k.series].add_done_callback(lambda f, out=out: _record(out, f))
        pool.shutdown(wait=False)
        _plan(out_root, matrix)
        _started = matrix
        return matrix


def _plan(root: Path, matrix: Matrix) -> None:
    plan = {"covers": {s: list(h) for s, h in matrix.covers.items()}, "skip": matrix.skip}
    (root / (PLAN + ".tmp")).write_text(json.dumps(plan))
    (root / (PLAN + ".tmp")).replace(root / PLAN)


def _planned(root: Path) -> Matrix:
    """The matrix another process started into root, as its plan says."""
    plan = root / PLAN
    wait_for(
        plan.exists,
        f"the kernel matrix's plan in {root} (the controller starts it "
        "when a worker has collected tests/vm)",
        60,
    )
    got = json.loads(plan.read_text())
    covers = {s: tuple(h) for s, h in got["covers"].items()}
    return Matrix(covers=covers, skip=got["skip"], root=root)


def started() -> Matrix | None:
    return _started


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Matrix:
    shared = os.environ.get(OUT_ENV)
    if _started is None and shared:  # an xdist worker: the controller started it
        m = _planned(Path(shared))
    else:
        m = start(tmp_path_factory.mktemp("kmatrix"))
    if m.skip:
        pytest.skip(m.skip)
    return m


def report(res: qemu.Result, headers: str) -> tuple[dict[str, int], list[str], float]:
    """junit totals, each failure or error with its message, and pytest's seconds."""
    path = res.out / f"junit-{headers}.xml"
    if not path.exists():
        return {}, [], 0.0
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert suite is not None
    totals = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    bad = []
    for case in suite.iter("testcase"):
        # an Element with no children is falsy: choose with `is not None`, never `or`
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            name = f"{case.get('classname')}::{case.get('name')}"
            bad.append(f"{name}: {problem.get('message', '')[:300]}")
    return totals, bad, float(suite.get("time", 0))


def _series() -> list[str]:
    return [s.name for s in kernels.SERIES]


@pytest.mark.timeout(4 * 3600)  # a hang guard: qemu.boot stops a guest that hangs
@pytest.mark.parametrize("headers", HEADERS)
@pytest.mark.parametrize("series", _series())
def test_real_kernel_suite(matrix: Matrix, series: str, headers: str) -> None:
    if series not in matrix.covers:
        pytest.skip(f"kernel {series} not fetched")
    if headers not in matrix.covers[series]:
        pytest.skip(
            f"the fallback tree ({kernel_headers.find_fallback()}) is {series}'s own headers"
        )
    res = matrix.result(series)
    totals, bad, _ = report(res, headers)
    rc_file = res.out / f"rc-{headers}"
    rc = int(rc_file.read_text().strip()) if rc_file.exists() else -1
    context = f"{series}/{headers} rc={rc} in {res.seconds:.0f}s\n{res.output[-4000:]}"
    if res.hung or rc < 0:
        context += f"\n{res.hung or 'the guest wrote no exit status'}; console:\n"
        context += res.console[-3000:]
    assert totals, f"no test report came back\n{context}"
    assert totals["tests"] > 0, context
    assert not bad, "\n".join(bad) + "\n" + context
    assert totals["failures"] == totals["errors"] == 0, context
    assert rc == 0, context
    if headers == "fallback":
        return
    check = json.loads((res.out / "check.json").read_text())
    # every eBPF feature is attached on every kernel of the matrix, and check agrees
    for feature in ("tcp_flows", "tcp_rtt", "processes", "drops"):
        assert check["features"][feature]["supported"] is True, (feature, check["features"])
    bytes_path = check["features"]["tcp_flows"]["paths"]["bytes"]
    # Debian's kernels have BTF: the socket's counters where the TCP iterator locks each
    # socket (5.15+), kprobes on 5.10
    assert bytes_path == ("kprobe" if series == "5.10" else "iter")
    # and exit codes come from the task's BTF-placed field, no syscall tracepoint on any
    assert check["features"]["processes"]["paths"]["exit_codes"] == "btf"
    # and drops are attributed through the sk_buff fields BTF places, on every kernel
    assert check["features"]["drops"]["paths"]["addresses"] == "btf"
    # and by the namespace of the packet's socket or device, BTF-placed too
    assert check["features"]["drops"]["paths"]["netns"] == "btf"


def summary_lines() -> list[str]:
    """One line per guest run: kernel, headers, tests passed, seconds."""
    m = started()
    shared = os.environ.get(OUT_ENV)
    if m is None and shared and (Path(shared) / PLAN).exists():
        m = _planned(Path(shared))  # booted before pytest (tests/vm/background.py)
    if m is None or m.skip:
        return [f"kernel matrix: skipped ({m.skip})"] if m is not None else []
    lines = []
    for series in m.covers:
        future = m.runs.get(series)
        if future is not None:
            done = future.done()
        else:
            done = m.root is not None and (m.root / f"vm-{series}" / RESULT).exists()
        if not done:
            lines.append(f"kernel matrix: {series}: not finished")
            continue
        res = m.result(series)
        abi = next((k.abi for k in kernels.cached() if k.series == series), series)
        for headers in m.covers[series]:
            totals, bad, secs = report(res, headers)
            if not totals:
                lines.append(
                    f"kernel matrix: {abi} ({headers} headers): no report "
                    f"({res.hung or 'see the test failure'})"
                )
                continue
            passed = totals["tests"] - totals["failures"] - totals["errors"] - totals["skipped"]
            lines.append(
                f"kernel matrix: {abi} ({headers} headers): {passed} passed, "
                f"{len(bad)} failed, {totals['skipped']} skipped in {secs:.0f} s"
            )
        lines.append(
            f"kernel matrix: {abi}: guest ran {res.seconds:.0f} s "
            f"({res.cpu_seconds:.0f} s of CPU)"
        )
    return lines
