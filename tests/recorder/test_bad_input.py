"""Bad input against the recorder (issue 69), on SQLite and PostgreSQL: what a client
sends is answered 4xx naming the field, never 5xx, never with SQL, a traceback or the
driver's words; a pattern cannot hold the service (RE2); channel credentials never leave
it; a metric rule Prometheus would refuse is refused before it is stored (the rules file
stays valid); one odd series or alert does not cost its batch's others."""

from __future__ import annotations

import http.server
import json
import logging
import subprocess
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from sqlalchemy import create_engine

from lens_ebpf.recorder.gen import remote_write_v1_pb2 as pb1
from lens_ebpf.recorder.gen import remote_write_v2_pb2 as pb2
from lens_ebpf.recorder.remote_write import wire
from lens_ebpf.recorder.store import schema
from tests import pglab
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer
from tests.recorder.conftest import rows
from tests.recorder.objects import NS, U
from tests.recorder.test_faults import metric
from tests.recorder.test_remote_write import NVIDIA, V1, Receiver, started
from tests.recorder.test_training import fluent_bit

# what no answer may hold: a statement, a traceback, the driver's or SQLAlchemy's words
LEAKS = (
    "SELECT",
    "INSERT",
    "Traceback",
    "psycopg",
    "sqlalchemy",
    "sqlite3",
    "Background on",
    "connection to server",
    'File "',
)
# (a+)+$ on a's then one other character: Python's re tries every split of the a's (27 took
# 6 s and each more doubles it); RE2 answers in microseconds
PATHOLOGICAL = "(a+)+$"
SLOW = "a" * 30 + "!"


def call(
    app: Any,
    method: str,
    path: str,
    body: Any = None,
    data: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any, str]:
    """(status, the JSON answer, its text): the text checked for what must not leak."""
    r = requests.request(
        method,
        f"http://127.0.0.1:{app.http.port}{path}",
        json=body,
        data=data,
        headers=headers,
        timeout=hang_guard(15),
    )
    assert not any(leak in r.text for leak in LEAKS), (path, r.text)
    try:
        got = r.json()
    except ValueError:
        got = None
    return r.status_code, got, r.text


def ok(app: Any, method: str, path: str, body: Any = None) -> Any:
    status, got, text = call(app, method, f"/v1/{path}", body)
    assert status == 200 and got["meta"]["code"] == 2000, (path, text)
    return got["data"]


def refused(
    app: Any, method: str, path: str, body: Any, *said: str, data: bytes | None = None
) -> str:
    """400/4001 (or the seed's 400 {"error"}), its message holding each of said."""
    headers = {"Content-Type": "application/json"} if data is not None else None
    status, got, text = call(app, method, path, body, data, headers)
    message = got["meta"]["message"] if "meta" in got else got["error"]
    assert status == 400, (path, text)
    assert "meta" not in got or got["meta"]["code"] == 4001, (path, text)
    assert all(s in message for s in said), (path, said, message)
    return str(message)


LOG_RULE = {
    "name": "r",
    "cluster_name": "",
    "enabled": True,
    "match_type": "pattern",
    "match_config": {"pattern": "oom"},
    "label_selectors": [],
    "severity": "warning",
    "alert_template": {"summary": "s"},
}


