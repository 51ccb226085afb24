"""A bare JSON-over-HTTP client for the double, for tests that check exact status codes, headers and streams.

The official client hides some of what the API returns (status objects of deletes, warnings, the raw
watch stream); this one shows it. It speaks only plain HTTP to loopback.
"""

from __future__ import annotations

import http.client
import json
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

TIMEOUT = 10.0  # seconds a test waits on the double before failing instead of hanging


@dataclass(frozen=True)
class Response:
    status: int
    body: Any
    headers: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    @property
    def reason(self) -> str:
        return str(self.body.get("reason", "")) if isinstance(self.body, dict) else ""


def _path(path: str, params: Mapping[str, Any] | None) -> str:
    if not params:
        return path
    return f"{path}?{urllib.parse.urlencode({k: str(v) for k, v in params.items()})}"


class Rest:
    """``Rest(url).post("/api/v1/namespaces/default/pods", pod)`` and friends; one connection per call."""

    def __init__(self, url: str) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme != "http" or parsed.hostname not in ("127.0.0.1", "localhost"):
            raise ValueError(f"Rest talks plain HTTP to loopback only, not {url}")
        self.host, self.port = parsed.hostname, parsed.port or 80

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
        headers: Mapping[str, str] | None = None,
    ) -> Response:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=TIMEOUT)
        try:
            data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
            sent = {"Accept": "application/json", **(headers or {})}
            if data is not None:
                sent["Content-Type"] = content_type
            connection.request(method, _path(path, params), body=data, headers=sent)
            reply = connection.getresponse()
            raw = reply.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = raw.decode(errors="replace")
            warnings = tuple(v for k, v in reply.getheaders() if k.lower() == "warning")
            return Response(reply.status, parsed, dict(reply.getheaders()), warnings)
        finally:
            connection.close()

    def get(self, path: str, **params: Any) -> Response:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any, **params: Any) -> Response:
        return self.request("POST", path, body, params=params)

    def put(self, path: str, body: Any, **params: Any) -> Response:
        return self.request("PUT", path, body, params=params)

    def patch(self, path: str, body: Any, content_type: str, **params: Any) -> Response:
        return self.request("PATCH", path, body, params=params, content_type=content_type)

    def delete(self, path: str, body: Any = None, **params: Any) -> Response:
        return self.request("DELETE", path, body, params=params)

    def watch(self, path: str, **params: Any) -> WatchStream:
        return WatchStream(self, path, {"watch": "true", **params})


class WatchStream:
    """An open watch; ``next()`` returns the next event (a dict) or None when the server ended the stream."""

    def __init__(self, rest: Rest, path: str, params: Mapping[str, Any]) -> None:
        self._connection = http.client.HTTPConnection(rest.host, rest.port, timeout=TIMEOUT)
        self._connection.request("GET", _path(path, params), headers={"Accept": "application/json"})
        self._response = self._connection.getresponse()
        self.status = self._response.status

    def next(self) -> dict[str, Any] | None:
        line = self._response.readline()
        if not line:
            return None
        event: dict[str, Any] = json.loads(line)
        return event

    def take(self, count: int) -> list[dict[str, Any]]:
        """Exactly ``count`` events; fails if the stream ends first."""
        events: list[dict[str, Any]] = []
        for _ in range(count):
            event = self.next()
            if event is None:
                raise AssertionError(f"watch ended after {len(events)} of {count} events: {events}")
            events.append(event)
        return events

    def rest(self) -> list[dict[str, Any]]:
        """Every event until the server ends the stream."""
        events = []
        while (event := self.next()) is not None:
            events.append(event)
        return events

    def close(self) -> None:
        self._response.close()
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()
