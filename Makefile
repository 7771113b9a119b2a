# The README's two commands: `make run` and `make test` (and `make docs`, the docs site).
VENV := .venv
PY := $(VENV)/bin/python
LISTEN ?= 0.0.0.0:9470

.PHONY: run test setup setup-test lint fmt docs unit bpf e2e bench protos try

setup:
	@scripts/setup.sh run

setup-test:
	@scripts/setup.sh test

run: setup
	$(VENV)/bin/lens-ebpf run --listen $(LISTEN)

lint: setup-test
	@scripts/lint.sh

# The formatter owns the layout: ruff format, then ruff check's fixes (imports, the easy ones).
fmt:
	$(VENV)/bin/ruff format lens_ebpf tests bench
	$(VENV)/bin/ruff check --fix lens_ebpf tests bench

# tests/unit alone, in two workers: no root, no BCC, ~40 s (~45 s of CPU); the venv from
# `make setup-test`.
unit:
	@test -x $(PY) || { echo "make unit: no $(PY); run make setup-test once" >&2; exit 2; }
	$(PY) -m pytest -q -p no:cacheprovider -n 2 tests/unit

# The real programs on this kernel (root), and the agent as a process (root).
bpf: setup-test
	$(PY) -m pytest -q -rs tests/bpf

e2e: setup-test
	$(PY) -m pytest -q -rs tests/e2e

# The docs site (docs/, mkdocs.yml) into site/, its generated reference fresh first.
docs: setup-test
	$(PY) scripts/metrics_reference.py
	$(PY) scripts/routes_reference.py
	$(VENV)/bin/mkdocs build --strict -d site

# The setup, lint, then two xdist workers over groups of tests (tests/conftest.py says
# which go together); the kernel matrix's guests boot during the setup (scripts/test.sh).
test:
	@scripts/test.sh

protos: setup-test
	scripts/gen_protos.sh

# A real Kubernetes node on this machine with lens-ebpf installed (docs/install/try-it.md).
try: setup-test
	$(PY) -m tests.kube.node

bench: setup-test
	$(PY) -m bench
