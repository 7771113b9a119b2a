"""One analysis of PyTorch profiler traces by HolisticTraceAnalysis (PyPI
`holistictraceanalysis`, which reads exactly these Kineto traces): per rank, the temporal
breakdown of the GPU's time into computation, non-computation (communication and memory
kernels) and idle, and the communication kernels' own time (HTA's kernel breakdown, its
top kernels and the others of each type); the communication-computation overlap; the
kernel types' and the longest kernels' time; and the busiest rank (the one the others
wait on in a collective).

HTA and pandas run in a child process (`python -m lens_ebpf.recorder.profiler.analysis DIR`,
its JSON on stdout): their memory goes with it, a trace that breaks them breaks only it,
and a timeout ends it. html() draws a result as one self-contained page (the TraceLens
page's iframe)."""

from __future__ import annotations

import gzip
import html as markup
import json
import math
import os
import subprocess
import sys
import tempfile
import zlib
from pathlib import Path
from typing import Any

from lens_ebpf.recorder.errors import BadRequest, Unavailable

TOP_KERNELS = 10  # the longest kernels listed, per kernel type


def number(v: Any) -> float:
    """A figure as JSON takes it: NaN and infinities (HTA's overlap of a rank without
    communication) are 0."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return 0.0
    return f if math.isfinite(f) else 0.0


def analyse(directory: str) -> dict[str, Any]:
    """HTA over the traces in directory (one a rank); the child's whole work."""
    import logging

    logging.disable(logging.WARNING)  # HTA logs each parse; the result says what matters
    from hta.trace_analysis import TraceAnalysis

    a = TraceAnalysis(trace_dir=directory)
    try:
        tb = a.get_temporal_breakdown(visualize=False)
    except (IndexError, KeyError) as exc:
        raise ValueError(
            f"no GPU kernels to break down (a CPU-only trace?): " f"{type(exc).__name__}"
        ) from None
    ranks = []
    for r in tb.to_dict("records"):
        ranks.append(
            {
                "rank": int(r["rank"]),
                "idle_time_us": number(r["idle_time(us)"]),
                "compute_time_us": number(r["compute_time(us)"]),
                "non_compute_time_us": number(r["non_compute_time(us)"]),
                "kernel_time_us": number(r["kernel_time(us)"]),
                "idle_pct": number(r["idle_time_pctg"]),
                "compute_pct": number(r["compute_time_pctg"]),
                "non_compute_pct": number(r["non_compute_time_pctg"]),
                "comm_comp_overlap_pct": 0.0,
            }
        )
    try:
        got = a.get_comm_comp_overlap(visualize=False).to_dict("records")
        overlap = {int(o["rank"]): number(o["comp_comm_overlap_pctg"]) for o in got}
    except Exception:  # noqa: BLE001  (a trace without communication: no overlap)
        overlap = {}
    for r in ranks:
        r["comm_comp_overlap_pct"] = overlap.get(r["rank"], 0.0)
    kinds: list[dict[str, Any]] = []
    kernels: list[dict[str, Any]] = []
    try:
        kt, kd = a.get_gpu_kernel_breakdown(visualize=False, num_kernels=TOP_KERNELS)
        kinds = [
            {
                "kernel_type": str(k["kernel_type"]),
                "time_us": number(k["sum"]),
                "pct": number(k["percentage"]),
            }
            for k in kt.to_dict("records")
        ]
        kernels = [
            {
                "rank": int(k["rank"]),
                "name": str(k["name"]),
                "kernel_type": str(k["kernel_type"]),
                "time_us": number(k["sum (us)"]),
                "mean_us": number(k["mean (us)"]),
                "max_us": number(k["max (us)"]),
                "count": 0,
            }
            for k in kd.to_dict("records")
        ]
    except Exception:  # noqa: BLE001  (the breakdown above is the analysis; this adds to it)
        pass
    for r in ranks:  # each kernel type's own time on the rank (its top kernels and others)
        mine = [k for k in kernels if k["rank"] == r["rank"]]
        for field, kind in (
            ("communication_time_us", "COMMUNICATION"),
            ("memory_time_us", "MEMORY"),
            ("computation_kernel_time_us", "COMPUTATION"),
        ):
            r[field] = sum(k["time_us"] for k in mine if k["kernel_type"] == kind)
    busiest = max(
        ranks, key=lambda r: (r["compute_time_us"] + r["non_compute_time_us"], -r["rank"])
    )
    return {
        "ranks": sorted(ranks, key=lambda r: r["rank"]),
        "kernel_types": kinds,
        "top_kernels": kernels,
        "slowest_rank": busiest["rank"],
        "slowest_rank_why": "the most GPU time busy (computation and communication): "
        "the rank the others wait on in a collective",
    }


def precheck(name: str, data: bytes) -> None:
    """BadRequest for a trace HTA cannot break down, said without starting it: not JSON,
    no traceEvents, no GPU kernel (a CPU-only rank)."""
    import orjson

    text = data
    if data[:2] == b"\x1f\x8b":
        try:
            text = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise BadRequest(f"the traces could not be analysed: {name}: not gzip: {exc}") from None
    try:
        doc = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"the traces could not be analysed: {name}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise BadRequest(f"the traces could not be analysed: {name}: no traceEvents list")
    if not any(isinstance(e, dict) and e.get("cat") == "kernel" for e in doc["traceEvents"]):
        raise BadRequest(f"{name}: no GPU kernels to break down (a CPU-only trace?)")


