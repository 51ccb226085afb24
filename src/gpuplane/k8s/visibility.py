"""Kueue's visibility API, served by gpuplane as an aggregated API of the Kubernetes API server.

``visibility.kueue.x-k8s.io`` ``v1beta1`` and ``v1beta2``, read-only::

    GET /apis/visibility.kueue.x-k8s.io/VERSION/clusterqueues/CQ/pendingworkloads?limit=&offset=
    GET /apis/visibility.kueue.x-k8s.io/VERSION/namespaces/NS/localqueues/LQ/pendingworkloads?...

Both answer a ``PendingWorkloadsSummary`` whose items are the pending workloads in queue order,
with ``positionInClusterQueue`` and ``positionInLocalQueue`` counted from 0 as Kueue counts them,
``limit`` (default 1000) and ``offset`` (default 0) applied after ordering. gpuplane adds
``eta`` (``{seconds, low, high, basis}``: the median start and its 10th-90th percentile range),
``reason`` and ``message`` to each item, and ``headEta`` to the summary: the ``eta`` of the
queue's first pending workload (with its ``workload``), whatever the page.

The API server proxies requests here (an ``APIService``, see docs/visibility.md). Authentication
is the API server's: a request is trusted only over a TLS client certificate signed by the
request-header (front-proxy) CA with an allowed common name, and the user and groups come from
the ``X-Remote-User``/``X-Remote-Group`` headers. Authorization is the API server's too: each
request becomes a ``SubjectAccessReview`` for verb ``get`` on the ``pendingworkloads``
subresource of the ClusterQueue or LocalQueue, so RBAC decides (answers are cached for a few
seconds).

What is pending comes from a :class:`VisibilityView` (the explanations of one plan), given by a
callable: the controller hands over each pass's view; ``gpuplane visibility`` computes its own.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import ssl
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from gpuplane.core.session import Plan, config_from_kueue, schedule
from gpuplane.insight.runtime_history import RuntimeSample
from gpuplane.insight.why import Explanation, explain_all
from gpuplane.k8s.api import SUBJECT_ACCESS_REVIEWS, ApiError, KubeApi
from gpuplane.k8s.replies import reply_json
from gpuplane.model.objects import ClusterState, Workload

log = logging.getLogger(__name__)

GROUP = "visibility.kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")
DEFAULT_LIMIT = 1000
ALLOWED_NAMES = ("front-proxy-client",)


# ---------------------------------------------------------------------------
# What is pending
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VisibilityView:
    """The explanations of one plan, with the workloads they are about."""

    explanations: tuple[Explanation, ...] = ()
    workloads: Mapping[str, Workload] = field(default_factory=dict)


def view_of(
    state: ClusterState, plan: Plan, now: float, *, history: Iterable[RuntimeSample] = ()
) -> VisibilityView:
    """The view of ``plan`` made on ``state`` at ``now``; ``history``: finished runs recorded
    elsewhere (the controller's runtime history), learned with the state's own."""
    config = config_from_kueue(state.configuration)
    found = explain_all(state, plan, now, config, diagnose=False, history=history)
    return VisibilityView(found, {wl.key: wl for wl in state.workloads})


def view_of_state(
    state: ClusterState, now: float, *, history: Iterable[RuntimeSample] = ()
) -> VisibilityView:
    """Plan as ``gpuplane schedule`` does (cycles to a fixed point), then :func:`view_of`."""
    plan = schedule(state, config_from_kueue(state.configuration), now, cycles=None)
    return view_of(state, plan, now, history=history)


def _rfc3339(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _eta(found: Explanation) -> dict[str, Any]:
    return {
        "seconds": found.eta.seconds,
        "low": found.eta.low,
        "high": found.eta.high,
        "basis": found.eta.basis,
    }


def _item(found: Explanation, wl: Workload | None) -> dict[str, Any]:
    ns, _, name = found.workload.partition("/")
    meta: dict[str, Any] = {"name": name, "namespace": ns}
    if wl is not None and wl.creation:
        meta["creationTimestamp"] = _rfc3339(wl.creation)
    lq = (found.local_queue or "").partition("/")[2]
    return {
        "metadata": meta,
        "priority": wl.priority if wl is not None else 0,
        "localQueueName": lq,
        "positionInClusterQueue": found.position_in_cluster_queue,
        "positionInLocalQueue": found.position_in_local_queue,
        "eta": _eta(found),
        "reason": found.reason,
        "message": found.message,
    }


def pending_workloads_summary(  # noqa: PLR0913 - keyword-only: the queue and the page
    view: VisibilityView,
    version: str,
    *,
    cluster_queue: str | None = None,
    local_queue: tuple[str, str] | None = None,
    limit: int = DEFAULT_LIMIT,
    offset: int = 0,
) -> dict[str, Any]:
    """The ``PendingWorkloadsSummary`` of a ClusterQueue, or of a LocalQueue ``(namespace, name)``."""
    queued = [e for e in view.explanations if e.position_in_cluster_queue is not None]
    if cluster_queue is not None:
        chosen = [e for e in queued if e.cluster_queue == cluster_queue]
        chosen.sort(key=lambda e: e.position_in_cluster_queue or 0)
    else:
        assert local_queue is not None
        key = f"{local_queue[0]}/{local_queue[1]}"
        chosen = [e for e in queued if e.local_queue == key]
        chosen.sort(key=lambda e: e.position_in_local_queue or 0)
    page = chosen[offset : offset + limit]
    summary: dict[str, Any] = {
        "kind": "PendingWorkloadsSummary",
        "apiVersion": f"{GROUP}/{version}",
        "metadata": {"creationTimestamp": None},
        "items": [_item(e, view.workloads.get(e.workload)) for e in page],
    }
    if chosen:  # the queue's head, whatever the page: when the queue moves next
        summary["headEta"] = {"workload": chosen[0].workload, **_eta(chosen[0])}
    return summary


def api_group() -> dict[str, Any]:
    versions = [{"groupVersion": f"{GROUP}/{v}", "version": v} for v in VERSIONS]
    return {
        "kind": "APIGroup",
        "apiVersion": "v1",
        "name": GROUP,
        "versions": versions,
        "preferredVersion": versions[0],
    }


def api_resources(version: str) -> dict[str, Any]:
    def res(name: str, kind: str, namespaced: bool, verbs: Sequence[str]) -> dict[str, Any]:
        return {
            "name": name,
            "singularName": "",
            "namespaced": namespaced,
            "kind": kind,
            "verbs": list(verbs),
        }

    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": f"{GROUP}/{version}",
        "resources": [
            res("clusterqueues", "ClusterQueue", False, []),
            res("clusterqueues/pendingworkloads", "PendingWorkloadsSummary", False, ["get"]),
            res("localqueues", "LocalQueue", True, []),
            res("localqueues/pendingworkloads", "PendingWorkloadsSummary", True, ["get"]),
        ],
    }


# ---------------------------------------------------------------------------
# Authorization: the API server decides (SubjectAccessReview), cached briefly
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Access:
    user: str
    groups: tuple[str, ...]
    resource: str  # clusterqueues | localqueues
    name: str
    namespace: str = ""


class Authorizer:
    """Asks the API server whether a user may ``get`` a ``pendingworkloads`` subresource."""

    def __init__(self, api: KubeApi, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[Access, tuple[float, bool, str]] = {}
        self._lock = threading.Lock()

    def allowed(self, access: Access, version: str) -> tuple[bool, str]:
        now = self.clock()
        with self._lock:
            hit = self._cache.get(access)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1], hit[2]
        attributes = {
            "group": GROUP,
            "version": version,
            "resource": access.resource,
            "subresource": "pendingworkloads",
            "name": access.name,
            "verb": "get",
        }
        if access.namespace:
            attributes["namespace"] = access.namespace
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": access.user, "groups": list(access.groups), "resourceAttributes": attributes},
        }
        try:
            answer = self.api.create(SUBJECT_ACCESS_REVIEWS, body)
        except ApiError as err:
            log.warning("SubjectAccessReview failed: %s", err)
            return False, "authorization is unavailable"
        status = answer.get("status", {})
        allowed = bool(status.get("allowed")) and not status.get("denied")
        reason = str(status.get("reason", ""))
        with self._lock:
            self._cache[access] = (now, allowed, reason)
        return allowed, reason


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _nonnegative(query: Mapping[str, list[str]], name: str, default: int) -> int:
    values = query.get(name)
    if not values:
        return default
    value = int(values[0])  # ValueError on bad input, answered as 400
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return value


@dataclass
class VisibilityApp:
    """Routing and authorization; no sockets (the handler below and the tests drive it)."""

    source: Callable[[], VisibilityView]
    authorizer: Authorizer | None
    allowed_names: Sequence[str] = ALLOWED_NAMES

    def handle(self, path: str, user: str | None, groups: Sequence[str]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, JSON body) for a GET of ``path`` (with query) by ``user``."""
        parsed = urllib.parse.urlsplit(path)
        parts = [p for p in parsed.path.split("/") if p]
        try:
            version, rest, who = self._route(parsed.path, parts, user)
            access, target = _pending_target(parsed.path, rest, who, groups)
            self._authorize(access, version)
            query = urllib.parse.parse_qs(parsed.query)
            try:
                limit = _nonnegative(query, "limit", DEFAULT_LIMIT)
                offset = _nonnegative(query, "offset", 0)
            except ValueError as err:
                raise _Reply(400, _status(400, "BadRequest", f"invalid query: {err}")) from err
            try:
                view = self.source()
            except Exception as err:  # the cluster could not be read: the API says so instead of dying
                log.exception("visibility source failed")
                message = f"pending workloads unavailable: {err}"
                raise _Reply(503, _status(503, "ServiceUnavailable", message)) from err
        except _Reply as reply:
            return reply.code, reply.body
        return 200, pending_workloads_summary(view, version, limit=limit, offset=offset, **target)

    @staticmethod
    def _route(path: str, parts: list[str], user: str | None) -> tuple[str, list[str], str]:
        """The served version, the path below it and the user; health, discovery and errors are
        replies."""
        if parts in (["healthz"], ["readyz"], ["livez"]):
            raise _Reply(200, {"status": "ok"})
        if user is None:
            raise _Reply(401, _status(401, "Unauthorized", "no authenticated front-proxy client"))
        if parts == ["apis"]:
            raise _Reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": [api_group()]})
        if len(parts) < 2 or parts[:2] != ["apis", GROUP]:
            raise _Reply(404, _status(404, "NotFound", f"the server could not find {path}"))
        if len(parts) == 2:
            raise _Reply(200, api_group())
        version = parts[2]
        if version not in VERSIONS:
            raise _Reply(404, _status(404, "NotFound", f"version {version} of {GROUP} is not served"))
        if len(parts) == 3:
            raise _Reply(200, api_resources(version))
        return version, parts[3:], user

    def _authorize(self, access: Access, version: str) -> None:
        if self.authorizer is None:
            return
        allowed, why = self.authorizer.allowed(access, version)
        if not allowed:
            scope = f' in the namespace "{access.namespace}"' if access.namespace else " at the cluster scope"
            message = (
                f'{access.resource}.{GROUP} "{access.name}" is forbidden: User "{access.user}" cannot get '
                f'resource "{access.resource}/pendingworkloads" in API group "{GROUP}"{scope}'
                + (f": {why}" if why else "")
            )
            raise _Reply(403, _status(403, "Forbidden", message))


class _Reply(Exception):  # noqa: N818 - not an error: a finished answer, raised to leave the routing early
    """An answer found before the pending workloads are read (health, discovery, an error)."""

    def __init__(self, code: int, body: dict[str, Any]) -> None:
        super().__init__(code)
        self.code = code
        self.body = body


def _pending_target(
    path: str, rest: list[str], user: str, groups: Sequence[str]
) -> tuple[Access, dict[str, Any]]:
    """Who asks for which queue's pending workloads, and the summary's queue argument."""
    if len(rest) == 3 and rest[0] == "clusterqueues" and rest[2] == "pendingworkloads":
        return Access(user, tuple(groups), "clusterqueues", rest[1]), {"cluster_queue": rest[1]}
    if (
        len(rest) == 5
        and rest[0] == "namespaces"
        and rest[2] == "localqueues"
        and rest[4] == "pendingworkloads"
    ):
        access = Access(user, tuple(groups), "localqueues", rest[3], rest[1])
        return access, {"local_queue": (rest[1], rest[3])}
    raise _Reply(404, _status(404, "NotFound", f"the server could not find {path}"))


def _identity(handler: BaseHTTPRequestHandler, app: VisibilityApp) -> tuple[str | None, list[str]]:
    """The user the API server vouches for, or ``None`` (no valid front-proxy certificate)."""
    sock = handler.connection
    cert = sock.getpeercert() if isinstance(sock, ssl.SSLSocket) else None
    if not cert:
        return None, []
    names = [str(attr[1]) for rdn in cert.get("subject", ()) for attr in rdn if attr[0] == "commonName"]
    if app.allowed_names and not any(n in app.allowed_names for n in names):
        return None, []
    user = handler.headers.get("X-Remote-User")
    groups = handler.headers.get_all("X-Remote-Group") or []
    return user, [g for value in groups for g in value.split(",") if g]


def make_handler(app: VisibilityApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            user, groups = _identity(self, app)
            status, body = app.handle(self.path, user, groups)
            reply_json(self, status, body)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug(format, *args)

    return Handler


def serve(  # noqa: PLR0913 - keyword-only: the TLS files and the address
    app: VisibilityApp,
    *,
    port: int,
    cert: str,
    key: str,
    client_ca: str,
    host: str = "0.0.0.0",
) -> ThreadingHTTPServer:
    """HTTPS server for ``app``; client certificates are checked against ``client_ca``.

    A request without a valid certificate still gets a TLS connection (health probes), but is
    anonymous and gets 401 for everything but ``/healthz``, ``/readyz`` and ``/livez``.
    """
    server = ThreadingHTTPServer((host, port), make_handler(app))
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    context.load_verify_locations(client_ca)
    context.verify_mode = ssl.CERT_OPTIONAL
    server.socket = context.wrap_socket(server.socket, server_side=True)
    return server


def self_signed(hosts: Sequence[str], directory: Path | None = None) -> tuple[Path, Path]:
    """A serving certificate and key for ``hosts`` (DNS names or IPs), valid one year; PEM files."""
    from cryptography import x509  # noqa: PLC0415 - only needed when no certificate is given
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import NameOID  # noqa: PLC0415

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0] if hosts else "gpuplane-visibility")])
    sans: list[x509.GeneralName] = []
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=365))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    folder = directory or Path(tempfile.mkdtemp(prefix="gpuplane-visibility-"))
    cert_path, key_path = folder / "tls.crt", folder / "tls.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_path.chmod(0o600)
    return cert_path, key_path


class CachedSource:
    """A view recomputed at most every ``ttl`` seconds (``gpuplane visibility`` without a controller)."""

    def __init__(self, compute: Callable[[], VisibilityView], ttl: float = 2.0) -> None:
        self.compute = compute
        self.ttl = ttl
        self._at = float("-inf")
        self._view = VisibilityView()
        self._lock = threading.Lock()

    def __call__(self) -> VisibilityView:
        with self._lock:
            if time.monotonic() - self._at >= self.ttl:
                self._view = self.compute()
                self._at = time.monotonic()
            return self._view


class LatestView:
    """The view of the controller's last pass (``observe`` is a controller observer)."""

    def __init__(self) -> None:
        self._view = VisibilityView()
        self._lock = threading.Lock()

    def observe(self, state: ClusterState, plan: Plan, now: float, pass_seconds: float | None = None) -> None:
        del pass_seconds
        self.set(view_of(state, plan, now))

    def set(self, view: VisibilityView) -> None:
        with self._lock:
            self._view = view

    def __call__(self) -> VisibilityView:
        with self._lock:
            return self._view
