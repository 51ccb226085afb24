#!/usr/bin/env bash
# Start a real Kubernetes control plane on loopback, for the tests and the benchmarks.
#
#   scripts/kube-up.sh [DIR]      (default DIR: $GPUPLANE_KUBE_DIR or /tmp/gpuplane-kube)
#
# It runs etcd (Debian's etcd-server), kube-apiserver, kube-controller-manager and kube-scheduler, all
# bound to 127.0.0.1 on free ports, and writes into DIR:
#   kubeconfig        admin (group system:masters), verifies the server's certificate against ca.crt
#   tokens.csv        static bearer tokens: admin, alice (group team-a), bob (group team-b), carol
#   users/NAME.kubeconfig  one kubeconfig per token user (no RBAC until a test grants it)
#   ca.crt, front-proxy-ca.crt   the serving CA and the aggregation (request-header) CA
#   logs/             one log per component;  pids: their process ids;  env: KUBECONFIG=...
#   audit.log         the API server's audit log (Metadata level) of the requests made by gpuplane's
#                     ServiceAccounts (namespace gpuplane-system) only, so it stays small; set
#                     GPUPLANE_KUBE_AUDIT=0 to start without it (audit-policy.yaml: the policy)
#
# There are no kubelets: Nodes are objects that tests create. So the TaintNodesByCondition admission
# plugin is off and the controller-manager runs without `nodelifecycle`, or every Node would be tainted
# not-ready. Pods bound to such Nodes never finish terminating: delete them with grace period 0.
#
# Binaries: $GPUPLANE_KUBE_BIN (a directory with kube-apiserver, kube-controller-manager and
# kube-scheduler, e.g. envtest's or a release download), else the xz-compressed v1.36.2 binaries in
# ../shared/k8s (or $GPUPLANE_KUBE_SRC), unpacked once into $XDG_CACHE_HOME/gpuplane/kube/VERSION so a
# second start takes seconds. Running it again on a DIR whose control plane answers does nothing.
# scripts/kube-down.sh DIR stops it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-${GPUPLANE_KUBE_DIR:-/tmp/gpuplane-kube}}"
VERSION="v1.36.2"
SRC="${GPUPLANE_KUBE_SRC:-${ROOT}/../shared/k8s}"
CACHE="${XDG_CACHE_HOME:-${HOME}/.cache}/gpuplane/kube/${VERSION}"
KCM_QPS="${GPUPLANE_KCM_QPS:-200}"     # the Job controller creates pods at about this rate
KCM_BURST="${GPUPLANE_KCM_BURST:-400}"
START_TIMEOUT="${GPUPLANE_KUBE_START_TIMEOUT:-90}"
AUDIT="${GPUPLANE_KUBE_AUDIT:-1}"

die() { echo "kube-up: $*" >&2; exit 1; }
log() { echo "kube-up: $*" >&2; }

mkdir -p "${DIR}"
DIR="$(cd "${DIR}" && pwd)"

# --- Already running? -------------------------------------------------------------------------------
if [[ -f "${DIR}/kubeconfig" ]] && kubectl --kubeconfig "${DIR}/kubeconfig" --request-timeout=3s \
    get --raw /readyz >/dev/null 2>&1; then
    log "already running in ${DIR}"
    echo "${DIR}/kubeconfig"
    exit 0
fi

# --- Binaries ---------------------------------------------------------------------------------------
command -v etcd >/dev/null || die "etcd not found: apt-get install etcd-server"
command -v openssl >/dev/null || die "openssl not found: apt-get install openssl"
command -v kubectl >/dev/null || die "kubectl not found: apt-get install kubectl"
if [[ -n "${GPUPLANE_KUBE_BIN:-}" ]]; then
    BIN="${GPUPLANE_KUBE_BIN}"
else
    BIN="${CACHE}"
    mkdir -p "${BIN}"
    for name in kube-apiserver kube-controller-manager kube-scheduler; do
        if [[ ! -x "${BIN}/${name}" ]]; then
            [[ -f "${SRC}/${name}.xz" ]] || die "${SRC}/${name}.xz not found (set GPUPLANE_KUBE_BIN or GPUPLANE_KUBE_SRC)"
            log "unpacking ${name} into ${BIN} (once)"
            xz -dc "${SRC}/${name}.xz" > "${BIN}/${name}.part"
            chmod +x "${BIN}/${name}.part"
            mv "${BIN}/${name}.part" "${BIN}/${name}"
        fi
    done
fi
for name in kube-apiserver kube-controller-manager kube-scheduler; do
    [[ -x "${BIN}/${name}" ]] || die "${BIN}/${name} is missing or not executable"