def run(traces: list[tuple[str, bytes]], timeout: float) -> dict[str, Any]:
    """HTA over traces (a file name and its bytes, one a rank) in a child process; its
    result, or BadRequest saying why the traces could not be analysed (checked first
    here: a malformed or CPU-only trace never starts HTA)."""
    for name, data in traces:
        precheck(name, data)
    with tempfile.TemporaryDirectory(prefix="lens-hta-") as tmp:
        for i, (_, data) in enumerate(traces):
            gz = data[:2] == b"\x1f\x8b"
            (Path(tmp) / f"trace-{i}.json{'.gz' if gz else ''}").write_bytes(data)
        env = {**os.environ, "PYTHONWARNINGS": "ignore"}
        try:
            got = subprocess.run(
                [sys.executable, "-m", "lens_ebpf.recorder.profiler.analysis", tmp],
                capture_output=True,
                timeout=timeout,
                env=env,
            )
        except subprocess.TimeoutExpired:
            raise Unavailable(f"the analysis took over {timeout:g} s") from None
    if got.returncode != 0:
        lines = [x for x in got.stderr.decode("utf-8", "replace").splitlines() if x.strip()]
        why = lines[-1] if lines else f"exit status {got.returncode}"
        raise BadRequest(f"the traces could not be analysed: {why[:500]}")
    result: dict[str, Any] = json.loads(got.stdout)
    return result


def _bar(r: dict[str, Any]) -> str:
    parts = [
        ("compute", r["compute_pct"], "#3b82f6"),
        ("non-compute", r["non_compute_pct"], "#f59e0b"),
        ("idle", r["idle_pct"], "#d1d5db"),
    ]
    x, out = 0.0, []
    for name, pct, color in parts:
        out.append(
            f'<rect x="{x:.2f}%" width="{pct:.2f}%" height="18" fill="{color}">'
            f"<title>{name} {pct:.2f}%</title></rect>"
        )
        x += pct
    return f'<svg width="100%" height="18">{"".join(out)}</svg>'


def html(result: dict[str, Any], title: str) -> str:
    """The result as one page: no script, no outside asset."""
    esc = markup.escape
    rows = "".join(
        f"<tr{' class=slow' if r['rank'] == result['slowest_rank'] else ''}><td>{r['rank']}</td>"
        f"<td>{r['compute_time_us'] / 1000:.1f}</td><td>{r['non_compute_time_us'] / 1000:.1f}</td>"
        f"<td>{r.get('communication_time_us', 0.0) / 1000:.1f}</td>"
        f"<td>{r['idle_time_us'] / 1000:.1f}</td><td>{r['comm_comp_overlap_pct']:.1f}%</td>"
        f"<td class=bar>{_bar(r)}</td></tr>"
        for r in result["ranks"]
    )
    kinds = "".join(
        f"<tr><td>{esc(k['kernel_type'])}</td><td>{k['time_us'] / 1000:.1f}</td>"
        f"<td>{k['pct']:.1f}%</td></tr>"
        for k in result["kernel_types"]
    )
    top = "".join(
        f"<tr><td>{k['rank']}</td><td class=name>{esc(k['name'][:160])}</td>"
        f"<td>{esc(k['kernel_type'])}</td><td>{k['time_us'] / 1000:.2f}</td>"
        f"<td>{k['mean_us']:.1f}</td></tr>"
        for k in sorted(result["top_kernels"], key=lambda k: -k["time_us"])[:20]
    )
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{esc(title)}</title><style>
body{{font:14px system-ui,sans-serif;margin:24px;color:#111}} h1{{font-size:20px}}
h2{{font-size:16px;margin-top:28px}} table{{border-collapse:collapse;width:100%}}
td,th{{border-bottom:1px solid #e5e7eb;padding:6px 8px;text-align:right}}
th{{background:#f9fafb}} td:first-child,th:first-child,td.name{{text-align:left}}
td.name{{font-family:monospace;font-size:12px}} td.bar{{width:40%}}
tr.slow{{background:#fef3c7}}
.key span{{display:inline-block;width:12px;height:12px;margin:0 4px 0 12px}}
</style></head><body>
<h1>{esc(title)}</h1>
<p>Slowest rank: <b>{result["slowest_rank"]}</b> ({esc(result["slowest_rank_why"])}).</p>
<h2>Temporal breakdown per rank (HolisticTraceAnalysis)</h2>
<p class=key><span style="background:#3b82f6"></span>compute
<span style="background:#f59e0b"></span>non-compute (communication, memory)
<span style="background:#d1d5db"></span>idle</p>
<table><tr><th>rank</th><th>compute ms</th><th>non-compute ms</th><th>communication ms</th>
<th>idle ms</th>
<th>comm/comp overlap</th><th>share of GPU time</th></tr>{rows}</table>
<h2>Kernel types</h2>
<table><tr><th>type</th><th>time ms</th><th>share</th></tr>{kinds}</table>
<h2>Longest kernels</h2>
<table><tr><th>rank</th><th>kernel</th><th>type</th><th>total ms</th><th>mean us</th></tr>
{top}</table>
</body></html>
"""


def main(argv: list[str]) -> int:
    try:
        result = analyse(argv[0])
    except Exception as exc:  # noqa: BLE001  (said on stderr's last line, the parent's why)
        print(f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 1
    json.dump(result, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
