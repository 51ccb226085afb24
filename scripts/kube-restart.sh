#!/usr/bin/env bash
# Restart one component of a control plane started by scripts/kube-up.sh DIR, as an operator's
# restart would: stop it (SIGTERM, then SIGKILL after 30 s), start it again with the same command
# line (its log goes on in DIR/logs/NAME.log), and wait until it is ready again.
#
#   bash scripts/kube-restart.sh DIR kube-apiserver [SECONDS]
#
# SECONDS (default 0): how long the component stays down before it starts again (an outage).
# NAME is one of etcd, kube-apiserver, kube-controller-manager, kube-scheduler. Ready means: for
# kube-apiserver and etcd, the API server answers /readyz; for the others, that the process is up.
set -euo pipefail

DIR="${1:?usage: kube-restart.sh DIR NAME}"
NAME="${2:?usage: kube-restart.sh DIR NAME [SECONDS]}"
DOWN="${3:-0}"
[[ -f "${DIR}/pids" ]] || { echo "kube-restart: no control plane in ${DIR}" >&2; exit 2; }
[[ -f "${DIR}/commands/${NAME}" ]] || { echo "kube-restart: no command kept for ${NAME} in ${DIR}" >&2; exit 2; }
pid="$(awk -v name="${NAME}" '$2 == name {print $1}' "${DIR}/pids")"
[[ -n "${pid}" ]] || { echo "kube-restart: ${NAME} is not in ${DIR}/pids" >&2; exit 2; }

kill "${pid}" 2>/dev/null || true
for _ in $(seq 150); do kill -0 "${pid}" 2>/dev/null || break; sleep 0.2; done
kill -9 "${pid}" 2>/dev/null || true
sleep "${DOWN}"

nohup bash -c "exec $(cat "${DIR}/commands/${NAME}")" >> "${DIR}/logs/${NAME}.log" 2>&1 < /dev/null &
new="$!"
awk -v name="${NAME}" -v pid="${new}" '$2 == name {$1 = pid} {print}' "${DIR}/pids" > "${DIR}/pids.new"
mv "${DIR}/pids.new" "${DIR}/pids"

if [[ "${NAME}" == kube-apiserver || "${NAME}" == etcd ]]; then
    deadline=$((SECONDS + 120))
    until kubectl --kubeconfig "${DIR}/kubeconfig" --request-timeout=3s get --raw /readyz >/dev/null 2>&1; do
        (( SECONDS < deadline )) || { echo "kube-restart: ${NAME} not ready within 120 s" >&2; exit 1; }
        sleep 0.5
    done
fi
echo "kube-restart: ${NAME} restarted in ${DIR} (pid ${new})" >&2
