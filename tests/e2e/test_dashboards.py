"""The dashboards GPU clusters already have, on lens-ebpf alone: a real VictoriaMetrics
(Debian's, what Primus-Lens runs) scrapes a real agent with `devices.compat: [amd, dcgm]`
on a node with both vendors' GPUs (the real amdsmi and pynvml bindings against the
stand-in libraries), and every expression of Primus-Lens's node-stat and node-history
dashboards, AMD device-metrics-exporter's GPU dashboard and dcgm-exporter's dashboard
(tests/fixtures/dashboards, unchanged) is evaluated with its template variables resolved
the way Grafana resolves them. Each returns data, except those listed in LACKING with the
reason (a counter the stand-in devices lack, a dashboard's own typo)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agentproc import AgentProc
from tests.conftest import wait_for
from tests.gpulab import amdsmi_symbols, build_amdsmi, build_nvml, missing_gcc
from tests.vmserver import VictoriaMetrics, available

pytestmark = pytest.mark.e2e
DASH = Path(__file__).parent.parent / "fixtures" / "dashboards"
NODE = "gpu-node-7"
INTERVAL = "30s"  # Grafana's $__interval

RDMA = (
    "rdma_stat_* come from `rdma statistic show` on the node's NICs; this node has no "
    "RDMA device (tests/unit/test_rdma*.py check those names)"
)
MI300 = "an MI300 value (current socket power, per-XCC busy); the AMD stand-ins are MI200s"
LACKING: dict[str, str] = {
    "rdma_stat_": RDMA,
    "sgpu_ecc_correct_total": "a typo in Primus-Lens's NodeHistory.json (no such metric anywhere)",
    "gpu_package_power": MI300 + ", which answer N/A for it (gpu_average_package_power is there)",
    "gpu_gfx_busy_instantaneous": MI300,
    'gpu_junction_temperature{gpu_uuid="$g_gpu_uuid", card_model=~"102-G302': (
        "the panel shows junction temperature for MI300 boards only; GPU 0 is an MI200 board"
    ),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "a DCGM profiling counter: NVML has no equivalent",
    "node_k8s_gpu_allocation_rate": "the kubelet's pods and their GPU requests: this node runs "
    "without Kubernetes (tests/unit/test_kubelet.py checks it)",
}
# RAS blocks whose ECC counters the AMD stand-in has no RAS feature for
for block in (
    "athub",
    "bif",
    "df",
    "fuse",
    "hdp",
    "ih",
    "jpeg",
    "mca",
    "mmhub",
    "mp0",
    "mp1",
    "mpio",
    "sem",
    "smn",
    "vcn",
):
    for word in ("correct", "uncorrect"):
        LACKING[f"gpu_ecc_{word}_{block}{{"] = f"the stand-in GPUs have no RAS on {block}"


def targets(path: Path) -> list[tuple[str, str]]:
    """(panel title, expression) of every query of a dashboard, nested rows included."""
    out: list[tuple[str, str]] = []

    def walk(panels: list[dict[str, Any]]) -> None:
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                if t.get("expr"):
                    out.append((str(p.get("title", "")), t["expr"]))

    walk(json.loads(path.read_text()).get("panels", []))
    return out


def variables(path: Path) -> list[tuple[str, str]]:
    """(name, label_values query) of the dashboard's query variables, in order."""
    out = []
    for v in json.loads(path.read_text()).get("templating", {}).get("list", []):
        q = v.get("query")
        q = q.get("query") if isinstance(q, dict) else q
        if v.get("type") == "query" and isinstance(q, str):
            out.append((v["name"], q))
    return out


LABEL_VALUES = re.compile(r"^label_values\(\s*(?:(.*?)\s*,\s*)?([A-Za-z_]\w*)\s*\)$")
EMPTY_MATCHER = re.compile(r'\s*[A-Za-z_]\w*\s*=\s*""\s*,?')


QUOTED_NAME = re.compile(r'\{"([A-Za-z_:][A-Za-z0-9_:]*)"\s*,\s*')


def substitute(expr: str, values: dict[str, str]) -> str:
    """The expression as Grafana sends it. Prometheus 3's quoted-name selector
    (`{"name", l="v"}`), which VictoriaMetrics 1.79 does not parse, is written in its
    classic spelling (`name{l="v"}`): the same selector."""
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace("${" + name + "}", values[name]).replace("$" + name, values[name])
    return QUOTED_NAME.sub(lambda m: m.group(1) + "{", expr)


def resolve(vm: VictoriaMetrics, path: Path) -> dict[str, str]:
    """Each variable's first value, as Grafana picks it; "" when it has none (Grafana
    then substitutes nothing, and `label=""` matches series without the label)."""
    values = {"g_metrics_prefix": "", "__interval": INTERVAL, "__rate_interval": INTERVAL}
    pending = variables(path)
    names = {n for n, _ in pending}
    while pending:  # a variable after those it names, as Grafana orders them
        ready = [
            (n, q)
            for n, q in pending
            if not any(re.search(rf"\$\{{?{o}\b", q) for o in names - values.keys())
        ]
        assert ready, f"{path.name}: variables that name each other: {pending}"
        name, query = ready[0]
        pending.remove((name, query))
        m = LABEL_VALUES.match(substitute(query, values).strip())
        assert m, f"{path.name}: variable {name}: {query!r} is not label_values(...)"
        selector, label = m.group(1), m.group(2)
        if selector:  # Prometheus refuses a selector of empty matchers only; Grafana too
            selector = EMPTY_MATCHER.sub("", selector)
            selector = None if re.fullmatch(r"\{\s*,?\s*\}", selector) else selector
        params = {"match[]": [selector]} if selector else {}
        got = sorted(vm.api(f"label/{label}/values", **params))
        values[name] = got[0] if got else ""
    return values


