"""Writes the cluster API's example answers into docs/recorder/api-examples.md, between
the markers `<!-- api-examples -->` and `<!-- /api-examples -->`, from what the tests got:

    API_EXAMPLES_OUT=/tmp/examples.json .venv/bin/python -m pytest -q \
        tests/recorder/test_cluster_api.py tests/recorder/test_devices.py \
        tests/recorder/test_training.py tests/recorder/test_timeline.py \
        tests/recorder/test_storage.py -k "not postgresql"
    .venv/bin/python scripts/api_examples.py /tmp/examples.json

Each answer is a real one (a real Prometheus with the tests' series, the API stand-in's
nodes and pods), its `data` (the envelope is the same for all); lists are cut to their
first two items.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[1] / "docs" / "recorder" / "api-examples.md"
START, END = "<!-- api-examples -->", "<!-- /api-examples -->"
# the routes, in the API page's order ({name}: a node, {uid}: a workload, {serial}: a device)
ROUTES = [
    "gpu-aggregation/clusters",
    "gpu-aggregation/cluster/hourly-stats",
    "clusters/overview",
    "clusters/consumers",
    "clusters/gpuHeatmap",
    "clusters/allocation",
    "nodes",
    "nodes/gpuAllocation",
    "nodes/gpuUtilization",
    "nodes/gpuUtilizationHistory",
    "nodes/{name}",
    "nodes/{name}/gpuDevices",
    "nodes/{name}/gpuMetrics",
    "nodes/{name}/workloads",
    "nodes/{name}/workloadsHistory",
    "nodes/{name}/devices",
    "nodes/{name}/devices/changelog",
    "devices/{serial}/history",
    "workloads",
    "workloadMetadata",
    "workloads/hierarchy",
    "workloads/{uid}",
    "workloads/{uid}/hierarchy",
    "workloads/{uid}/metrics",
    "workloads/{uid}/trainingPerformance",
    "workloads/{uid}/timeline",
    "storage/overview",
    "storage/volumes",
]
FIXED = {"gpuAllocation", "gpuUtilization", "gpuUtilizationHistory", "hierarchy"}


def pattern(route: str) -> re.Pattern[str]:
    name = r"(?!(" + "|".join(FIXED) + r")$)[^/]+"  # a name, not a fixed word
    parts = [name if p.startswith("{") else re.escape(p) for p in route.split("/")]
    return re.compile("^/v1/" + "/".join(parts) + "$")


def cut(value: Any, keep: int = 2) -> Any:
    if isinstance(value, list):
        return [cut(v, keep) for v in value[:keep]]
    if isinstance(value, dict):
        return {k: cut(v, keep) for k, v in value.items()}
    return value


def compact(value: Any, indent: int = 0, width: int = 92, lead: int = 0) -> str:
    """JSON with what fits a line on one line; lead: what comes before the value on its
    first line after the indent (its key)."""
    flat = json.dumps(value, ensure_ascii=False)
    if indent + lead + len(flat) <= width or not isinstance(value, dict | list) or not value:
        return flat
    pad = " " * (indent + 2)
    if isinstance(value, dict) and not any(
        isinstance(v, dict | list) and v for v in value.values()
    ):
        # scalars: as many "key": value pairs on a line as fit
        lines, line = [], pad
        for k, v in value.items():
            item = f"{json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}"
            if line.strip() and len(line) + len(item) + 2 > width:
                lines.append(line.rstrip())
                line = pad
            line += item + ", "
        lines.append(line.rstrip().rstrip(","))
        return "{\n" + "\n".join(lines) + "\n" + " " * indent + "}"
    if isinstance(value, dict):
        items = [
            f"{pad}{json.dumps(k)}: {compact(v, indent + 2, width, len(json.dumps(k)) + 2)}"
            for k, v in value.items()
        ]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    items = [pad + compact(v, indent + 2, width) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"


def render(examples: dict[str, Any]) -> str:
    out = [START, ""]
    for route in ROUTES:
        rx = pattern(route)
        got = [v for k, v in examples.items() if rx.match(k)]
        if not got:
            raise SystemExit(f"api_examples: no example answer of {route}")
        best = max(got, key=lambda v: len(json.dumps(v["body"])))  # the fullest
        out += [
            f"`GET {best['request']}` →",
            "",
            "```json",
            compact(cut(best["body"]["data"])),
            "```",
            "",
        ]
    return "\n".join(out + [END])


def main() -> int:
    examples = json.loads(Path(sys.argv[1]).read_text())
    text = PAGE.read_text()
    if START not in text or END not in text:
        raise SystemExit(f"api_examples: {PAGE.name} lacks {START} ... {END}")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(head + render(examples) + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
