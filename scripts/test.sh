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
# The real components the tests start: kubectl; etcd for the real control plane (scripts/kube-up.sh,
# with the Kubernetes binaries from ../shared/k8s, unpacked by xz); openssl for its certificates;
# Prometheus (and promtool) for the metrics tests; Chromium and its driver for the web console tests.
# Keep this the only place that installs system packages.
if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    step "apt-get install python3 python3-pip"
    apt-get update -qq
    apt-get install -y -qq python3 python3-pip
fi
# scripts/check-wheel.sh installs the wheel into a fresh virtual environment (Debian ships venv apart).
if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    step "apt-get install python3-venv"
    apt-get update -qq
    apt-get install -y -qq python3-venv
fi

declare -A wanted=(
    [kubectl]=kubectl [etcd]=etcd-server [openssl]=openssl [xz]=xz-utils
    [prometheus]=prometheus [promtool]=prometheus [chromium]=chromium [chromedriver]=chromium-driver
)
missing=()
for binary in "${!wanted[@]}"; do
    command -v "${binary}" >/dev/null || missing+=("${wanted[${binary}]}")
done
if (( ${#missing[@]} )); then
    mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
    step "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
# Debian's packages start no services here; the tests start their own on loopback.

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

# --- The wheel, as the image installs it ----------------------------------------------------------
# Builds the wheel and installs it with the image's pins (deploy/image/constraints.txt) in a fresh
# virtual environment: the commands run, every module imports, the package data is there.
step "scripts/check-wheel.sh"
bash scripts/check-wheel.sh

# --- Tests ----------------------------------------------------------------------------------------
step "pytest"
status=0
python3 -m pytest -q || status=$?
if [[ ${status} -eq 5 ]]; then
    echo "pytest collected no tests: that is a failure, not a pass" >&2
    exit 1
fi

# --- The controller's end-to-end suite again, on a real control plane -------------------------------
# The run above used the API-server double; the same tests now run unchanged on kube-apiserver,
# kube-controller-manager and kube-scheduler v1.36.2 (scripts/kube-up.sh), stopped on exit.
step "pytest: controller end-to-end tests on a real control plane"
kube_dir="$(mktemp -d)"
trap 'bash scripts/kube-down.sh --purge "${kube_dir}" >/dev/null 2>&1 || true' EXIT
e2e_status=0
if bash scripts/kube-up.sh "${kube_dir}" >/dev/null; then
    GPUPLANE_E2E_KUBECONFIG="${kube_dir}/kubeconfig" \
        python3 -m pytest -q tests/test_controller_e2e.py tests/test_controller_leader.py tests/test_k8s_informer.py \
            tests/test_kubectl_view_e2e.py tests/test_kubectl_plugin.py \
            tests/test_job_life_e2e.py tests/test_partial_admission_e2e.py tests/test_sim_vs_real.py \
            tests/test_webhook_jobs_e2e.py tests/test_why_bypass.py tests/test_doctor_webhook.py tests/test_deploy.py \
            tests/test_runtime_history_e2e.py tests/test_eta_live_e2e.py tests/test_chaos_e2e.py \
            tests/test_deployed_e2e.py tests/test_dra_e2e.py tests/test_multikueue_e2e.py tests/test_multikueue_watch.py || e2e_status=$?
else
    echo "the real control plane did not start" >&2
    e2e_status=1
fi
if [[ ${status} -eq 0 ]]; then
    status=${e2e_status}
fi
exit "${status}"
