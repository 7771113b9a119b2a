#!/usr/bin/env bash
# `make test`: the setup, lint and the whole suite. The kernel matrix's guests boot as
# soon as the setup has the venv and the kernels (tests/vm/background.py), so their
# emulated kernels run while the setup builds what remains, lint runs and the host's
# tests run; pytest reads their results from the directory named here. Whatever way
# this ends, the guests stop with it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTEST_KMATRIX_DIR=$(mktemp -d /tmp/lens-kmatrix-XXXXXXXX)
export PYTEST_KMATRIX_DIR
stop_guests() {
  local pgid
  pgid=$(cat "$PYTEST_KMATRIX_DIR/pgid" 2>/dev/null || true)
  if [ -n "$pgid" ]; then kill -TERM -- "-$pgid" 2>/dev/null || true; fi
}
trap stop_guests EXIT
scripts/setup.sh test
scripts/lint.sh
.venv/bin/python -m pytest -q -rs --durations=25 -n 2 --dist loadgroup --no-loadscope-reorder tests
