"""The kernel matrix: the real-kernel suite inside Debian's 5.10, 6.1 and 6.12 kernels.

Each kernel boots in QEMU over this machine's root (tests/vm/qemu.py) and runs the
BPF suite (exact bytes both ways, opens, closes, failed connects, resets,
retransmits, RTT buckets, exec/exit codes and signals, OOM, policy classes), the RDMA
suite on a Soft-RoCE device (tests/rdma: exact sends/receives, queue pairs attributed
to a process and to a containerd container's pod) and the
agent's own start, /readyz and clean SIGTERM, with the kernel's matching headers; then
an agent start and a flow with the agent's fallback header tree (another kernel's).
The host kernel runs the same suite as the rest of `make test`. Two guests run at a
time (TCG is one host thread per guest CPU).
"""

from __future__ import annotations

import json
import os
import shutil
import xml.etree.ElementTree as ET
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from lens_ebpf import kernel_headers
from tests.conftest import bpf_unavailable
from tests.vm import kernels, qemu

ROOT = Path(__file__).resolve().parents[2]
PY = ".venv/bin/python -m pytest -q -p no:cacheprovider -rs -o timeout=900"
AGENT = "tests/e2e/test_agent.py::test_"
# the agent: /readyz ready with each feature's path, a flow counted exactly, a clean
# SIGTERM; and what check says. The agent's other e2e tests (config errors, flags,
# SIGINT, reloads) do not depend on the kernel and run on the host only.
FALLBACK = f"{AGENT}serves_metrics_counts_a_flow_and_stops_cleanly"
# and a real RDMA device: Soft-RoCE on a veth, ibv_rc_pingpong, QPs per process and pod
SUITE = f"tests/bpf tests/rdma {FALLBACK} {AGENT}check_json_reports_tracepoints_and_kprobes"


def _guest_command(tests: str, cost: bool) -> str:
    """The suite, then what check says of this kernel, then (once) the probes' cost."""
    bench = ".venv/bin/python -m bench.kernel_cost --json $KMATRIX_OUT/cost.json; " if cost else ""
    return (
        f"{PY} --junitxml=$KMATRIX_OUT/junit.xml {tests}; rc=$?; "
        ".venv/bin/lens-ebpf check --json > $KMATRIX_OUT/check.json 2>/dev/null; "
        f"{bench}exit $rc"
    )


def _why_not() -> str | None:
    if os.environ.get("KMATRIX_KERNEL"):
        return "already inside a matrix guest"
    if shutil.which("qemu-system-x86_64") is None:
        return "qemu-system-x86_64 missing: scripts/setup.sh test installs qemu-system-x86"
    if not kernels.cached():
        err = kernels.CACHE / "fetch-error"
        why = err.read_text().strip() if err.exists() else "not run"
        return f"no kernels fetched (python -m tests.vm.kernels fetch: {why})"
    return bpf_unavailable()


@pytest.fixture(scope="session")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Future]:
    """Every guest run, started together on first use, two at a time."""
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    pool = ThreadPoolExecutor(max_workers=2)
    runs: dict[tuple[str, str], Future] = {}
    fallback = kernel_headers.find_fallback()
    # the whole suites first, the short fallback runs after them
    for headers, tests in (("matching", SUITE), ("fallback", FALLBACK)):
        for k in kernels.cached():
            if headers == "fallback" and fallback and fallback.name == f"linux-headers-{k.abi}":
                continue  # the fallback tree is this kernel's own: the matching run covers it
            out = tmp_path_factory.mktemp(f"vm-{k.series}-{headers}")
            runs[(k.series, headers)] = pool.submit(
                qemu.boot,
                k,
                _guest_command(tests, headers == "matching"),
                workdir=ROOT,
                headers=headers,
                out=out,
            )
    pool.shutdown(wait=False)
    return runs


def _report(res: qemu.Result) -> tuple[dict[str, int], list[str]]:
    """junit totals, and each failure or error with its message."""
    path = res.out / "junit.xml"
    if not path.exists():
        return {}, []
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
    return totals, bad


def _series() -> list[str]:
    return [s.name for s in kernels.SERIES]


@pytest.mark.timeout(1800)  # the first waits while the guests run, two at a time
@pytest.mark.parametrize("headers", ["matching", "fallback"])
@pytest.mark.parametrize("series", _series())
def test_real_kernel_suite(matrix: dict, series: str, headers: str) -> None:
    future = matrix.get((series, headers))
    if future is None:
        known = any(k.series == series for k in kernels.cached())
        pytest.skip(
            f"the fallback tree ({kernel_headers.find_fallback()}) is {series}'s own headers"
            if known
            else f"kernel {series} not fetched"
        )
    res: qemu.Result = future.result(timeout=1500)
    totals, bad = _report(res)
    context = f"{series}/{headers} rc={res.rc} in {res.seconds:.0f}s\n{res.output[-4000:]}"
    if res.rc < 0:
        context += f"\nconsole:\n{res.console[-3000:]}"
    assert totals, f"no test report came back\n{context}"
    assert totals["tests"] > 0, context
    assert not bad, "\n".join(bad) + "\n" + context
    assert totals["failures"] == totals["errors"] == 0, context
    assert res.rc == 0, context
    check = json.loads((res.out / "check.json").read_text())
    # every eBPF feature is attached on every kernel of the matrix, and check agrees
    for feature in ("tcp_flows", "tcp_rtt", "processes"):
        assert check["features"][feature]["supported"] is True, (feature, check["features"])
    bytes_path = check["features"]["tcp_flows"]["paths"]["bytes"]
    assert bytes_path == ("kprobe" if series in ("5.10", "6.1") else "tracepoint")
    print(f"\n{series} ({headers} headers): {totals} in {res.seconds:.0f}s; "
          + ", ".join(f"{f}={v['path']}" for f, v in check["features"].items()))  # fmt: skip
    cost = res.out / "cost.json"
    if cost.exists():  # per-probe cost on this (emulated) kernel, for the record
        for name, p in sorted(json.loads(cost.read_text())["probes"].items()):
            print(f"  {name}: {p['runs']} runs, {p['ns_per_run']:.0f} ns/run")