# -- (3) one regular expression cannot freeze the service ------------------------------------
def test_a_pathological_pattern_cannot_hold_the_service(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    # the rule tester (each call bounded by the hang guard: Python's re would take minutes)
    assert ok(
        app, "POST", "log-alert-rules/test", {"pattern": PATHOLOGICAL, "sample_log": SLOW}
    ) == {"matched": False, "captures": []}
    assert ok(
        app,
        "POST",
        "log-alert-rules/test",
        {"pattern": "(a+)+!$", "sample_log": SLOW, "flags": {"case_insensitive": True}},
    ) == {"matched": True, "captures": ["a" * 30]}
    # saved as a log rule (and as a label selector's regex): every line goes through it
    ok(
        app,
        "POST",
        "log-alert-rules",
        {**LOG_RULE, "name": "slow", "match_config": {"pattern": PATHOLOGICAL}},
    )
    ok(
        app,
        "POST",
        "log-alert-rules",
        {
            **LOG_RULE,
            "name": "slow-selector",
            "label_selectors": [{"key": "pod", "operator": "=~", "value": PATHOLOGICAL}],
        },
    )
    app.alerts.log_rules.invalidate()
    line = fluent_bit(SLOW, [SLOW, "a" * 30], [time.time(), time.time()])
    for rec in line:
        rec["kubernetes"]["namespace_name"] = NS
    status, got, text = call(
        app,
        "POST",
        "/logs",
        data=json.dumps(line).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert status == 200 and got["data"]["lines"] == 2, text
    assert app.alerts.log_rules.counts.matched == 1  # "aaa...a" matches (a+)+$, SLOW not
    # a silence's regex matcher, tried on every alert that comes in
    ok(
        app,
        "POST",
        "alert-silences",
        {
            "name": "slow",
            "silence_type": "label",
            "label_matchers": [{"name": "x", "operator": "=~", "value": PATHOLOGICAL}],
        },
    )
    status, got, text = call(
        app, "POST", "/v1/alerts/webhook", {"alert_name": "Slow", "labels": {"x": SLOW}}
    )
    assert status == 200 and got["data"]["silenced"] == 0, text
    status, got, text = call(
        app,
        "POST",
        "/v1/alerts/webhook",
        {"alert_name": "Slow", "labels": {"x": "a" * 30, "y": "1"}},
    )
    assert status == 200 and got["data"]["silenced"] == 1, text


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        (r"(a)\1", r"invalid escape sequence: \1"),  # a backreference
        ("a(?=b)", "invalid perl operator: (?="),  # look-ahead
        ("(?<!a)b", "invalid perl operator: (?<"),  # look-behind
    ],
)
def test_syntax_re2_refuses_is_400_naming_the_field(
    api: FakeApiServer, recorder_app: Any, tmp_path: Path, pattern: str, reason: str
) -> None:
    app = recorder_app(f"sqlite:///{tmp_path / 'r.db'}")
    refused(
        app,
        "POST",
        "/v1/log-alert-rules/test",
        {"pattern": pattern, "sample_log": "ab"},
        "pattern=",
        reason,
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules",
        {**LOG_RULE, "match_config": {"pattern": pattern}},
        "match_config.pattern=",
        reason,
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules",
        {**LOG_RULE, "label_selectors": [{"key": "pod", "operator": "=~", "value": pattern}]},
        "label_selectors[0].value=",
        reason,
    )
    refused(
        app,
        "POST",
        "/v1/alert-silences",
        {
            "name": "s",
            "silence_type": "label",
            "label_matchers": [
                {"name": "x", "operator": "=", "value": "y"},
                {"name": "x", "operator": "!~", "value": pattern},
            ],
        },
        "label_matchers[1].value=",
        reason,
    )
    refused(
        app,
        "POST",
        "/v1/alert-silences",
        {
            "name": "s",
            "silence_type": "resource",
            "resource_filters": [{"resource_type": "pod", "operator": "=~", "value": pattern}],
        },
        "resource_filters[0].value=",
        reason,
    )
    assert rows(f"sqlite:///{tmp_path / 'r.db'}", "alert_silences") == []


# -- (4) channel secrets never leave ---------------------------------------------------------
class Hook:
    """A webhook receiver that keeps each request's path and Authorization header."""

    def __init__(self) -> None:
        self.got: list[tuple[str, str]] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers["Content-Length"]))
                me.got.append((self.path, self.headers.get("Authorization", "")))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SECRETS = (
    "hunter2",
    "ding-secret",
    "ding-token",
    "wechat-secret",
    "tok-123",
    "pw-in-url",
    "url-tok",
)


