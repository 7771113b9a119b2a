"""The Profiler Files tab, the TraceLens page and the trace viewer end to end (issue 71 part
B): real torch.profiler traces (the HolisticTraceAnalysis fixtures) in a real containerd
container, found by a real agent, listed by the recorder, downloaded byte for byte,
analysed (each rank's compute, non-compute and idle time equal to what HTA computes for the
same files, called here directly), the analysis page and the viewer (speedscope) opened in
headless Chromium (screenshots in the test's directory); bad input, each a clear error in
the Primus-Lens envelope: a 2 GiB trace, a malformed one, a CPU-only one, a pod the agent
on its node does not have."""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import hang_guard, wait_for
from tests.deepdivelab import RECORDER_TOKEN, agent_for, containerd_with_python
from tests.k8slab import FakeApiServer
from tests.profilerlab import (
    FIXTURES,
    GLOBS,
    HUGE,
    HUGE_BYTES,
    LAYOUT,
    MALFORMED,
    clear,
    start_trainer,
)
from tests.recorder.objects import NS, U, gpu_pod, state, workload
from tests.recorder.test_cluster_api import node
from tests.recorder.test_management import Client, token_file

AMD = "amd.com/gpu"
VIEWER = Path(sys.prefix) / "share" / "speedscope" / "index.html"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no {FIXTURES}")
RANK0 = "/prof/step5/node-a_4037.1682725898236.pt.trace.json.gz"
RANK1 = "/prof/step5/node-a_4045.1682725898079.pt.trace.json.gz"
MI250 = "/work/mi250.pt.trace.json"
CPU = "/torchprof/cpu_only_rank-34.Jul_15_10_52_41.1074.pt.trace.json.gz"


@functools.cache
def hta(*names: str) -> dict[int, dict[str, float]]:
    """HolisticTraceAnalysis's own temporal breakdown of these fixtures by rank, and each
    rank's communication kernels' time from its kernel breakdown."""
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        for n in names:
            shutil.copy(FIXTURES / n, Path(d) / n)
        a = TraceAnalysis(trace_dir=d)
        tb = a.get_temporal_breakdown(visualize=False)
        _, kd = a.get_gpu_kernel_breakdown(visualize=False, num_kernels=10)
    comm = kd[kd["kernel_type"] == "COMMUNICATION"].groupby("rank")["sum (us)"].sum()
    return {
        int(r["rank"]): {
            "compute_time_us": r["compute_time(us)"],
            "non_compute_time_us": r["non_compute_time(us)"],
            "idle_time_us": r["idle_time(us)"],
            "communication_time_us": float(comm.get(r["rank"], 0.0)),
        }
        for r in tb.to_dict("records")
    }


def rank_pod(api: FakeApiServer, name: str, uid: str, node_name: str, owner: str) -> None:
    p = state(gpu_pod(name, owner, AMD, 1, node_name), "Running", ready=True)
    p["metadata"]["uid"] = uid
    api.put("pods", p)


