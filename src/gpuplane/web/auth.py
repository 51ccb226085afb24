"""Who is looking, and which namespaces they may see.

Every request carries a bearer token (``Authorization: Bearer ...``, or the ``gpuplane_token``
cookie that the login page sets in the browser). An :class:`Authenticator` turns it into a
:class:`Viewer`, or ``None`` for a token it does not accept (the console answers 401).

* :class:`KubeAuthenticator` asks the API server: a ``TokenReview`` says who the token belongs
  to, then ``SubjectAccessReview``s say whether that user may ``list`` Workloads
  (``kueue.x-k8s.io``) cluster-wide or in each namespace, ``list`` Nodes, and ``list``
  MultiKueueClusters (the Fleet panel of a MultiKueue manager). Kubernetes RBAC
  alone decides. Answers are cached per token for ``ttl`` seconds, so a page view costs no API
  call once warm, and a revoked grant stops working within ``ttl``.
* :class:`TokenFileAuthenticator` reads kube-apiserver's static token file format
  (``token,user,uid,"group1,group2"``), for state-file mode: a known token sees everything.

The console has no write endpoint, so a token only ever reads.
"""

from __future__ import annotations

import csv
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuplane.k8s.api import ApiError, KubeApi, Resource

TOKEN_REVIEWS = Resource("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
ACCESS_REVIEWS = Resource(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
COOKIE = "gpuplane_token"


@dataclass(frozen=True, slots=True)
class Viewer:
    """An authenticated user and what they may see. ``namespaces`` is ``None`` for all of them;
    ``sees_fleet``: whether they may list MultiKueueClusters (the Fleet panel), which says what they
    may see, not who they are, so viewers compare without it."""

    name: str
    groups: tuple[str, ...] = ()
    namespaces: frozenset[str] | None = None
    sees_nodes: bool = True
    sees_fleet: bool = field(default=True, compare=False)

    def sees(self, namespace: str) -> bool:
        return self.namespaces is None or namespace in self.namespaces

    def sees_owner(self, owner: str) -> bool:
        """Whether a device holder (``ns/name`` or ``pod:ns/name``) is in a visible namespace."""
        namespace = owner.removeprefix("pod:").partition("/")[0]
        return self.sees(namespace)


EVERYONE = Viewer("anonymous")


class Authenticator(Protocol):
    def authenticate(self, token: str) -> Viewer | None:
        """The viewer a token stands for, or ``None`` when the token is not accepted."""


class AllowAll:
    """No authentication (``--no-auth``): every request sees everything."""

    def authenticate(self, token: str) -> Viewer | None:  # noqa: ARG002  # the token is ignored by design
        return EVERYONE


class TokenFileAuthenticator:
    """Static tokens from a file in kube-apiserver's ``--token-auth-file`` format."""

    def __init__(self, path: Path) -> None:
        self._users: dict[str, Viewer] = {}
        with path.open(newline="", encoding="utf-8") as handle:
            for row in csv.reader(handle):
                if not row or row[0].startswith("#"):
                    continue
                if len(row) < 2 or not row[0].strip():
                    raise ValueError(f"{path}: each line needs at least token,user")
                groups = tuple(g for g in (row[3].split(",") if len(row) > 3 else []) if g)
                self._users[row[0].strip()] = Viewer(row[1].strip(), groups)
        if not self._users:
            raise ValueError(f"{path}: no tokens")

    def authenticate(self, token: str) -> Viewer | None:
        for known, viewer in self._users.items():
            if hmac.compare_digest(known.encode(), token.encode()):
                return viewer
        return None


class KubeAuthenticator:
    """TokenReview then SubjectAccessReview against the API server, cached per token."""

    def __init__(
        self,
        api: KubeApi,
        namespaces: Callable[[], Iterable[str]],
        *,
        ttl: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = api
        self.namespaces = namespaces
        self.ttl = ttl
        self.clock = clock
        self._cache: dict[str, tuple[float, Viewer | None]] = {}
        self._lock = threading.Lock()

    def authenticate(self, token: str) -> Viewer | None:
        digest = hashlib.sha256(token.encode()).hexdigest()
        now = self.clock()
        with self._lock:
            hit = self._cache.get(digest)
        if hit is not None and now - hit[0] < self.ttl:
            return hit[1]
        viewer = self._review(token)
        with self._lock:
            self._cache[digest] = (now, viewer)
        return viewer

    def _review(self, token: str) -> Viewer | None:
        try:
            review = self.api.create(
                TOKEN_REVIEWS,
                {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}},
            )
        except ApiError:
            return None
        status = review.get("status", {})
        if not status.get("authenticated"):
            return None
        user = status.get("user", {})
        name = str(user.get("username", ""))
        groups = tuple(str(g) for g in user.get("groups", []) or [])
        uid = str(user.get("uid", ""))
        extra = user.get("extra") or {}

        def allowed(verb: str, resource: str, group: str, namespace: str = "") -> bool:
            attrs = {"verb": verb, "resource": resource, "group": group}
            if namespace:
                attrs["namespace"] = namespace
            body = {
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": name,
                    "groups": list(groups),
                    "uid": uid,
                    "extra": extra,
                    "resourceAttributes": attrs,
                },
            }
            try:
                answer = self.api.create(ACCESS_REVIEWS, body)
            except ApiError:
                return False
            return bool(answer.get("status", {}).get("allowed"))

        sees_nodes = allowed("list", "nodes", "")
        sees_fleet = allowed("list", "multikueueclusters", "kueue.x-k8s.io")
        if allowed("list", "workloads", "kueue.x-k8s.io"):
            return Viewer(name, groups, None, sees_nodes, sees_fleet)
        visible = frozenset(
            ns for ns in self.namespaces() if allowed("list", "workloads", "kueue.x-k8s.io", ns)
        )
        return Viewer(name, groups, visible, sees_nodes, sees_fleet)


def bearer_token(authorization: str | None, cookie: str | None) -> str | None:
    """The token of a request: the Authorization header first, then the console's cookie."""
    if authorization:
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
        return None
    if cookie:
        return cookie
    return None
