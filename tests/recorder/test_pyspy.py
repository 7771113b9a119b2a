"""The Py-Spy Profiler tab end to end: the recorder asks the agent on the pod's node (a real
agent, its gRPC port taking the recorder's token) about a Python rank in a real containerd
container; the process tree with its exact pids, py-spy tasks through their lifecycle to a
speedscope file and a dump naming the rank's functions, a cancel, and bad input, each a
clear error in the Primus-Lens envelope."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lens_ebpf.agent.deepdive.pyspy import find_pyspy
from tests.conftest import wait_for
from tests.containerlab import Containerd
from tests.deepdivelab import (
    RECORDER_TOKEN,
    agent_for,
    children,
    containerd_with_python,
    start_rank,
)
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.objects import NS, U, gpu_pod, state, workload
from tests.recorder.test_cluster_api import node
from tests.recorder.test_management import Client, token_file

pytestmark = pytest.mark.skipif(not find_pyspy(""), reason="py-spy is not installed")
AMD = "amd.com/gpu"


@pytest.fixture(scope="module")
def ctd() -> Iterator[Containerd]:
    yield from containerd_with_python("ddr-")


def rank_pod(api: FakeApiServer, name: str, uid: str, node_name: str = "node-a") -> None:
    p = state(gpu_pod(name, "bert", AMD, 1, node_name), "Running", ready=True)
    p["metadata"]["uid"] = uid
    api.put("pods", p)


def recorder_token(tmp: Path) -> str:
    f = tmp / "recorder-agent-token"
    f.write_text(RECORDER_TOKEN + "\n")
    return str(f)


def test_the_profiler_tab_through_the_agent(
    ctd: Containerd, api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    rank = start_rank(ctd, "bert-worker-0", "spin", namespace=NS)
    agent, address = agent_for(ctd, tmp_path)
    try:
        api.put("pytorchjobs", workload("bert", {}, {}))
        api.put("nodes", node("node-a", "True", {AMD: "8"}, "127.0.0.1"))
        api.put("nodes", node("node-b", "True", {AMD: "8"}, "127.0.0.2"))
        rank_pod(api, "bert-worker-0", rank.pod_uid)
        rank_pod(api, "bert-worker-9", "uid-elsewhere", "node-b")  # no agent answers there
        app = recorder_app(
            f"sqlite:///{tmp_path / 'r.db'}",
            api__token_file=token_file(tmp_path),
            deepdive__agent_port=int(address.rpartition(":")[2]),
            deepdive__token_file=recorder_token(tmp_path),
        )
        c = Client(app)
        wait_for(
            lambda: c.call(
                "POST", f"workloads/{U['bert']}/process-tree", {"pod_uid": rank.pod_uid}
            )[0]
            == 200,
            "the pod and its node known to the recorder",
            every=0.2,
        )
        tree = c.data(
            "POST",
            f"workloads/{U['bert']}/process-tree",
            {"pod_uid": rank.pod_uid},
            route="workloads/{uid}/process-tree",
        )
        assert (tree["pod_name"], tree["pod_namespace"], tree["node_name"]) == (
            "bert-worker-0",
            NS,
            "node-a",
        )
        [ct] = tree["containers"]
        root = ct["root_process"]
        sleep, helper = children(rank.pid)
        assert (root["host_pid"], root["container_pid"], root["is_python"]) == (rank.pid, 1, True)
        kids = {k["host_pid"]: k for k in root["children"]}
        assert sorted(kids) == [sleep, helper]
        assert (kids[sleep]["is_python"], kids[helper]["is_python"]) == (False, True)
        assert (ct["process_count"], ct["python_count"], tree["total_python"]) == (3, 2, 2)
        assert root["env"] == [] and isinstance(root["memory_rss"], int)

        # a speedscope record and a dump, each through its lifecycle to a file
        def finished(task: str) -> dict[str, Any]:
            return wait_for(
                lambda: (t := c.data("GET", f"pyspy/task/{task}", route="pyspy/task/{id}"))[
                    "status"
                ]
                in ("completed", "failed", "cancelled")
                and t,
                f"task {task} ended",
                every=0.2,
            )

        made = c.data(
            "POST",
            "pyspy/sample",
            {
                "pod_uid": rank.pod_uid,
                "node_name": "node-a",
                "pid": rank.pid,
                "duration": 1,
                "format": "speedscope",
            },
            route="pyspy/sample",
        )
        assert made["status"] in ("pending", "running") and made["task_id"].startswith("pyspy-")
        done = finished(made["task_id"])
        assert done["status"] == "completed", done
        assert done["file_path"] == f"/v1/pyspy/file/{done['task_id']}/{done['output_file']}"
        r = app_get(app, done["file_path"])
        assert r.headers["Content-Type"].startswith("application/json")
        doc = r.json()
        assert {"spin_in_train_step", "main"} <= {f["name"] for f in doc["shared"]["frames"]}
        assert done["file_size"] == len(r.content)
        listed = c.data("GET", f"pyspy/file/{done['task_id']}", route="pyspy/file/{id}")
        assert [(f["file_name"], f["file_size"]) for f in listed["files"]] == [
            (done["output_file"], len(r.content))
        ]
        assert listed["files"][0]["download_url"] == done["file_path"] + "?cluster=local"

        asked = {"pod_uid": rank.pod_uid, "pid": rank.pid, "format": "dump"}
        dump = finished(c.data("POST", "pyspy/sample", asked)["task_id"])
        threads = app_get(app, dump["file_path"]).json()
        assert [f["name"] for f in threads[0]["frames"]][:2] == ["spin_in_train_step", "main"]

        listed = c.data("POST", "pyspy/tasks", {"workload_uid": U["bert"]}, route="pyspy/tasks")
        assert [t["task_id"] for t in listed["tasks"]] == [dump["task_id"], done["task_id"]]
        assert (listed["total"], listed["limit"], listed["offset"]) == (2, 50, 0)
        assert (
            c.data("GET", "pyspy/tasks?status=completed&limit=1", route="pyspy/tasks")["total"] == 2
        )

        # a cancel kills the run on the node; a task ended cannot be cancelled
        long = c.data(
            "POST", "pyspy/sample", {"pod_uid": rank.pod_uid, "pid": rank.pid, "duration": 60}
        )
        agent.wait_sample("lens_agent_pyspy_running", {}, 1)
        got = c.data(
            "POST",
            f"pyspy/task/{long['task_id']}/cancel",
            {"reason": "enough"},
            route="pyspy/task/{id}/cancel",
        )
        assert got == {
            "task_id": long["task_id"],
            "status": "cancelled",
            "message": "task cancelled",
        }
        agent.wait_sample("lens_agent_pyspy_running", {}, 0)
        assert finished(long["task_id"])["status"] == "cancelled"
        status, body = c.call("POST", f"pyspy/task/{done['task_id']}/cancel", {})
        assert (status, body["meta"]["code"]) == (400, 4001)
        assert "cannot cancel task in status: completed" in body["meta"]["message"]

        # bad input: each a clear error in the envelope
        def failed(pid: int, pod: str = rank.pod_uid, **more: Any) -> str:
            asked = {"pod_uid": pod, "pid": pid, "format": "dump", **more}
            t = finished(c.data("POST", "pyspy/sample", asked)["task_id"])
            assert t["status"] == "failed"
            return str(t["error"])

        assert "is not a Python process" in failed(sleep)
        assert "is not a process of pod" in failed(1)
        for body_, code, says in [
            (
                {"pod_uid": rank.pod_uid, "pid": rank.pid, "node_name": "node-b"},
                4001,
                "runs on node node-a, not node-b",
            ),
            ({"pod_uid": "no-such-pod", "pid": 1}, 4004, "pod no-such-pod is not known"),
            ({"pod_uid": rank.pod_uid}, 4001, "pid is required"),
            ({"pod_uid": rank.pod_uid, "pid": 1, "format": "png"}, 4001, "format 'png'"),
            ({"pod_uid": rank.pod_uid, "pid": 1, "duration": 100000}, 4001, "max_duration"),
        ]:
            status, body = c.call("POST", "pyspy/sample", body_)
            assert body["meta"]["code"] == code and says in body["meta"]["message"], body
        status, body = c.call(
            "POST", f"workloads/{U['bert']}/process-tree", {"pod_uid": "uid-elsewhere"}
        )
        assert (status, body["meta"]["code"]) == (503, 5003), body  # node-b's agent: none
        assert "node-b" in body["meta"]["message"]
        status, body = c.call("GET", "pyspy/task/pyspy-nothere")
        assert (status, body["meta"]["code"]) == (404, 4004)
        r = app_get(app, f"/v1/pyspy/file/{long['task_id']}/x.json", ok=False)
        assert r.status_code == 404 and "has no file (cancelled)" in r.json()["meta"]["message"]

        # the process sampled exits mid-sample: the task fails saying so
        import os
        import signal

        asked = {"pod_uid": rank.pod_uid, "pid": helper, "duration": 30, "format": "raw"}
        dying = c.data("POST", "pyspy/sample", asked)
        agent.wait_sample("lens_agent_pyspy_running", {}, 1)
        os.kill(helper, signal.SIGKILL)
        gone = finished(dying["task_id"])
        assert gone["status"] == "failed" and f"process {helper} exited" in gone["error"]

        # a task its replica left running (it stopped): failed once past its deadline
        from datetime import UTC, datetime, timedelta

        from lens_ebpf.recorder.store import schema

        with app.engine.begin() as conn:
            conn.execute(
                schema.pyspy_tasks.insert().values(
                    cluster="local",
                    task_id="pyspy-orphan",
                    status="running",
                    workload_uid="",
                    pod_uid=rank.pod_uid,
                    pod_name="bert-worker-0",
                    pod_namespace=NS,
                    node_name="node-a",
                    pid=rank.pid,
                    action="record",
                    reason="requested",
                    options={
                        "duration": 30,
                        "rate": 100,
                        "format": "speedscope",
                        "native": False,
                        "subprocesses": False,
                        "locals": False,
                    },
                    output_file="",
                    file_size=0,
                    error="",
                    created_at=datetime.now(UTC) - timedelta(hours=1),
                )
            )
        assert app.deepdive.expire() == 1
        orphan = c.data("GET", "pyspy/task/pyspy-orphan", route="pyspy/task/{id}")
        assert (orphan["status"], orphan["error"]) == (
            "failed",
            "the recorder running it stopped before it ended",
        )
    finally:
        ctd.remove(rank.cid)
        agent.stop()


def app_get(app: Any, path: str, ok: bool = True) -> Any:
    import requests

    from tests.conftest import hang_guard

    r = requests.get(f"http://127.0.0.1:{app.http.port}{path}", timeout=hang_guard(30))
    if ok:
        assert r.status_code == 200, (path, r.status_code, r.text[:300])
    return r


def shipped(pod: str, uid: str, texts: list[str], times: list[float]) -> list[dict[str, Any]]:
    """Fluent Bit's records of one rank's lines."""
    return [
        {
            "date": ts,
            "log": text + "\n",
            "kubernetes": {
                "pod_name": pod,
                "namespace_name": NS,
                "pod_id": uid,
                "container_name": "pytorch",
            },
        }
        for text, ts in zip(texts, times, strict=True)
    ]


def test_a_stall_takes_each_ranks_stack_and_names_the_one_apart(
    ctd: Containerd, api: FakeApiServer, recorder_app: Any, tmp_path: Path
) -> None:
    """Two ranks log iterations and stop: rank 0 waits in the collective, rank 1 is stuck
    loading a batch. The stall's alert carries both stacks and names rank 1; the NCCL
    watchdog lines that follow take the same capture (once per stall)."""
    from datetime import UTC, datetime

    import requests

    from tests.conftest import hang_guard
    from tests.recorder.conftest import rows
    from tests.recorder.test_training import megatron

    ranks = [
        start_rank(ctd, "bert-worker-0", "barrier", namespace=NS),
        start_rank(ctd, "bert-worker-1", "stuck", namespace=NS),
    ]
    agent, address = agent_for(ctd, tmp_path)
    try:
        api.put("pytorchjobs", workload("bert", {}, {}))
        api.put("nodes", node("node-a", "True", {AMD: "8"}, "127.0.0.1"))
        for r in ranks:
            rank_pod(api, r.pod_name, r.pod_uid)
        t0 = float(int(datetime.now(UTC).timestamp()) - 600)
        clock = [datetime.fromtimestamp(t0, UTC)]
        url = f"sqlite:///{tmp_path / 'r.db'}"
        app = recorder_app(
            url,
            clock=lambda: clock[0],
            training__check_seconds=3600,
            deepdive__agent_port=int(address.rpartition(":")[2]),
            deepdive__token_file=recorder_token(tmp_path),
        )
        eventually(lambda: all(app.tracker.gpu_pod(NS, r.pod_name) for r in ranks))
        base = f"http://127.0.0.1:{app.http.port}/logs"

        def post(body: list[dict[str, Any]]) -> None:
            got = requests.post(base, json=body, timeout=hang_guard(10))
            assert got.status_code == 200, got.text

        for i in range(1, 11):  # iterations of 1 s, then nothing
            for r in ranks:
                post(shipped(r.pod_name, r.pod_uid, [megatron(i, 1000.0)], [t0 + i]))
        assert app.writer.flush(10)
        clock[0] = datetime.fromtimestamp(t0 + 10 + 6, UTC)  # five medians without progress
        assert app.training.check(clock[0]) == 1

        def captured() -> Any:
            got = [e for e in rows(url, "training_events") if e["kind"] == "stall_stacks"]
            return got[0]["detail"] if got else None

        stacks = wait_for(captured, "each rank's stack on the timeline", every=0.2)
        assert stacks["reason"] == "training_stalled"
        assert stacks["different"] == ["bert-worker-1"]
        by_pod = {r["pod"]: r for r in stacks["ranks"]}
        assert [by_pod[r.pod_name]["pid"] for r in ranks] == [r.pid for r in ranks]
        assert by_pod["bert-worker-0"]["stack"][0].startswith("wait_in_barrier (rank.py:")
        assert by_pod["bert-worker-1"]["stack"][0].startswith("load_next_batch (rank.py:")
        assert [by_pod[p]["differs"] for p in ("bert-worker-0", "bert-worker-1")] == [False, True]
        # the alert made from the stall carries them
        app.alerts.jobs.findings()
        assert app.writer.flush(10)
        [alert] = [a for a in rows(url, "alert_events") if a["alert_name"] == "TrainingStalled"]
        assert alert["raw_data"]["detail"]["stacks"]["different"] == ["bert-worker-1"]
        kept = [t for t in rows(url, "pyspy_tasks") if t["reason"] == "stall"]
        assert sorted(t["pod_name"] for t in kept) == ["bert-worker-0", "bert-worker-1"]
        assert all(t["status"] == "completed" and t["content"] for t in kept)

        # the ranks' watchdog lines: the NCCL alert fires and takes the same stacks
        line = (
            "[Rank {}] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=11, "
            "OpType=ALLREDUCE, Timeout(ms)=600000) ran for 600031 milliseconds before "
            "timing out."
        )
        for n, r in enumerate(ranks):
            post(shipped(r.pod_name, r.pod_uid, [line.format(n)], [t0 + 620]))

        def watchdog() -> Any:
            got = [a for a in rows(url, "alert_events") if a["alert_name"] == "NCCLWatchdogTimeout"]
            return got and (got[0]["raw_data"] or {}).get("stacks")

        assert wait_for(watchdog, "the watchdog alert with the stacks", every=0.2) == stacks
        assert app.deepdive.stalls_captured == 1
        assert len([t for t in rows(url, "pyspy_tasks") if t["reason"] == "stall"]) == 2
    finally:
        for r in ranks:
            ctd.remove(r.cid)
        agent.stop()