done

# --- Ports ------------------------------------------------------------------------------------------
free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}
ETCD_PORT="$(free_port)"; ETCD_PEER_PORT="$(free_port)"; API_PORT="$(free_port)"
KCM_PORT="$(free_port)"; SCHED_PORT="$(free_port)"
SERVER="https://127.0.0.1:${API_PORT}"

# --- Certificates and keys --------------------------------------------------------------------------
PKI="${DIR}/pki"
rm -rf "${PKI}" "${DIR}/etcd" "${DIR}/users"
mkdir -p "${PKI}" "${DIR}/logs" "${DIR}/users"
ossl() { openssl "$@" >/dev/null 2>&1 || die "openssl $1 failed"; }
new_ca() {  # new_ca NAME CN
    ossl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$2" \
        -keyout "${PKI}/$1.key" -out "${PKI}/$1.crt" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature"
}
new_cert() {  # new_cert NAME CA CN EXTENSIONS
    ossl req -newkey rsa:2048 -nodes -subj "/CN=$3" -keyout "${PKI}/$1.key" -out "${PKI}/$1.csr"
    printf '%s\n' "$4" > "${PKI}/$1.ext"
    ossl x509 -req -in "${PKI}/$1.csr" -CA "${PKI}/$2.crt" -CAkey "${PKI}/$2.key" -CAcreateserial \
        -days 30 -out "${PKI}/$1.crt" -extfile "${PKI}/$1.ext"
}
new_ca ca gpuplane-test-ca
new_cert apiserver ca kube-apiserver \
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
new_ca front-proxy-ca gpuplane-front-proxy-ca
new_cert front-proxy-client front-proxy-ca front-proxy-client \
    "keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
ossl genrsa -out "${PKI}/sa.key" 2048
ossl rsa -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub"
cp "${PKI}/ca.crt" "${DIR}/ca.crt"
cp "${PKI}/front-proxy-ca.crt" "${DIR}/front-proxy-ca.crt"

# --- Tokens and kubeconfigs -------------------------------------------------------------------------
token() { openssl rand -hex 16; }
declare -A TOKENS
: > "${DIR}/tokens.csv"
add_user() {  # add_user NAME GROUPS
    local value; value="$(token)"
    TOKENS[$1]="${value}"
    if [[ -n "$2" ]]; then
        printf '%s,%s,%s,"%s"\n' "${value}" "$1" "$1" "$2" >> "${DIR}/tokens.csv"
    else
        printf '%s,%s,%s\n' "${value}" "$1" "$1" >> "${DIR}/tokens.csv"
    fi
}
add_user admin system:masters
add_user system:kube-controller-manager ""
add_user system:kube-scheduler ""
add_user alice team-a
add_user bob team-b
add_user carol ""
chmod 600 "${DIR}/tokens.csv"

kubeconfig() {  # kubeconfig FILE USER
    local ca; ca="$(base64 -w0 < "${PKI}/ca.crt")"
    cat > "$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: gpuplane-test
  cluster:
    server: ${SERVER}
    certificate-authority-data: ${ca}
users:
- name: $2
  user:
    token: ${TOKENS[$2]}
contexts:
- name: $2@gpuplane-test
  context:
    cluster: gpuplane-test
    user: $2
current-context: $2@gpuplane-test
EOF
    chmod 600 "$1"
}
kubeconfig "${DIR}/kubeconfig" admin
kubeconfig "${PKI}/kcm.kubeconfig" system:kube-controller-manager
kubeconfig "${PKI}/scheduler.kubeconfig" system:kube-scheduler
for user in alice bob carol; do kubeconfig "${DIR}/users/${user}.kubeconfig" "${user}"; done

