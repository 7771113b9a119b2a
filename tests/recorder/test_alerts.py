"""Alerts that name the workload (issue 59), end to end with the real parts: a real
Prometheus evaluates a rule on a GPU exporter's series and sends its alert to a real
Alertmanager (Debian's 0.25), whose webhook brings it to the recorder; the recorder
stores it once with the workload that held that GPU (through the maps remote write
uses), shows it on the workload's timeline, stores its end; a silence made through the
API is Alertmanager's too and keeps the next notification from being sent, and ending
it lets it go; a Megatron job's NCCL watchdog lines on two ranks fire the shipped log
rule once, which reaches Alertmanager with the workload's labels and, routed back to
the recorder, is not stored twice. A write without the API's token is refused."""

from __future__ import annotations

import http.server
import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.agentproc import free_port
from tests.conftest import hang_guard
from tests.k8slab import FakeApiServer, eventually
from tests.recorder.conftest import rows
from tests.recorder.objects import NS
from tests.recorder.test_remote_write import NVIDIA, Exporter, bert, devices
from tests.recorder.test_training import fluent_bit, metric

API_TOKEN, INGEST_TOKEN = "api-token-59", "ingest-token-59"
FIX = Path(__file__).parent.parent / "fixtures"
HOT = (
    'DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-c2f76b33-7953-256e-8f33-1343419b1a1c",'
    'pci_bus_id="00000000:31:00.0",device="nvidia0",modelName="NVIDIA L4",'
    f'Hostname="{NVIDIA}"}} '
)
RULES = {
    "groups": [
        {
            "name": "gpu",
            "interval": "1s",
            "rules": [
                {
                    "alert": "GPUTooHot",
                    "expr": "DCGM_FI_DEV_GPU_TEMP > 90",
                    "labels": {"severity": "critical"},
                    "annotations": {
                        "summary": "GPU {{ $labels.gpu }} on {{ $labels.Hostname }} is at "
                        "{{ $value }} C"
                    },
                }
            ],
        }
    ]
}


