"""Protobuf request bodies: what the double decodes, and what it refuses rather than guess at."""

from __future__ import annotations

from typing import Any

import pytest

from apiserver import protobuf
from apiserver.errors import ApiError
from apiserver.rest import Rest

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster


def varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def envelope(api_version: str, kind: str, payload: bytes) -> bytes:
    type_meta = field(1, api_version) + field(2, kind)
    return protobuf.MAGIC + field(1, type_meta) + field(2, payload)


def configmap(*extra: bytes) -> bytes:
    meta = field(1, "c") + field(2, "") + field(8, b"")  # empty generateName and zero creationTimestamp
    entry = field(1, "k") + field(2, "v")
    return envelope("v1", "ConfigMap", field(1, meta) + field(2, entry) + b"".join(extra))


DECODED = [
    pytest.param(
        configmap(),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}},
        id="zero-values-dropped",
    ),
    pytest.param(
        configmap(field(99, 0), field(98, b"")),
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"k": "v"}},
        id="unknown-zero-fields-skipped",
    ),
    pytest.param(
        envelope("v1", "DeleteOptions", field(1, 0) + field(4, "Orphan")),
        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0, "propagationPolicy": "Orphan"},
        id="pointer-zero-kept",
    ),
    pytest.param(
        envelope("v1", "DeleteOptions", field(1, -1)),
        {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": -1},
        id="negative-int",
    ),
]


@pytest.mark.parametrize(("body", "want"), DECODED)
def test_decode(body: bytes, want: dict[str, Any]) -> None:
    assert protobuf.decode(body) == want


REFUSED = [
    pytest.param(configmap(field(99, 7)), id="unknown-non-zero-field"),
    pytest.param(envelope("v1", "Secret", b""), id="kind-without-a-table"),
    pytest.param(b"\x08\x01", id="no-envelope"),
    pytest.param(protobuf.MAGIC + b"\x0a\x05ab", id="truncated"),
]


@pytest.mark.parametrize("body", REFUSED)
def test_refuses_what_it_cannot_name(body: bytes) -> None:
    with pytest.raises(ApiError) as refused:
        protobuf.decode(body)
    assert refused.value.code == 415


def test_protobuf_create_over_http(rest: Rest) -> None:
    reply = rest.request(
        "POST", "/api/v1/namespaces/default/configmaps", configmap(), content_type=protobuf.CONTENT_TYPE
    )
    assert reply.status == 201, reply.body
    assert reply.body["data"] == {"k": "v"}
    refused = rest.request(
        "POST",
        "/api/v1/namespaces/default/configmaps",
        configmap(field(99, 7)),
        content_type=protobuf.CONTENT_TYPE,
    )
    assert (refused.status, refused.reason) == (415, "UnsupportedMediaType")
