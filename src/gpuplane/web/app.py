"""The console's HTTP surface: read-only pages, one event stream, static files.

Routes (every one ``GET``; there is no write endpoint, so other methods get 405)::

    /                         overview          /nodes               node and device map
    /queues                   cohorts, quota    /reports             simulation reports
    /workloads/{ns}/{name}    one workload      /reports/{i}/{file}  a report's plot
    /events                   server-sent events: the snapshot version, on every change
    /login                    the token form (static page; the token stays in the browser)
    /healthz                  liveness, no authentication, no data

Authentication happens on every request except ``/login``, ``/healthz`` and ``/static``:
no token or an unknown token is 401 (the login page for a browser), a namespace the viewer's
RBAC does not cover is 403. Every response carries a strict Content-Security-Policy: scripts
and styles only from this server, no inline script, no frames, no third-party origin.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jinja2 import Environment, PackageLoader, select_autoescape
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.gzip import GZipMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gpuplane import __version__
from gpuplane.web import pages
from gpuplane.web.auth import COOKIE, Authenticator, Viewer, bearer_token
from gpuplane.web.pages import duration, gpus, measure, timestamp
from gpuplane.web.prometheus import HistoryCache
from gpuplane.web.snapshot import ConsoleSnapshot
from gpuplane.web.sources import SnapshotHub

STATIC = Path(__file__).parent / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    "Cache-Control": "no-store",
}


class SecurityHeaders:
    """Pure ASGI middleware (streams pass straight through): refuse writes, add the headers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = str(scope.get("path", "")).startswith("/static/")
        extra = [
            (name.lower().encode(), value.encode())
            for name, value in SECURITY_HEADERS.items()
            if not (static and name == "Cache-Control")
        ]

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in present)]
            await send(message)

        if scope.get("method") not in ("GET", "HEAD"):
            response = PlainTextResponse(
                "read-only console\n", status_code=405, headers={"Allow": "GET, HEAD"}
            )
            await response(scope, receive, send_with_headers)
            return
        await self.app(scope, receive, send_with_headers)


