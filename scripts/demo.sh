#!/usr/bin/env bash
# The main job: install gpuplane, then schedule the quick-start cluster and print the plan as a table.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

export PIP_BREAK_SYSTEM_PACKAGES=1  # see scripts/test.sh
export PIP_DISABLE_PIP_VERSION_CHECK=1

if ! command -v python3 >/dev/null || ! python3 -m pip --version >/dev/null 2>&1; then
    apt-get update -qq
    apt-get install -y -qq python3 python3-pip
fi

python3 -m pip install --quiet -e .
# The main job: one virtual week of a mixed GPU cluster, stock Kubernetes vs gpuplane, side by side.
gpuplane simulate "$@"
