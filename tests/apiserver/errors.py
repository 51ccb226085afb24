"""API errors as the Kubernetes API server reports them: an HTTP status plus a ``metav1.Status`` body.

Every refusal in the double is an :class:`ApiError`. The server turns it into the JSON ``Status`` that
clients parse (``reason``, ``code``, ``details.causes``), so the official client raises ``ApiException``
with the same status and kubectl prints the same kind of message as against a real cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Cause:
    """One field-level reason inside a 422 Invalid status (``details.causes[]``)."""

    field: str
    reason: str
    message: str


# The reason strings are metav1.StatusReason values; clients switch on them.
_REASON_BY_CODE = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}


@dataclass
class ApiError(Exception):
    """A refused request. ``status()`` renders the body the server sends."""

    code: int
    message: str
    reason: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if not self.reason:
            self.reason = _REASON_BY_CODE.get(self.code, "Unknown")

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def _details(kind: str, name: str, group: str = "") -> dict[str, Any]:
    details: dict[str, Any] = {"kind": kind}
    if name:
        details["name"] = name
    if group:
        details["group"] = group
    return details


def qualified(resource: str, group: str) -> str:
    """``pods`` or ``jobs.batch``: how the server names a resource in messages."""
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        404, f'{qualified(resource, group)} "{name}" not found', "NotFound", _details(resource, name, group)
    )


def already_exists(resource: str, group: str, name: str) -> ApiError:
    return ApiError(
        409,
        f'{qualified(resource, group)} "{name}" already exists',
        "AlreadyExists",
        _details(resource, name, group),
    )


def conflict(resource: str, group: str, name: str, why: str) -> ApiError:
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        "Conflict",
        _details(resource, name, group),
    )


STALE = "the object has been modified; please apply your changes to the latest version and try again"


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> ApiError:
    listed = ", ".join(f"{c.field}: {c.message}" for c in causes)
    text = f"[{listed}]" if len(causes) > 1 else listed
    details = _details(kind, name, group)
    details["causes"] = [{"reason": c.reason, "message": c.message, "field": c.field} for c in causes]
    shown = f"{kind}.{group}" if group else kind
    return ApiError(422, f'{shown} "{name}" is invalid: {text}', "Invalid", details)


def bad_request(message: str) -> ApiError:
    return ApiError(400, message, "BadRequest")


def forbidden(message: str) -> ApiError:
    return ApiError(403, message, "Forbidden")


def expired(message: str) -> ApiError:
    return ApiError(410, message, "Expired")


def method_not_allowed(message: str) -> ApiError:
    return ApiError(405, message, "MethodNotAllowed")


def unsupported_media_type(content_type: str) -> ApiError:
    return ApiError(
        415,
        f"the body of the request was in an unknown format - accepted media types include: "
        f"application/json, application/merge-patch+json (got {content_type!r})",
        "UnsupportedMediaType",
    )


def resource_not_found(path: str) -> ApiError:
    """What the server answers for a group, version or resource it does not serve."""
    return ApiError(
        404,
        "the server could not find the requested resource",
        "NotFound",
        {"causes": [{"reason": "UnexpectedServerResponse", "message": f"404 page not found: {path}"}]},
    )