def test_channel_secrets_never_leave(api: FakeApiServer, recorder_app: Any, db_url: str) -> None:
    app = recorder_app(db_url)
    hook = Hook()
    try:
        configs = {
            "email": {
                "smtp_host": "smtp.example",
                "smtp_port": 587,
                "from": "a@example",
                "username": "alerts",
                "password": "hunter2",
            },
            "dingtalk": {
                "webhook_url": "https://oapi.dingtalk.com/robot/send?" "access_token=ding-token",
                "secret": "ding-secret",
            },
            "wechat": {"corp_id": "ww1", "agent_id": 1000002, "secret": "wechat-secret"},
            "webhook": {
                "url": f"http://bob:pw-in-url@127.0.0.1:{hook.port}/hook?token=url-tok",
                "headers": {"Authorization": "Bearer tok-123", "Content-Type": "application/json"},
                "timeout": 5,
            },
        }
        made = {}
        for kind, cfg in configs.items():
            status, got, text = call(
                app,
                "POST",
                "/v1/notification-channels",
                {"name": kind, "type": kind, "config": cfg},
            )
            assert status == 200 and not any(s in text for s in SECRETS), text
            made[kind] = got["data"]
        shown = made["webhook"]["config"]
        assert shown == {
            "url": f"http://<secret>@127.0.0.1:{hook.port}/hook?token=<secret>",
            "headers": {"Authorization": "<secret>", "Content-Type": "application/json"},
            "timeout": 5,
        }
        assert made["email"]["config"]["password"] == "<secret>"
        assert made["email"]["config"]["username"] == "alerts"
        assert made["dingtalk"]["config"] == {
            "webhook_url": "https://oapi.dingtalk.com/<secret>",
            "secret": "<secret>",
        }
        # every read: the list, each channel, the answer to an update
        reads = [
            "/v1/notification-channels?limit=100",
            "/api/notification-channels",
            *(f"/lens/v1/notification-channels/{c['id']}" for c in made.values()),
        ]
        for path in reads:
            status, _, text = call(app, "GET", path)
            assert status == 200 and not any(s in text for s in SECRETS), text
        # the edit form sends back what it was shown: the stored values are kept
        for kind, c in made.items():
            status, _, text = call(
                app,
                "PUT",
                f"/v1/notification-channels/{c['id']}",
                {"name": kind, "type": kind, "description": "edited", "config": c["config"]},
            )
            assert status == 200 and not any(s in text for s in SECRETS), text
        stored = {r["type"]: r for r in rows(db_url, "notification_channels")}
        assert {k: stored[k]["config"] for k in configs} == configs
        assert all(r["description"] == "edited" for r in stored.values())
        # and a changed one (a new password) is taken; <secret> inside a value not shown so
        # is refused, not stored
        email = {**made["email"]["config"], "password": "new-pw"}
        ok(app, "PUT", f"notification-channels/{made['email']['id']}", {"config": email})
        refused(
            app,
            "PUT",
            f"/v1/notification-channels/{made['webhook']['id']}",
            {"config": {**shown, "url": "http://<secret>@elsewhere/hook"}},
            "config.url",
            "<secret>",
        )
        refused(
            app,
            "POST",
            "/v1/notification-channels",
            {"name": "new", "type": "dingtalk", "config": made["dingtalk"]["config"]},
            "config.webhook_url",
            "<secret>",
        )
        stored = {r["type"]: r for r in rows(db_url, "notification_channels")}
        assert stored["email"]["config"]["password"] == "new-pw"
        assert stored["webhook"]["config"] == configs["webhook"]
        # the webhook is sent with its real credentials: the header, the URL's query
        said = ok(app, "POST", f"notification-channels/{made['webhook']['id']}/test")
        assert said["success"] is True, said
        assert hook.got == [("/hook?token=url-tok", "Bearer tok-123")]
        # a failure's message names the URL without them
        hook.stop()
        said = ok(app, "POST", f"notification-channels/{made['webhook']['id']}/test")
        assert said["success"] is False and "<secret>" in said["message"], said
        assert not any(s in json.dumps(said) for s in SECRETS), said
    finally:
        hook.stop()


