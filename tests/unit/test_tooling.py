"""The habits' tools agree (docs/contributing/style.md, Tooling): pre-commit runs what
`make lint` runs, from the venv, fetching nothing; mypy is strict and ruff checks names."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def lint_recipe() -> list[str]:
    """The commands `make lint` runs: its recipe's lines ($(VENV) spelt .venv), a script
    it calls (scripts/*.sh) read for its own."""
    text = (ROOT / "Makefile").read_text()
    recipe = re.search(r"^lint:.*\n((?:\t.*\n)+)", text, re.M)
    assert recipe, "the Makefile has no lint target"
    out = []
    for line in recipe[1].splitlines():
        line = line.strip().lstrip("@").replace("$(VENV)", ".venv")
        script = re.fullmatch(r"(scripts/\S+\.sh)", line)
        if script:
            lines = (ROOT / script[1]).read_text().splitlines()
            out += [x.strip() for x in lines if x.strip().startswith(".venv/")]
        else:
            out.append(line)
    return out


def test_pre_commit_runs_what_make_lint_runs_from_the_venv() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    hooks = [h for repo in config["repos"] for h in repo["hooks"]]
    # local hooks only: nothing is cloned or installed from the network
    assert {repo["repo"] for repo in config["repos"]} == {"local"}
    assert {h["language"] for h in hooks} == {"system"}
    tools = {h["id"]: h["entry"].split() for h in hooks}
    assert set(tools) == {"ruff-format", "ruff", "mypy"}
    assert all(argv[0].startswith(".venv/bin/") for argv in tools.values())
    lint = lint_recipe()
    # the same tool and subcommand as make lint (pre-commit fixes what lint only checks)
    for argv in tools.values():
        assert any(line.startswith(" ".join(argv[:2])) for line in lint), (argv, lint)
    assert " ".join(tools["mypy"]) in lint  # the whole package, as make lint checks it
    # and over the same folders as make lint's ruff
    folders = re.search(r"ruff check (.*)$", next(x for x in lint if "ruff check" in x))
    assert folders
    for h in hooks:
        if h["id"].startswith("ruff"):
            assert h["files"] == "^(" + "|".join(folders[1].split()) + ")/"


def test_mypy_is_strict_and_ruff_checks_names() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]
    assert config["mypy"]["strict"] is True
    # errors are ignored only in protoc's output
    for override in config["mypy"].get("overrides", []):
        if override.get("ignore_errors"):
            assert all(".gen." in m for m in override["module"]), override
    assert "N" in config["ruff"]["lint"]["select"]
