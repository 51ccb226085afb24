#!/usr/bin/env bash
# The project's test command: install, then lint, type-check, check layering, and run the tests.
# Works on a fresh Debian machine as root with no virtual environment; any failing step fails the run.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# Debian marks its system Python as externally managed (PEP 668); this script installs into it on
# purpose, as a disposable CI machine would. Other pips ignore the variable.
export PIP_BREAK_SYSTEM_PACKAGES=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

step() { printf '\n==> %s\n' "$*"; }

# --- System packages ------------------------------------------------------------------------------
# Later work adds the real components the tests start here (apt-get install of kubectl, prometheus,
# chromium, chromium-driver). Keep this the only place that installs system packages.
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    step "apt-get install python3 python3-pip"
    apt-get update -qq
    apt-get install -y -qq python3 python3-pip
fi

# kubectl: the API-server double's tests run the real binary against it.
if ! command -v kubectl >/dev/null; then
    step "apt-get install kubectl"
    apt-get update -qq && apt-get install -y -qq kubectl
fi

# --- Python packages ------------------------------------------------------------------------------
step "pip install -e .[dev]"
python3 -m pip install --quiet -e '.[dev]'

# --- Static checks --------------------------------------------------------------------------------
step "ruff check"
python3 -m ruff check .

step "ruff format --check"
python3 -m ruff format --check .

step "mypy --strict src/gpuplane"
python3 -m mypy --strict src/gpuplane

step "lint-imports"
lint-imports

# --- Tests ----------------------------------------------------------------------------------------
step "pytest"
status=0
python3 -m pytest -q || status=$?
if [[ ${status} -eq 5 ]]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi
exit "${status}"