# --- Start ------------------------------------------------------------------------------------------
: > "${DIR}/pids"
mkdir -p "${DIR}/commands"
start() {  # start NAME COMMAND...: the command is kept in DIR/commands/NAME for scripts/kube-restart.sh
    local name="$1"; shift
    printf '%q ' "$@" > "${DIR}/commands/${name}"
    nohup "$@" > "${DIR}/logs/${name}.log" 2>&1 < /dev/null &
    echo "$! ${name}" >> "${DIR}/pids"
}
fail() {
    log "$1; last lines of the logs in ${DIR}/logs:"
    tail -n 15 "${DIR}"/logs/*.log >&2 || true
    bash "${ROOT}/scripts/kube-down.sh" "${DIR}" >/dev/null 2>&1 || true
    exit 1
}
wait_for() {  # wait_for WHAT COMMAND...
    local what="$1"; shift
    local deadline=$((SECONDS + START_TIMEOUT))
    until "$@" >/dev/null 2>&1; do
        (( SECONDS < deadline )) || fail "${what} did not become ready within ${START_TIMEOUT} s"
        sleep 0.5
    done
}

start etcd etcd --name gpuplane-test --data-dir "${DIR}/etcd" \
    --listen-client-urls "http://127.0.0.1:${ETCD_PORT}" --advertise-client-urls "http://127.0.0.1:${ETCD_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "gpuplane-test=http://127.0.0.1:${ETCD_PEER_PORT}" \
    --quota-backend-bytes 4294967296 --snapshot-count 100000
wait_for etcd python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:${ETCD_PORT}/health', timeout=2)"

# Audit: which verb on which resource gpuplane's own ServiceAccounts used (tests/test_rbac_audit.py
# compares it with what deploy/ grants). Nothing else is logged.
AUDIT_FLAGS=()
if [[ "${AUDIT}" != "0" ]]; then
    cat > "${DIR}/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:gpuplane-system"]
  - level: None
POLICY
    AUDIT_FLAGS=(--audit-policy-file "${DIR}/audit-policy.yaml" --audit-log-path "${DIR}/audit.log"
        --audit-log-format json --audit-log-maxsize 200 --audit-log-mode blocking)
fi

start kube-apiserver "${BIN}/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:${ETCD_PORT}" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "${API_PORT}" \
    --tls-cert-file "${PKI}/apiserver.crt" --tls-private-key-file "${PKI}/apiserver.key" \
    --client-ca-file "${PKI}/ca.crt" \
    --token-auth-file "${DIR}/tokens.csv" \
    --authorization-mode RBAC \
    --service-account-key-file "${PKI}/sa.pub" --service-account-signing-key-file "${PKI}/sa.key" \
    --service-account-issuer https://kubernetes.default.svc \
    --service-cluster-ip-range 10.96.0.0/16 \
    --disable-admission-plugins TaintNodesByCondition \
    --allow-privileged=true \
    --requestheader-client-ca-file "${PKI}/front-proxy-ca.crt" \
    --requestheader-allowed-names front-proxy-client \
    --requestheader-username-headers X-Remote-User \
    --requestheader-group-headers X-Remote-Group \
    --requestheader-extra-headers-prefix X-Remote-Extra- \
    --proxy-client-cert-file "${PKI}/front-proxy-client.crt" \
    --proxy-client-key-file "${PKI}/front-proxy-client.key" \
    --max-requests-inflight 1600 --max-mutating-requests-inflight 800 \
    "${AUDIT_FLAGS[@]}" \
    --profiling=false
wait_for kube-apiserver kubectl --kubeconfig "${DIR}/kubeconfig" --request-timeout=3s get --raw /readyz

start kube-controller-manager "${BIN}/kube-controller-manager" \
    --kubeconfig "${PKI}/kcm.kubeconfig" \
    --authentication-kubeconfig "${PKI}/kcm.kubeconfig" --authorization-kubeconfig "${PKI}/kcm.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "${KCM_PORT}" \
    --controllers '*,-nodelifecycle' \
    --service-account-private-key-file "${PKI}/sa.key" --use-service-account-credentials \
    --root-ca-file "${PKI}/ca.crt" \
    --leader-elect=false \
    --kube-api-qps "${KCM_QPS}" --kube-api-burst "${KCM_BURST}" \
    --profiling=false
start kube-scheduler "${BIN}/kube-scheduler" \
    --kubeconfig "${PKI}/scheduler.kubeconfig" \
    --authentication-kubeconfig "${PKI}/scheduler.kubeconfig" \
    --authorization-kubeconfig "${PKI}/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "${SCHED_PORT}" \
    --leader-elect=false \
    --profiling=false

# Ready means: the default namespace has its ServiceAccount (the controller-manager works), and the
# scheduler answers its health check.
wait_for kube-controller-manager kubectl --kubeconfig "${DIR}/kubeconfig" --request-timeout=3s \
    -n default get serviceaccount default
wait_for kube-scheduler python3 -c "
import ssl, urllib.request
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
urllib.request.urlopen('https://127.0.0.1:${SCHED_PORT}/healthz', context=ctx, timeout=2)"

printf 'KUBECONFIG=%s\n' "${DIR}/kubeconfig" > "${DIR}/env"
log "control plane ${VERSION} up at ${SERVER} (logs in ${DIR}/logs)"
echo "${DIR}/kubeconfig"
