"""The Management pages (issue 70, items 4 to 7): every job run kept and served (a failed
one with its error); workloads' frameworks detected from their evidence (the Megatron-LM
fixture log, a DeepSpeed job); clusters added from a kubeconfig into the multi-cluster
Secret, tested, initialized (deploy/agent's DaemonSet and RBAC in a second, real API
server), made default and removed; settings changed at run time (applied at once, in the
audit); releases; writes only with the API's credentials; bad input refused with nothing
stored. Each answer's fields against the original's Go structs (go_types.py)."""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from lens_ebpf.core.runner import Job
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.go_types import CONTRACT, MANAGEMENT, violations
from tests.recorder.objects import U, gpu_pod, state
from tests.recorder.test_cluster_api import put_trainer
from tests.recorder.test_training import fluent_bit, post

FIXTURE = Path("/work/shared/fixtures/megatron-single-node.log")
HERE_FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "training"
LENS = "lens"  # the service's namespace, where the multi-cluster Secret is
SECRET = "multi-k8s-config"
TOKEN = "s3cret-api-token"
ONE = "management/clusters/{cluster_name}"


def megatron_log() -> list[str]:
    """The fixture log of a Megatron-LM run on one node (the shared one, else the copy the
    training tests keep)."""
    path = FIXTURE if FIXTURE.exists() else HERE_FIXTURE / "megatron-single-node.log"
    return [line for line in path.read_text().splitlines() if line.strip()]


class Client:
    """The service's API as the pages ask it: a call's status and its JSON, the
    envelope's data checked against the original's types where the route has them."""

    def __init__(self, app: Any, token: str = TOKEN) -> None:
        self.app, self.token = app, token
        self.checked: set[str] = set()

    def call(
        self, method: str, path: str, body: Any = None, token: str | None = None, route: str = ""
    ) -> tuple[int, Any]:
        headers = {}
        tok = self.token if token is None else token
        if tok:
            headers["Authorization"] = f"Bearer {tok}"
        r = requests.request(
            method,
            f"http://127.0.0.1:{self.app.http.port}/lens/v1/{path}",
            json=body,
            headers=headers,
            timeout=hang_guard(30),
        )
        got = r.json() if r.content else None
        key = f"{method} {route}" if route else ""
        schema = {**CONTRACT, **MANAGEMENT}.get(key)
        if schema is not None and r.status_code < 300:
            data = got["data"] if isinstance(got, dict) and "meta" in got else got
            if data is not None:
                assert violations(data, schema[1]) == [], (key, data)
            self.checked.add(key)
        return r.status_code, got

    def data(self, method: str, path: str, body: Any = None, route: str = "") -> Any:
        status, got = self.call(method, path, body, route=route)
        assert status == 200 and got["meta"]["code"] == 2000, (path, status, got)
        return got["data"]


def token_file(tmp_path: Path) -> str:
    f = tmp_path / "api-token"
    f.write_text(TOKEN + "\n")
    return str(f)


