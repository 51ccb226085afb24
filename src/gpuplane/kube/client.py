"""A thin, dict-based layer over the official Kubernetes Python client: the one client wrapper
of every driver that talks to a cluster (the controller, the console, the reaper).

The official client does authentication, TLS and kubeconfig handling; this module
only builds paths for any resource (built-in or custom) and returns plain dicts, so
informers, the cache and the core's parser all work on the same JSON shapes the API
server sends. Errors are :class:`ApiError` with the HTTP status. Which resources the
controller uses is :mod:`gpuplane.k8s.api`'s.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from gpuplane.kube.ratelimit import DEFAULT_BURST, DEFAULT_QPS, RateLimiter


@dataclass(frozen=True, slots=True)
class Resource:
    """One REST resource: where it lives and what its objects are called."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
        if sub:
            base += f"/{sub}"
        return base


class ApiError(Exception):
    """An HTTP error from the API server."""

    def __init__(self, status: int, reason: str, body: str = "") -> None:
        super().__init__(f"{status} {reason}: {body[:300]}")
        self.status = status
        self.reason = reason
        self.body = body

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @property
    def not_found(self) -> bool:
        return self.status == 404


class WatchStop:
    """Ends one watch stream from another thread whenever :meth:`stop` comes: before the stream is
    opened, while it is being opened, or while it is read (owns the stop flag and the open response).

    The client's own ``Watch.stop`` misses a stop that lands before its stream has opened (the
    stream would then run until its first event or the server's timeout, holding a connection).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stopped = False
        self._response: urllib3.BaseHTTPResponse | None = None

    @property
    def stopped(self) -> bool:
        return self._stopped

    def stop(self) -> None:
        """Stop the stream: the open response's socket is shut down, so its reader ends at once."""
        with self._lock:
            self._stopped = True
            response = self._response
        if response is not None:
            _cut(response)

    def opened(self, response: urllib3.BaseHTTPResponse) -> None:
        """Note the stream's response (cut at once when the stream was stopped already)."""
        with self._lock:
            self._response = response
            stopped = self._stopped
        if stopped:
            _cut(response)

    def closed(self) -> None:
        with self._lock:
            self._response = None


def _cut(response: urllib3.BaseHTTPResponse) -> None:
    """Shut the socket of an open response down (its reader sees the end of the stream); the
    reader's ``close`` then closes it."""
    with contextlib.suppress(Exception):  # closed meanwhile: nothing to cut
        response.shutdown()


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> k8s_client.ApiClient:
    """An ApiClient from a kubeconfig file, or in-cluster configuration when none is given."""
    configuration = k8s_client.Configuration()
    # Every informer holds a connection open for its watch, and the controller writes from a pool of
    # threads; the default pool (5 per CPU) is smaller than that on small machines, and the overflow
    # was opened and thrown away on every request.
    configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, 64)
    if kubeconfig:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]  # the client ships no annotations here
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    else:
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]  # the client ships no annotations here
                context=context, client_configuration=configuration
            )
    return k8s_client.ApiClient(configuration)