class Sink:
    """A webhook receiver beside the recorder: each notification Alertmanager sends."""

    def __init__(self) -> None:
        self.got: list[dict[str, Any]] = []
        me = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                me.got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def states(self, name: str) -> list[str]:
        """The status of each notification of alert `name`, in order."""
        return [
            a["status"]
            for n in self.got
            for a in n["alerts"]
            if a["labels"].get("alertname") == name
        ]

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def call(
    app: Any, method: str, path: str, body: Any = None, token: str | None = API_TOKEN
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = requests.request(
        method,
        f"http://127.0.0.1:{app.http.port}/v1/{path}",
        json=body,
        headers=headers,
        timeout=hang_guard(15),
    )
    return r.status_code, r.json()


def data(app: Any, method: str, path: str, body: Any = None) -> Any:
    status, got = call(app, method, path, body)
    assert (status, got["meta"]) == (200, {"code": 2000, "message": "OK"}), got
    return got["data"]


def alert_rows(url: str, name: str) -> list[dict[str, Any]]:
    return [r for r in rows(url, "alert_events") if r["alert_name"] == name]


def test_alerts_end_to_end(api: FakeApiServer, recorder_app: Any, tmp_path: Path) -> None:
    from tests.amserver import Alertmanager
    from tests.amserver import available as am_missing
    from tests.promserver import Prometheus
    from tests.promserver import available as prom_missing

    if prom_missing() or am_missing():
        pytest.skip(prom_missing() or am_missing() or "")
    url = f"sqlite:///{tmp_path / 'alerts.db'}"
    (tmp_path / "api").write_text(API_TOKEN + "\n")
    (tmp_path / "ingest").write_text(INGEST_TOKEN + "\n")
    port = free_port()
    sink = Sink()
    am = Alertmanager(
        [
            {
                "url": f"http://127.0.0.1:{port}/v1/alerts/metric",
                "send_resolved": True,
                "http_config": {"authorization": {"type": "Bearer", "credentials": INGEST_TOKEN}},
            },
            {"url": sink.url, "send_resolved": True},
        ]
    )
    exporter = Exporter(f"{HOT}95\n")
    (tmp_path / "rules.yml").write_text(json.dumps(RULES))
    prom = None
    try:
        bert(api)
        app = recorder_app(
            url,
            listen=f"127.0.0.1:{port}",
            remote_write__cache_seconds=3600,
            api__token_file=str(tmp_path / "api"),
            ingest__token_file=str(tmp_path / "ingest"),
            alerts__alertmanager_url=am.url,
            alerts__notify_seconds=3600,
            alerts__findings_seconds=3600,
        )
        eventually(lambda: sum(r["running"] for r in rows(url, "gpu_pods")) == 3, timeout=15)
        devices(app)  # GPU 0 of the NVIDIA node: held by bert-worker-0
        app.remote_write.indexer.refresh()
        uid = next(r["uid"] for r in rows(url, "gpu_workloads") if r["name"] == "bert")
        prom = Prometheus(
            [exporter.target],
            rule_files=[str(tmp_path / "rules.yml")],
            alertmanagers=[f"127.0.0.1:{am.port}"],
        )

        # 1. fired: stored once, with the workload that holds the GPU
        eventually(
            lambda: [r["status"] for r in alert_rows(url, "GPUTooHot")] == ["firing"],
            timeout=hang_guard(60),
        )
        listed = data(app, "GET", "alerts?status=firing&alert_name=bert&offset=0&limit=20")
        assert listed["total"] == 1 and listed["alerts"] == listed["data"]
        a = listed["alerts"][0]
        assert (
            a["source"],
            a["severity"],
            a["workload_id"],
            a["workload_name"],
            a["pod_name"],
            a["node_name"],
        ) == ("metric", "critical", uid, "bert", "bert-worker-0", NVIDIA)
        assert a["ends_at"] is None and a["labels"]["UUID"].startswith("GPU-c2f76b33")
        e = a["enriched_data"]
        assert e["workload_info"] == {
            "uid": uid,
            "name": "bert",
            "namespace": NS,
            "kind": "PyTorchJob",
            "gpu_request": 3,
        }
        assert e["pod_info"]["name"] == "bert-worker-0" and e["gpu_info"]["index"] == 0
        assert e["node_info"]["gpu_count"] == 8
        assert data(app, "GET", f"alerts/{a['id']}") == a
        assert data(app, "GET", "alerts/summary")["critical"] == {"count": 1, "change": 1}
        status, got = call(app, "GET", f"workloads/{uid}/timeline")  # (no Prometheus set)
        assert (status, got["meta"]["code"]) == (200, 2000)
        timeline = got["data"]
        entries = [x for x in timeline["entries"] if x["type"] == "alert"]
        assert [(x["pod"], x["detail"]["alert_name"], x["detail"]["status"]) for x in entries] == [
            ("bert-worker-0", "GPUTooHot", "firing")
        ]

        # 2. resolved: the same row ends
        exporter.text = f"{HOT}31\n"
        eventually(
            lambda: [r["status"] for r in alert_rows(url, "GPUTooHot")] == ["resolved"],
            timeout=hang_guard(60),
        )
        assert alert_rows(url, "GPUTooHot")[0]["ends_at"] is not None
        eventually(lambda: sink.states("GPUTooHot")[-1:] == ["resolved"], timeout=hang_guard(30))
        sent = len(sink.states("GPUTooHot"))

        # 3. a silence made here is Alertmanager's too: the next firing is not sent
        now = datetime.now(UTC)
        made = data(
            app,
            "POST",
            "alert-silences",
            {
                "name": "Silence GPUTooHot",
                "silence_type": "alert_name",
                "alert_names": ["GPUTooHot"],
                "starts_at": now.isoformat(),
                "ends_at": (now + timedelta(hours=2)).isoformat(),
                "reason": "maintenance",
                "enabled": True,
            },
        )
        am_id = made["alertmanager_id"]
        assert am_id and made["alertmanager_error"] is None
        there = {s["id"]: s for s in am.silences()}
        assert there[am_id]["status"]["state"] == "active"
        assert there[am_id]["matchers"] == [
            {"name": "alertname", "value": "GPUTooHot", "isRegex": False, "isEqual": True}
        ]
        exporter.text = f"{HOT}97\n"

        def suppressed() -> bool:
            got = [x for x in am.alerts() if x["labels"]["alertname"] == "GPUTooHot"]
            return (
                bool(got)
                and got[0]["status"]["state"] == "suppressed"
                and got[0]["status"]["silencedBy"] == [am_id]
            )

        eventually(suppressed, timeout=hang_guard(60))
        # Alertmanager flushes the group every second: three more flushes send nothing
        flushed = threading.Event()
        flushed.wait(3)
        assert len(sink.states("GPUTooHot")) == sent
        assert [r["status"] for r in alert_rows(url, "GPUTooHot")] == ["resolved"]
        listed = data(app, "GET", "alert-silences?enabled=true&offset=0&limit=20")
        assert [s["id"] for s in listed["data"]] == [made["silence_id"]]

        # 4. ended now (the page's End now): expired there, the firing sent, the row open again
        data(app, "PATCH", f"alert-silences/{made['silence_id']}/disable")
        assert {s["id"]: s for s in am.silences()}[am_id]["status"]["state"] == "expired"
        eventually(lambda: sink.states("GPUTooHot")[-1:] == ["firing"], timeout=hang_guard(30))
        eventually(
            lambda: [(r["status"], r["fired"]) for r in alert_rows(url, "GPUTooHot")]
            == [("firing", 2)],
            timeout=hang_guard(30),
        )

        # 5. a Megatron job's NCCL watchdog on two ranks: the shipped log rule fires once
        lines = (FIX / "training" / "nccl-timeout.log").read_text().splitlines()
        t = datetime.now(UTC).timestamp()
        for i, pod in enumerate(("bert-worker-0", "bert-worker-1")):
            ranked = [x.replace("rank3", f"rank{i}").replace("Rank 3", f"Rank {i}") for x in lines]
            r = requests.post(
                f"http://127.0.0.1:{port}/logs",
                json=fluent_bit(pod, ranked, [t + i] * len(ranked)),
                headers={"Authorization": f"Bearer {INGEST_TOKEN}"},
                timeout=hang_guard(15),
            )
            assert r.status_code == 200, r.text
        assert app.writer.flush(10)
        logged = alert_rows(url, "NCCLWatchdogTimeout")
        assert [
            (r["source"], r["severity"], r["workload_id"], r["workload_name"]) for r in logged
        ] == [("log", "critical", uid, "bert")]
        assert metric(app, 'lens_recorder_log_rule_lines_total{result="fired"}') == 1
        assert metric(app, 'lens_recorder_log_rule_lines_total{result="suppressed"}') == 7
        app.alerts.jobs.notify()  # (every notify_seconds) our alerts to Alertmanager

        def in_alertmanager() -> dict[str, str] | None:
            got = [x for x in am.alerts() if x["labels"]["alertname"] == "NCCLWatchdogTimeout"]
            return got[0]["labels"] if got else None

        eventually(lambda: in_alertmanager() is not None, timeout=hang_guard(30))
        labels = in_alertmanager() or {}
        assert (
            labels["workload"],
            labels["workload_uid"],
            labels["namespace"],
            labels["severity"],
            labels["lens_alert_id"],
        ) == ("bert", uid, NS, "critical", logged[0]["id"])
        # routed back here by Alertmanager's webhook: taken, not stored again
        eventually(lambda: sink.states("NCCLWatchdogTimeout") == ["firing"], timeout=hang_guard(30))
        eventually(
            lambda: metric(
                app, 'lens_recorder_alerts_received_total{source="metric",' 'outcome="own"}'
            )
            == 1,
            timeout=hang_guard(30),
        )
        assert len(alert_rows(url, "NCCLWatchdogTimeout")) == 1
        sent_rows = [
            r for r in rows(url, "alert_notifications") if r["alert_id"] == logged[0]["id"]
        ]
        assert [(r["channel"], r["status"], r["ok"]) for r in sent_rows] == [
            ("alertmanager", "firing", True)
        ]
        assert (
            metric(
                app,
                'lens_recorder_alert_notifications_total{receiver="alertmanager",' 'result="ok"}',
            )
            == 1
        )  # ours only: Alertmanager's own are not sent back

        # 6. a write without the API's token: 401; with a wrong one: 403; counted
        status, got = call(app, "POST", "alert-silences", {"name": "x"}, token=None)
        assert (status, got["meta"]["code"]) == (401, 4010)
        status, got = call(app, "DELETE", f"alert-silences/{made['silence_id']}", token="nope")
        assert (status, got["meta"]["code"]) == (403, 4003)
        assert (
            metric(
                app, 'lens_recorder_api_writes_refused_total{route="/alert-silences",' 'code="401"}'
            )
            == 1
        )
        assert data(app, "GET", f"alert-silences/{made['silence_id']}")["enabled"] is False
    finally:
        if prom is not None:
            prom.stop()
        am.stop()
        exporter.stop()
        sink.stop()


def test_the_services_findings_become_alerts(
    api: FakeApiServer, recorder_app: Any, db_url: str
) -> None:
    """A training job that stalls (the training events of docs/recorder/training.md):
    the findings job stores TrainingStalled on its workload, once however often it looks,
    and its end once the job progresses again."""
    from tests.recorder.objects import U
    from tests.recorder.test_training import run, started

    t0 = float(int(datetime.now(UTC).timestamp()) // 60 * 60 - 7200)
    clock = [datetime.fromtimestamp(t0, UTC)]
    app = started(
        api,
        recorder_app,
        db_url,
        clock=lambda: clock[0],
        training__check_seconds=3600,
        alerts__findings_seconds=3600,
    )
    last = run(app, 1, [1.0] * 60, t0)  # iterations 1..60 at 1.0 s
    clock[0] = datetime.fromtimestamp(last + 6, UTC)
    assert app.training.check(clock[0]) == 1  # no progress for five medians
    assert app.writer.flush(10)
    app.alerts.jobs.findings()
    app.alerts.jobs.findings()
    (stall,) = alert_rows(db_url, "TrainingStalled")
    assert (
        stall["source"],
        stall["severity"],
        stall["status"],
        stall["workload_id"],
        stall["workload_name"],
        stall["ends_at"],
    ) == ("lens", "critical", "firing", U["bert"], "bert", None)
    assert stall["starts_at"].replace(tzinfo=UTC).timestamp() == last
    run(app, 61, [7.0], last)  # progress again: the stall ends
    assert app.writer.flush(10)
    app.alerts.jobs.findings()
    (stall,) = alert_rows(db_url, "TrainingStalled")
    assert stall["status"] == "resolved"
    assert stall["ends_at"].replace(tzinfo=UTC).timestamp() == last + 7.0
    outcomes = {
        k: metric(app, f'lens_recorder_alerts_received_total{{source="lens",' f'outcome="{k}"}}')
        for k in ("new", "unchanged", "resolved")
    }
    # new: the stall, then the slowdown iteration 61 was (7 s); unchanged: the second look
    assert outcomes == {"new": 2.0, "unchanged": 1.0, "resolved": 1.0}
    assert [r["status"] for r in alert_rows(db_url, "TrainingSlowdown")] == ["firing"]
