#!/usr/bin/env bash
# Stop a control plane started by scripts/kube-up.sh DIR (default: $GPUPLANE_KUBE_DIR or
# /tmp/gpuplane-kube). With --purge, also delete DIR (its etcd data, certificates and logs).
set -euo pipefail

purge=0
if [[ "${1:-}" == "--purge" ]]; then purge=1; shift; fi
DIR="${1:-${GPUPLANE_KUBE_DIR:-/tmp/gpuplane-kube}}"
[[ -f "${DIR}/pids" ]] || { echo "kube-down: nothing running in ${DIR}" >&2; exit 0; }

# Stop in reverse order of start: clients first, etcd last.
mapfile -t pids < <(tac "${DIR}/pids" | awk '{print $1}')
for pid in "${pids[@]}"; do kill "${pid}" 2>/dev/null || true; done
for _ in $(seq 50); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "${pid}" 2>/dev/null && alive=1; done
    (( alive )) || break
    sleep 0.2
done
for pid in "${pids[@]}"; do kill -9 "${pid}" 2>/dev/null || true; done
rm -f "${DIR}/pids"
if (( purge )); then rm -rf "${DIR}"; fi
echo "kube-down: stopped the control plane in ${DIR}" >&2
