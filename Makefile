# Run `make` (or `make help`) to list the targets.
.DEFAULT_GOAL := help
PYTHON ?= python3

.PHONY: help install lint test bench demo conformance

help: ## List the targets with their descriptions
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

install: ## Install gpuplane in editable mode with the development tools
	$(PYTHON) -m pip install -e '.[dev]'

lint: ## Lint, check formatting, type-check (strict) and check import layering
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m mypy --strict src/gpuplane
	lint-imports

test: ## Install, then run every check and the test suite (the README's test command)
	bash scripts/test.sh

bench: ## Run the benchmarks (not part of the test suite)
	$(PYTHON) bench/run.py

demo: ## Install, then schedule the quick-start example and print the plan
	bash scripts/demo.sh

conformance: ## Run the shared Kueue conformance scenarios against the schedule command
	$(PYTHON) ../shared/conformance/check.py ../shared/conformance/kueue
