"""The HTTP face of the double: the Kubernetes REST API on a loopback socket, served from a thread.

Plain HTTP/1.1 on 127.0.0.1 with an ephemeral port; kubectl and the official Python client both accept an
``http://`` server in a kubeconfig, so no TLS is involved. Every request is parsed into a
:class:`~.faults.Request`, logged, offered to the fault hooks, then routed:

    /version /healthz /readyz /livez        static
    /api /apis /api/v1 /apis/<g>[/<v>]       discovery
    /openapi/v3[/<g>/<v>]                    OpenAPI (see .discovery)
    /api/v1/...  /apis/<g>/<v>/...           resources: [namespaces/<ns>/]<plural>[/<name>[/<subresource>]]

Request bodies are JSON (YAML for apply patches) or, from kubectl's generator commands, protobuf (see
.protobuf); answers are always JSON, which every client accepts. Watches stream newline-separated JSON
events with chunked transfer encoding until the client leaves, the watch's ``timeoutSeconds`` runs out,
a fault cuts it, or the double stops.
"""

from __future__ import annotations

import contextlib
import json
import select
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

import yaml

from . import discovery, protobuf
from .errors import ApiError, bad_request, method_not_allowed, resource_not_found, unsupported_media_type
from .faults import Exchange, Faults, Request, RequestLog
from .patch import json_patch, merge_patch, strategic_merge_patch
from .resources import ResourceType
from .selectors import field_selector, label_selector
from .store import Selection, Store, VirtualClock, WatchEvent, WriteResult
from .tables import table

_POLL = 0.05  # seconds between checks of a quiet watch for a gone client or a stopping server
_TRUE = ("true", "1")


class _Route:
    """Where a resource request points: endpoint, namespace, name and subresource."""

    def __init__(
        self, rt: ResourceType, namespace: str, name: str, subresource: str, *, watch_path: bool
    ) -> None:
        self.rt, self.namespace, self.name, self.subresource, self.watch_path = (
            rt,
            namespace,
            name,
            subresource,
            watch_path,
        )