def lacking(expr: str) -> str | None:
    return next((why for key, why in LACKING.items() if key in expr), None)


@pytest.fixture
def scraped(tmp_path: Path) -> Iterator[tuple[AgentProc, VictoriaMetrics]]:
    for reason in (available(), missing_gcc()):
        if reason:
            pytest.skip(reason)
    symbols = amdsmi_symbols()
    if symbols is None:
        pytest.skip("the amdsmi binding (PyPI amdsmi) is not installed")
    build_amdsmi(tmp_path / "rocm", symbols)
    build_nvml(tmp_path / "nvml")
    (tmp_path / "sys").mkdir()
    env = {
        "NODE_NAME": NODE,
        "ROCM_PATH": str(tmp_path / "rocm"),
        "ROCM_HOME": str(tmp_path / "rocm"),
        "LD_LIBRARY_PATH": str(tmp_path / "nvml"),
        "LENS_DEVICES__COMPAT": "[amd, dcgm]",
        "LENS_DEVICES__SYSFS_ROOT": str(tmp_path / "sys"),
        "LENS_COLLECTORS__GPU__INTERVAL_SECONDS": "1",
        "LENS_COLLECTORS__GPU__NVIDIA_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__GPU__AMD_SMI": "lens-no-such-tool",
        "LENS_COLLECTORS__GPU__KMSG": "",
        "LENS_COLLECTORS__GPU__NVML_EVENTS": "false",
        "LENS_COLLECTORS__RDMA__TOOL": "lens-no-such-rdma-tool",
    }
    agent = AgentProc("--no-collector.tcp", "--no-collector.processes", env=env)
    vm = None
    try:
        agent.wait_ready()
        vm = VictoriaMetrics([agent.base.removeprefix("http://")], {"node": NODE})
        # enough scrapes that rate/delta/increase over $__interval have two points
        wait_for(
            lambda: vm.query(f'count_over_time(gpu_health{{node="{NODE}"}}[{INTERVAL}]) >= 5')
            and vm.query(f"count_over_time(DCGM_FI_DEV_GPU_TEMP[{INTERVAL}]) >= 5"),
            "five scrapes of both vendors' GPUs",
            timeout=60,
        )
        yield agent, vm
    finally:
        if vm is not None:
            vm.stop()
        assert agent.stop() == 0


def evaluate(vm: VictoriaMetrics, path: Path, values: dict[str, str]) -> list[str]:
    """The expressions that return nothing and are not listed in LACKING. An expression
    ending in a filter (`> 0`) whose series are all filtered out counts as data when
    the series are there (zero errors on this device)."""
    empty = []
    tally = {"data": 0, "filtered to nothing": 0, "lacking": 0}
    for title, raw in targets(path):
        expr = substitute(raw, values)
        if vm.query(expr):
            assert not lacking(raw), f"{path.name}: {raw!r} has data, yet LACKING lists it"
            tally["data"] += 1
            continue
        m = re.match(r"^(.*?)\s*>\s*[0-9.]+\s*$", expr, re.S)
        if m and vm.query(m.group(1)):
            tally["filtered to nothing"] += 1
            continue
        if lacking(raw):
            tally["lacking"] += 1
        else:
            empty.append(f"{path.name} [{title}] {expr}")
    print(f"{path.name}: {len(targets(path))} expressions: {tally}")
    return empty


def test_the_dashboards_people_have_answer_from_lens_ebpf(scraped) -> None:
    _, vm = scraped
    empty: list[str] = []
    resolved = {}
    for name in (
        "primus-lens-NodeStat.json",
        "primus-lens-NodeHistory.json",
        "amd-device-metrics-exporter-gpu.json",
        "dcgm-exporter-dashboard.json",
    ):
        values = resolve(vm, DASH / name)
        resolved[name] = values
        empty += evaluate(vm, DASH / name, values)
    # the pickers found this node and its GPUs, as the dashboards ask for them
    assert resolved["primus-lens-NodeStat.json"]["node"] == NODE
    amd = resolved["amd-device-metrics-exporter-gpu.json"]
    assert (amd["g_hostname"], amd["g_gpu_id"], amd["g_gpu_uuid"]) == (
        NODE,
        "0",
        "0x5F1A2B3C4D5E6F70",
    )
    assert amd["g_card_model"] == "102-D65209-0C" and amd["g_gpu_vbios"] == "113-D65209-073"
    assert resolved["dcgm-exporter-dashboard.json"]["gpu"] == "0"
    assert empty == [], "\n".join(empty)
    # and the numbers are the devices': two GPUs 0 of two vendors, told apart
    assert (
        vm.query(f'gpu_utilization{{node="{NODE}",gpu_id="0",vendor="amd"}}')[0]["value"][1] == "73"
    )
    assert vm.query('DCGM_FI_DEV_FB_USED{gpu="0"}')[0]["value"][1] == "40960"
    assert vm.query(f'gpu_total_vram{{node="{NODE}",gpu_id="1"}}')[0]["value"][1] == "65504"
