"""A report as one self-contained HTML file (inline CSS and SVG, no script, no font or image
fetched), and its PDF printed by headless Chromium."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from html import escape
from pathlib import Path
from typing import Any

from lens_ebpf.recorder.errors import Unavailable
from lens_ebpf.recorder.reports import charts

PDF_TIMEOUT = 120.0  # seconds Chromium may take to print one report

CSS = """
body { font-family: Helvetica, Arial, sans-serif; color: #1f2430; margin: 24px; font-size: 13px; }
h1 { font-size: 22px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 8px;
  border-bottom: 1px solid #d9dde3; padding-bottom: 3px; }
.sub { color: #5b6270; margin-bottom: 14px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; }
.card { border: 1px solid #d9dde3; border-radius: 6px; padding: 8px 12px; min-width: 120px; }
.card b { display: block; font-size: 18px; } .card span { color: #5b6270; font-size: 11px; }
table { border-collapse: collapse; width: 100%; margin: 4px 0; }
th, td { text-align: left; padding: 3px 6px; border-bottom: 1px solid #eceff3; }
th { background: #f4f6f8; } td.n, th.n { text-align: right; }
.up { color: #b3261e; } .down { color: #1e7b45; } .none { color: #5b6270; }
@media print { body { margin: 0; } h2 { break-after: avoid; } svg, table { break-inside: avoid; } }
"""


def _n(v: Any, digits: int = 1, unit: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{digits}f}{unit}"
    return f"{v}{unit}"


def _delta(v: Any, unit: str = "") -> str:
    if v is None:
        return "<span class='none'>n/a</span>"
    cls = "up" if v > 0 else "down" if v < 0 else "none"
    return f"<span class='{cls}'>{v:+,.1f}{unit}</span>"


def _table(head: list[str], rows: list[list[str]], numeric: set[int]) -> str:
    if not rows:
        return "<p class='none'>None this week.</p>"
    th = "".join(
        f"<th class='{'n' if i in numeric else ''}'>{escape(h)}</th>" for i, h in enumerate(head)
    )
    body = "".join(
        "<tr>"
        + "".join(f"<td class='{'n' if i in numeric else ''}'>{c}</td>" for i, c in enumerate(row))
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def html(c: dict[str, Any]) -> str:
    """The report as one HTML document."""
    e = escape
    parts = [*_head(c), *_usage(c), *_events(c), *_compared(c)]
    if c["notes"]:
        parts.append(
            "<h2>Notes</h2><ul>" + "".join(f"<li>{e(n)}</li>" for n in c["notes"]) + "</ul>"
        )
    parts.append(
        "<p class='sub'>Made by the lens-ebpf recorder from its own records and "
        "Prometheus; GPU-hours are GPUs allocated times the hours their pods ran.</p>"
        "</body></html>"
    )
    return "\n".join(parts)


def _head(c: dict[str, Any]) -> list[str]:
    """The title, the week and the summary's cards."""
    s = c["summary"]
    e = escape
    cards = [
        ("GPUs", _n(s["total_gpus"])),
        ("GPU-hours allocated", _n(s["total_gpu_hours"])),
        ("GPU-hours used", _n(s["used_gpu_hours"])),
        ("Idle GPU-hours", _n(s["idle_gpu_hours"])),
        ("Allocation", _n(s["avg_allocation"], unit="%")),
        ("Utilization", _n(s["avg_utilization"], unit="%")),
        ("GPU faults", _n(c["gpu_faults"]["count"])),
        ("Device changes", _n(c["device_changes"]["count"])),
    ]
    return [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>GPU utilization report {e(c['cluster_name'])} {e(c['week'])}</title>",
        f"<style>{CSS}</style></head><body>",
        f"<h1>GPU utilization report: {e(c['cluster_name'])}</h1>",
        f"<div class='sub'>Week {e(c['week'])}: {e(c['period']['start'])} to "
        f"{e(c['period']['end'])} ({e(c['period']['timezone'])} days)</div>",
        "<div class='cards'>"
        + "".join(f"<div class='card'><b>{v}</b><span>{e(k)}</span></div>" for k, v in cards)
        + "</div>",
    ]


def _usage(c: dict[str, Any]) -> list[str]:
    """Allocation and utilization by day, GPU-hours by namespace and by label."""
    e = escape
    daily = c["daily"]
    day_chart = charts.daily_bars(
        [d["date"] for d in daily],
        [
            ("Allocation %", charts.BLUE, [d["allocation"] for d in daily]),
            ("Utilization %", charts.GREEN, [d["utilization"] for d in daily]),
        ],
    )
    ns_chart = charts.hour_bars(
        [
            (
                n["namespace"],
                n["gpu_hours"],
                n["used_gpu_hours"] if n["utilization"] is not None else None,
            )
            for n in c["namespaces"][:15]
        ]
    )
    parts = [
        "<h2>Allocation and utilization by day</h2>",
        day_chart,
        _table(
            ["Day", "GPUs", "GPU-hours allocated", "used", "allocation", "utilization"],
            [
                [
                    e(d["date"]),
                    _n(d["gpus"]),
                    _n(d["gpu_hours"]),
                    _n(d["used_gpu_hours"]),
                    _n(d["allocation"], unit="%"),
                    _n(d["utilization"], unit="%"),
                ]
                for d in daily
            ],
            {1, 2, 3, 4, 5},
        ),
        "<h2>GPU-hours by namespace</h2>",
        ns_chart,
        _table(
            ["Namespace", "GPU-hours allocated", "used", "idle", "utilization"],
            [
                [
                    e(n["namespace"]),
                    _n(n["gpu_hours"]),
                    _n(n["used_gpu_hours"]),
                    _n(n["idle_gpu_hours"]),
                    _n(n["utilization"], unit="%"),
                ]
                for n in c["namespaces"]
            ],
            {1, 2, 3, 4},
        ),
    ]
    if c["labels"]:
        parts += [
            "<h2>GPU-hours by label</h2>",
            _table(
                ["Label", "Value", "GPU-hours allocated", "used", "utilization"],
                [
                    [
                        e(x["key"]),
                        e(x["value"]),
                        _n(x["gpu_hours"]),
                        _n(x["used_gpu_hours"]),
                        _n(x["utilization"], unit="%"),
                    ]
                    for x in c["labels"]
                ],
                {2, 3, 4},
            ),
        ]
    return parts


def _events(c: dict[str, Any]) -> list[str]:
    """The idlest workloads, GPU faults, device changes, training slowdowns and stalls."""
    e = escape
    return [
        "<h2>Workloads with the most idle GPU-hours</h2>",
        _table(
            ["Workload", "Kind", "GPUs", "GPU-hours", "idle", "utilization"],
            [
                [
                    e(f"{w['namespace']}/{w['name']}"),
                    e(w["kind"]),
                    _n(w["gpus"]),
                    _n(w["gpu_hours"]),
                    _n(w["idle_gpu_hours"]),
                    _n(w["utilization"], unit="%"),
                ]
                for w in c["top_idle_workloads"]
            ],
            {2, 3, 4, 5},
        ),
        f"<h2>GPU faults ({c['gpu_faults']['count']})</h2>",
        _table(
            ["Time", "Node", "GPU", "Fault", "Workloads hit"],
            [
                [
                    e(f["at"]),
                    e(f["node"]),
                    _n(f["gpu_index"]),
                    e(" ".join(x for x in (f["fault"], f["code"], f["message"]) if x)),
                    e(", ".join(f["workloads"]) or "none"),
                ]
                for f in c["gpu_faults"]["items"]
            ],
            set(),
        ),
        f"<h2>Device changes ({c['device_changes']['count']})</h2>",
        _table(
            ["Time", "Node", "Device", "Field", "From", "To", "Workloads on the node"],
            [
                [
                    e(d["at"]),
                    e(d["node"]),
                    e(f"{d['kind']} {d['slot']}"),
                    e(d["field"]),
                    e(d["old_value"]),
                    e(d["new_value"]),
                    e(", ".join(d["workloads"]) or "none"),
                ]
                for d in c["device_changes"]["items"]
            ],
            set(),
        ),
        "<h2>Training slowdowns and stalls ("
        + ", ".join(
            f"{k.removeprefix('training_')}: {n}" for k, n in c["training"]["counts"].items()
        )
        + ")</h2>",
        _table(
            ["Time", "Kind", "Workload", "Pod", "Iteration", "Seconds", "Median"],
            [
                [
                    e(t["at"]),
                    e(t["kind"].removeprefix("training_")),
                    e(f"{t['namespace']}/{t['workload']}"),
                    e(t["pod"] or "all"),
                    _n(t["iteration"]),
                    _n(t["value"], 2),
                    _n(t["baseline"], 2),
                ]
                for t in c["training"]["items"]
            ],
            {4, 5, 6},
        ),
    ]


def _compared(c: dict[str, Any]) -> list[str]:
    """The week's figures against the week before."""
    s, ch, prev = c["summary"], c["change"], c["previous_week"]["summary"]
    e = escape
    compared = [
        ("GPU-hours allocated", "total_gpu_hours", ""),
        ("GPU-hours used", "used_gpu_hours", ""),
        ("Idle GPU-hours", "idle_gpu_hours", ""),
        ("Allocation", "avg_allocation", "%"),
        ("Utilization", "avg_utilization", "%"),
        ("Workloads", "workloads", ""),
        ("Low-utilization workloads", "low_util_count", ""),
    ]
    return [
        "<h2>Against the week before</h2>",
        _table(
            ["Figure", "This week", "Week before", "Change"],
            [
                [e(name), _n(s[k], unit=u), _n(prev[k], unit=u), _delta(ch[k], u)]
                for name, k, u in compared
            ],
            {1, 2, 3},
        ),
    ]


class ChromiumMissing(Unavailable):
    """No Chromium to print the PDF with."""


def chromium_args(chromium: str, profile: str, *more: str) -> list[str]:
    """Headless, and nothing fetched or kept beyond the page: no sync, no updates."""
    return [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *more,
    ]


def find_chromium(chromium: str) -> str:
    found = shutil.which(chromium)
    if found is None:
        raise ChromiumMissing(
            f"{chromium!r} not found on PATH: the PDF needs headless "
            "Chromium (Debian's chromium package; recorder.reports."
            "chromium names another); the HTML and JSON are served"
        )
    return found


def pdf(document: str, chromium: str = "chromium") -> bytes:
    """The HTML document printed to PDF by headless Chromium."""
    exe = find_chromium(chromium)
    with tempfile.TemporaryDirectory(prefix="lens-report-") as tmp:
        page, out = Path(tmp) / "report.html", Path(tmp) / "report.pdf"
        page.write_text(document, encoding="utf-8")
        args = chromium_args(
            exe,
            str(Path(tmp) / "profile"),
            f"--print-to-pdf={out}",
            "--no-pdf-header-footer",
            page.as_uri(),
        )
        try:
            res = subprocess.run(args, capture_output=True, text=True, timeout=PDF_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise Unavailable(f"chromium: no PDF within {PDF_TIMEOUT:.0f} s") from None
        if res.returncode != 0 or not out.exists() or out.stat().st_size == 0:
            tail = (res.stderr or res.stdout).strip().splitlines()[-1:] or ["no output"]
            raise Unavailable(f"chromium exited {res.returncode}: {tail[0][:300]}")
        return out.read_bytes()


def screenshot(page: Path, png: Path, chromium: str = "chromium", size: str = "1200,1600") -> None:
    """A PNG of an HTML file as headless Chromium draws it (the docs' example, the tests)."""
    exe = find_chromium(chromium)
    with tempfile.TemporaryDirectory(prefix="lens-report-") as tmp:
        args = chromium_args(
            exe,
            str(Path(tmp) / "profile"),
            f"--screenshot={png}",
            f"--window-size={size}",
            "--hide-scrollbars",
            page.resolve().as_uri(),
        )
        res = subprocess.run(args, capture_output=True, text=True, timeout=PDF_TIMEOUT)
        if res.returncode != 0 or not png.exists():
            raise Unavailable(f"chromium exited {res.returncode}: {res.stderr[-300:]}")
