"""The nine Alert pages of the Primus-Lens web UI, their calls replayed as the pages make
them (Web/apps/lens/src/services/alerts: snake_case bodies, offset and limit, "" for an
empty search) against the recorder on SQLite and PostgreSQL: every answer 2000 in the
shape the page reads, the numbers exact; the writes' errors (a duplicate name 409/4002,
a shipped rule or template 403/4003, a bad pattern or URL 400/4001, an unknown id
404/4004); a webhook channel's test and its notifications delivered to a real HTTP
receiver, each alert once per state; the metric rules written where Prometheus reads
them without the Operator's CRD, a file promtool checks."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
import yaml

from lens_ebpf.recorder.alerts.logtemplates import TEMPLATES
from lens_ebpf.recorder.alerts.rules import shipped
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer
from tests.recorder.test_alerts import Sink

SHIPPED_RULES = len(shipped())
TRAINING_RULES = sum(t["training"] for t in TEMPLATES)


def call(app: Any, method: str, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    r = requests.request(
        method,
        f"http://127.0.0.1:{app.http.port}/lens/v1/{path}",
        json=body,
        timeout=hang_guard(15),
    )
    return r.status_code, r.json()


def ok(app: Any, method: str, path: str, body: Any = None) -> Any:
    status, got = call(app, method, path, body)
    assert (status, got["meta"]) == (200, {"code": 2000, "message": "OK"}), (path, got)
    return got["data"]


HTTP = {4001: 400, 4002: 409, 4003: 403, 4004: 404, 4010: 401}


def refused(app: Any, method: str, path: str, body: Any, code: int) -> str:
    status, got = call(app, method, path, body)
    assert (status, got["meta"]["code"], got["data"]) == (HTTP[code], code, None), got
    return str(got["meta"]["message"])


def iso(at: datetime) -> str:
    """As the pages send a time: Date.toISOString()."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"


def post_alerts(app: Any, now: datetime) -> dict[str, str]:
    """Two alerts of the workload bert (a GPU Xid, then its training stalled 60 s later,
    sent as generic webhooks) and one of Prometheus's through the Alertmanager v2 path
    (a node's temperature, 2 h ago); their ids by name."""
    base = f"http://127.0.0.1:{app.http.port}"
    bert = {"workload_uid": "uid-bert", "workload": "bert", "namespace": "ml", "node": "gpu-1"}
    for name, sev, ago in (("GPUXid", "critical", 600), ("TrainingStalled", "high", 540)):
        r = requests.post(
            base + "/v1/alerts/webhook",
            json={
                "alert_name": name,
                "severity": sev,
                "labels": bert,
                "annotations": {"summary": f"{name} on bert"},
                "starts_at": iso(now - timedelta(seconds=ago)),
            },
            timeout=hang_guard(10),
        )
        assert r.status_code == 200 and r.json()["data"]["new"] == 1, r.text
    r = requests.post(
        base + "/api/v2/alerts",
        json=[
            {
                "labels": {"alertname": "HighTemperature", "severity": "warning", "node": "gpu-2"},
                "annotations": {"summary": "gpu-2 is hot"},
                "startsAt": iso(now - timedelta(hours=2)),
            }
        ],
        timeout=hang_guard(10),
    )
    assert r.status_code == 200 and r.json()["data"] == {
        "received": 1,
        "new": 1,
        "resolved": 0,
        "reopened": 0,
        "unchanged": 0,
        "silenced": 0,
        "own": 0,
    }, r.text
    got = ok(app, "GET", "alerts?alert_name=&offset=0&limit=20")["alerts"]
    return {a["alert_name"]: a["id"] for a in got}


