"""The weekly GPU utilization report: exact figures for a week of known pods and a real
Prometheus, its PDF and HTML as Chromium prints and draws them, the routes, the CLI, the
scheduled job, and Chromium missing."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import zlib
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy import create_engine

from lens_ebpf.recorder import cli
from lens_ebpf.recorder.errors import BadRequest
from lens_ebpf.recorder.prom import Prom
from lens_ebpf.recorder.reports import content, render, week, weekly
from lens_ebpf.recorder.scope import Scope
from lens_ebpf.recorder.store import schema as t
from lens_ebpf.recorder.store.writer import upgrade
from tests.conftest import hang_guard
from tests.recorder.test_cluster_api import conforms

H = timedelta(hours=1)
WEEK = week.containing(datetime.now(UTC)).before()  # Prometheus keeps 15 days
MON = WEEK.start
NOW = WEEK.end + 10 * H  # Monday 10:00 after it: its report is due (09:00)
# pod: (uid, namespace, name, node, GPUs, start, end, workload uid, utilization %)
PODS = [
    ("pa", "train", "w1-0", "n1", 4, MON, MON + 48 * H, "w1", 25.0),
    ("pb", "infer", "b", "n1", 2, MON + 36 * H, MON + 42 * H, None, 50.0),
    ("pc", "train", "w2-0", "n2", 1, MON - 12 * H, MON + 12 * H, "w2", 100.0),
]
WORKLOADS = [("w1", "w1", {"team": "ml"}), ("w2", "w2", {"team": "research"})]
OPTS = content.Options(label_keys=("team",), top_n=10, low_utilization=30.0)
ITEM = {
    "id": "string",
    "cluster_name": "string",
    "period_start": "string",
    "period_end": "string",
    "generated_at": "string",
    "status": "string",
    "has_html": "boolean",
    "has_pdf": "boolean",
    "has_json": "boolean",
    "metadata": {
        "cluster_name": "string",
        "week": "string",
        "avg_utilization": "number",
        "avg_allocation": "number",
        "total_gpus": "integer",
        "low_util_count": "integer",
        "wasted_gpu_days": "number",
        "total_gpu_hours": "number",
    },
    "error_message": "string",
}
# WeeklyReportsListResponse; WeeklyReportDetailResponse is ITEM with json_content beside
LIST = {"total": "integer", "page": "integer", "size": "integer", "reports": [ITEM]}


@pytest.fixture(scope="module")
def prometheus() -> Iterator[Any]:
    from tests.promserver import Prometheus, available

    if available():
        pytest.skip(available())
    lines = ["# TYPE gpu_utilization gauge"]
    for _uid, ns, pod, node, _g, start, end, _w, util in PODS:
        at = start + timedelta(minutes=5)
        while at < end:
            lines.append(
                f'gpu_utilization{{namespace="{ns}",pod="{pod}",node="{node}",'
                f'gpu_id="0"}} {util} {int(at.timestamp())}'
            )
            at += timedelta(minutes=10)
    lines.sort(key=lambda s: int(s.rsplit(" ", 1)[1]) if not s.startswith("#") else 0)
    prom = Prometheus([], openmetrics="\n".join(lines) + "\n# EOF\n")
    yield prom
    prom.stop()


def seed(url: str, cluster: str = "local") -> None:
    """The week's pods, workloads, snapshots, faults, device changes and training events."""
    eng = create_engine(url)
    upgrade(eng, cluster)
    with eng.begin() as conn:
        for uid, name, labels in WORKLOADS:
            conn.execute(
                t.gpu_workloads.insert(),
                {
                    "cluster": cluster,
                    "uid": uid,
                    "api_version": "batch/v1",
                    "kind": "Job",
                    "namespace": "train",
                    "name": name,
                    "gpu_request": 0,
                    "gpu_resources": {},
                    "labels": labels,
                    "updated_at": MON,
                    "created_at": MON - 24 * H,
                },
            )
        for uid, ns, pod, node, gpus, start, end, wl, _u in PODS:
            conn.execute(
                t.gpu_pods.insert(),
                {
                    "cluster": cluster,
                    "uid": uid,
                    "namespace": ns,
                    "name": pod,
                    "node": node,
                    "gpus": gpus,
                    "gpu_resources": {"amd.com/gpu": gpus},
                    "phase": "Succeeded",
                    "workload_uid": wl,
                    "created_at": start,
                    "started_at": start,
                    "ended_at": end,
                    "updated_at": end,
                },
            )
        conn.execute(
            t.allocation_snapshots.insert(),
            [
                {
                    "cluster": cluster,
                    "at": MON + timedelta(days=d, hours=12),
                    "node": "",
                    "allocatable": 8,
                    "requested": 0,
                    "rate": 0.0,
                }
                for d in range(7)
            ],
        )
        conn.execute(
            t.node_events.insert(),
            {
                "cluster": cluster,
                "node": "n1",
                "seq": 1,
                "at": MON + 6 * H,
                "kind": "gpu_fault",
                "payload": {
                    "gpu_index": 3,
                    "fault": "xid",
                    "code": "79",
                    "message": "GPU has fallen off the bus",
                },
            },
        )
        conn.execute(
            t.device_changelog.insert(),
            {
                "cluster": cluster,
                "at": MON + 37 * H,
                "node": "n1",
                "kind": "gpu",
                "slot": "0000:1b:00.0",
                "device_key": "GPU-1",
                "field": "firmware_version",
                "old_value": "1.0",
                "new_value": "1.1",
            },
        )
        conn.execute(
            t.training_events.insert(),
            {
                "cluster": cluster,
                "workload_uid": "w1",
                "namespace": "train",
                "workload": "w1",
                "kind": "training_slowdown",
                "at": MON + 8 * H,
                "iteration": 120,
                "value": 3.0,
                "baseline": 1.5,
                "detail": {},
            },
        )
    eng.dispose()


