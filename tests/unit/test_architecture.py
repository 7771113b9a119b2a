"""The map in the README's Architecture section, kept true: every import of lens_ebpf
(module level, inside functions, under TYPE_CHECKING) goes down the layers, never from
one service into the other; no package imports back into one that imports it; and each
service runs without the other's libraries."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "lens_ebpf"
# layer -> the layers it may import (itself included); the root package holds the version
ALLOWED = {
    "core": {"core"},
    "protocol": {"core", "protocol"},
    "k8s": {"core", "k8s"},
    "agent": {"core", "protocol", "k8s", "agent"},
    "recorder": {"core", "protocol", "k8s", "recorder"},
    "cli": {"core", "protocol", "k8s", "agent", "recorder", "cli"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in PKG.rglob("*.py") if "gen" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every lens_ebpf module this one imports, wherever the import statement stands."""
    out = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.split(".")[0] == "lens_ebpf"}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, *([node.module] if node.module else [])])
            if base.split(".")[0] != "lens_ebpf":
                continue
            for a in node.names:  # `from pkg import module` names a module
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
    return out


def layer(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 1 or parts[1] in ("cli", "__main__"):
        return "cli" if len(parts) > 1 else "root"
    return parts[1]


def unit(name: str) -> str:
    """The node the cycle check sees: a service's subpackage or module, a shared package."""
    parts = name.split(".")
    return ".".join(
        parts[:3] if len(parts) > 2 and parts[1] in ("agent", "recorder") else parts[:2]
    )


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(name, path, set(mods)) for name, path in mods.items()}


def test_imports_go_down_the_layers_and_never_across_services() -> None:
    wrong = []
    for name, targets in graph().items():
        src = layer(name)
        for target in targets:
            dst = layer(target)
            if dst != "root" and src != "root" and dst not in ALLOWED[src]:
                wrong.append(f"{name} imports {target} ({src} -> {dst})")
    assert wrong == []


def test_no_package_imports_back_into_one_that_imports_it() -> None:
    edges: dict[str, set[str]] = defaultdict(set)
    for name, targets in graph().items():
        for target in targets:
            if unit(name) != unit(target) and layer(target) != "root":
                edges[unit(name)].add(unit(target))
    cycles = []
    state: dict[str, int] = {}  # 1 on the path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_checker_sees_imports_in_functions_and_type_checking(tmp_path: Path) -> None:
    src = tmp_path / "x.py"
    src.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from lens_ebpf.recorder.store.writer import Writer\n"
        "def f():\n    import lens_ebpf.agent.trace\n"
    )
    known = set(modules())
    assert imports("lens_ebpf.core.x", src, known) == {
        "lens_ebpf.recorder.store.writer", "lens_ebpf.agent.trace"}  # fmt: skip


def test_each_extra_brings_its_own_service_only() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(reqs: list[str]) -> set[str]:
        return {r.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower()
                for r in reqs}  # fmt: skip

    base = names(meta["dependencies"])
    extras = {k: names(v) for k, v in meta["optional-dependencies"].items()}
    database = {"sqlalchemy", "alembic", "psycopg"}
    devices = {"psutil", "nvidia-ml-py", "amdsmi"}
    assert not (base | extras["agent"]) & database  # pip install .[agent]
    assert not (base | extras["recorder"]) & devices  # pip install .[recorder]
    assert database <= extras["recorder"] and devices <= extras["agent"]


BLOCK = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed in this image")
sys.meta_path.insert(0, Block())
import {package}
for mod in pkgutil.walk_packages({package}.__path__, "{package}."):
    if ".gen" not in mod.name and ".migrations" not in mod.name:  # alembic runs those
        importlib.import_module(mod.name)
print("imported")
"""


def imports_without(package: str, blocked: set[str]) -> subprocess.CompletedProcess[str]:
    code = BLOCK.format(package=package, blocked=sorted(blocked))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)  # fmt: skip


def test_the_recorder_needs_nothing_of_the_agents() -> None:
    res = imports_without("lens_ebpf.recorder", {"bcc", "psutil", "pynvml", "amdsmi"})
    assert res.stdout.strip() == "imported", res.stderr


def test_the_agent_needs_nothing_of_the_recorder() -> None:
    res = imports_without("lens_ebpf.agent", {"sqlalchemy", "alembic", "psycopg"})
    assert res.stdout.strip() == "imported", res.stderr