# -- job history --------------------------------------------------------------------------------
def test_every_job_run_is_kept_a_failed_one_with_its_error(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    app = recorder_app(db_url, api__token_file=token_file(tmp_path))
    c = Client(app)

    def full_disk() -> None:
        raise OSError(28, "No space left on device")

    app.runner.add(Job("export/b", 3600, full_disk, leader_only=True))
    app.runner.add(Job("counted", 3600, lambda: {"rows": 7, "more": 2}, leader_only=True))
    for _ in range(2):
        assert app.runner.run("export/b")
    assert app.runner.run("counted")
    app.job_history.flush()
    assert app.job_history.recorded >= 3

    got = c.data(
        "GET",
        "job-execution-histories?status=failed&pageNum=1&pageSize=10",
        route="job-execution-histories",
    )
    assert got["total"] == 2 and (got["pageNum"], got["pageSize"]) == (1, 10)
    failed = got["data"][0]
    assert (failed["job_name"], failed["job_type"], failed["cluster_name"], failed["status"]) == (
        "export/b",
        "export",
        "b",
        "failed",
    )
    assert failed["error_message"] == "OSError: [Errno 28] No space left on device"
    assert "full_disk" in failed["error_stack"] and failed["exit_code"] == 1
    assert failed["duration_seconds"] >= 0 and failed["ended_at"] >= failed["started_at"]
    assert failed["schedule"] == "@every 3600s" and failed["metadata"]["leader_only"] is True

    one = c.data(
        "GET", f"job-execution-histories/{failed['id']}", route="job-execution-histories/{id}"
    )
    assert one == failed
    recent = c.data(
        "GET",
        "job-execution-histories/recent-failures?limit=5",
        route="job-execution-histories/recent-failures",
    )
    assert [r["id"] for r in recent] == [r["id"] for r in got["data"]]
    counted = c.data(
        "GET", "job-execution-histories?job_name=count", route="job-execution-histories"
    )["data"]
    assert [(r["job_name"], r["status"], r["rows_touched"]) for r in counted] == [
        ("counted", "success", 9)
    ]
    # the service's own jobs' runs (their first, at start), with the rows they wrote
    names = {r["job_name"] for r in c.data("GET", "job-execution-histories?pageSize=100")["data"]}
    assert {"snapshot", "hourly", "prune", "settings"} <= names

    stats = c.data(
        "GET",
        "job-execution-histories/statistics/export%2Fb",
        route="job-execution-histories/statistics/{job_type}/{cluster}",
    )
    assert (stats["total_runs"], stats["failure_count"], stats["success_count"]) == (2, 0 + 2, 0)
    assert stats["last_status"] == "failed" and stats["success_rate"] == 0.0
    assert stats["common_errors"] == [{"error_message": failed["error_message"], "count": 2}]
    stats = c.data(
        "GET",
        "job-execution-histories/statistics/counted",
        route="job-execution-histories/statistics/{job_name}",
    )
    assert (stats["total_runs"], stats["success_count"], stats["last_status"]) == (1, 1, "success")
    none = c.data("GET", "job-execution-histories/statistics/nothing")
    assert (none["total_runs"], none["last_status"], none["avg_duration"]) == (0, "", 0.0)

    # bad input: named, 4001/4004
    base = "job-execution-histories"
    for path, code in (
        (f"{base}/x1", 4001),
        (f"{base}/99999", 4004),
        (f"{base}?status=exploded", 4001),
        (f"{base}?start_time_from=yesterday", 4001),
        (f"{base}?order_by=password", 4001),
        (f"{base}?pageSize=1000", 4001),
    ):
        status, body = c.call("GET", path)
        assert body["meta"]["code"] == code, (path, body)

    # kept recorder.job_history.retention_days: older runs pruned
    app.job_history.prune(datetime.now(UTC) + timedelta(days=8), 7)
    assert app.writer.flush(10)
    assert rows(db_url, "job_execution_history") == []


def test_a_follower_records_no_runs(tmp_path: Path) -> None:
    """Only the leader records: a replica that does not lead holds nothing."""
    from sqlalchemy import create_engine

    from lens_ebpf.core.runner import Runner
    from lens_ebpf.recorder.management.job_history import JobHistory
    from lens_ebpf.recorder.store.writer import Writer, upgrade

    eng = create_engine(f"sqlite:///{tmp_path / 'r.db'}")
    upgrade(eng)
    leading = [False]
    hist = JobHistory(eng, Writer(eng, 10), "home", lambda: leading[0], lambda: True, "r-0")
    runner = Runner([Job("a", 60, lambda: None, leader_only=False)])
    runner.observe(hist.observe)
    runner.run("a")
    assert hist.held() == 0
    leading[0] = True
    runner.run("a")
    assert hist.flush() == 1
    assert [
        (r["job_name"], r["hostname"], r["cluster_name"])
        for r in rows(f"sqlite:///{tmp_path / 'r.db'}", "job_execution_history")
    ] == [("a", "r-0", "home")]
    eng.dispose()


# -- framework detection ---------------------------------------------------------------------------
DS_LINES = [
    "[2026-11-25 14:00:01,100] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, "
    "lr=[0.0001], mom=[(0.9, 0.999)]",
    "steps: 10 loss: 0.6931 iter time (s): 0.210 samples/sec: 152.381",
    "steps: 20 loss: 0.6120 iter time (s): 0.205 samples/sec: 156.098",
]


def deepspeed_job(api: FakeApiServer) -> None:
    """The PyTorchJob bert running DeepSpeed: its launcher's command line, its image, its
    environment's names."""
    from tests.recorder.objects import KIND, workload

    api.put(
        KIND["bert"][2],
        workload("bert", {}, {"conditions": [{"type": "Running", "status": "True"}]}),
    )
    p = gpu_pod("bert-worker-0", "bert", "nvidia.com/gpu", 2, "gpu-2")
    c = p["spec"]["containers"][0]
    c["image"] = "registry.example.com/ml/deepspeed:v0.14.2-torch2.3"
    c["command"] = ["deepspeed"]
    c["args"] = ["--num_gpus=2", "train.py", "--deepspeed", "--deepspeed_config", "ds.json"]
    c["env"] += [{"name": "DS_ACCELERATOR", "value": "cuda"}]
    api.put("pods", state(p, "Running", True))


def test_frameworks_are_detected_from_their_evidence(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    put_trainer(api, "2026-11-25T13:00:00Z")
    for name in ("trainer-5d9f-a", "trainer-5d9f-b"):
        p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
        api.put("pods", state(p, "Running", True))
    deepspeed_job(api)
    # the detection job's own runs wait an hour: the test runs it, and counts what it does
    app = recorder_app(
        db_url, api__token_file=token_file(tmp_path), detection__interval_seconds=3600
    )
    c = Client(app)
    eventually(lambda: len([r for r in rows(db_url, "gpu_pods") if r["running"]]) == 3, timeout=15)
    # the fixture log of a Megatron-LM run, as its pod printed it (Fluent Bit's JSON)
    log = megatron_log()
    t0 = datetime(2026, 11, 25, 14, 0, tzinfo=UTC).timestamp()
    r = post(app, fluent_bit("trainer-5d9f-a", log, [t0 + i for i in range(len(log))]))
    assert r.status_code == 200, r.text
    assert app.writer.flush(10)
    assert app.detection.run() >= 2
    assert app.writer.flush(10)

    mega = c.data(
        "GET", f"detection-status/{U['trainer']}", route="detection-status/{workload_uid}"
    )
    assert (
        mega["status"],
        mega["detection_state"],
        mega["framework"],
        mega["frameworks"],
        mega["workload_type"],
        mega["base_framework"],
        mega["evidence_sources"],
    ) == ("verified", "completed", "megatron", ["megatron"], "training", "megatron", ["log"])
    assert mega["confidence"] == 0.9 and mega["framework_layer"] == "orchestration"
    assert mega["orchestration_framework"] == "megatron" and not mega["has_conflicts"]
    assert mega["confirmed_at"] and mega["attempt_count"] == 1
    log_cov = next(x for x in mega["coverage"] if x["source"] == "log")
    assert (log_cov["status"], log_cov["evidence_count"], log_cov["has_gap"]) == (
        "collected",
        1,
        False,
    )
    assert log_cov["covered_from"] == "2026-11-25T14:00:10Z"  # its first iteration line
    ev = c.data(
        "GET",
        f"detection-status/{U['trainer']}/evidence",
        route="detection-status/{workload_uid}/evidence",
    )
    (line,) = (e for e in ev["evidence"] if e["source"] == "log")
    assert (
        line["framework"],
        line["confidence"],
        line["evidence"]["framework_name"],
        line["evidence"]["format"],
        line["evidence"]["lines"],
    ) == ("megatron", 0.9, "Megatron-LM", "megatron", 10)
    assert line["evidence"]["last_line"]["iteration"] == 10
    assert line["evidence"]["last_line"]["target_iterations"] == 5000

    # DeepSpeed: its launcher's command line, its environment, its image; no log yet
    ds = c.data("GET", f"detection-status/{U['bert']}", route="detection-status/{workload_uid}")
    assert (ds["status"], ds["framework"], ds["workload_type"], ds["evidence_sources"]) == (
        "confirmed",
        "deepspeed",
        "training",
        ["process", "image"],
    )
    assert ds["confidence"] >= 0.9
    got = c.data("GET", f"detection-status/{U['bert']}/evidence?source=process")["evidence"]
    assert {(e["framework"], e["evidence"]["matched"]) for e in got} == {
        ("deepspeed", "deepspeed"),
        ("deepspeed", "DS_ACCELERATOR"),
    }
    cmd = next(e for e in got if "command_line" in e["evidence"])
    assert cmd["evidence"]["command_line"] == (
        "deepspeed --num_gpus=2 train.py --deepspeed " "--deepspeed_config ds.json"
    )
    images = c.data("GET", f"detection-status/{U['bert']}/evidence?source=image")["evidence"]
    assert {(e["framework"], e["framework_layer"], e["evidence"]["matched"]) for e in images} == {
        ("deepspeed", "orchestration", "deepspeed"),
        ("pytorch", "runtime", "torch"),
    }
    assert {e["evidence"]["image"] for e in images} == {
        "registry.example.com/ml/deepspeed:v0.14.2-torch2.3"
    }
    assert ds["frameworks"] == ["deepspeed", "pytorch"] and ds["runtime_framework"] == "pytorch"

    # new evidence (its log lines) reruns its detection: verified now
    r = post(app, fluent_bit("bert-worker-0", DS_LINES, [t0 + 60 + i for i in range(3)]))
    assert r.status_code == 200, r.text
    assert app.writer.flush(10)
    assert app.detection.run() == 1  # only bert's evidence is new
    assert app.writer.flush(10)
    ds = c.data("GET", f"detection-status/{U['bert']}")
    assert (ds["status"], ds["attempt_count"], ds["evidence_sources"]) == (
        "verified",
        2,
        ["process", "log", "image"],
    )
    assert app.detection.run() == 0  # nothing new: nothing detected again

    # the page's list, summary, coverage, tasks, log gap
    listing = c.data(
        "GET", "detection-status?status=verified&page=1&page_size=20", route="detection-status"
    )
    assert {d["workload_uid"] for d in listing["data"]} == {U["trainer"], U["bert"]}
    assert listing["total"] == 2 and listing["data"][0]["coverage"] == []
    summary = c.data("GET", "detection-status/summary", route="detection-status/summary")
    assert summary["total_workloads"] == 2 and summary["status_counts"]["verified"] == 2
    assert summary["detection_state_counts"]["completed"] == 2
    cov = c.data(
        "GET",
        f"detection-status/{U['bert']}/coverage",
        route="detection-status/{workload_uid}/coverage",
    )
    assert {x["source"]: x["evidence_count"] for x in cov["coverage"]} == {
        "process": 2,
        "log": 1,
        "image": 2,
        "label": 0,
    }
    gap = c.data(
        "GET",
        f"detection-status/{U['bert']}/coverage/log-gap",
        route="detection-status/{workload_uid}/coverage/log-gap",
    )
    assert gap == {"workload_uid": U["bert"], "has_gap": False}
    tasks = c.data(
        "GET", f"detection-status/{U['bert']}/tasks", route="detection-status/{workload_uid}/tasks"
    )
    assert [(x["task_type"], x["status"]) for x in tasks["tasks"]] == [
        ("detection_coordinator", "completed")
    ]

    # the page's Trigger: a write (the API's credentials), run at the leader's next look
    status, body = c.call("POST", f"detection-status/{U['bert']}/trigger", token="")
    assert (status, body["meta"]["code"]) == (401, 4010)
    got = c.data(
        "POST",
        f"detection-status/{U['bert']}/trigger",
        route="detection-status/{workload_uid}/trigger",
    )
    assert (got["status"], got["task_type"]) == ("pending", "detection_coordinator")
    assert c.data("GET", f"detection-status/{U['bert']}")["detection_state"] == "pending"
    assert app.detection.run() == 1
    assert app.writer.flush(10)
    after = c.data("GET", f"detection-status/{U['bert']}")
    assert (after["detection_state"], after["status"], after["attempt_count"]) == (
        "completed",
        "verified",
        1,
    )
    status, body = c.call("POST", "detection-status/uid-nobody/trigger")
    assert (status, body["meta"]["code"]) == (404, 4004)
    got = c.data(
        "POST",
        f"detection-status/{U['bert']}/coverage/initialize",
        route="detection-status/{workload_uid}/coverage/initialize",
    )
    assert got["message"] == "coverage already initialized" and got["count"] == 4
    status, body = c.call("GET", "detection-status/uid-nobody")
    assert (status, body["meta"]["code"]) == (404, 4004)
    status, body = c.call("GET", "detection-status?status=certain")
    assert (status, body["meta"]["code"]) == (400, 4001)


def test_the_verdicts_of_evidence() -> None:
    """frameworks.py: stacks, inference, conflicts, a suspicion."""
    from lens_ebpf.recorder.detection import frameworks as fw

    v = fw.verdict(
        fw.from_image("docker.io/rocm/primus:v25.9", "main")
        + [fw.from_log_format("megatron", 3, {})]
    )  # type: ignore[list-item]
    assert (v.status, v.framework, v.frameworks, v.wrapper_framework, v.base_framework) == (
        "verified",
        "primus",
        ["primus", "megatron"],
        "primus",
        "megatron",
    )
    v = fw.verdict(fw.from_command(["python3", "-m", "vllm.entrypoints.openai.api_server"], "m"))
    assert (v.status, v.framework, v.workload_type) == ("confirmed", "vllm", "inference")
    v = fw.verdict(
        fw.from_command(["python", "-m", "sglang.launch_server"], "m")
        + fw.from_command(["vllm", "serve", "x"], "n")
    )
    assert v.status == "conflict" and v.conflicts[0]["reason"] == "two inference servers"
    v = fw.verdict(fw.from_image("pytorchlightning/pytorch_lightning:2.4", "m"))
    assert (v.status, v.framework, v.frameworks) == (
        "suspected",
        "lightning",
        ["lightning", "pytorch"],
    )
    v = fw.verdict(
        fw.from_command(["torchrun", "--nproc_per_node=8", "-m", "torchtitan.train"], "m")
    )
    assert (v.framework, v.frameworks) == ("torchtitan", ["torchtitan", "pytorch"])
    assert fw.verdict([]).status == "unknown"
    assert fw.from_image("busybox:1.36", "m") == []


# -- system configuration -----------------------------------------------------------------------
def test_a_setting_changed_at_run_time_takes_effect_and_is_audited(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    from sqlalchemy import create_engine, update

    from lens_ebpf.recorder.store import schema

    app = recorder_app(db_url, api__token_file=token_file(tmp_path))
    c = Client(app)
    key = "recorder.training.slowdown_factor"
    listing = {i["key"]: i for i in c.data("GET", "system-config", route="system-config")}
    item = listing[key]
    assert (item["value"], item["is_readonly"], item["category"], item["version"]) == (
        1.5,
        False,
        "detection",
        0,
    )
    assert listing["recorder.database_url"]["is_readonly"] is True
    assert (
        "password" not in json.dumps(listing["recorder.database_url"]["value"])
        or ":***@" in listing["recorder.database_url"]["value"]
    )
    token = listing["recorder.api.token_file"]
    assert (token["value"], token["is_encrypted"]) == ("******", True)  # never shown
    assert TOKEN not in json.dumps(listing)
    detection = c.data("GET", "system-config?category=detection")
    assert key in {i["key"] for i in detection} and all(
        i["category"] == "detection" for i in detection
    )

    # bad input: nothing stored, nothing changed
    for body, token_, code in (
        ({"value": "fast"}, TOKEN, 4001),
        ({"value": 0.5}, TOKEN, 4001),
        ({}, TOKEN, 4001),
        ({"value": 3}, "", 4010),
        ({"value": 3}, "wrong", 4003),
    ):
        status, got = c.call("PUT", f"system-config/{key}", body, token=token_)
        assert got["meta"]["code"] == code and got["data"] is None, got
    status, got = c.call("PUT", f"system-config/{key}", {"value": "fast"})
    assert key in got["meta"]["message"] and "number" in got["meta"]["message"]
    status, got = c.call("PUT", "system-config/recorder.database_url", {"value": "sqlite://"})
    assert (status, got["meta"]["code"]) == (403, 4003)
    status, got = c.call("PUT", "system-config/recorder.nothing", {"value": 1})
    assert (status, got["meta"]["code"]) == (404, 4004)
    assert rows(db_url, "system_config") == [] and rows(db_url, "system_config_history") == []
    assert app.cfg.recorder.training.slowdown_factor == 1.5

    # changed: at once, in the part that reads it (training), and audited
    got = c.data(
        "PUT",
        f"system-config/{key}",
        {"value": 2.5, "change_reason": "noisy nodes"},
        route="system-config/{key}",
    )
    assert got == {"message": "Configuration saved", "key": key, "value": 2.5, "version": 1}
    assert app.training.cfg.slowdown_factor == 2.5 and app.cfg.recorder.training is app.training.cfg
    one = c.data("GET", f"system-config/{key}", route="system-config/{key}")
    assert (one["value"], one["version"], one["updated_by"], one["is_readonly"]) == (
        2.5,
        1,
        "token",
        False,
    )
    c.data("PUT", "system-config/recorder.retention.days", {"value": 3})
    assert app.jobs.retention == timedelta(days=3)
    root = logging.getLogger()
    level = root.level
    try:
        c.data("PUT", "system-config/log_level", {"value": "debug"})
        assert root.level == logging.DEBUG
        c.data("DELETE", "system-config/log_level", route="system-config/{key}")
        assert root.level == logging.INFO and app.cfg.log_level == "info"
    finally:
        root.setLevel(level)
    history = c.data("GET", f"system-config/{key}/history", route="system-config/{key}/history")
    assert [
        (h["old_value"], h["new_value"], h["version"], h["changed_by"], h["change_reason"])
        for h in history
    ] == [(1.5, 2.5, 1, "token", "noisy nodes")]

    # a change another replica made (the database's) is applied here by the settings job
    eng = create_engine(db_url)
    with eng.begin() as conn:
        conn.execute(
            update(schema.system_config).where(schema.system_config.c.key == key).values(value=4.0)
        )
    eng.dispose()
    app.apply_stored()
    assert app.training.cfg.slowdown_factor == 4.0
    c.data("DELETE", f"system-config/{key}")
    assert app.training.cfg.slowdown_factor == 1.5  # what it started with
    assert [h["new_value"] for h in c.data("GET", f"system-config/{key}/history")] == [None, 2.5]

    # the agent image: the Cluster page's installer, the System Config page's registry
    assert c.data("GET", "registry/config", route="registry/config")["config"] == {
        "registry": "docker.io",
        "namespace": "",
        "harbor_external_url": "",
        "image_versions": {"lens-ebpf": "0.1.0"},
    }
    got = c.data(
        "PUT",
        "registry/config",
        {
            "registry": "harbor.example.com",
            "namespace": "lens",
            "image_versions": {"lens-ebpf": "0.2.0"},
        },
        route="registry/config",
    )
    assert (got["config"]["registry"], got["config"]["namespace"]) == ("harbor.example.com", "lens")
    assert app.management.settings.agent_image() == "harbor.example.com/lens/lens-ebpf:0.2.0"
    status, installer = c.call(
        "GET", "management/config/installer", route="management/config/installer"
    )
    assert installer == {
        "repository": "harbor.example.com/lens/lens-ebpf",
        "tag": "0.2.0",
        "full_image": "harbor.example.com/lens/lens-ebpf:0.2.0",
    }
    status, got = c.call(
        "PUT",
        "management/config/installer.image",
        {
            "value": {"repository": "docker.io/amd/lens-ebpf", "tag": "0.3.0"},
            "description": "Dataplane installer image configuration",
            "category": "installer",
        },
        route="management/config/{key}",
    )
    assert status == 200 and got["key"] == "installer.image"
    assert app.cfg.recorder.management.agent_image == "docker.io/amd/lens-ebpf:0.3.0"
    status, got = c.call("GET", "management/config", route="management/config")
    assert status == 200 and {"installer.image", key} <= {i["key"] for i in got}
    status, got = c.call(
        "GET", "management/config/installer.image", route="management/config/{key}"
    )
    assert got["value"] == {"repository": "docker.io/amd/lens-ebpf", "tag": "0.3.0"}
    status, got = c.call("PUT", "management/config/installer.image", {"value": "x"}, token="")
    assert status == 401 and got["error"] and got["meta"]["code"] == 4010
    url = c.data("GET", "registry/image-url?image=lens-ebpf&tag=0.3.0", route="registry/image-url")
    assert url["image_url"] == "docker.io/amd/lens-ebpf:0.3.0"
    synced = c.data(
        "POST",
        "registry/sync-from-harbor",
        {"harbor_external_url": "https://harbor.example.com:8443"},
        route="registry/sync-from-harbor",
    )
    assert synced["config"]["registry"] == "harbor.example.com:8443"
    status, got = c.call(
        "DELETE", "management/config/installer.image", route="management/config/{key}"
    )
    assert status == 204 and app.management.settings.agent_image() == "lens-ebpf:0.1.0"


# -- clusters, releases: a second, real API server ----------------------------------------------
@pytest.fixture()
def lab() -> Iterator[Any]:
    """A real kube-apiserver 1.20.2 (tests/kube/apiserver.py): the second cluster."""
    from tests.kube.apiserver import KubeApiServer, unavailable

    why = unavailable()
    if why:
        pytest.skip(why)
    with KubeApiServer() as server:
        yield server


def secret_keys(api: FakeApiServer) -> dict[str, str]:
    got = api.get("secrets", LENS, SECRET)
    return {k: base64.b64decode(v).decode() for k, v in ((got or {}).get("data") or {}).items()}


def in_lab(lab: Any, path: str) -> dict[str, Any] | None:
    status, got = lab.request("GET", path)
    return got if status == 200 else None


def test_a_second_cluster_added_tested_initialized_made_default_and_removed(
    lab: Any, api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    """(lab first: it stops after the service that watches it.)"""
    from lens_ebpf.recorder.management import manifest
    from tests.recorder.test_cluster_api import node

    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    # the task and scan jobs' own runs wait an hour: the test runs them
    app = recorder_app(
        db_url,
        api__token_file=token_file(tmp_path),
        management__task_seconds=3600,
        management__release_scan_seconds=3600,
        top={
            ("multicluster", "secret"): SECRET,
            ("multicluster", "namespace"): LENS,
            ("multicluster", "reload_seconds"): 0.5,
        },
    )
    c = Client(app)
    kubeconfig = lab.admin_kubeconfig.read_text()

    # bad input: a clear error (the envelope's, and the original's "error"), nothing stored
    closed = kubeconfig.replace(lab.url, "https://127.0.0.1:1")
    for body, token, status, says in (
        ({"cluster_name": "b", "kubeconfig": "clusters: [oops"}, TOKEN, 400, "kubeconfig"),
        (
            {"cluster_name": "b", "kubeconfig": "apiVersion: v1\nkind: Config\n"},
            TOKEN,
            400,
            "kubeconfig",
        ),
        ({"cluster_name": "b", "kubeconfig": closed}, TOKEN, 400, "does not answer"),
        ({"cluster_name": "B_2", "kubeconfig": kubeconfig}, TOKEN, 400, "cluster_name"),
        ({"cluster_name": "b"}, TOKEN, 400, "kubeconfig"),
        ({"cluster_name": "b", "kubeconfig": kubeconfig}, "", 401, "token"),
        ({"cluster_name": "local", "kubeconfig": kubeconfig}, TOKEN, 409, "exists"),
    ):
        got_status, got = c.call("POST", "management/clusters", body, token=token)
        assert got_status == status and says in got["error"], (body, got)
        assert got["meta"]["message"] == got["error"] and got["data"] is None
    assert secret_keys(api) == {}
    assert "b" not in {r["cluster_name"] for r in rows(db_url, "managed_clusters")}

    # added: kept in the multi-cluster Secret (never echoed back), followed at once
    status, b = c.call(
        "POST",
        "management/clusters",
        {
            "cluster_name": "b",
            "display_name": "Lab B",
            "kubeconfig": kubeconfig,
            "labels": {"site": "lab"},
        },
        route="management/clusters",
    )
    assert status == 201, b
    assert (
        b["cluster_name"],
        b["display_name"],
        b["source"],
        b["k8s_endpoint"],
        b["k8s_configured"],
        b["labels"],
        b["is_default"],
    ) == ("b", "Lab B", "secret", lab.url, True, {"site": "lab"}, False)
    assert lab.admin_token not in json.dumps(b)
    assert secret_keys(api) == {"b": kubeconfig}
    eventually(
        lambda: [
            (x["cluster_name"], x["up"])
            for x in c.call("GET", "management/clusters", route="management/clusters")[1]
        ]
        == [("local", True), ("b", True)],
        timeout=20,
    )
    status, listing = c.call("GET", "management/clusters")
    assert lab.admin_token not in json.dumps(listing)
    assert (
        c.call("GET", "management/clusters/b", route="management/clusters/{cluster_name}")[1][
            "infrastructure_status"
        ]
        == "not_initialized"
    )
    status, got = c.call(
        "PUT",
        "management/clusters/b",
        {"description": "the lab"},
        route="management/clusters/{cluster_name}",
    )
    assert (status, got["description"]) == (200, "the lab")

    # tested
    status, t = c.call(
        "POST", "management/clusters/b/test", route="management/clusters/{cluster_name}/test"
    )
    assert (status, t["k8s_connected"], t["k8s_version"]) == (200, True, "v1.20.2")

    # initialized: deploy/agent's objects installed there, as a task whose logs the page tails
    status, task = c.call(
        "POST",
        "management/clusters/b/initialize",
        {"storage_mode": "external"},
        route="management/clusters/{cluster_name}/initialize",
    )
    assert status == 200 and task["status"] == "pending", task
    status, got = c.call("POST", "management/clusters/b/initialize", {})
    assert status == 409 and "under way" in got["error"]
    status, active = c.call(
        "GET",
        "management/clusters/b/tasks/active",
        route="management/clusters/{cluster_name}/tasks/active",
    )
    assert active["id"] == task["task_id"]
    assert app.management.tasks.run() == 1
    assert app.writer.flush(10)
    status, tasks = c.call(
        "GET",
        "management/clusters/b/tasks?limit=20",
        route="management/clusters/{cluster_name}/tasks",
    )
    (done,) = tasks["data"]
    assert (done["status"], done["install_scope"], done["error_message"]) == (
        "completed",
        "infrastructure",
        "",
    ), done
    status, logs = c.call(
        "GET",
        f"management/clusters/b/tasks/{done['id']}/logs?tail=1000",
        route=f"{ONE}/tasks/{{task_id}}/logs",
    )
    objs = manifest.objects()
    for d in objs:
        ns = d["metadata"].get("namespace")
        assert (
            f"created {d['kind']} {ns + '/' if ns else ''}{d['metadata']['name']}" in logs["logs"]
        ), logs["logs"]
    assert "API v1.20.2" in logs["logs"] and logs["log_lines"] == len(objs) + 4
    status, tail = c.call("GET", f"management/clusters/b/tasks/{done['id']}/logs?tail=1")
    assert tail["logs"].startswith(tail["logs"].splitlines()[-1]) and tail["log_lines"] == 1
    # ... and they are there, as the manifest says
    for d in objs:
        got = in_lab(lab, manifest.path_of(d))
        assert got is not None, d["kind"]
        for field in ("rules", "roleRef", "subjects", "data"):
            if field in d:
                assert got[field] == d[field], (d["kind"], field)
    ds = in_lab(lab, "/apis/apps/v1/namespaces/lens-ebpf/daemonsets/lens-ebpf")
    assert ds is not None
    want = next(d for d in objs if d["kind"] == "DaemonSet")["spec"]["template"]["spec"]
    have = ds["spec"]["template"]["spec"]
    assert (
        have["containers"][0]["image"],
        have["containers"][0]["args"],
        have["serviceAccountName"],
        have["hostPID"],
    ) == ("lens-ebpf:0.1.0", want["containers"][0]["args"], "lens-ebpf", True)
    status, infra = c.call(
        "GET", "management/clusters/b/infrastructure/status", route=f"{ONE}/infrastructure/status"
    )
    assert (infra["initialized"], infra["status"], infra["last_task"]["status"]) == (
        True,
        "ready",
        "completed",
    )
    status, one = c.call(
        "GET",
        f"management/clusters/b/tasks/{done['id']}",
        route="management/clusters/{cluster_name}/tasks/{task_id}",
    )
    assert one["id"] == done["id"]

    # releases: what it runs, read from its DaemonSet; a version deployed, then rolled back
    assert app.management.releases.scan() == 2
    assert app.writer.flush(10)
    configs = {
        x["cluster_name"]: x for x in c.data("GET", "releases/clusters", route="releases/clusters")
    }
    assert configs["b"]["deployed_version"]["image_tag"] == "0.1.0"
    assert configs["b"]["agent_image"] == "lens-ebpf:0.1.0"
    assert configs["local"]["deployed_version_id"] is None
    assert configs["local"]["sync_status"] == "not_installed"
    observed = configs["b"]["deployed_version_id"]
    v2 = c.data(
        "POST",
        "releases/versions",
        {
            "version_name": "v0.2.0",
            "channel": "stable",
            "image_registry": "docker.io/amd",
            "image_tag": "0.2.0",
            "chart_version": "0.2.0",
            "default_values": {},
            "release_notes": "faster",
        },
        route="releases/versions",
    )
    assert v2["status"] == "draft"
    c.data(
        "PATCH",
        f"releases/versions/{v2['id']}/status",
        {"status": "active"},
        route="releases/versions/{id}/status",
    )
    assert [
        v["version_name"] for v in c.data("GET", "releases/versions", route="releases/versions")
    ] == ["v0.2.0", "0.1.0"]
    c.data(
        "PUT",
        "releases/clusters/b/version",
        {"release_version_id": v2["id"], "values_override": {}},
        route="releases/clusters/{cluster_name}/version",
    )
    assert (
        c.data("GET", "releases/clusters/b", route="releases/clusters/{cluster_name}")[
            "sync_status"
        ]
        == "out_of_sync"
    )
    got = c.data(
        "POST",
        "releases/clusters/b/deploy",
        {"scope": "apps"},
        route="releases/clusters/{cluster_name}/deploy",
    )
    assert app.management.tasks.run() == 1
    assert app.writer.flush(10)
    assert app.management.releases.scan_one("b") == 1
    assert app.writer.flush(10)
    ds = in_lab(lab, "/apis/apps/v1/namespaces/lens-ebpf/daemonsets/lens-ebpf")
    assert (
        ds
        and ds["spec"]["template"]["spec"]["containers"][0]["image"]
        == "docker.io/amd/lens-ebpf:0.2.0"
    )
    b_release = c.data("GET", "releases/clusters/b")
    assert (b_release["sync_status"], b_release["deployed_version_id"]) == ("synced", v2["id"])
    rolled = c.data(
        "POST", "releases/clusters/b/rollback", route="releases/clusters/{cluster_name}/rollback"
    )
    assert rolled["rollback_to_version"] == observed
    assert app.management.tasks.run() == 1
    assert app.writer.flush(10)
    ds = in_lab(lab, "/apis/apps/v1/namespaces/lens-ebpf/daemonsets/lens-ebpf")
    assert ds and ds["spec"]["template"]["spec"]["containers"][0]["image"] == "lens-ebpf:0.1.0"
    history = c.data(
        "GET",
        "releases/clusters/b/history?limit=20",
        route="releases/clusters/{cluster_name}/history",
    )
    assert [(h["action"], h["status"]) for h in history] == [
        ("rollback", "completed"),
        ("upgrade", "completed"),
        ("initialize", "completed"),
    ]
    assert (
        c.data("GET", f"releases/history/{got['history_id']}", route="releases/history/{id}")[
            "release_version_id"
        ]
        == v2["id"]
    )
    status, body = c.call("DELETE", f"releases/versions/{v2['id']}")
    assert (status, body["meta"]["code"]) == (200, 2000)  # b runs the observed one again

    # made default: a question naming no cluster is about b now
    status, got = c.call(
        "PUT", "management/clusters/b/default", route="management/clusters/{cluster_name}/default"
    )
    assert (status, got["cluster_name"]) == (200, "b")
    assert c.data("GET", "nodes")["cluster_name"] == "b"
    assert (
        c.data("GET", "releases/clusters/default", route="releases/clusters/default")[
            "default_cluster"
        ]
        == "b"
    )
    assert {
        x["cluster_name"]: x["is_default"] for x in c.call("GET", "management/clusters")[1]
    } == {"local": False, "b": True}
    c.data("DELETE", "releases/clusters/default", route="releases/clusters/default")
    assert c.data("GET", "nodes")["cluster_name"] == "local"
    c.data(
        "PUT", "releases/clusters/default", {"cluster_name": "b"}, route="releases/clusters/default"
    )
    assert c.data("GET", "nodes")["cluster_name"] == "b"

    # removed: out of the Secret, no longer followed; the default the home cluster again
    status, got = c.call("DELETE", "management/clusters/local")
    assert status == 403 and "home cluster" in got["error"]
    status, got = c.call("DELETE", "management/clusters/b", token="")
    assert status == 401 and secret_keys(api) == {"b": kubeconfig}
    status, got = c.call(
        "DELETE", "management/clusters/b", route="management/clusters/{cluster_name}"
    )
    assert (status, got) == (204, None)
    assert secret_keys(api) == {}
    assert [x["cluster_name"] for x in c.call("GET", "management/clusters")[1]] == ["local"]
    assert c.data("GET", "nodes")["cluster_name"] == "local"
    status, got = c.call("GET", "management/clusters/b")
    assert status == 404 and "not found" in got["error"]
    assert rows(db_url, "managed_clusters")[0]["cluster_name"] == "local"


# -- the type test's asks and writes (tests/recorder/test_types.py) --------------------------------
MANAGEMENT_ASKS = [
    ("job-execution-histories", "pageNum=1&pageSize=20"),
    ("job-execution-histories/recent-failures", "limit=10"),
    ("job-execution-histories/statistics/{job_name}", ""),
    ("job-execution-histories/statistics/{job_type}/{cluster}", ""),
    ("job-execution-histories/{id}", ""),
    ("detection-status/summary", ""),
    ("detection-status", "page=1&page_size=20"),
    ("detection-status/{workload_uid}", ""),
    ("detection-status/{workload_uid}/coverage", ""),
    ("detection-status/{workload_uid}/coverage/log-gap", ""),
    ("detection-status/{workload_uid}/tasks", ""),
    ("detection-status/{workload_uid}/evidence", ""),
    ("system-config", "cluster=local"),
    ("system-config/{key}", ""),
    ("system-config/{key}/history", ""),
    ("registry/config", ""),
    ("registry/image-url", "image=lens-ebpf&tag=0.1.0"),
    ("releases/versions", ""),
    ("releases/versions/{id}", ""),
    ("releases/clusters", ""),
    ("releases/clusters/default", ""),
    ("releases/clusters/{cluster_name}", ""),
    ("releases/clusters/{cluster_name}/history", "limit=20"),
    ("releases/history/{id}", ""),
    ("metric-alert-rules/{id}/status", ""),
    ("log-alert-rules/multi-cluster", ""),
    ("log-alert-rules/{id}/statistics", ""),
    ("log-alert-rules/{id}/versions", ""),
    ("alert-rule-advices/{id}", ""),
]


MANAGEMENT_FILLS = {
    "{key}": "recorder.training.stall_factor",
    "{cluster_name}": "local",
    "{job_name}": "snapshot",
    "{job_type}": "storage_scan",
    "{cluster}": "local",
}


def management_ids(ids: dict[str, str]) -> dict[str, str]:
    """The {id} of each route of MANAGEMENT_ASKS that has one (none: a 404)."""
    return {
        "job-execution-histories/{id}": ids.get("run", "1"),
        "job-execution-histories/statistics/{job_name}": "snapshot",
        "job-execution-histories/statistics/{job_type}/{cluster}": "storage_scan/local",
        "system-config/{key}": "recorder.training.stall_factor",
        "system-config/{key}/history": "recorder.training.stall_factor",
        "releases/versions/{id}": ids.get("version", "1"),
        "releases/clusters/{cluster_name}": "local",
        "releases/clusters/{cluster_name}/history": "local",
        "releases/history/{id}": ids.get("task", "1"),
        "metric-alert-rules/{id}/status": "1",
        "log-alert-rules/{id}/statistics": "1",
        "log-alert-rules/{id}/versions": "1",
        "alert-rule-advices/{id}": "1",
    }


def management_writes(app: Any, w: Any, log_rule: int) -> dict[str, str]:
    """Every write of the Management pages' typed routes, as the pages send them (w:
    test_types's writer); the ids made."""
    from sqlalchemy import update

    from lens_ebpf.recorder.store import schema

    for _ in range(2):
        app.runner.run("settings")
    app.job_history.flush()
    app.detection.run()  # (its job may have run already: the rows are there either way)
    assert app.writer.flush(10)
    uid = U["trainer"]
    assert uid in {
        r["workload_uid"]
        for r in rows(
            str(app.engine.url.render_as_string(hide_password=False)), "workload_detections"
        )
    }
    w("POST", "detection-status/{workload_uid}/trigger", f"detection-status/{uid}/trigger")
    w(
        "POST",
        "detection-status/{workload_uid}/coverage/initialize",
        f"detection-status/{uid}/coverage/initialize",
    )
    key = "recorder.training.stall_factor"
    w("PUT", "system-config/{key}", f"system-config/{key}", {"value": 6})
    w("PUT", "system-config/{key}", f"system-config/{key}", {"value": 7})
    w("DELETE", "system-config/{key}", "system-config/recorder.timeline.regression_factor")
    w(
        "PUT",
        "system-config/{key}",
        "system-config/recorder.timeline.regression_factor",
        {"value": 3},
    )
    w("DELETE", "system-config/{key}", "system-config/recorder.timeline.regression_factor")
    w("PUT", "registry/config", "registry/config", {"registry": "docker.io", "namespace": "amd"})
    w(
        "POST",
        "registry/sync-from-harbor",
        "registry/sync-from-harbor",
        {"harbor_external_url": "https://harbor.example.com"},
    )
    made, versions = [], []
    for tag in ("0.1.0", "0.2.0"):
        v = w(
            "POST",
            "releases/versions",
            "releases/versions",
            {"version_name": f"v{tag}", "image_tag": tag, "image_registry": "docker.io/amd"},
        )
        w(
            "PUT",
            "releases/versions/{id}",
            f"releases/versions/{v['id']}",
            {"release_notes": "ours"},
        )
        w(
            "PATCH",
            "releases/versions/{id}/status",
            f"releases/versions/{v['id']}/status",
            {"status": "active"},
        )
        w(
            "PUT",
            "releases/clusters/{cluster_name}/version",
            "releases/clusters/local/version",
            {"release_version_id": v["id"], "values_override": {}},
        )
        got = w(
            "POST",
            "releases/clusters/{cluster_name}/deploy",
            "releases/clusters/local/deploy",
            {"scope": "apps"},
        )
        made.append(got["task_id"])
        versions.append(v["id"])
        eng = app.engine  # the task done as the leader's run would (no agent objects here)
        with eng.begin() as conn:
            tasks = schema.cluster_tasks
            conn.execute(
                update(tasks).where(tasks.c.id == got["task_id"]).values(status="completed")
            )
    w(
        "PUT",
        "releases/clusters/{cluster_name}/values",
        "releases/clusters/local/values",
        {"values_override": {"logLevel": "debug"}},
    )
    w("POST", "releases/clusters/{cluster_name}/rollback", "releases/clusters/local/rollback")
    gone = w(
        "POST",
        "releases/versions",
        "releases/versions",
        {"version_name": "scratch", "image_tag": "0.0.1"},
    )
    w("DELETE", "releases/versions/{id}", f"releases/versions/{gone['id']}")
    w("PUT", "releases/clusters/default", "releases/clusters/default", {"cluster_name": "local"})
    w("DELETE", "releases/clusters/default", "releases/clusters/default")
    w("POST", "log-alert-rules/{id}/rollback/{version}", f"log-alert-rules/{log_rule}/rollback/1")
    with app.engine.connect() as conn:
        run = conn.execute(schema.job_execution_history.select().limit(1)).first()
    return {
        "run": str(run.id) if run is not None else "1",
        "version": str(versions[0]),
        "task": str(made[0]),
    }


# -- the Alert pages' routes served since: a log rule's versions, statistics; a metric rule's
# status; rules of every cluster; an advice ---------------------------------------------------
def test_log_rule_versions_rollback_statistics_and_a_metric_rules_status(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    put_trainer(api, "2026-11-25T13:00:00Z")
    p = gpu_pod("trainer-5d9f-a", "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
    api.put("pods", state(p, "Running", True))
    app = recorder_app(
        db_url, api__token_file=token_file(tmp_path), alerts__rules_file=str(tmp_path / "rules.yml")
    )
    c = Client(app)
    eventually(lambda: any(r["running"] for r in rows(db_url, "gpu_pods")), timeout=15)
    rule = {
        "name": "oom",
        "description": "",
        "cluster_name": "",
        "enabled": True,
        "priority": 50,
        "match_type": "pattern",
        "severity": "warning",
        "match_config": {"pattern": "out of memory", "flags": {"case_insensitive": True}},
        "label_selectors": [],
        "group_wait": 0,
        "repeat_interval": 3600,
        "alert_template": {"title": "OOM", "summary": "OOM"},
    }
    rid = c.data("POST", "log-alert-rules", rule)["rule_id"]
    c.data("PUT", f"log-alert-rules/{rid}", {"severity": "critical", "priority": 90})
    got = c.data("GET", f"log-alert-rules/{rid}/versions", route="log-alert-rules/{id}/versions")
    assert [(v["version"], v["status"], v["config"]["severity"]) for v in got["versions"]] == [
        (2, "active", "critical"),
        (1, "superseded", "warning"),
    ]
    back = c.data(
        "POST", f"log-alert-rules/{rid}/rollback/1", route="log-alert-rules/{id}/rollback/{version}"
    )
    assert (back["version"], back["restored_version"]) == (3, 1)
    now = c.data("GET", f"log-alert-rules/{rid}")
    assert (now["severity"], now["priority"]) == ("warning", 50)
    got = c.data("GET", f"log-alert-rules/{rid}/versions")
    assert (got["total"], got["versions"][0]["change_log"]) == (3, "rollback to version 1")
    status, body = c.call("POST", f"log-alert-rules/{rid}/rollback/9")
    assert (status, body["meta"]["code"]) == (404, 4004)
    status, body = c.call("POST", f"log-alert-rules/{rid}/rollback/1", token="")
    assert (status, body["meta"]["code"]) == (401, 4010)

    # its statistics: the alerts it raised
    at = datetime.now(UTC).timestamp()
    r = post(app, fluent_bit("trainer-5d9f-a", ["RuntimeError: CUDA out of memory."], [at]))
    assert r.status_code == 200, r.text
    eventually(lambda: any(a["source"] == "log" for a in rows(db_url, "alert_events")), timeout=15)
    stats = c.data(
        "GET", f"log-alert-rules/{rid}/statistics", route="log-alert-rules/{id}/statistics"
    )
    assert (stats["summary"]["total_fired"], stats["summary"]["rule_name"]) == (1, "oom")
    (hour,) = stats["statistics"]
    assert (hour["fired_count"], hour["rule_id"], hour["cluster_name"]) == (1, rid, "local")
    status, body = c.call("GET", f"log-alert-rules/{rid}/statistics?date_from=yesterday")
    assert (status, body["meta"]["code"]) == (400, 4001)

    # every cluster's rules; a metric rule's sync status; an advice (there are none)
    multi = c.data(
        "GET",
        "log-alert-rules/multi-cluster?pageNum=1&pageSize=100",
        route="log-alert-rules/multi-cluster",
    )
    assert [x["cluster_name"] for x in multi["clusters"]] == ["local"]
    assert rid in {x["id"] for x in multi["clusters"][0]["rules"]}
    metric = {
        "name": "gpu-hot",
        "cluster_name": "local",
        "enabled": True,
        "description": "",
        "groups": [
            {
                "name": "g",
                "interval": "30s",
                "rules": [
                    {
                        "alert": "GPUHot",
                        "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
                        "for": "5m",
                        "labels": {"severity": "critical"},
                        "annotations": {},
                    }
                ],
            }
        ],
        "labels": {},
    }
    mid = c.data("POST", "metric-alert-rules", metric)["rule_id"]
    assert (
        c.data("GET", f"metric-alert-rules/{mid}/status", route="metric-alert-rules/{id}/status")[
            "status"
        ]
        == "pending"
    )
    c.data("POST", "metric-alert-rules/sync", {"rule_ids": [mid]})
    st = c.data("GET", f"metric-alert-rules/{mid}/status")
    assert st["status"] == "synced" and st["last_sync_time"]
    status, body = c.call("GET", "alert-rule-advices/7")
    assert (status, body["meta"]["code"]) == (404, 4004)