def scope(prometheus: Any, cluster: str = "local") -> Scope:
    return Scope(cluster, Prom(prometheus.base, 10, 11000))


def test_weeks_and_when_a_report_is_due() -> None:
    w = week.parse("2026-W47")
    assert (w.start, w.end) == (
        datetime(2026, 11, 16, tzinfo=UTC),
        datetime(2026, 11, 23, tzinfo=UTC),
    )
    berlin = week.parse("2026W47", "Europe/Berlin")
    assert berlin.start == datetime(2026, 11, 15, 23, tzinfo=UTC)
    assert w.before().name == "2026-W46" and week.parse("2026-W01").before().name == "2025-W52"
    # due Monday 09:00 after the week: before it, the week before that
    assert week.due(datetime(2026, 11, 23, 9, tzinfo=UTC), "monday", 9).name == "2026-W47"
    assert week.due(datetime(2026, 11, 23, 8, 59, tzinfo=UTC), "monday", 9).name == "2026-W46"
    assert week.due(datetime(2026, 11, 26, tzinfo=UTC), "wednesday", 0).name == "2026-W47"
    for bad, why in (
        ("2026-47", "ISO week"),
        ("2026-W54", "has no week 54"),
        ("last week", "ISO week"),
    ):
        with pytest.raises(BadRequest, match=why):
            week.parse(bad)
    with pytest.raises(BadRequest, match="IANA"):
        assert week.parse("2026-W47", "Mars/Olympus").start