def _environment() -> Environment:
    env = Environment(
        loader=PackageLoader("gpuplane.web", "templates"),
        autoescape=select_autoescape(("html",)),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["duration"] = duration
    env.filters["gpus"] = gpus
    env.filters["timestamp"] = timestamp
    env.filters["measure"] = measure
    env.globals["version"] = __version__
    return env


@dataclass(slots=True)
class _Console:
    """The console's pages and endpoints over one hub's snapshots."""

    hub: SnapshotHub
    authenticator: Authenticator
    history: HistoryCache | None
    report_list: list[pages.Report]
    heartbeat: float
    poll: float
    env: Environment = field(default_factory=_environment)

    def render(self, name: str, request: Request, status: int = 200, **context: Any) -> HTMLResponse:
        html = self.env.get_template(name).render(request_path=request.url.path, **context)
        return HTMLResponse(html, status_code=status)

    def viewer_of(self, request: Request) -> Viewer:
        token = bearer_token(request.headers.get("authorization"), request.cookies.get(COOKIE))
        viewer = self.authenticator.authenticate(token) if token else None
        if viewer is None:
            raise HTTPException(401, "a valid bearer token is required")
        return viewer

    def snapshot(self) -> ConsoleSnapshot:
        snap = self.hub.current()
        if snap is None:
            raise HTTPException(503, "the console is still reading the cluster")
        return snap

    def page(self, build: Callable[[Request, Viewer], HTMLResponse]) -> Callable[[Request], Any]:
        def endpoint(request: Request) -> HTMLResponse:
            return build(request, self.viewer_of(request))

        async def run(request: Request) -> HTMLResponse:
            return await run_in_threadpool(endpoint, request)

        return run

    def overview(self, request: Request, viewer: Viewer) -> HTMLResponse:
        snap = self.snapshot()
        data = pages.overview(snap, viewer, self.history.get() if self.history is not None else None)
        return self.render("overview.html", request, snap=snap, viewer=viewer, **data)

    def queues(self, request: Request, viewer: Viewer) -> HTMLResponse:
        snap = self.snapshot()
        return self.render("queues.html", request, snap=snap, viewer=viewer, **pages.queues(snap, viewer))

    def workload(self, request: Request, viewer: Viewer) -> HTMLResponse:
        ns = request.path_params["namespace"]
        name = request.path_params["name"]
        if not viewer.sees(ns):
            raise HTTPException(403, f"{viewer.name} may not see namespace {ns}")
        snap = self.snapshot()
        data = pages.workload(snap, f"{ns}/{name}", viewer)
        if data is None:
            raise HTTPException(404, f"no workload {ns}/{name}")
        return self.render("workload.html", request, snap=snap, viewer=viewer, **data)

    def nodes(self, request: Request, viewer: Viewer) -> HTMLResponse:
        if not viewer.sees_nodes:
            raise HTTPException(403, f"{viewer.name} may not list nodes")
        snap = self.snapshot()
        return self.render("nodes.html", request, snap=snap, viewer=viewer, **pages.nodes(snap, viewer))

    def report_list_page(self, request: Request, viewer: Viewer) -> HTMLResponse:
        return self.render(
            "reports.html",
            request,
            snap=self.hub.current(),
            viewer=viewer,
            reports=[pages.report(r) for r in self.report_list],
        )

    async def report_file(self, request: Request) -> Response:
        await run_in_threadpool(self.viewer_of, request)
        index = request.path_params["index"]
        name = request.path_params["file"]
        if index >= len(self.report_list) or name not in self.report_list[index].plots:
            raise HTTPException(404, "no such plot")
        return FileResponse(self.report_list[index].path / name, media_type="image/png")

    async def events(self, request: Request) -> Response:
        await run_in_threadpool(self.viewer_of, request)

        async def stream() -> AsyncIterator[str]:
            # Each open page costs one coroutine that reads an integer twice a second: no thread,
            # no API call, however many pages are open.
            seen = self.hub.version
            yield f"retry: 2000\nevent: snapshot\ndata: {seen}\n\n"
            idle = 0.0
            while not await request.is_disconnected():
                await asyncio.sleep(self.poll)
                version = self.hub.version
                if version != seen:
                    seen = version
                    idle = 0.0
                    yield f"event: snapshot\ndata: {version}\n\n"
                    continue
                idle += self.poll
                if idle >= self.heartbeat:
                    idle = 0.0
                    yield ": keep-alive\n\n"

        return StreamingResponse(
            stream(), media_type="text/event-stream", headers={"X-Accel-Buffering": "no"}
        )

    async def login(self, request: Request) -> HTMLResponse:
        return self.render("login.html", request, snap=None, viewer=None, status=200)

    async def healthz(self, request: Request) -> PlainTextResponse:  # noqa: ARG002  # Starlette passes it
        return PlainTextResponse("ok\n" if self.hub.current() is not None else "starting\n")

    async def http_error(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 401:
            wants_html = "text/html" in request.headers.get("accept", "")
            if wants_html:
                presented = bearer_token(request.headers.get("authorization"), request.cookies.get(COOKIE))
                response: Response = self.render(
                    "login.html", request, status=401, snap=None, viewer=None, refused=presented is not None
                )
            else:
                response = PlainTextResponse(f"{exc.detail}\n", status_code=401)
            response.headers["WWW-Authenticate"] = 'Bearer realm="gpuplane"'
            return response
        return self.render(
            "error.html",
            request,
            status=exc.status_code,
            snap=None,
            viewer=None,
            status_code=exc.status_code,
            detail=exc.detail,
        )


def create_app(  # noqa: PLR0913  the hub and the authenticator, then keyword-only options
    hub: SnapshotHub,
    authenticator: Authenticator,
    *,
    history: HistoryCache | None = None,
    reports: Sequence[Path] = (),
    heartbeat: float = 15.0,
    poll: float = 0.5,
) -> Starlette:
    """The console as an ASGI app over ``hub``'s snapshots."""
    console = _Console(hub, authenticator, history, pages.load_reports(reports), heartbeat, poll)
    page = console.page
    routes = [
        Route("/", page(console.overview)),
        Route("/queues", page(console.queues)),
        Route("/workloads/{namespace}/{name}", page(console.workload)),
        Route("/nodes", page(console.nodes)),
        Route("/reports", page(console.report_list_page)),
        Route("/reports/{index:int}/{file}", console.report_file),
        Route("/events", console.events),
        Route("/login", console.login),
        Route("/healthz", console.healthz),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Starlette(
        routes=routes,
        # Pages of thousands of rows are mostly repeated markup: gzip makes them a tenth the size.
        middleware=[
            Middleware(SecurityHeaders),
            Middleware(GZipMiddleware, minimum_size=1024, compresslevel=6),
        ],
        exception_handlers={HTTPException: console.http_error},
    )