# -- (7) bad input is a 4xx, never a 5xx ------------------------------------------------------
def test_bad_parameters_are_400_naming_them(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    big = "9223372036854775808"  # one past a BIGINT
    cases = [
        ("/v1/alerts?alert_name=%00", "'alert_name'", "NUL"),
        ("/v1/alerts?offset=" + big, "offset=", "out of range"),
        ("/v1/alerts?limit=1" + "0" * 30, "limit=", "out of range"),
        ("/v1/alerts?pageNum=9223372036854775807&pageSize=20", "pageNum=", "from 1 to"),
        ("/v1/nodes?page_num=9223372036854775807&page_size=1000", "page_num=", "from 1 to"),
        ("/v1/alerts/%00x", "'id'", "NUL"),
        ("/v1/notification-channels/" + big, "id=", "out of range"),
        ("/v1/log-alert-rules?search=a%00b", "'search'", "NUL"),
        ("/v1/alert-silences/x%00", "'id'", "NUL"),
        ("/v1/nodes?name=%00", "'name'", "NUL"),
        ("/v1/nodes/gpuUtilizationHistory?start=" + big + "&end=1", "start=", "out of range"),
        ("/workloads?namespace=%00", "'namespace'", "NUL"),
        ("/pods?since=1e308", "since=", "out of range"),
        ("/pods?since=inf", "since=", "out of range"),
        ("/pods?since=99999999999999d", "since=", "further back"),
        ("/pods?name=%00", "'name'", "NUL"),
    ]
    for path, *said in cases:
        refused(app, "GET", path, None, *said)
    # a write's path and query too, before anything is read or written
    refused(app, "PUT", "/v1/log-alert-rules/" + big, {"enabled": False}, "id=", "out of range")
    refused(app, "POST", "/v1/alerts/webhook?x=%00", {"alert_name": "a"}, "'x'", "NUL")
    assert ok(app, "GET", "alerts?offset=9223372036854775807&limit=1")["alerts"] == []


def nested(depth: int, inner: Any = "x") -> Any:
    for _ in range(depth):
        inner = [inner]
    return inner


def deep(body: Any, depth: int) -> bytes:
    """body as JSON, its "<deep>" a list nested depth deep (past what json.dumps writes)."""
    return json.dumps(body).encode().replace(b'"<deep>"', b"[" * depth + b'"x"' + b"]" * depth)


def test_bad_bodies_are_400_naming_the_field(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    silence = {"name": "s", "silence_type": "alert_name", "alert_names": ["A"]}
    refused(
        app,
        "POST",
        "/v1/alert-silences",
        None,
        "reason",
        "nested deeper than",
        data=deep({**silence, "reason": "<deep>"}, 1000),
    )
    refused(app, "POST", "/v1/alert-silences", {**silence, "name": "a\x00b"}, "name", "NUL")
    refused(
        app,
        "POST",
        "/v1/alert-silences",
        {**silence, "alert_names": ["A", "B\x00"]},
        "alert_names[1]",
        "NUL",
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules",
        {**LOG_RULE, "priority": 2**63},
        "priority=",
        "out of range",
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules",
        {**LOG_RULE, "priority": "99999999999"},
        "priority=",
        "out of range",
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules",
        {
            **LOG_RULE,
            "match_config": {"pattern": "x", "threshold": {"count": 2, "time_window": "9" * 5000}},
        },
        "match_config.threshold.time_window",
        "a duration",
    )
    refused(
        app,
        "POST",
        "/v1/log-alert-rules/batch-update",
        {"rule_ids": [1, "99999999999999999999999"], "enabled": True},
        "rule_ids[1]",
        "out of range",
    )
    # JSON has no infinity: a number past a double's range is not taken
    status, got, text = call(
        app,
        "POST",
        "/v1/notification-channels",
        data=b'{"name": 1e400}',
        headers={"Content-Type": "application/json"},
    )
    assert status == 400 and "not JSON" in got["meta"]["message"], text
    assert rows(db_url, "alert_silences") == []
    assert not [r for r in rows(db_url, "log_alert_rules") if r["name"] == LOG_RULE["name"]]
    # POST /logs: a body nested past any parser's depth, a record nested past Python's
    # recursion where it is read (its time), a NUL in its pod: the rest of it taken
    too_deep = b"[" * 5000 + b"]" * 5000
    status, got, text = call(
        app, "POST", "/logs", data=too_deep, headers={"Content-Type": "application/json"}
    )
    assert status == 400 and "not a JSON array of records" in got["meta"]["message"], text
    good = fluent_bit("bert-worker-0", ["a line"], [time.time()])[0]
    records = [
        good,
        {**good, "date": "<deep>"},
        {**good, "kubernetes": {**good["kubernetes"], "pod_name": "p\x00"}},
    ]
    status, got, text = call(
        app, "POST", "/logs", data=deep(records, 900), headers={"Content-Type": "application/json"}
    )
    assert status == 200 and (got["data"]["lines"], got["data"]["malformed"]) == (1, 2), text
    lines = b"\n".join(
        [
            json.dumps(good).encode(),
            b"[" * 3000 + b"]" * 3000,
            deep({**good, "date": "<deep>"}, 900),
        ]
    )
    status, got, text = call(
        app, "POST", "/logs", data=b"{}\n" + lines, headers={"Content-Type": "application/json"}
    )
    assert status == 200 and got["data"]["lines"] == 1, text


def alert(name: str, **over: Any) -> dict[str, Any]:
    return {
        "status": "firing",
        "labels": {"alertname": name, "severity": "warning", "node": "gpu-1"},
        "annotations": {"summary": name},
        "startsAt": "2026-01-01T00:00:00Z",
        "endsAt": "0001-01-01T00:00:00Z",
        **over,
    }


def test_an_alertmanager_batch_keeps_its_good_alerts(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    app = recorder_app(db_url)
    body = {
        "version": "4",
        "status": "firing",
        "receiver": "lens",
        "groupKey": "{}:{}",
        "commonLabels": {"severity": "warning"},
        "commonAnnotations": {},
        "alerts": [
            alert("GoodOne"),
            alert("Disk\x00Full", annotations={"summary": "a\x00b"}),
            alert("BadTime", startsAt="yesterday"),
            alert("x" * 300),
            alert("GoodTwo", fingerprint="f" * 65),
            alert("Deep", annotations={"summary": "s", "more": nested(40)}),
            alert("GoodThree", labels={"alertname": "GoodThree", "pod": "p" * 400}),
        ],
    }
    status, got, text = call(app, "POST", "/v1/alerts/metric", body)
    assert status == 400 and got["meta"]["code"] == 4001, text
    message = got["meta"]["message"]
    assert message.startswith("4 of 7 alerts refused, the others stored: "), message
    assert got["data"]["refused"] == [
        "alerts[2] (alertname='BadTime'): startsAt='yesterday': an RFC 3339 time is required",
        f"alerts[3] (alertname='{'x' * 55}...'): " "labels.alertname: longer than 253 characters",
        "alerts[4] (alertname='GoodTwo'): fingerprint: longer than 64 characters",
        "alerts[5] (alertname='Deep'): annotations.more" + "[0]" * 30 + ": nested deeper "
        "than 32 levels",
    ]
    assert (got["data"]["received"], got["data"]["new"]) == (7, 3)
    stored = {r["alert_name"]: r for r in rows(db_url, "alert_events")}
    assert sorted(stored) == ["Disk\ufffdFull", "GoodOne", "GoodThree"]
    assert stored["Disk\ufffdFull"]["annotations"] == {"summary": "a\ufffdb"}
    assert stored["GoodThree"]["pod_name"] == "p" * 253  # cut to its column: stored
    assert (
        metric(app, 'lens_recorder_alerts_received_total{source="metric",outcome="refused"}') == 4
    )
    # sent again (Alertmanager's next group_interval): the stored ones unchanged
    status, got, _ = call(app, "POST", "/v1/alerts/metric", body)
    assert status == 400 and (got["data"]["new"], got["data"]["unchanged"]) == (0, 3)
    # a generic webhook's NUL: made storable
    status, got, text = call(
        app, "POST", "/v1/alerts/webhook", {"alert_name": "N\x00", "labels": {"a": "\x00"}}
    )
    assert status == 200 and got["data"]["new"] == 1, text
    assert ok(app, "GET", "alerts?alert_name=N")["alerts"][0]["labels"]["a"] == "\ufffd"


@pytest.fixture()
def pg(postgres: pglab.Postgres) -> pglab.Postgres:
    return postgres


def test_an_outage_is_503_logged_once(
    api: FakeApiServer, recorder_app: Any, pg: pglab.Postgres, caplog: pytest.LogCaptureFixture
) -> None:
    url = pg.create_database("bad_input_outage")
    app = recorder_app(url)
    assert ok(app, "GET", "alerts")["total"] == 0
    caplog.set_level(logging.INFO)
    pg.stop()
    try:
        for _ in range(3):
            for method, path, body in (
                ("POST", "/v1/alerts/metric", {"alerts": [alert("A")]}),
                ("POST", "/api/v2/alerts", [alert("B")]),
                ("GET", "/v1/alerts", None),
                ("GET", "/v1/alert-silences", None),
                ("POST", "/v1/log-alert-rules", LOG_RULE),
                ("GET", "/workloads", None),
            ):
                status, got, text = call(app, method, path, body)
                assert status == 503, (path, text)
                assert got.get("error", "").startswith("database unavailable") or (
                    got["meta"]["code"],
                    got["meta"]["message"],
                ) == (5003, "database unavailable: OperationalError"), (path, text)
    finally:
        pg.start()
    assert ok(app, "GET", "alerts")["total"] == 0
    said = [r for r in caplog.records if r.name.startswith("lens_ebpf.recorder.api")]
    assert [(r.levelname, r.getMessage()) for r in said] == [
        (
            "WARNING",
            "recorder: the database is unavailable to requests (OperationalError); "
            "they are answered 503 until it is back",
        ),
        ("INFO", "recorder: the database answers requests again (18 answered 503 " "meanwhile)"),
    ]
    assert not [
        r
        for r in caplog.records
        if r.exc_info and r.name.startswith(("lens_ebpf.core.http", "lens_ebpf.recorder.api"))
    ]  # no traceback per request


# -- (8) metric rules Prometheus would refuse are refused ------------------------------------
RULE = {
    "name": "gpu-hot",
    "enabled": True,
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
                    "annotations": {"summary": "{{ $labels.gpu }} is hot"},
                }
            ],
        }
    ],
}