def chromium(url: str, png: Path) -> str:
    """The page's DOM once its scripts ran (headless Chromium), its screenshot in png."""
    with tempfile.TemporaryDirectory() as profile:
        got = subprocess.run(
            [
                "chromium",
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--virtual-time-budget=10000",
                "--window-size=1400,900",
                "--hide-scrollbars",
                f"--screenshot={png}",
                "--dump-dom",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=hang_guard(60),
        )
    assert png.exists(), got.stderr[-500:]
    return got.stdout


def test_traces_listed_downloaded_analysed_and_viewed(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    for ctd in containerd_with_python("pfr-"):
        t = start_trainer(ctd, "bert-worker-0", NS)
        agent, address = agent_for(ctd, tmp_path, env={"LENS_COLLECTORS__PROFILER__GLOBS": GLOBS})
        try:
            run(api, recorder_app, tmp_path, t, address)
        finally:
            ctd.remove(t.cid)
            clear(ctd.rootfs)
            agent.stop()


def run(api: FakeApiServer, recorder_app: Any, tmp_path: Path, t: Any, address: str) -> None:
    api.put("pytorchjobs", workload("bert", {}, {}))
    api.put("jobs", workload("nightly-29000", {}, {}))
    api.put("nodes", node("node-a", "True", {AMD: "8"}, "127.0.0.1"))
    rank_pod(api, "bert-worker-0", t.pod_uid, "node-a", "bert")
    # the Job's pod is on node-a as the API server has it, not among the agent's containers
    rank_pod(api, "nightly-29000-x", "uid-not-on-node-a", "node-a", "nightly-29000")
    secret = tmp_path / "recorder-agent-token"
    secret.write_text(RECORDER_TOKEN + "\n")
    app = recorder_app(
        f"sqlite:///{tmp_path / 'r.db'}",
        api__token_file=token_file(tmp_path),
        profiler__agent_port=int(address.rpartition(":")[2]),
        profiler__token_file=str(secret),
        profiler__viewer_dir=str(VIEWER.parent),
        profiler__max_file_bytes=64 << 20,
    )
    c = Client(app)
    bert = U["bert"]
    listed = wait_for(
        lambda: (got := c.call("GET", f"workloads/{bert}/profiler-files"))[0] == 200
        and got[1]["data"],
        "bert's traces listed",
        every=0.2,
    )
    files = {f["path"]: f for f in listed}
    assert set(files) == {*LAYOUT, MALFORMED, HUGE}
    assert {files[p]["rank"] for p in (RANK0, RANK1, CPU)} == {0, 1, 34}
    for f in listed:
        assert (f["workload_uid"], f["pod_name"], f["node_name"], f["file_type"]) == (
            bert,
            "bert-worker-0",
            "node-a",
            "pytorch_trace",
        )
        assert f["status"] == "listed" and isinstance(f["id"], int)
    assert files[HUGE]["file_size"] == HUGE_BYTES
    # listed again: the same rows, not new ones
    assert sorted(f["id"] for f in c.data("GET", f"workloads/{bert}/profiler-files")) == sorted(
        f["id"] for f in listed
    )

    # downloads: each byte for byte; the 2 GiB one refused by the cap, nothing else touched
    base = f"http://127.0.0.1:{app.http.port}/v1"
    import requests

    for path, data in t.files.items():
        r = requests.get(
            f"{base}/profiler-files/{files[path]['id']}/download", timeout=hang_guard(30)
        )
        assert r.status_code == 200 and r.content == data, path
        assert Path(path).name in r.headers["Content-Disposition"]
    r = requests.get(f"{base}/profiler-files/{files[HUGE]['id']}/download", timeout=hang_guard(30))
    assert (r.status_code, r.json()["meta"]["code"]) == (400, 4001), r.text
    assert f"{HUGE_BYTES} bytes, over" in r.json()["meta"]["message"]
    fetched = {f["path"]: f["status"] for f in c.data("GET", f"workloads/{bert}/profiler-files")}
    assert fetched[HUGE] == "failed" and fetched[RANK0] == "fetched"
    r = requests.get(f"{base}/profiler-files/999999/download", timeout=hang_guard(5))
    assert (r.status_code, r.json()["meta"]["code"]) == (404, 4004)

    # a pod the agent on its node does not have: a clear error, the service serving on
    status, got = c.call("GET", f"workloads/{U['nightly-29000']}/profiler-files")
    assert (status, got["meta"]["code"]) == (404, 4004), got
    assert "no running container on node node-a" in got["meta"]["message"]

    # TraceLens: the two NCCL ranks together, the MI250 rank alone; each figure HTA's
    def session(kind: str, path: str) -> dict[str, Any]:
        made = c.data(
            "POST",
            f"{kind}/sessions",
            {"workload_uid": bert, "profiler_file_id": files[path]["id"]},
            route=f"POST {kind}/sessions",
        )
        assert made["status"] in ("pending", "initializing", "ready", "failed"), made
        sid = made["session_id"]
        return wait_for(
            lambda: (s := c.data("GET", f"{kind}/sessions/{sid}"))["status"] in ("ready", "failed")
            and s,
            f"{kind} session {sid}",
            every=0.2,
        )

    nccl = session("tracelens", RANK0)
    assert nccl["status"] == "ready", nccl
    assert nccl["profiler_file_ids"] == [files[RANK0]["id"], files[RANK1]["id"]]
    want = hta("trace_filter_sampled_rank-0.json.gz", "trace_filter_sampled_rank-1.json.gz")
    got_ranks = {
        r["rank"]: {
            k: r[k]
            for k in (
                "compute_time_us",
                "non_compute_time_us",
                "idle_time_us",
                "communication_time_us",
            )
        }
        for r in nccl["analysis"]["ranks"]
    }
    assert got_ranks == want
    assert nccl["analysis"]["slowest_rank"] in (0, 1)
    assert {k["kernel_type"] for k in nccl["analysis"]["kernel_types"]} >= {
        "COMMUNICATION",
        "COMPUTATION",
    }
    # the ranks named in the request (the same pair, from rank 1's trace), and a bad list
    pair = c.data(
        "POST",
        "tracelens/sessions",
        {
            "workload_uid": bert,
            "profiler_file_id": files[RANK1]["id"],
            "profiler_file_ids": [files[RANK0]["id"], files[RANK1]["id"]],
        },
    )
    assert pair["profiler_file_ids"] == [files[RANK1]["id"], files[RANK0]["id"]]
    status, got = c.call(
        "POST",
        "tracelens/sessions",
        {"workload_uid": bert, "profiler_file_id": files[RANK1]["id"], "profiler_file_ids": ["x"]},
    )
    assert got["meta"]["code"] == 4001 and "profiler_file_ids" in got["meta"]["message"]
    c.data("DELETE", f"tracelens/sessions/{pair['session_id']}")
    mi250 = session("tracelens", MI250)
    want = hta("amd_trace_mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert [
        {
            k: r[k]
            for k in (
                "rank",
                "compute_time_us",
                "non_compute_time_us",
                "idle_time_us",
                "communication_time_us",
            )
        }
        for r in mi250["analysis"]["ranks"]
    ] == [{"rank": 0, **want[0]}]
    listed_sessions = c.data("GET", f"tracelens/workloads/{bert}/sessions")
    assert {s["session_id"] for s in listed_sessions["sessions"]} == {
        nccl["session_id"],
        mi250["session_id"],
    } and listed_sessions["total"] == 2
    page = requests.get(
        f"http://127.0.0.1:{app.http.port}{nccl['ui_path']}", timeout=hang_guard(10)
    )
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "Slowest rank" in page.text and "<script" not in page.text
    extended = c.data("PATCH", f"tracelens/sessions/{nccl['session_id']}", {"extend_minutes": 30})
    assert extended["expires_at"] > nccl["expires_at"]

    # bad traces: each session fails saying why, and the service goes on
    for path, why in (
        (CPU, "no GPU kernels"),
        (MALFORMED, "could not be analysed"),
        (HUGE, "over"),
    ):
        failed = session("tracelens", path)
        assert failed["status"] == "failed" and why in failed["status_message"], failed
        assert failed["ui_path"] == "" and failed["analysis"] is None
    job = U["nightly-29000"]
    for body, code in (
        ({"workload_uid": bert}, 4001),
        ({"workload_uid": bert, "profiler_file_id": 999999}, 4004),
        ({"workload_uid": job, "profiler_file_id": files[MI250]["id"]}, 4001),
        (
            {
                "workload_uid": bert,
                "profiler_file_id": files[MI250]["id"],
                "resource_profile": "huge",
            },
            4001,
        ),
    ):
        status, got = c.call("POST", "tracelens/sessions", body)
        assert got["meta"]["code"] == code, (body, got)
    profiles = c.data("GET", "tracelens/resource-profiles")["profiles"]
    assert [p["value"] for p in profiles if p["is_default"]] == ["medium"]

    # the viewer: speedscope opening the MI250 rank's trace, as the page's iframe asks
    view = session("perfetto", MI250)
    assert view["status"] == "ready" and view["viewer_type"] == "speedscope"
    trace = requests.get(
        f"http://127.0.0.1:{app.http.port}{view['ui_path']}trace.json", timeout=hang_guard(10)
    )
    # the trace's own events, its string pids and tids numbered (speedscope keys threads by
    # number), each keeping its name in a thread_name event
    wrote = json.loads(gzip.decompress((FIXTURES / LAYOUT[MI250]).read_bytes()))
    served = trace.json()["traceEvents"]
    assert [
        (e["name"], e.get("ts"), e.get("dur")) for e in served[: len(wrote["traceEvents"])]
    ] == [(e["name"], e.get("ts"), e.get("dur")) for e in wrote["traceEvents"]]
    streams = {str(e["tid"]) for e in wrote["traceEvents"] if isinstance(e.get("tid"), str)}
    assert streams and streams <= {
        e["args"]["name"] for e in served if e.get("name") == "thread_name"
    }
    # the retention: fetched bytes dropped (the rows listed again), fetched anew when asked
    assert app.profiler.prune(datetime.now(UTC) + timedelta(hours=169)) >= 5
    again = {f["path"]: f["status"] for f in c.data("GET", f"workloads/{bert}/profiler-files")}
    assert again[RANK0] == "listed" and again[HUGE] == "failed"
    r = requests.get(f"{base}/profiler-files/{files[RANK0]['id']}/download", timeout=hang_guard(30))
    assert r.content == t.files[RANK0]
    assert c.data("DELETE", f"tracelens/sessions/{mi250['session_id']}")["status"] == "deleted"
    status, got = c.call("GET", f"tracelens/sessions/{mi250['session_id']}/ui")
    assert got["meta"]["code"] == 4001 and "deleted" in got["meta"]["message"]
    if shutil.which("chromium") is None or not VIEWER.is_file():
        pytest.skip("chromium or speedscope not installed (scripts/setup.sh test installs both)")
    url = (
        f"http://127.0.0.1:{app.http.port}{view['ui_path']}?cluster=local"
        "#!/viewer?url=/trace.json"
    )
    out = tmp_path  # the screenshots: printed with -s, kept with pytest's tmp directories
    dom = chromium(url, out / "profiler-viewer.png")
    print(f"the viewer as Chromium draws it: {out / 'profiler-viewer.png'}")
    # speedscope's views of a loaded profile, not its error nor its drop zone
    assert "Left Heavy" in dom and "Sandwich" in dom, dom[-2000:]
    assert "Something went wrong" not in dom and "Drag and drop" not in dom
