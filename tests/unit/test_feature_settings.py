"""A feature reads its own typed sections and the shared ones its Context carries; only
the wiring holds the agent's whole Config (agent/feature.py, docs/contributing/feature.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from lens_ebpf.agent import config, feature
from lens_ebpf.agent.devices.gpu.collector import GpuSettings
from lens_ebpf.agent.devices.rdma.collector import RdmaSettings
from lens_ebpf.agent.registry import FEATURES
from lens_ebpf.agent.service import Agent

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "lens_ebpf.agent.config"
# the modules that load the config and hand each part its sections, and why each may
WIRING = {
    "lens_ebpf/agent/config.py": "defines it",
    "lens_ebpf/agent/service.py": "the Agent: builds each feature's Context, the event API",
    "lens_ebpf/agent/cli.py": "loads it for run, check and trace",
    "lens_ebpf/agent/trace.py": "trace's setup: builds the programs without the Agent",
    "lens_ebpf/agent/check.py": "`lens-ebpf check --config`: the tuner's section and the roots",
}
# what any module may take from agent/config.py: the section models it defines
SECTIONS = frozenset(
    name
    for name, obj in vars(config).items()
    if isinstance(obj, type)
    and issubclass(obj, BaseModel)
    and obj.__module__ == CONFIG
    and obj is not config.Config
)


def whole_config_uses(source: str, package: str) -> list[tuple[int, str]]:
    """(line, name) of each thing the module (in package) takes from agent/config.py that
    is not a section model: Config, or load() that hands one back; however imported, in
    functions and under TYPE_CHECKING too."""
    found: list[tuple[int, str]] = []
    modules = set()  # names the module agent/config.py itself is bound to
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            where = ".".join(p for p in (base, node.module or "") if p)
            if where == CONFIG:
                found += [(node.lineno, a.name) for a in node.names if a.name not in SECTIONS]
            elif f"{where}.config" == CONFIG:
                modules |= {a.asname or a.name for a in node.names if a.name == "config"}
        elif isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name == CONFIG}
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Attribute)
            and ast.unparse(node.value) in modules
            and node.attr not in SECTIONS
        ):
            found.append((node.lineno, node.attr))
    return sorted(found)


def test_only_the_wiring_takes_the_whole_config() -> None:
    for path in WIRING:
        assert (ROOT / path).exists(), f"{path} is wiring no more: drop it from WIRING"
    bad = {}
    for path in sorted((ROOT / "lens_ebpf" / "agent").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        package = ".".join(path.relative_to(ROOT).parent.parts)
        if rel not in WIRING and (got := whole_config_uses(path.read_text(), package)):
            bad[rel] = got
    assert not bad, f"take the sections you read (ctx.bpf, ctx.devices, ...), not: {bad}"


BAD = """
from typing import TYPE_CHECKING
from lens_ebpf.agent import config as c
from lens_ebpf.agent.config import BpfConfig
import lens_ebpf.agent.config
if TYPE_CHECKING:
    from lens_ebpf.agent.config import Config
def f():
    from ..config import load
    return c.Config, c.DevicesConfig, lens_ebpf.agent.config.defaults()
"""


def test_the_checker_sees_the_whole_config_however_imported() -> None:
    assert {"BpfConfig", "DevicesConfig", "NodeConfig"} <= SECTIONS and "Config" not in SECTIONS
    assert whole_config_uses(BAD, "lens_ebpf.agent.tcp") == [
        (7, "Config"),
        (9, "load"),
        (10, "Config"),
        (10, "defaults"),
    ]
    fine = "from lens_ebpf.agent.config import BpfConfig, EventsConfig\nfrom .. import events\n"
    assert whole_config_uses(fine, "lens_ebpf.agent.tcp") == []


def test_each_feature_is_handed_its_own_sections_and_the_shared_ones() -> None:
    cfg = config.load(None, env={}, overrides={("kubernetes", "mode"): "off"})
    agent = Agent(cfg)
    try:
        by_name = {f.name: f.ctx for f in agent.features}
        gpu = by_name["gpu"]
        assert set(gpu.sections) == {"gpu"} and set(by_name["tcp_flows"].sections) == {"tcp", "rtt"}
        assert gpu.settings("gpu", GpuSettings) is cfg.collectors.section("gpu")
        with pytest.raises(AssertionError, match="collectors.rdma is not this feature's"):
            gpu.settings("rdma", RdmaSettings)
        assert gpu.devices is cfg.devices and gpu.bpf is cfg.bpf
        assert gpu.node.name == cfg.node_name and gpu.node.ip == cfg.node.ip
        # the parts are the agent's, one for all: what one feature offers, another reads
        assert gpu.offers is by_name["rdma"].offers is agent.ctx.offers
        assert gpu.watch is agent.ctx.watch and gpu.bus is agent.ctx.bus
    finally:
        agent.stop()


def test_the_contributing_pages_feature_runs(tmp_path: Path) -> None:
    """docs/contributing/feature.md's example, as written: its section, its collector."""
    page = (ROOT / "docs" / "contributing" / "feature.md").read_text()
    block = re.search(r"```python\n(.*?)```", page, re.S)
    assert block is not None
    temp = tmp_path / "class" / "hwmon" / "hwmon0" / "temp1_input"
    temp.parent.mkdir(parents=True)
    temp.write_text("45500\n")
    feature.registered()
    example: dict[str, object] = {"__name__": "lens_ebpf.agent.devices.hwmon"}
    exec(compile(block.group(1), "docs/contributing/feature.md", "exec"), example)
    try:
        cfg = config.load(
            None,
            env={"LENS_DEVICES__SYSFS_ROOT": str(tmp_path)},
            overrides={("kubernetes", "mode"): "off"},
        )
        assert cfg.collectors.section("hwmon") == example["HwmonSettings"]()  # type: ignore[operator]
        agent = Agent(cfg)
        try:
            hwmon = next(f for f in agent.features if f.name == "hwmon")
            assert hwmon.enabled() == ""
            collector = hwmon.make()  # type: ignore[attr-defined]
            collector.run_once()
            [family] = collector.families
            assert [(s.labels, s.value) for s in family.samples] == [
                ({"chip": "hwmon0", "sensor": "temp1"}, 45.5)
            ]
        finally:
            agent.stop()
    finally:
        del FEATURES.parts["hwmon"]
