# The README's two commands: `make run` and `make test`.
VENV := .venv
PY := $(VENV)/bin/python
LISTEN ?= 0.0.0.0:9470

.PHONY: run test setup setup-test lint unit bpf e2e bench protos

setup:
	@scripts/setup.sh run

setup-test:
	@scripts/setup.sh test

run: setup
	$(VENV)/bin/lens-ebpf run --listen $(LISTEN)

lint: setup-test
	$(VENV)/bin/ruff check lens_ebpf tests bench
	$(VENV)/bin/ruff format --check lens_ebpf tests bench
	$(VENV)/bin/mypy lens_ebpf

test: lint
	$(PY) -m pytest -q -rs tests

protos: setup-test
	scripts/gen_protos.sh

bench: setup-test
	$(PY) -m bench
