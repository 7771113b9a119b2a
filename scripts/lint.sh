#!/usr/bin/env bash
# `make lint`: ruff's rules and layout, mypy, and the docs site built strictly.
set -euo pipefail
cd "$(dirname "$0")/.."
set -x
.venv/bin/ruff check lens_ebpf tests bench
.venv/bin/ruff format --check lens_ebpf tests bench
.venv/bin/mypy lens_ebpf
.venv/bin/mkdocs build --strict -q -d site