class ApiServerDouble:
    """A Kubernetes API server double. Start it, point clients at ``url`` or ``kubeconfig_path``, stop it.

    ``store`` holds the objects (inspect or seed them directly), ``faults`` injects failures, ``requests``
    logs every exchange. Server-side bugs (exceptions while handling a request) are collected in
    ``server_errors`` and answered with 500, so tests can assert there were none.
    """

    def __init__(
        self, *, history_limit: int = 1000, seed: int = 0, clock: VirtualClock | None = None
    ) -> None:
        self.store = Store(clock=clock, history_limit=history_limit, seed=seed)
        self.faults = Faults()
        self.requests = RequestLog()
        self.server_errors: list[BaseException] = []
        self.kubeconfig_path: Path | None = None
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self, kubeconfig: Path | None = None) -> Self:
        if self._httpd is not None:
            raise RuntimeError("already started")
        self._httpd = _HTTPServer(self)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": _POLL},
            name="apiserver-double",
            daemon=True,
        )
        self._thread.start()
        if kubeconfig is not None:
            self.write_kubeconfig(kubeconfig)
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.stopping.set()
        self.store.close()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        httpd.join_handlers(timeout=5)

    def __enter__(self) -> Self:
        return self.start() if self._httpd is None else self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def address(self) -> str:
        if self._httpd is None:
            raise RuntimeError("not started")
        host, port = self._httpd.server_address[:2]
        return f"{host!s}:{port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """Write a kubeconfig whose current context points at this double; returns ``path``."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "apiserver-double", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {}}],
            "contexts": [
                {
                    "name": "apiserver-double",
                    "context": {"cluster": "apiserver-double", "user": "tester", "namespace": namespace},
                }
            ],
            "current-context": "apiserver-double",
            "preferences": {},
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        self.kubeconfig_path = path
        return path

    # --- conveniences for tests --------------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        """Move the virtual clock (finishing graceful pod deletions whose time has come)."""
        self.store.advance(seconds)


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, double: ApiServerDouble) -> None:
        self.double = double
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._handlers: set[threading.Thread] = set()
        super().__init__(("127.0.0.1", 0), _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self._serve, args=(request, client_address), daemon=True, name="apiserver-double-conn"
        )
        with self._lock:
            self._connections.add(request)
            self._handlers.add(thread)
        thread.start()

    def _serve(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except (ConnectionError, OSError, TimeoutError):
            pass
        except Exception as error:
            self.double.server_errors.append(error)
        finally:
            self.shutdown_request(request)
            with self._lock:
                self._connections.discard(request)
                self._handlers.discard(threading.current_thread())

    def close_connections(self) -> None:
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)

    def join_handlers(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._lock:
            handlers = list(self._handlers)
        for thread in handlers:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _query(path: str) -> tuple[str, dict[str, str]]:
    parsed = urllib.parse.urlsplit(path)
    return parsed.path, dict(urllib.parse.parse_qsl(parsed.query, keep_blank_values=True))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _HTTPServer

    def log_message(self, *_args: Any) -> None:
        """Quiet: the request log records every exchange."""

    def setup(self) -> None:
        super().setup()
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_GET  # noqa: N815

    @property
    def double(self) -> ApiServerDouble:
        return self.server.double

    # --- plumbing ----------------------------------------------------------------------------------

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            data = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0] or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return data
                data += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send_json(self, code: int, body: Any, warnings: tuple[str, ...] = ()) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        for warning in warnings:
            self.send_header("Warning", f'299 - "{warning.replace(chr(34), chr(92) + chr(34))}"')
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        path, query = _query(self.path)
        raw = self._read_body()
        content_type = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        request = Request(
            self.command,
            path,
            query=query,
            content_type=content_type,
            user_agent=self.headers.get("User-Agent") or "",
        )
        warnings: tuple[str, ...] = ()
        try:
            route = self._route(path) if path.startswith(("/api/", "/apis/")) else None
            body = self._parse_body(raw, content_type)
            request = self._describe(request, route, body)
            decision = self.double.faults.decide(request)
            if decision.delay:
                time.sleep(decision.delay)
            if decision.error is not None and not (request.verb == "watch" and decision.error.code == 410):
                raise decision.error
            if request.verb == "watch" and route is not None:
                selection = self._selection(route, query)
                self.double.requests.record(Exchange(request, 200))
                self._watch(request, route, selection, decision.error)
                return
            code, reply, warnings = self._dispatch(request, route, body)
        except ApiError as error:
            code, reply = error.code, error.status()
        except Exception as error:
            self.double.server_errors.append(error)
            failure = ApiError(500, f"apiserver double: {type(error).__name__}: {error}", "InternalError")
            code, reply = failure.code, failure.status()
        # Log before answering: a client that has its answer must find the exchange in the log.
        self.double.requests.record(Exchange(request, code))
        self._send_json(code, reply, warnings)

    @staticmethod
    def _parse_body(raw: bytes, content_type: str) -> Any:
        if not raw:
            return None
        if content_type == protobuf.CONTENT_TYPE:
            return protobuf.decode(raw)
        try:
            if content_type.endswith("yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise bad_request(f"the body of the request could not be decoded: {error}") from None

    def _route(self, path: str) -> _Route | None:
        """Resolve a resource path, or None for discovery paths (/api, /api/v1, /apis/g, /apis/g/v)."""
        parts = [urllib.parse.unquote(p) for p in path.strip("/").split("/")]
        if parts[0] == "api":
            group, version, rest = "", parts[1] if len(parts) > 1 else "", parts[2:]
        else:
            group = parts[1] if len(parts) > 1 else ""
            version, rest = (parts[2] if len(parts) > 2 else ""), parts[3:]
        if not rest:
            return None
        registry = self.double.store.registry
        watch_path = rest[0] == "watch"
        if watch_path:
            rest = rest[1:]
        namespace = ""
        if len(rest) >= 3 and rest[0] == "namespaces":
            inner = registry.lookup(group, version, rest[2])
            if (inner is not None and inner.namespaced) or (group == "" and rest[2] == "bindings"):
                namespace, rest = rest[1], rest[2:]
        if group == "" and rest[0] == "bindings" and namespace:
            pods = registry.lookup("", "v1", "pods")
            if pods is not None:
                return _Route(pods, namespace, "", "binding", watch_path=False)
        rt = registry.lookup(group, version, rest[0])
        if rt is None or len(rest) > 3:
            raise resource_not_found(path)
        if namespace and not rt.namespaced:
            raise resource_not_found(path)
        name = rest[1] if len(rest) > 1 else ""
        subresource = rest[2] if len(rest) > 2 else ""
        if subresource and subresource not in rt.subresources:
            raise resource_not_found(path)
        return _Route(rt, namespace, name, subresource, watch_path=watch_path)

    def _describe(self, request: Request, route: _Route | None, body: Any) -> Request:
        if route is None:
            return Request(
                request.method,
                request.path,
                query=request.query,
                body=body,
                content_type=request.content_type,
                user_agent=request.user_agent,
            )
        name = route.name
        if not name and request.method == "POST" and isinstance(body, dict):
            # A create names its object in the body (as the audit log's objectRef does).
            name = str((body.get("metadata") or {}).get("name", ""))
        return Request(
            request.method,
            request.path,
            verb=self._verb(route, request.query),
            group=route.rt.group,
            version=route.rt.version,
            resource=route.rt.plural,
            subresource=route.subresource,
            namespace=route.namespace,
            name=name,
            kind=route.rt.kind,
            query=request.query,
            body=body,
            content_type=request.content_type,
            user_agent=request.user_agent,
        )

    def _verb(self, route: _Route, query: Mapping[str, str]) -> str:
        method = self.command
        if method == "GET":
            if route.watch_path or query.get("watch", "").lower() in _TRUE:
                return "watch"
            return "get" if route.name else "list"
        if method == "POST":
            return "create"
        if method == "PUT":
            return "update"
        if method == "PATCH":
            return "patch"
        if method == "DELETE":
            return "delete" if route.name else "deletecollection"
        raise method_not_allowed(f"method {method} is not supported")

    # --- non-resource paths ------------------------------------------------------------------------

    def _dispatch(
        self, request: Request, route: _Route | None, body: Any
    ) -> tuple[int, Any, tuple[str, ...]]:
        if route is not None:
            return self._resource(request, route, body)
        if request.method != "GET":
            raise method_not_allowed(f"{request.method} is not supported on {request.path}")
        registry = self.double.store.registry
        path = request.path.rstrip("/") or "/"
        parts = path.strip("/").split("/")
        found: Any = None
        if path == "/version":
            found = discovery.SERVER_VERSION
        elif path in ("/healthz", "/readyz", "/livez"):
            found = "ok"
        elif path == "/api":
            found = discovery.api_versions(self.double.address)
        elif path == "/apis":
            found = discovery.api_group_list(registry)
        elif parts[0] == "api" and len(parts) == 2:
            found = discovery.api_resource_list(registry, "", parts[1])
        elif parts[0] == "apis" and len(parts) == 2:
            found = discovery.api_group(registry, parts[1])
        elif parts[0] == "apis" and len(parts) == 3:
            found = discovery.api_resource_list(registry, parts[1], parts[2])
        elif path == "/openapi/v3":
            found = discovery.openapi_v3_index(registry)
        elif parts[:2] == ["openapi", "v3"] and len(parts) in (4, 5):
            group, version = (
                ("", parts[3]) if parts[2] == "api" else (parts[3], parts[4] if len(parts) == 5 else "")
            )
            if registry.types(group, version):
                found = discovery.openapi_v3_document(registry, group, version)
        if found is None:
            raise resource_not_found(path)
        return 200, found, ()

    # --- resources ---------------------------------------------------------------------------------

    def _selection(self, route: _Route, query: Mapping[str, str]) -> Selection:
        fields = query.get("fieldSelector", "")
        if route.name:
            # A get-style watch of one object is a watch with a name field selector.
            fields = ",".join(filter(None, [fields, f"metadata.name={route.name}"]))
        return Selection(
            route.namespace, label_selector(query.get("labelSelector")), field_selector(fields, route.rt.kind)
        )

    def _wants_table(self) -> bool:
        return "as=Table" in (self.headers.get("Accept") or "")

    def _resource(self, request: Request, route: _Route, body: Any) -> tuple[int, Any, tuple[str, ...]]:
        store, rt, query = self.double.store, route.rt, request.query
        dry_run = query.get("dryRun") == "All"
        validation = query.get("fieldValidation", "")
        if request.verb == "get":
            if route.subresource not in ("", "status"):
                raise method_not_allowed(f"GET is not supported on {route.subresource}")
            obj = store.get(rt, route.namespace, route.name)
            return 200, self._present(rt, [obj], obj, {}), ()
        if request.verb == "list":
            result = store.list_page(
                rt,
                self._selection(route, query),
                resource_version=query.get("resourceVersion", ""),
                match=query.get("resourceVersionMatch", ""),
                limit=int(query.get("limit") or 0),
                continue_token=query.get("continue", ""),
            )
            meta: dict[str, Any] = {"resourceVersion": str(result.resource_version)}
            if result.continue_token:
                meta["continue"] = result.continue_token
            if result.remaining is not None:
                meta["remainingItemCount"] = result.remaining
            items = [self._list_item(rt, item) for item in result.items]
            reply = {
                "kind": f"{rt.kind}List",
                "apiVersion": rt.group_version,
                "metadata": meta,
                "items": items,
            }
            return 200, self._present(rt, result.items, reply, meta), ()
        if request.verb == "create":
            if route.subresource == "binding":
                store.bind(rt, route.namespace, request.name, body, dry_run=dry_run)
                return 201, _success(), ()
            if route.subresource == "eviction":
                store.evict(rt, route.namespace, route.name, body, dry_run=dry_run)
                return 201, _success(), ()
            if route.name:
                raise method_not_allowed(f"POST is not supported on a named {rt.kind}")
            return self._written(
                store.create(rt, route.namespace, body, dry_run=dry_run, field_validation=validation)
            )
        if request.verb == "update":
            return self._written(
                store.update(
                    rt,
                    route.namespace,
                    route.name,
                    body,
                    subresource=route.subresource,
                    dry_run=dry_run,
                    field_validation=validation,
                )
            )
        if request.verb == "patch":
            apply, create = self._patcher(request, rt, body)
            return self._written(
                store.patch(
                    rt,
                    route.namespace,
                    route.name,
                    apply,
                    subresource=route.subresource,
                    dry_run=dry_run,
                    field_validation=validation,
                    create_if_missing=create,
                )
            )
        if request.verb == "delete":
            gone = store.delete(
                rt, route.namespace, route.name, self._delete_options(query, body), dry_run=dry_run
            )
            return gone.code, gone.object, ()
        if request.verb == "deletecollection":
            deleted = store.delete_collection(
                rt, self._selection(route, query), self._delete_options(query, body)
            )
            items = [self._list_item(rt, item) for item in deleted]
            meta = {"resourceVersion": str(store.resource_version)}
            return (
                200,
                {"kind": f"{rt.kind}List", "apiVersion": rt.group_version, "metadata": meta, "items": items},
                (),
            )
        raise method_not_allowed(f"{request.method} is not supported")

    @staticmethod
    def _written(result: WriteResult) -> tuple[int, Any, tuple[str, ...]]:
        return result.code, result.object, result.warnings

    @staticmethod
    def _list_item(rt: ResourceType, item: dict[str, Any]) -> dict[str, Any]:
        # Typed lists of built-in kinds carry no kind/apiVersion on their items; unstructured ones do.
        return item if rt.custom else {k: v for k, v in item.items() if k not in ("kind", "apiVersion")}

    def _present(
        self, rt: ResourceType, objects: Sequence[Mapping[str, Any]], plain: Any, meta: Mapping[str, Any]
    ) -> Any:
        if not self._wants_table():
            return plain
        include = _query(self.path)[1].get("includeObject", "Metadata")
        return table(rt, objects, self.double.store.clock.now(), include=include, list_meta=meta)

    @staticmethod
    def _delete_options(query: Mapping[str, str], body: Any) -> dict[str, Any]:
        options = dict(body) if isinstance(body, dict) else {}
        if "gracePeriodSeconds" in query:
            options["gracePeriodSeconds"] = int(query["gracePeriodSeconds"])
        if "propagationPolicy" in query:
            options["propagationPolicy"] = query["propagationPolicy"]
        if query.get("orphanDependents") in _TRUE:
            options["orphanDependents"] = True
        return options

    def _patcher(self, request: Request, rt: ResourceType, body: Any) -> tuple[Callable[[Any], Any], bool]:
        kind = request.content_type
        if kind == "application/json-patch+json":
            return (lambda obj: json_patch(obj, body)), False
        if kind == "application/merge-patch+json":
            return (lambda obj: merge_patch(obj, body)), False
        if kind == "application/strategic-merge-patch+json":
            if rt.custom:
                raise ApiError(
                    415,
                    "strategic merge patch is not supported for custom resources; use a merge patch",
                    "UnsupportedMediaType",
                )
            return (lambda obj: strategic_merge_patch(obj, body)), False
        if kind == "application/apply-patch+yaml":
            if not request.query.get("fieldManager"):
                raise bad_request("PATCH " + request.path + ": fieldManager is required for apply requests")
            if not isinstance(body, dict):
                raise bad_request("apply patch must be an object")
            merge = merge_patch if rt.custom else strategic_merge_patch
            return (lambda obj: merge(obj, {k: v for k, v in body.items() if k != "status"})), True
        raise unsupported_media_type(kind)

    # --- watch -------------------------------------------------------------------------------------

    def _watch(self, request: Request, route: _Route, selection: Selection, fault: ApiError | None) -> None:
        store, rt, query = self.double.store, route.rt, request.query
        bookmarks = query.get("allowWatchBookmarks", "").lower() in _TRUE
        initial = query.get("sendInitialEvents")
        table_mode = self._wants_table()
        watcher = None
        failure = fault
        if failure is None:
            try:
                watcher = store.watch(
                    rt,
                    selection,
                    resource_version=query.get("resourceVersion", ""),
                    bookmarks=bookmarks,
                    send_initial_events=None if initial is None else initial.lower() in _TRUE,
                )
            except ApiError as error:
                failure = error
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Cache-Control", "no-cache, private")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if failure is not None:
            self._chunk({"type": "ERROR", "object": failure.status()})
            self._end_stream()
            return
        assert watcher is not None
        cut = self.double.faults.watch_cut(request)
        timeout = float(query["timeoutSeconds"]) if query.get("timeoutSeconds") else None
        deadline = time.monotonic() + timeout if timeout else None
        sent = 0
        try:
            while not self.server.stopping.is_set():
                if cut is not None and sent >= (cut.cut_after or 0):
                    if cut.abrupt:
                        self.close_connection = True
                        with contextlib.suppress(OSError):
                            self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                event = watcher.next(_POLL)
                if event is None:
                    if watcher.closed or self._client_gone():
                        break
                    continue
                if not self._chunk(self._event(rt, event, table_mode)):
                    return
                if event.type != "BOOKMARK":
                    sent += 1
        finally:
            store.stop_watch(watcher)
        self._end_stream()

    def _event(self, rt: ResourceType, event: WatchEvent, table_mode: bool) -> dict[str, Any]:
        obj = dict(event.object)
        if event.type != "BOOKMARK":
            obj["apiVersion"], obj["kind"] = rt.group_version, rt.kind
            if table_mode:
                include = _query(self.path)[1].get("includeObject", "Metadata")
                obj = table(rt, [obj], self.double.store.clock.now(), include=include, list_meta={})
        return {"type": event.type, "object": obj}

    def _chunk(self, payload: Any) -> bool:
        data = json.dumps(payload).encode() + b"\n"
        try:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        except OSError:
            self.close_connection = True
            return False
        return True

    def _end_stream(self) -> None:
        try:
            self.wfile.write(b"0\r\n\r\n")
        except OSError:
            self.close_connection = True

    def _client_gone(self) -> bool:
        try:
            poller = select.poll()  # not select.select: a busy test process may hold fds past 1024
            poller.register(self.connection, select.POLLIN)
            if poller.poll(0):
                return bool(self.connection.recv(1, socket.MSG_PEEK) == b"")
        except OSError:
            return True
        return False


def _success() -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}
