# Engram — `make` alone lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# uv comes from PyPI: use the one on PATH, or bootstrap a private copy into .tools/.
UV ?= $(shell command -v uv 2>/dev/null || echo .tools/bin/uv)
PY := .venv/bin/python
export UV_PYTHON_DOWNLOADS := never
PYTEST_ARGS ?=

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-11s %s\n", $$1, $$2}'

.tools/bin/uv:
	python3 -m venv .tools
	.tools/bin/pip install --quiet 'uv>=0.13,<0.14'

.PHONY: install
install: $(if $(findstring .tools/,$(UV)),.tools/bin/uv) ## create .venv from uv.lock (all services, dev tools)
	$(UV) sync --frozen --all-packages

# --inexact: a .venv that `make install` filled keeps its dev tools (no churn between
# `make run` and `make test`); a fresh clone gets the services and the CLI only.
# --compile-bytecode: the first `engram …` command a person types starts warm (about 1 s,
# not 4 s compiling every module it imports).
.PHONY: install-run
install-run: $(if $(findstring .tools/,$(UV)),.tools/bin/uv) ## .venv with what running needs (no test, lint or chart tools)
	$(UV) sync --frozen --all-packages --no-dev --inexact --compile-bytecode

.PHONY: fmt
fmt: install ## format and auto-fix the code
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

.PHONY: lint
lint: install ## ruff (lint + format check), mypy (the types) and the generated-code checks
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(MAKE) --no-print-directory mypy-tests
	$(MAKE) --no-print-directory proto-check
	$(MAKE) --no-print-directory workers-check

# Every test folder in one run, with the packages' settings ([tool.mypy]): tests/ is on
# the path for engram_testing, and a test module is named after its folder (several hold
# a conftest.py). The .venv of tests/clients/litellm is LiteLLM's own, not test code.
TEST_DIRS := tests $(wildcard services/*/tests libs/*/tests)

.PHONY: mypy-tests
mypy-tests: install ## mypy over the test code (every test folder; part of make lint)
	MYPYPATH=tests $(PY) -m mypy --explicit-package-bases --exclude '/\.venv/' $(TEST_DIRS)

.PHONY: proto
proto: install ## regenerate the gRPC/protobuf code from proto/
	$(PY) scripts/gen_proto.py

.PHONY: proto-check
proto-check: install ## fail if the committed generated code differs from a fresh regeneration
	$(PY) scripts/check_proto.py

.PHONY: workers-check
workers-check: install ## fail if scripts, settings, Dockerfile or chart disagree with the worker catalogue
	$(PY) scripts/check_workers.py

.PHONY: helm-check
helm-check: install ## hadolint the Dockerfile; helm lint, render and validate the chart (offline)
	$(PY) deploy/scripts/helm_check.py

.PHONY: test
test: install lint helm-check ## install from the lock, lint, check the chart, and run every test
	$(PY) -m pytest $(PYTEST_ARGS)

.PHONY: run
run: install-run ## start the whole local stack (nats-server, gateway, retrieval and the workers in one process)
	.venv/bin/engram up --light

.PHONY: bench
bench: install ## Search latency at 1k and 10k memories (tables, JSON, plot under bench-results/)
	.venv/bin/engram bench latency --sizes 1000,10000

.PHONY: clean
clean: ## remove the environment and caches (keeps .engram data)
	rm -rf .venv .tools .pytest_cache .ruff_cache