def test_the_alert_pages_calls(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    rules_file = tmp_path / "lens-rules.yml"
    app = recorder_app(db_url, alerts__rules_file=str(rules_file))
    home = app.cfg.recorder.cluster_name
    now = datetime.now(UTC)
    ids = post_alerts(app, now)
    assert sorted(ids) == ["GPUXid", "HighTemperature", "TrainingStalled"]

    # -- Overview ------------------------------------------------------------------------------
    assert ok(app, "GET", "alerts/summary") == {
        "critical": {"count": 1, "change": 1},
        "high": {"count": 1, "change": 1},
        "warning": {"count": 1, "change": 0},
        "info": {"count": 0, "change": 0},
    }
    trend = ok(app, "GET", "alerts/trend?group_by=hour&hours=24")
    assert len(trend) == 25 and all(p["timestamp"].endswith(":00:00Z") for p in trend)
    assert [sum(p[s] for p in trend) for s in ("critical", "high", "warning", "info")] == [
        1,
        1,
        1,
        0,
    ]
    assert ok(app, "GET", "alerts/top-sources?limit=5") == [
        {"alert_name": n, "count": 1} for n in ("GPUXid", "HighTemperature", "TrainingStalled")
    ]
    assert ok(app, "GET", "alerts/by-cluster") == [{"cluster_name": home, "count": 3}]
    page = ok(app, "GET", "alerts?severity=critical&status=firing&limit=5")
    assert (page["total"], [a["alert_name"] for a in page["alerts"]]) == (1, ["GPUXid"])
    assert ok(app, "GET", "alert-silences?enabled=true&limit=5") == {
        "data": [],
        "total": 0,
        "offset": 0,
        "limit": 5,
    }

    # -- Events and an event's detail ----------------------------------------------------------
    page = ok(
        app,
        "GET",
        f"alerts?alert_name=bert&starts_after={iso(now - timedelta(hours=1))}" "&offset=0&limit=20",
    )
    assert [a["alert_name"] for a in page["alerts"]] == ["TrainingStalled", "GPUXid"]
    xid = ok(app, "GET", f"alerts/{ids['GPUXid']}")
    assert (
        xid["source"],
        xid["workload_id"],
        xid["workload_name"],
        xid["node_name"],
        xid["ends_at"],
        xid["annotations"],
    ) == ("webhook", "uid-bert", "bert", "gpu-1", None, {"summary": "GPUXid on bert"})
    groups = ok(app, "GET", f"alerts/{ids['GPUXid']}/correlations")["correlations"]
    assert [
        (g["correlation_type"], g["correlation_score"], [a["alert_name"] for a in g["alerts"]])
        for g in groups
    ] == [("causal", 1.0, ["TrainingStalled"])]
    assert ok(app, "GET", f"alerts/{ids['HighTemperature']}/correlations") == {"correlations": []}
    refused(app, "GET", "alerts/nope", None, 4004)
    refused(app, "GET", "alerts?severity=urgent", None, 4001)
    refused(app, "GET", "alerts?starts_after=yesterday", None, 4001)
    quick = ok(
        app,
        "POST",
        "alert-silences",
        {
            "name": "Quick Silence - GPUXid",
            "silence_type": "alert_name",
            "alert_names": ["GPUXid"],
            "starts_at": iso(now),
            "ends_at": iso(now + timedelta(hours=2)),
            "reason": "Quick silence from events list",
            "enabled": True,
        },
    )
    assert quick["alertmanager_id"] is None  # no recorder.alerts.alertmanager_url: kept here
    # the same alert on another node, now: silenced as it comes in
    r = requests.post(
        f"http://127.0.0.1:{app.http.port}/v1/alerts/webhook",
        json={"alert_name": "GPUXid", "severity": "critical", "labels": {"node": "gpu-3"}},
        timeout=hang_guard(10),
    )
    assert r.json()["data"]["silenced"] == 1
    assert ok(app, "GET", "alerts/summary")["critical"] == {"count": 1, "change": 1}

    # -- Silences ------------------------------------------------------------------------------
    page = ok(app, "GET", "alert-silences?enabled=true&search=&offset=0&limit=20")
    assert page["total"] == 1 and page["data"][0]["silenced_count"] == 1
    assert page["data"][0]["alert_names"] == ["GPUXid"] and page["data"][0]["ends_at"]
    form = {
        "name": "gpu-3 maintenance",
        "description": "",
        "cluster_name": "",
        "enabled": True,
        "silence_type": "resource",
        "resource_filters": [{"resource_type": "node", "operator": "=", "value": "gpu-3"}],
        "label_matchers": [],
        "alert_names": [],
        "starts_at": iso(now),
        "reason": "reboot",
    }
    sid = ok(app, "POST", "alert-silences", form)["silence_id"]
    assert ok(app, "GET", f"alert-silences/{sid}")["ends_at"] is None  # permanent
    ok(
        app,
        "PUT",
        f"alert-silences/{sid}",
        {**form, "id": sid, "ends_at": iso(now + timedelta(hours=1))},
    )
    assert ok(app, "GET", f"alert-silences/{sid}")["ends_at"] is not None
    ok(app, "PATCH", f"alert-silences/{sid}/disable")
    assert ok(app, "GET", "alert-silences?enabled=true&offset=0&limit=20")["total"] == 1
    assert ok(app, "DELETE", f"alert-silences/{sid}") == {
        "message": "alert silence deleted successfully"
    }
    refused(app, "GET", f"alert-silences/{sid}", None, 4004)
    refused(app, "POST", "alert-silences", {**form, "silence_type": "mood"}, 4001)
    held = ok(app, "GET", f"alert-silences/silenced-alerts?silence_id={quick['silence_id']}")
    assert [a["alert_name"] for a in held["data"]] == ["GPUXid"]

    # -- Metric rules ---------------------------------------------------------------------------
    page = ok(app, "GET", "metric-alert-rules?search=&offset=0&limit=20")
    assert page["total"] == SHIPPED_RULES and all(r["built_in"] for r in page["data"])
    assert ok(app, "GET", "notification-channels?enabled=true&limit=100")["items"] == []
    body = {
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
                        "annotations": {"summary": "hot", "description": "GPU is hot"},
                    }
                ],
            }
        ],
        "labels": {},
    }
    rid = ok(app, "POST", "metric-alert-rules", body)["rule_id"]
    refused(app, "POST", "metric-alert-rules", body, 4002)
    refused(app, "POST", "metric-alert-rules", {**body, "name": "x", "groups": []}, 4001)
    ok(app, "PUT", f"metric-alert-rules/{rid}", {"enabled": False})  # the table's switch
    one = ok(app, "GET", f"metric-alert-rules/{rid}")
    assert (one["enabled"], one["sync_status"], one["groups"][0]["rules"][0]["for"]) == (
        False,
        "pending",
        "5m",
    )
    ok(app, "PUT", f"metric-alert-rules/{rid}", {**body, "enabled": True})
    copy = ok(app, "POST", f"metric-alert-rules/{rid}/clone", {})["rule_id"]
    assert ok(app, "GET", f"metric-alert-rules/{copy}")["name"] == "gpu-hot-copy"
    built_in = page["data"][0]["id"]
    assert "clone it" in refused(
        app, "PUT", f"metric-alert-rules/{built_in}", {"enabled": False}, 4003
    )
    synced = ok(app, "POST", "metric-alert-rules/sync", {"cluster": home})
    assert (synced["total"], synced["synced"], synced["failed"]) == (2, 2, 0)
    assert "no PrometheusRule CRD" in synced["message"]
    text = rules_file.read_text()
    assert [g["name"] for g in yaml.safe_load(text)["groups"]] == [
        f"group_1 (rule {rid})",
        f"group_1 (rule {copy})",
    ]
    check = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True
    )
    assert check.returncode == 0, check.stdout + check.stderr
    r = requests.get(
        f"http://127.0.0.1:{app.http.port}/v1/metric-alert-rules/rules-file", timeout=hang_guard(10)
    )
    assert (r.status_code, r.text) == (200, text)
    assert ok(app, "GET", f"metric-alert-rules/{rid}")["sync_status"] == "synced"
    ok(app, "DELETE", f"metric-alert-rules/{copy}")
    refused(app, "GET", f"metric-alert-rules/{copy}", None, 4004)

    # -- Log rules -------------------------------------------------------------------------------
    page = ok(app, "GET", "log-alert-rules?search=&offset=0&limit=20")
    assert page["total"] == TRAINING_RULES and page["rules"] == page["data"]
    form = {
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
    lid = ok(app, "POST", "log-alert-rules", form)["rule_id"]
    refused(app, "POST", "log-alert-rules", form, 4002)
    refused(
        app,
        "POST",
        "log-alert-rules",
        {**form, "name": "bad", "match_config": {"pattern": "("}},
        4001,
    )
    ok(app, "PUT", f"log-alert-rules/{lid}", {"enabled": False})
    assert ok(app, "GET", f"log-alert-rules/{lid}")["enabled"] is False
    clone = ok(app, "POST", f"log-alert-rules/{lid}/clone", {"name": "oom_copy"})
    assert ok(app, "GET", f"log-alert-rules/{clone['rule_id']}")["name"] == "oom_copy"
    assert ok(
        app,
        "POST",
        "log-alert-rules/test",
        {
            "pattern": "out of (memory)",
            "sample_log": "CUDA Out Of Memory",
            "flags": {"case_insensitive": True, "multi_line": False},
        },
    ) == {"matched": True, "captures": ["Memory"]}
    page = ok(app, "GET", "log-alert-rules?enabled=false&search=oom&offset=0&limit=20")
    assert [r["name"] for r in page["data"]] == ["oom_copy", "oom"]  # the newest first
    ok(app, "DELETE", f"log-alert-rules/{lid}")

    # -- Templates -----------------------------------------------------------------------------
    templates = ok(app, "GET", "log-alert-rule-templates")
    assert len(templates) == len(TEMPLATES) and all(t["built_in"] for t in templates)
    watchdog = next(t for t in templates if t["name"] == "NCCL-RCCL-Watchdog-Timeout")
    assert (watchdog["category"], watchdog["match_type"], watchdog["severity"]) == (
        "network",
        "pattern",
        "critical",
    )
    assert "Watchdog" in watchdog["match_config"]["pattern"]
    made = ok(
        app,
        "POST",
        f"log-alert-rule-templates/{watchdog['id']}/instantiate",
        {"name": "watchdog-ml", "cluster_name": home},
    )
    assert ok(app, "GET", f"log-alert-rules/{made['rule_id']}")["cluster_name"] == home
    assert ok(app, "GET", f"log-alert-rule-templates/{watchdog['id']}")["usage_count"] == 2
    refused(app, "DELETE", f"log-alert-rule-templates/{watchdog['id']}", None, 4003)

    # -- Rule advices (none are made here) -----------------------------------------------------
    assert ok(app, "GET", "alert-rule-advices?status=pending&offset=0&limit=20") == {
        "data": [],
        "advices": [],
        "total": 0,
        "offset": 0,
        "limit": 20,
    }
    assert ok(app, "GET", "alert-rule-advices/summary")["avg_confidence"] == 0
    assert ok(app, "POST", "alert-rule-advices/refresh", {})["triggered"] is False
    refused(app, "POST", "alert-rule-advices/1/status", {"status": "rejected"}, 4004)

    # -- Channels ---------------------------------------------------------------------------------
    sink = Sink()
    try:
        types = ok(app, "GET", "notification-channels/types")
        assert [t["type"] for t in types] == [
            "webhook",
            "alertmanager",
            "email",
            "dingtalk",
            "wechat",
            "slack",
        ]
        hook = ok(
            app,
            "POST",
            "notification-channels",
            {
                "name": "oncall",
                "type": "webhook",
                "enabled": True,
                "description": "",
                "config": {"url": sink.url, "method": "POST", "timeout": 30},
            },
        )
        refused(
            app,
            "POST",
            "notification-channels",
            {"name": "x", "type": "webhook", "config": {"url": "not a url"}},
            4001,
        )
        refused(
            app,
            "POST",
            "notification-channels",
            {"name": "oncall", "type": "webhook", "config": {"url": sink.url}},
            4002,
        )
        slack = ok(
            app,
            "POST",
            "notification-channels",
            {
                "name": "chat",
                "type": "slack",
                "enabled": True,
                "config": {"webhook_url": "https://hooks.slack.example/x"},
            },
        )
        assert ok(app, "POST", f"notification-channels/{hook['id']}/test") == {
            "success": True,
            "message": "Test notification sent successfully",
        }
        assert sink.got[0]["alert_name"] == "LensTestNotification"
        said = ok(app, "POST", f"notification-channels/{slack['id']}/test")
        assert said["success"] is False and "Alertmanager" in said["message"]
        page = ok(app, "GET", "notification-channels?search=&offset=0&limit=20")
        assert page["total"] == 2 and page["items"] == page["channels"]
        # each alert the last day saw, once per state; the silenced one not
        app.alerts.jobs.notify()
        app.alerts.jobs.notify()
        got = sorted((n["alert_name"], n["status"]) for n in sink.got[1:])
        assert got == [
            ("GPUXid", "firing"),
            ("HighTemperature", "firing"),
            ("TrainingStalled", "firing"),
        ]
        ok(app, "PUT", f"notification-channels/{slack['id']}", {"enabled": False})
        assert ok(app, "GET", "notification-channels?enabled=true&limit=100")["total"] == 1
        assert ok(app, "DELETE", f"notification-channels/{slack['id']}") == {"deleted": True}
        refused(app, "DELETE", f"notification-channels/{slack['id']}", None, 4004)
    finally:
        sink.stop()