def with_rule(**over: Any) -> dict[str, Any]:
    g = RULE["groups"][0]
    return {**RULE, "groups": [{**g, "rules": [{**g["rules"][0], **over}]}]}


def test_metric_rules_are_checked_before_they_are_stored(
    api: FakeApiServer, recorder_app: Any, db_url: str, tmp_path: Path
) -> None:
    rules_file = tmp_path / "lens-rules.yml"
    app = recorder_app(db_url, alerts__rules_file=str(rules_file))
    at = "groups[0].rules[0]"
    for over, said in (
        (
            {"expr": "up == (("},
            f"{at}.expr: could not parse expression: unclosed left " "parenthesis",
        ),
        (
            {"expr": "rate(up[5m]) > bogus(up)"},
            f"{at}.expr: could not parse expression: " "unknown function with name 'bogus'",
        ),
        ({"for": "soon"}, f'{at}.for: not a valid duration string: "soon"'),
        ({"for": "5"}, f'{at}.for: not a valid duration string: "5"'),
        ({"keep_firing_for": "1.5h"}, f"{at}.keep_firing_for: not a valid duration string"),
        ({"labels": {"gpu-model": "x"}}, f"{at}.labels: invalid label name: gpu-model"),
        (
            {"annotations": {"summary": "{{ $labels.gpu "}},
            f"{at}.annotations.summary: " "template: unclosed action",
        ),
    ):
        refused(app, "POST", "/v1/metric-alert-rules", with_rule(**over), said)
    refused(
        app,
        "POST",
        "/v1/metric-alert-rules",
        {**RULE, "groups": [{**RULE["groups"][0], "interval": "soon"}]},
        'groups[0].interval: not a valid duration string: "soon"',
    )
    refused(
        app,
        "POST",
        "/v1/metric-alert-rules",
        {**RULE, "groups": RULE["groups"] * 2},
        'groups[1].name: groupname: "g" is ' "repeated in the same file",
    )
    rid = ok(app, "POST", "metric-alert-rules", RULE)["rule_id"]
    refused(
        app,
        "PUT",
        f"/v1/metric-alert-rules/{rid}",
        with_rule(expr="up == (("),
        "could not parse expression",
    )
    assert ok(app, "GET", f"metric-alert-rules/{rid}")["groups"] == RULE["groups"]
    # a rule stored before these checks: left out of the file, its sync failed, saying why
    eng = create_engine(db_url)
    try:
        with eng.begin() as conn:
            now = datetime.now(UTC)
            conn.execute(
                schema.metric_alert_rules.insert().values(
                    name="legacy",
                    cluster_name=app.cfg.recorder.cluster_name,
                    enabled=True,
                    groups=with_rule(expr="up == ((", **{"for": "soon"})["groups"],
                    description="",
                    labels={},
                    built_in=False,
                    sync_status="pending",
                    sync_message="",
                    created_by="old",
                    created_at=now,
                    updated_at=now,
                )
            )
    finally:
        eng.dispose()
    synced = ok(app, "POST", "metric-alert-rules/sync", {})
    assert (synced["synced"], synced["failed"]) == (1, 1), synced
    legacy = next(r for r in ok(app, "GET", "metric-alert-rules?search=legacy")["data"])
    assert legacy["sync_status"] == "failed"
    assert legacy["sync_message"].startswith("left out of the rules file: groups[0]")
    groups = yaml.safe_load(rules_file.read_text())["groups"]
    assert [g["name"] for g in groups] == [f"g (rule {rid})"]
    promtool_checks(rules_file)