class KubeApi:
    """Raw JSON requests through the official client's transport.

    Every request except a watch first takes a token from :attr:`limiter`: at most ``burst``
    requests at once, then ``qps`` per second (``qps=None``: no limit). The defaults bound a
    controller well above kube-scheduler's 50 QPS and below what one API server takes.
    """

    def __init__(
        self,
        api_client: k8s_client.ApiClient,
        timeout: float = 30.0,
        *,
        qps: float | None = DEFAULT_QPS,
        burst: int = DEFAULT_BURST,
    ) -> None:
        self.api_client = api_client
        self.timeout = timeout
        self.limiter = RateLimiter(qps, burst) if qps is not None else None

    def close(self) -> None:
        """Close every pooled connection of the client (idempotent); a later request opens anew."""
        self.api_client.close()  # type: ignore[no-untyped-call]  # the client ships no annotations here

    def _call(  # noqa: PLR0913 - one HTTP request: verb, path, query, body and two options
        self,
        method: str,
        path: str,
        query: Mapping[str, object] | None = None,
        body: object = None,
        *,
        content_type: str = "application/json",
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        if self.limiter is not None and not (query or {}).get("watch"):
            self.limiter.acquire()
        params = [(k, str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()]
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        serialized = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=params,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        return self.api_client.call_api(*serialized, _request_timeout=timeout or self.timeout)

    def request(
        self,
        method: str,
        path: str,
        query: Mapping[str, object] | None = None,
        body: object = None,
        *,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        response = self._call(method, path, query, body, content_type=content_type)
        data = response.read()
        if response.status >= 400:
            raise ApiError(response.status, str(response.reason), data.decode("utf-8", "replace"))
        if not data:
            return {}
        parsed = json.loads(data)
        return parsed if isinstance(parsed, dict) else {"items": parsed}

    # --- verbs --------------------------------------------------------------

    def list(self, res: Resource, namespace: str | None = None, **query: str | int | bool) -> dict[str, Any]:
        return self.request("GET", res.path(namespace), query)

    def get(self, res: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.request("GET", res.path(namespace, name))

    def create(self, res: Resource, body: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        return self.request("POST", res.path(namespace), body=dict(body))

    def replace(self, res: Resource, body: Mapping[str, Any], sub: str | None = None) -> dict[str, Any]:
        meta = body["metadata"]
        return self.request("PUT", res.path(meta.get("namespace"), meta["name"], sub), body=dict(body))

    def patch(  # noqa: PLR0913 - the API's patch: object, patch, namespace, subresource, type
        self,
        res: Resource,
        name: str,
        patch: object,
        namespace: str | None = None,
        *,
        sub: str | None = None,
        kind: str = "merge",
    ) -> dict[str, Any]:
        content = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[kind]
        return self.request("PATCH", res.path(namespace, name, sub), body=patch, content_type=content)

    def delete(
        self, res: Resource, name: str, namespace: str | None = None, **options: Any
    ) -> dict[str, Any]:
        return self.request("DELETE", res.path(namespace, name), body=options or None)

    def open_watch(  # noqa: PLR0913 - the client's list call: resource, namespace and four options
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        resource_version: str = "",
        timeout_seconds: int = 60,
        allow_watch_bookmarks: bool = True,
        stop: WatchStop | None = None,
        label_selector: str = "",
        **client_flags: bool,
    ) -> urllib3.BaseHTTPResponse:
        """Open a watch of ``res``: the list call that ``kubernetes.watch.Watch.stream`` drives.

        The client passes ``watch=True`` and ``_preload_content=False`` (``client_flags``), which is
        what this call always does; it returns the open response, which the client reads line by
        line and closes (``stop`` is told of it, so a stop from another thread can cut it). A
        refused watch (4xx/5xx before the stream starts) raises :class:`ApiError`.
        """
        del client_flags
        if stop is not None and stop.stopped:
            raise ApiError(499, "watch stopped before it was opened")
        query = {
            "watch": True,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": allow_watch_bookmarks,
            "timeoutSeconds": timeout_seconds,
        }
        if label_selector:
            query["labelSelector"] = label_selector
        response = self._call("GET", res.path(namespace), query, timeout=(10.0, timeout_seconds + 10.0))
        raw: urllib3.BaseHTTPResponse = response.response
        if response.status >= 400:
            try:
                body = response.read().decode("utf-8", "replace")
            finally:
                raw.release_conn()
            raise ApiError(response.status, str(response.reason), body)
        if stop is not None:
            stop.opened(raw)
        return raw

    def watch(  # noqa: PLR0913 - keyword-only: the client's watcher and the stop
        self,
        res: Resource,
        resource_version: str,
        timeout_seconds: int = 60,
        namespace: str | None = None,
        *,
        watcher: k8s_watch.Watch | None = None,
        stop: WatchStop | None = None,
        label_selector: str = "",
    ) -> Generator[dict[str, Any], None, None]:
        """Watch events from ``resource_version`` (with bookmarks) until the server ends the stream.

        The official client's :class:`kubernetes.watch.Watch` reads the stream; events come as the
        server sent them (``type`` and ``object``, a plain dict). An ERROR event, such as ``410
        Gone`` for a version the server no longer has, raises :class:`ApiError` (the client does
        not retry a watch that has a timeout). ``stop.stop()`` from another thread ends the stream
        at once, whenever it comes (``watcher.stop()`` does too, once the stream has opened).
        ``label_selector``: only the objects it selects.
        """
        watcher = watcher or k8s_watch.Watch()  # type: ignore[no-untyped-call]  # the client ships no annotations here
        stream = watcher.stream(  # type: ignore[no-untyped-call]
            self.open_watch,
            res,
            namespace,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            allow_watch_bookmarks=True,
            stop=stop,
            label_selector=label_selector,
        )
        try:
            for event in stream:
                if event is not None:  # the client yields None for a blank line
                    yield {"type": event["type"], "object": event["raw_object"]}
        except ApiException as err:
            raise ApiError(int(err.status or 500), str(err.reason), str(err.body or "")) from err
        finally:
            stream.close()  # the client closes the response and gives its connection back
            if stop is not None:
                stop.closed()
