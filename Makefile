# The project's verbs. Each target installs what it needs: a fresh machine has only Python 3.11+.
SHELL := /bin/bash
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
UV := $(shell command -v uv 2>/dev/null || echo python3 -m uv)
RUN := $(UV) run --frozen

.PHONY: help install test lint format demo bench synth clean

help:
	@echo "make demo   run the local emulator's scenario (no AWS account, no GitHub)"
	@echo "make test   run the test suite"
	@echo "make lint   ruff, mypy, import contracts, and cfn-lint on the synthesised template"
	@echo "make bench  benchmarks (BENCH=\"pickup agent\" for some), 3 runs each; min/median to bench/results.json"
	@echo "make synth  synthesise the CloudFormation template into cdk.out/"

.venv/.installed: pyproject.toml uv.lock
	@$(UV) --version >/dev/null 2>&1 || python3 -m pip install --quiet 'uv>=0.5' \
		|| python3 -m pip install --quiet --user 'uv>=0.5'
# Compiled at install: where PYTHONDONTWRITEBYTECODE is set (CI here sets it), every interpreter (each
# test worker, Lambda environment and agent the emulator starts) would compile each module it imports.
	$(UV) sync --frozen --compile-bytecode
	@touch $@

install: .venv/.installed

test: install
	@$(RUN) python -m compileall -q -j 0 lambdas agent emulator bench demo infra tests >/dev/null
# Three workers on two cores, stealing work: the whole-system scenarios spend half their time waiting
# on compressed timers, so two workers kept only 1.2 cores busy (780 CPU s in 675 s). Measured here on
# 2026-11-27: -n 2 (load scheduling) 675-793 s, -n 3 --dist worksteal 475 s, -n 4 486 s.
	$(RUN) pytest -n 3 --dist worksteal -q --durations=15

lint: install
	$(RUN) ruff check .
	$(RUN) ruff format --check .
	$(RUN) mypy
	$(RUN) lint-imports
	$(RUN) python app.py
# W3005: CDK makes each function depend on its role's policy explicitly, on purpose, so the policy
# exists before the function can first run; cfn-lint calls that redundant.
	$(RUN) cfn-lint --ignore-checks W3005 -- cdk.out/RunnerPool.template.json

format: install
	$(RUN) ruff format .
	$(RUN) ruff check --fix .

demo: install
	$(RUN) python -m demo

bench: install
	$(RUN) python -m bench $(BENCH)

synth: install
	$(RUN) python app.py

clean:
	rm -rf .venv cdk.out .pytest_cache .mypy_cache .ruff_cache .import_linter_cache
