"""The Primus-Lens API's types (issue 70): an unserved method on a served path answers 405
in the envelope."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import recorded, rows
from tests.recorder.go_types import CONTRACT, INT, NUM, STR, TIME, violations
from tests.recorder.objects import U, gpu_pod, state
from tests.recorder.test_alert_pages import post_alerts
from tests.recorder.test_cluster_api import gpu_pod as plain_gpu_pod
from tests.recorder.test_cluster_api import node, openmetrics, put_trainer
from tests.recorder.test_management import (
    MANAGEMENT_ASKS,
    MANAGEMENT_FILLS,
    management_ids,
    management_writes,
)


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "tracelens/resource-profiles"),
        ("POST", "workloads/w/profiler-files"),
        ("DELETE", "nodes/gpu-1"),
        ("PUT", "clusters/overview"),
        ("OPTIONS", "alerts"),
    ],
)
def test_an_unserved_method_answers_405_in_the_envelope(
    recorder_app: Any, tmp_path: Any, method: str, path: str
) -> None:
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    for prefix in ("/v1", "/lens/v1", "/api"):
        r = requests.request(
            method,
            f"http://127.0.0.1:{app.http.port}{prefix}/{path}",
            json={},
            timeout=hang_guard(5),
        )
        body = r.json()
        assert r.status_code == 405 and set(body) == {"meta", "data"}, body
        assert body["data"] is None and body["meta"]["code"] == 4016
        assert f"{method} /{path}" in body["meta"]["message"]
        assert r.headers["Allow"] == "GET"


# -- every served route's answers, against the Go structs' types -------------------------
T0 = (int(datetime.now(UTC).timestamp()) // 3600 - 3) * 3600  # three hours ago, whole
AT = datetime.fromtimestamp(T0 + 300, UTC)  # the service's now: within the samples
RFC = "%Y-%m-%dT%H:%M:%SZ"
NAME = "trainer-5d9f-a"


def closed_url() -> str:
    """A Prometheus that is down: a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def fill(
    api: FakeApiServer, app: Any, url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """The full database: two GPU nodes, a Deployment's two pods and a bare one, gpu-1's
    GPUs as its agent reports them, the storage scan's objects, two hours of snapshots
    and their statistics (written while Prometheus had no samples: the issue's blank
    page), three alerts, training lines, last week's report (made without Chromium).
    The ids the routes are asked with."""
    from tests.recorder.test_degrade import report_gpus
    from tests.recorder.test_storage import objects
    from tests.recorder.test_training import fluent_bit, megatron, post

    put_trainer(api, datetime.fromtimestamp(T0 - 7200, UTC).strftime(RFC))
    api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
    api.put("nodes", node("gpu-2", "True", {"nvidia.com/gpu": "4"}, "10.0.0.12"))
    for name in (NAME, "trainer-5d9f-b"):
        p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
        api.put("pods", p)
        api.put("pods", state(p, "Running", True))
    api.put("pods", plain_gpu_pod("c", "gpu-2", "nvidia.com/gpu", 1, "Running"))
    objects(api, AT)
    eventually(
        lambda: recorded(url, 3, 2) and len(rows(url, "gpu_workloads")) == 2,
        timeout=15,
    )
    report_gpus(app)
    app.storage.run_once(AT)
    h = datetime.fromtimestamp(T0, UTC)
    for hour in (h - timedelta(hours=1), h):
        for minute in (10, 40):
            app.jobs.snapshot(hour + timedelta(minutes=minute))
    assert app.writer.flush(10)
    app.jobs.hourly(h + timedelta(hours=1, minutes=5))
    assert app.writer.flush(10)
    alerts = post_alerts(app, AT)
    lines = [megatron(i, 1000.0 + i) for i in range(1, 4)]
    r = post(app, fluent_bit(NAME, lines, [T0 + 60.0 + i for i in range(3)]))
    assert r.status_code == 200, r.text
    monkeypatch.setenv("PATH", str(tmp_path))  # no Chromium: a failed report, at once
    (report,) = app.reports.run(AT)
    monkeypatch.undo()
    assert app.writer.flush(10)
    gpu = next(d for d in rows(url, "node_devices") if d["kind"] == "gpu")
    return {
        "uid": U["trainer"],
        "node": "gpu-1",
        "alert": alerts["GPUXid"],
        "serial": gpu["serial"] or gpu["key"],
        "report": report,
    }


def asks(ids: dict[str, str]) -> list[tuple[str, str]]:
    """Each GET route (as declared) and a request of it; ids: the full database's (on the
    empty one, the routes of one thing answer 404)."""
    h = datetime.fromtimestamp(T0, UTC)
    span = (
        f"start_time={(h - timedelta(hours=2)).strftime(RFC)}&end_time="
        f"{(h + timedelta(hours=2)).strftime(RFC)}"
    )
    g = f"start={T0}&end={T0 + 240}&step=60"
    uid, name = ids.get("uid", "uid-none"), ids.get("node", "gpu-1")
    alert, silence = ids.get("alert", "none"), ids.get("silence", "none")
    dims = "dimension_type=label&dimension_key=app"
    out = [
        ("clusters", ""),
        ("clusters/allocation", f"start={T0 - 7200}&end={T0 + 7200}"),
        ("clusters/consumers", "page_num=1&page_size=10"),
        ("clusters/gpuHeatmap", ""),
        ("clusters/overview", ""),
        ("nodes", "page_num=1&page_size=10&status=&name=&gpu_name=&order_by=&desc=false"),
        ("nodes", "order_by=gpu_utilization&desc=true"),
        ("nodes/fragmentation-analysis", ""),
        ("nodes/gpuAllocation", ""),
        ("nodes/gpuUtilization", ""),
        ("nodes/gpuUtilizationHistory", g),
        ("nodes/load-balance-analysis", ""),
        ("nodes/{name}", ""),
        ("nodes/{name}/fragmentation", ""),
        ("nodes/{name}/gpuDevices", ""),
        ("nodes/{name}/gpuMetrics", g),
        ("nodes/{name}/workloads", "page_num=1&page_size=10"),
        ("nodes/{name}/workloadsHistory", "page_num=1&page_size=10"),
        ("workloadMetadata", ""),
        ("workloads", "page_num=1&page_size=10&name=&namespace=&kind=&order_by=&desc=false"),
        ("workloads/gpuUtilizationHistory", f"kind=Deployment&name=trainer&{g}"),
        ("workloads/hierarchy", "kind=Deployment&name=trainer"),
        ("workloads/statistic", ""),
        ("workloads/statistics", ""),
        ("workloads/{uid}", ""),
        ("workloads/{uid}/hierarchy", ""),
        ("workloads/{uid}/metrics", g),
        ("workloads/{uid}/events", ""),
        ("workloads/{uid}/gpuMetrics", g),
        ("workloads/{uid}/stats", ""),
        ("workloads/{uid}/profiler-files", ""),
        ("tracelens/resource-profiles", ""),
        ("tracelens/sessions", ""),
        ("tracelens/workloads/{workload_uid}/sessions", ""),
        ("tracelens/sessions/{session_id}", ""),
        ("perfetto/sessions/{session_id}", ""),
        ("devices/{serial}/history", ""),
        ("nodes/{name}/devices", ""),
        ("nodes/{name}/devices/changelog", ""),
        ("storage/overview", ""),
        ("storage/volumes", "page_num=1&page_size=10"),
        ("gpu-aggregation/cluster/hourly-stats", span),
        ("gpu-aggregation/clusters", ""),
        ("gpu-aggregation/dimension-keys", f"dimension_type=label&{span}"),
        ("gpu-aggregation/dimension-values", f"{dims}&{span}"),
        ("gpu-aggregation/labels/hourly-stats", f"{dims}&{span}"),
        ("gpu-aggregation/namespaces", span),
        ("gpu-aggregation/namespaces/hourly-stats", span),
        ("gpu-aggregation/snapshots", span),
        ("gpu-aggregation/snapshots/latest", ""),
        ("gpu-aggregation/workloads/hourly-stats", span),
        ("workloads/{uid}/timeline", ""),
        ("workloads/{uid}/trainingPerformance", ""),
        ("weekly-reports/gpu_utilization", ""),
        ("weekly-reports/gpu_utilization/latest", ""),
        ("weekly-reports/gpu_utilization/{id}", ""),
        ("pods/cache", ""),
        ("pods/workload/cache", ""),
        ("alert-rule-advices", "status=pending&offset=0&limit=20"),
        ("alert-rule-advices/summary", ""),
        ("alert-silences", "enabled=true&search=&offset=0&limit=20"),
        ("alert-silences/silenced-alerts", f"silence_id={silence}"),
        ("alert-silences/{id}", ""),
        ("alerts", "alert_name=&offset=0&limit=20"),
        ("alerts/by-cluster", ""),
        ("alerts/summary", ""),
        ("alerts/top-sources", "limit=5"),
        ("alerts/trend", "group_by=hour&hours=24"),
        ("alerts/{id}", ""),
        ("alerts/{id}/correlations", ""),
        ("log-alert-rule-templates", ""),
        ("log-alert-rule-templates/{id}", ""),
        ("log-alert-rules", "search=&offset=0&limit=20"),
        ("log-alert-rules/{id}", ""),
        ("metric-alert-rules", "search=&offset=0&limit=20"),
        ("metric-alert-rules/{id}", ""),
        ("notification-channels", "offset=0&limit=20"),
        ("notification-channels/types", ""),
        ("notification-channels/{id}", ""),
        *MANAGEMENT_ASKS,
    ]
    fills = {
        "{name}": name,
        "{uid}": uid,
        "{serial}": ids.get("serial", "none"),
        "{workload_uid}": uid,
        "{session_id}": "none",
        **MANAGEMENT_FILLS,
    }
    by_route = {
        "alerts/{id}": alert,
        "alerts/{id}/correlations": alert,
        "alert-silences/{id}": silence,
        "weekly-reports/gpu_utilization/{id}": ids.get("report", "none"),
        "log-alert-rule-templates/{id}": "1",
        "log-alert-rules/{id}": "1",
        "metric-alert-rules/{id}": "1",
        "notification-channels/{id}": ids.get("channel", "1"),
        **management_ids(ids),
    }
    got = []
    for route, query in out:
        path = route.replace("{id}", by_route.get(route, "none"))
        for k, v in fills.items():
            path = path.replace(k, v)
        got.append((route, f"{path}?{query}" if query else path))
    return got


@dataclass
class Answers:
    """Each route's 2000 answers (by "METHOD path" as declared), and what was asked."""

    got: dict[str, list[tuple[str, Any]]] = field(default_factory=dict)
    codes: dict[str, set[int]] = field(default_factory=dict)

    def ask(
        self, app: Any, method: str, route: str, path: str, body: Any = None, when: str = ""
    ) -> Any:
        r = requests.request(
            method,
            f"http://127.0.0.1:{app.http.port}/lens/v1/{path}",
            json=body,
            timeout=hang_guard(15),
        )
        answer = r.json()
        key = f"{method} {route}"
        self.codes.setdefault(key, set()).add(answer["meta"]["code"])
        assert answer["meta"]["code"] in (2000, 4004, 5003), (when, path, answer)
        if answer["meta"]["code"] == 2000:
            self.got.setdefault(key, []).append((f"{when} {path}", answer["data"]))
        return answer["data"]


def writes(app: Any, a: Answers, now: datetime) -> dict[str, str]:
    """Every write route of the Alert pages, as the pages send them (their bodies as
    test_alert_pages.py gives them); the ids made."""
    home = app.cfg.recorder.cluster_name

    def w(method: str, route: str, path: str, body: Any = None) -> Any:
        return a.ask(app, method, route, path, body, "write")

    at = now.strftime(RFC)
    ends = (now + timedelta(hours=2)).strftime(RFC)
    quick = w(
        "POST",
        "alert-silences",
        "alert-silences",
        {
            "name": "Quick Silence - GPUXid",
            "silence_type": "alert_name",
            "alert_names": ["GPUXid"],
            "starts_at": at,
            "ends_at": ends,
            "reason": "quick",
            "enabled": True,
        },
    )
    form = {
        "name": "gpu-3 maintenance",
        "description": "",
        "cluster_name": "",
        "enabled": True,
        "silence_type": "resource",
        "label_matchers": [],
        "alert_names": [],
        "resource_filters": [{"resource_type": "node", "operator": "=", "value": "gpu-3"}],
        "starts_at": at,
        "reason": "reboot",
    }
    sid = w("POST", "alert-silences", "alert-silences", form)["silence_id"]
    w("PUT", "alert-silences/{id}", f"alert-silences/{sid}", {**form, "ends_at": ends})
    w("PATCH", "alert-silences/{id}/disable", f"alert-silences/{sid}/disable")
    w("DELETE", "alert-silences/{id}", f"alert-silences/{sid}")
    rule = {
        "name": "gpu-hot",
        "cluster_name": home,
        "enabled": True,
        "description": "hot",
        "groups": [
            {
                "name": "group_1",
                "interval": "30s",
                "rules": [
                    {
                        "alert": "GPUHot",
                        "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
                        "for": "5m",
                        "labels": {"severity": "critical"},
                        "annotations": {"summary": "hot"},
                    }
                ],
            }
        ],
        "labels": {},
    }
    rid = w("POST", "metric-alert-rules", "metric-alert-rules", rule)["rule_id"]
    w("PUT", "metric-alert-rules/{id}", f"metric-alert-rules/{rid}", {"enabled": False})
    copy = w("POST", "metric-alert-rules/{id}/clone", f"metric-alert-rules/{rid}/clone", {})
    w("POST", "metric-alert-rules/sync", "metric-alert-rules/sync", {"cluster": home})
    w("DELETE", "metric-alert-rules/{id}", f"metric-alert-rules/{copy['rule_id']}")
    log = {
        "name": "oom",
        "description": "",
        "cluster_name": "",
        "enabled": True,
        "priority": 50,
        "match_type": "pattern",
        "match_config": {"pattern": "out of memory", "flags": {"case_insensitive": True}},
        "label_selectors": [],
        "severity": "critical",
        "group_wait": 30,
        "repeat_interval": 3600,
        "alert_template": {"title": "OOM", "summary": "OOM"},
    }
    lid = w("POST", "log-alert-rules", "log-alert-rules", log)["rule_id"]
    w("PUT", "log-alert-rules/{id}", f"log-alert-rules/{lid}", {"enabled": False})
    clone = w(
        "POST", "log-alert-rules/{id}/clone", f"log-alert-rules/{lid}/clone", {"name": "oom_copy"}
    )
    w(
        "POST",
        "log-alert-rules/batch-update",
        "log-alert-rules/batch-update",
        {"rule_ids": [lid, clone["rule_id"]], "enabled": True},
    )
    w(
        "POST",
        "log-alert-rules/test",
        "log-alert-rules/test",
        {
            "pattern": "out of (memory)",
            "sample_log": "CUDA Out Of Memory",
            "flags": {"case_insensitive": True, "multi_line": False},
        },
    )
    w("DELETE", "log-alert-rules/{id}", f"log-alert-rules/{clone['rule_id']}")
    mine = w(
        "POST",
        "log-alert-rule-templates",
        "log-alert-rule-templates",
        {
            "name": "mine",
            "category": "custom",
            "description": "",
            "template_config": {
                "match_type": "pattern",
                "match_config": {"pattern": "boom"},
                "severity": "warning",
            },
            "tags": ["x"],
        },
    )
    w(
        "POST",
        "log-alert-rule-templates/{id}/instantiate",
        f"log-alert-rule-templates/{mine['template_id']}/instantiate",
        {"name": "boom-rule", "cluster_name": home},
    )
    w("DELETE", "log-alert-rule-templates/{id}", f"log-alert-rule-templates/{mine['template_id']}")
    w("POST", "alert-rule-advices/refresh", "alert-rule-advices/refresh", {})
    for what in ("status", "apply"):  # there are no advices: 404
        w(
            "POST",
            f"alert-rule-advices/{{id}}/{what}",
            f"alert-rule-advices/1/{what}",
            {"status": "rejected"},
        )
    hook = w(
        "POST",
        "notification-channels",
        "notification-channels",
        {
            "name": "oncall",
            "type": "webhook",
            "enabled": True,
            "description": "",
            "config": {"url": closed_url() + "/hook", "method": "POST", "timeout": 1},
        },
    )
    w("PUT", "notification-channels/{id}", f"notification-channels/{hook['id']}", {"enabled": True})
    w("POST", "notification-channels/{id}/test", f"notification-channels/{hook['id']}/test")
    gone = w(
        "POST",
        "notification-channels",
        "notification-channels",
        {
            "name": "chat",
            "type": "slack",
            "enabled": False,
            "config": {"webhook_url": "https://hooks.slack.example/x"},
        },
    )
    w("DELETE", "notification-channels/{id}", f"notification-channels/{gone['id']}")
    w("POST", "workloads/batchStats", "workloads/batchStats", {"uids": [U["trainer"], "none"]})
    return {
        "silence": quick["silence_id"],
        "channel": str(hook["id"]),
        "log_rule": str(lid),
        **management_writes(app, w, lid),
    }


# the surfaces whose routes are the Primus-Lens API's JSON; the others: the report's and
# the rules' files (not JSON), the seed's plain JSON and the POST routes of what comes in
# (lens-ebpf's own, their answers counts)
TYPED = ("lens", "alerts")


def served() -> set[str]:
    from lens_ebpf.recorder.api import ROUTES

    return {
        f"{r.method} {r.path}"
        for table, _, surface in ROUTES
        if surface in TYPED
        for r in table.routes
    }


def test_every_served_route_has_the_originals_types() -> None:
    """A route served without its types here is a test failure: a new route comes with
    its Go struct's schema (go_types.py)."""
    assert served() - CONTRACT.keys() == set()
    assert CONTRACT.keys() - served() == set()  # none stale


def test_the_schema_catches_a_null_number_and_allows_a_pointer() -> None:
    schema = {"a": NUM, "b": "number?", "c": [STR], "d": TIME, "e": {"*": NUM}, "f": {"g": INT}}
    good = {"a": 1, "b": None, "c": [], "d": None, "e": None, "f": {"g": 2}, "more": None}
    assert violations(good, schema) == []
    assert violations({**good, "a": None}, schema) == ["$.a: null, the original's number"]
    assert violations({**good, "c": None}, schema) == ["$.c: None, not a list"]
    assert violations({**good, "f": None}, schema) == ["$.f: None, not an object"]
    assert violations({**good, "e": {"x": None}}, schema) == [
        "$.e['x']: null, the original's number"
    ]
    assert violations({k: v for k, v in good.items() if k != "a"}, schema) == ["$.a: missing"]


# answered through a real agent: tests/recorder/test_pyspy.py checks their answers against
# CONTRACT (its Client's route=)
AGENT_ROUTES = {
    "POST workloads/{uid}/process-tree",
    "POST pyspy/sample",
    "GET pyspy/tasks",
    "POST pyspy/tasks",
    "GET pyspy/task/{id}",
    "POST pyspy/task/{id}/cancel",
    "GET pyspy/file/{id}",
}


def test_every_routes_answers_have_the_originals_types(
    api: FakeApiServer,
    recorder_app: Any,
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every route of the API, with Prometheus up (its samples), empty (none) and down, on
    an empty and a full database: each answer's fields of a number, string, bool or list
    in the Go struct never null (a pointer's may be), of their type, none missing."""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    up, empty = Prometheus([], openmetrics=openmetrics(T0)), Prometheus([])
    a = Answers()
    try:
        app = recorder_app(
            db_url,
            clock=lambda: AT,
            prometheus__url=up.base,
            alerts__rules_file=str(tmp_path / "rules.yml"),
            profiler__timeout_seconds=1,
        )
        states = {"up": up.base, "empty": empty.base, "down": closed_url()}
        for name, url in states.items():
            app.prom.url = url
            for route, path in asks({}):
                a.ask(app, "GET", route, path, when=f"empty database, Prometheus {name}")
        app.prom.url = empty.base  # the hours are written while it has no samples of them
        ids = fill(api, app, db_url, tmp_path, monkeypatch)
        app.prom.url = up.base
        ids |= writes(app, a, AT)
        for name, url in states.items():
            app.prom.url = url
            app.storage.run_once(AT)  # its claims' usage as Prometheus gives it now
            for route, path in asks(ids):
                a.ask(app, "GET", route, path, when=f"full database, Prometheus {name}")
    finally:
        up.stop()
        empty.stop()
    broken = [
        f"{key} ({when}): {v}"
        for key, answers in sorted(a.got.items())
        for when, data in answers
        for v in violations(data, CONTRACT[key][1])
    ]
    assert broken == [], "\n".join(broken[:40])
    only_errors = {k for k, (source, _) in CONTRACT.items() if source.startswith("404 only")}
    assert served() - only_errors - AGENT_ROUTES - a.got.keys() == set()  # every route answered


def test_hours_without_samples_answer_numbers_and_say_so(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """The issue's blank /statistics/namespace: hourly rows written while Prometheus had
    no samples of their hour answer 0 where the original has a float64 (NamespaceStats.vue
    calls toFixed on them), and meta.message says they are unknown."""
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    empty = Prometheus([])
    try:
        put_trainer(api, datetime.fromtimestamp(T0 - 7200, UTC).strftime(RFC))
        api.put("nodes", node("gpu-1", "True", {"amd.com/gpu": "8"}, "10.0.0.11"))
        for name in (NAME, "trainer-5d9f-b"):
            p = gpu_pod(name, "trainer-5d9f", "amd.com/gpu", 1, "gpu-1")
            api.put("pods", p)
            api.put("pods", state(p, "Running", True))
        app = recorder_app(db_url, clock=lambda: AT, prometheus__url=empty.base)
        eventually(
            lambda: recorded(db_url, 2, 1) and len(rows(db_url, "gpu_workloads")) == 2,
            timeout=15,
        )
        h = datetime.fromtimestamp(T0, UTC)
        for minute in (10, 40):
            app.jobs.snapshot(h + timedelta(minutes=minute))
        assert app.writer.flush(10)
        app.jobs.hourly(h + timedelta(hours=1, minutes=5))
        assert app.writer.flush(10)
        span = f"start_time={h.strftime(RFC)}&end_time={h.strftime(RFC)}"
        for route, fields in (
            ("namespaces", ("avg", "max", "min")),
            ("cluster", ("avg", "max", "min", "p50", "p95")),
            ("workloads", ("avg", "max", "min", "p50", "p95")),
        ):
            r = requests.get(
                f"http://127.0.0.1:{app.http.port}/v1/gpu-aggregation/{route}/"
                f"hourly-stats?{span}",
                timeout=hang_guard(10),
            )
            body = r.json()
            assert r.status_code == 200 and body["meta"]["code"] == 2000, body
            (row,) = body["data"]["data"]
            assert [row[f"{f}_utilization"] for f in fields] == [0.0] * len(fields), row
            message = body["meta"]["message"]
            assert (
                message.startswith("OK; figures unknown, answered as 0: ")
                and "1 of these hours' rows have no GPU samples" in message
            ), message
        # the stored rows keep what is unknown as unknown
        assert rows(db_url, "namespace_gpu_hourly_stats")[0]["avg_utilization"] is None
    finally:
        empty.stop()