def test_figures_exact_for_a_week_of_known_pods(prometheus: Any, db_url: str) -> None:
    seed(db_url)
    eng = create_engine(db_url)
    with eng.connect() as conn:
        made = weekly.make(conn, scope(prometheus), WEEK, NOW, OPTS, chromium=None)
    eng.dispose()
    c = made.content
    assert made.id == f"rpt_{MON:%Y%m%d}_local" and made.pdf is None and not made.error
    # A: 4 GPUs x 48 h at 25%; B: 2 x 6 h at 50%; C: 1 x 12 h (of 24) at 100%
    assert c["summary"] == {
        "total_gpus": 8,
        "capacity_gpu_hours": 1344.0,
        "total_gpu_hours": 216.0,
        "used_gpu_hours": 66.0,
        "idle_gpu_hours": 150.0,
        "avg_allocation": 16.07,
        "avg_utilization": 30.56,
        "workloads": 3,
        "pods": 3,
        "low_util_count": 1,
        "wasted_gpu_days": 6.25,
    }
    days = [
        (d["gpu_hours"], d["used_gpu_hours"], d["allocation"], d["utilization"]) for d in c["daily"]
    ]
    assert (
        days
        == [(108.0, 36.0, 56.25, 33.33), (108.0, 30.0, 56.25, 27.78)] + [(0.0, 0.0, 0.0, None)] * 5
    )
    assert [d["date"] for d in c["daily"]][0] == MON.date().isoformat()
    assert c["namespaces"] == [
        {
            "namespace": "train",
            "gpu_hours": 204.0,
            "used_gpu_hours": 60.0,
            "idle_gpu_hours": 144.0,
            "utilization": 29.41,
        },
        {
            "namespace": "infer",
            "gpu_hours": 12.0,
            "used_gpu_hours": 6.0,
            "idle_gpu_hours": 6.0,
            "utilization": 50.0,
        },
    ]
    assert [(x["key"], x["value"], x["gpu_hours"], x["utilization"]) for x in c["labels"]] == [
        ("team", "ml", 192.0, 25.0),
        ("team", "research", 12.0, 100.0),
    ]
    assert [
        (w["namespace"], w["name"], w["kind"], w["gpus"], w["idle_gpu_hours"])
        for w in c["top_idle_workloads"]
    ] == [
        ("train", "w1", "Job", 4, 144.0),
        ("infer", "b", "Pod", 2, 6.0),
        ("train", "w2", "Job", 1, 0.0),
    ]
    (fault,) = c["gpu_faults"]["items"]
    assert (
        c["gpu_faults"]["count"],
        fault["node"],
        fault["gpu_index"],
        fault["code"],
        fault["workloads"],
    ) == (1, "n1", 3, "79", ["train/w1"])
    (change,) = c["device_changes"]["items"]
    assert (change["field"], change["old_value"], change["new_value"], change["workloads"]) == (
        "firmware_version",
        "1.0",
        "1.1",
        ["infer/b", "train/w1"],
    )
    assert c["training"]["counts"] == {"training_slowdown": 1, "training_stalled": 0}
    assert c["training"]["items"][0]["workload"] == "w1"
    # the week before: C's other 12 h at 100%
    prev = c["previous_week"]["summary"]
    assert (prev["total_gpu_hours"], prev["used_gpu_hours"], prev["avg_utilization"]) == (
        12.0,
        12.0,
        100.0,
    )
    assert c["change"]["total_gpu_hours"] == 204.0 and c["change"]["avg_utilization"] == -69.44
    assert c["notes"] == []
    assert c["chart_data"]["cluster_usage_trend"]["series"][1]["data"][:2] == [33.33, 27.78]
    assert "216.0" in c["markdown_report"]
    html = made.html
    assert (
        html.count("<svg") == 2
        and "<script" not in html
        and "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    )


def distinct_bytes(png: bytes) -> int:
    """Distinct byte values of a PNG's pixel data (one colour gives a handful)."""
    pos, data = 8, b""
    while pos < len(png):
        n, kind = struct.unpack(">I4s", png[pos : pos + 8])
        if kind == b"IDAT":
            data += png[pos + 8 : pos + 8 + n]
        pos += 12 + n
    return len(set(zlib.decompress(data)))


def test_pdf_holds_the_numbers_and_chromium_draws_the_charts(
    prometheus: Any, tmp_path: Path
) -> None:
    if shutil.which("chromium") is None or shutil.which("pdftotext") is None:
        pytest.skip(
            "Debian's chromium and poppler-utils are not installed "
            "(scripts/setup.sh test installs them)"
        )
    url = f"sqlite:///{tmp_path / 'r.db'}"
    seed(url)
    eng = create_engine(url)
    with eng.connect() as conn:
        made = weekly.make(conn, scope(prometheus), WEEK, NOW, OPTS)
    eng.dispose()
    assert made.pdf is not None and made.pdf.startswith(b"%PDF") and not made.error
    (tmp_path / "report.pdf").write_bytes(made.pdf)
    text = subprocess.run(
        ["pdftotext", "-layout", str(tmp_path / "report.pdf"), "-"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for figure in (
        "216.0",
        "66.0",
        "150.0",
        "16.1%",
        "30.6%",
        "train/w1",
        WEEK.name,
        "GPU has fallen off the bus",
        "firmware_version",
    ):
        assert figure in text, figure
    page, png = tmp_path / "report.html", tmp_path / "report.png"
    page.write_text(made.html)
    render.screenshot(page, png)
    print(f"the report as Chromium draws it: {png}")
    body = png.read_bytes()
    assert body.startswith(b"\x89PNG") and distinct_bytes(body) > 32


def test_routes_job_once_and_chromium_missing(
    prometheus: Any, recorder_app: Any, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed(db_url)
    app = recorder_app(
        db_url,
        clock=lambda: NOW,
        prometheus__url=prometheus.base,
        reports__weekly=False,
        aggregation__label_keys=["team"],
    )
    assert "weekly_report" not in [j.name for j in app.jobs_to_run()]
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium on it
    assert app.reports.run(NOW) == [f"rpt_{MON:%Y%m%d}_local"]
    assert app.writer.flush(10)
    assert app.reports.run(NOW) == []  # made once
    restarted = weekly.job_for(app.cfg.recorder, app.engine, app.writer, app.clusters.scopes)
    assert restarted.run(NOW + 3 * H) == []  # after a restart too: the row says it is made
    monkeypatch.undo()
    base = f"http://127.0.0.1:{app.http.port}/v1/weekly-reports/gpu_utilization"

    def lens(path: str) -> Any:
        r = requests.get(base + path, timeout=hang_guard(5))
        body = r.json()
        assert r.status_code == 200 and body["meta"]["code"] == 2000, body
        return body["data"]

    got = lens("?page=1&page_size=20&cluster_name=local")
    assert conforms(got, LIST), got
    (item,) = got["reports"]
    rid = item["id"]
    assert (got["total"], got["page"], got["size"]) == (1, 1, 20)
    assert (item["status"], item["has_html"], item["has_pdf"], item["has_json"]) == (
        "failed",
        True,
        False,
        True,
    )
    assert "chromium" in item["error_message"] and "not found on PATH" in item["error_message"]
    assert (item["period_start"], item["period_end"]) == (
        MON.strftime("%Y-%m-%d"),
        (WEEK.end - H).strftime("%Y-%m-%d"),
    )
    assert item["metadata"]["total_gpu_hours"] == 216.0 and item["metadata"]["low_util_count"] == 1
    detail = lens(f"/{rid}")
    assert conforms({k: v for k, v in detail.items() if k != "json_content"}, ITEM), detail
    assert detail["json_content"]["summary"]["used_gpu_hours"] == 66.0
    assert lens("/latest?cluster=local")["id"] == rid
    assert lens("?status=generated")["total"] == 0
    html = requests.get(f"{base}/{rid}/html", timeout=hang_guard(5))
    assert html.status_code == 200 and html.headers["Content-Type"].startswith("text/html")
    assert "GPU utilization report: local" in html.text
    raw = requests.get(f"{base}/{rid}/json", timeout=hang_guard(5))
    assert raw.json()["summary"]["total_gpu_hours"] == 216.0
    assert "attachment" in raw.headers["Content-Disposition"]
    pdf = requests.get(f"{base}/{rid}/pdf", timeout=hang_guard(5)).json()
    assert pdf["meta"]["code"] == 4004 and "no PDF content" in pdf["meta"]["message"]
    missing = requests.get(f"{base}/rpt_nope", timeout=hang_guard(5)).json()
    assert missing["meta"]["code"] == 4004
    bad = requests.get(f"{base}?page=0", timeout=hang_guard(5))
    assert bad.status_code == 400 and "page" in bad.json()["meta"]["message"]
    # kept recorder.reports.keep_weeks (104) after its week ended, then pruned, counted
    before = app.jobs.pruned["gpu_usage_weekly_reports"]
    app.jobs.prune(WEEK.end + timedelta(weeks=104) - H)
    assert app.writer.flush(10) and lens("")["total"] == 1
    app.jobs.prune(WEEK.end + timedelta(weeks=104) + H)
    assert app.writer.flush(10) and lens("")["total"] == 0
    assert app.jobs.pruned["gpu_usage_weekly_reports"] - before == 1


def test_the_longest_bars_label_stays_inside_the_chart() -> None:
    """A bar's "allocated / used" label goes after the bar, or inside its end where the
    chart's edge would cut it."""
    import re

    from lens_ebpf.recorder.reports import charts

    svg = charts.hour_bars([("ns-a", 6096.0, 4627.2), ("ns-b", 10.0, 5.0)], width=720)
    labels = re.findall(r"<text x='([\d.]+)' y='[\d.]+'( text-anchor='end')?>([^<]*h[^<]*)</", svg)
    assert [(anchor != "", text) for _, anchor, text in labels] == [
        (True, "6096 h / 4627.2 used"),
        (False, "10 h / 5 used"),
    ]
    for x, anchor, text in labels:
        end = float(x) if anchor else float(x) + charts.CHAR_W * len(text)
        assert end <= 720, (text, end)


def test_cli_writes_the_same_report(
    prometheus: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    seed(url)
    monkeypatch.setenv("LENS_RECORDER__PROMETHEUS__URL", prometheus.base)
    monkeypatch.setenv("LENS_RECORDER__AGGREGATION__LABEL_KEYS", '["team"]')
    out = tmp_path / "week.json"
    assert (
        cli.main(
            ["report", "--week", WEEK.name, "--format", "json", "-o", str(out), "--database", url]
        )
        == 0
    )
    got = json.loads(out.read_text())
    eng = create_engine(url)
    with eng.connect() as conn:
        want = weekly.make(conn, scope(prometheus), WEEK, NOW, OPTS, chromium=None).content
    eng.dispose()
    assert got == json.loads(json.dumps(want)) and got["summary"]["total_gpu_hours"] == 216.0
    html = tmp_path / "week.html"
    assert cli.main(["--database", url, "report", "--week", WEEK.name, "-o", str(html)]) == 0
    assert "216.0" in html.read_text()
    assert cli.main(["report", "--week", "2026-47", "--database", url]) != 0
    assert "expected an ISO week" in capsys.readouterr().err
    monkeypatch.setenv("PATH", str(tmp_path))
    assert (
        cli.main(
            [
                "report",
                "--week",
                WEEK.name,
                "--format",
                "pdf",
                "-o",
                str(tmp_path / "w.pdf"),
                "--database",
                url,
            ]
        )
        != 0
    )
    assert "not found on PATH" in capsys.readouterr().err