def promtool_checks(path: Path) -> None:
    """Prometheus's own check of a rules file (Debian's promtool: scripts/setup.sh test)."""
    try:
        check = subprocess.run(
            ["promtool", "check", "rules", str(path)],
            capture_output=True,
            text=True,
            timeout=hang_guard(30),
        )
    except FileNotFoundError:
        pytest.skip("promtool is not installed (scripts/setup.sh test installs prometheus)")
    assert check.returncode == 0, check.stdout + check.stderr


# -- (9) remote write: an odd series does not cost its request's others ----------------------
def series(labels: dict[str, str], value: float = 1.0) -> bytes:
    ts = pb1.TimeSeries()
    for k in sorted(labels):
        ts.labels.add(name=k, value=labels[k])
    ts.samples.add(value=value, timestamp=int(time.time() * 1000))
    return wire.field(0x0A, ts.SerializeToString())


GOOD = {
    "__name__": "DCGM_FI_DEV_GPU_UTIL",
    "Hostname": NVIDIA,
    "UUID": "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",
}


def test_remote_write_keeps_the_good_samples_of_a_batch(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    receiver = Receiver()
    try:
        app = started(api, recorder_app, db_url, remote_write__url=receiver.url)
        # a label value no GPU index is (a superscript two, 5,000 digits): no pod, not an
        # error; the good series beside them copied, the request 204
        odd = [
            series({"__name__": "DCGM_FI_DEV_GPU_TEMP", "Hostname": NVIDIA, "gpu": v})
            for v in ("²", "9" * 5000, "٣")
        ]
        status, _, text = call(
            app, "POST", "/prometheus", data=wire.snappy(b"".join([*odd, series(GOOD)])), headers=V1
        )
        assert status == 204, text
        ((_, body),) = receiver.got
        (copy,) = pb1.WriteRequest.FromString(wire.unsnappy(body, 1 << 20)).timeseries
        assert {lb.name: lb.value for lb in copy.labels}["workload_uid"] == U["bert"]
        # a series that cannot be read (a label's bytes not UTF-8): left out and named,
        # the rest written, the request 400 (not sent again: what it would send is written)
        bad = wire.field(
            0x0A,
            wire.field(0x0A, wire.field(0x0A, b"__name__") + wire.field(0x12, b"up\xff"))
            + wire.field(0x12, b"\x09" + b"\x00" * 8),
        )
        status, got, text = call(
            app,
            "POST",
            "/prometheus",
            data=wire.snappy(series(GOOD, 2.0) + bad + series(GOOD, 3.0)),
            headers=V1,
        )
        assert status == 400, text
        assert got["meta"]["message"] == (
            "1 series left out, the rest written: series 1 "
            '{__name__="up\ufffd"}: Error parsing message with '
            "type 'prometheus.TimeSeries'"
        ), text
        sent = pb1.WriteRequest.FromString(wire.unsnappy(receiver.got[-1][1], 1 << 20))
        assert [s.value for ts in sent.timeseries for s in ts.samples] == [2.0, 3.0]
        assert metric(app, "lens_recorder_remote_write_series_invalid_total") == 1
        # 2.0: a reference past the symbols table is that series', the rest written, and
        # the headers say what was
        req = pb2.Request(symbols=["", *(x for kv in GOOD.items() for x in kv)])
        for refs in ([1, 2, 3, 4, 5, 6], [1, 2, 3, 99], [1, 2, 3, 4, 5, 6]):
            req.timeseries.add(labels_refs=refs).samples.add(
                value=5.0, timestamp=int(time.time() * 1000)
            )
        v2 = {
            **V1,
            "Content-Type": "application/x-protobuf;proto=io.prometheus.write.v2.Request",
            "X-Prometheus-Remote-Write-Version": "2.0.0",
        }
        r = requests.post(
            f"http://127.0.0.1:{app.http.port}/prometheus",
            headers=v2,
            data=wire.snappy(req.SerializeToString()),
            timeout=hang_guard(10),
        )
        assert r.status_code == 400, r.text
        assert (
            'series 1 {__name__="DCGM_FI_DEV_GPU_UTIL"}: a label, exemplar or metadata '
            "reference past the symbols table" in r.json()["meta"]["message"]
        )
        assert r.headers["X-Prometheus-Remote-Write-Samples-Written"] == "2"
        got2 = pb2.Request.FromString(wire.unsnappy(receiver.got[-1][1], 1 << 20))
        assert len(got2.timeseries) == 2
    finally:
        receiver.stop()
