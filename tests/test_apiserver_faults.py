"""Each fault hook of the double, and the request log tests assert on."""

from __future__ import annotations

import json
import socket
from typing import Any

import pytest
from kubernetes import client, watch

from apiserver.errors import ApiError
from apiserver.faults import MAX_DELAY, Faults, Request
from apiserver.fixtures import Cluster
from apiserver.rest import Rest
from manifests import Manifest, pod_spec

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

PODS = "/api/v1/namespaces/default/pods"
CONFIGMAPS = "/api/v1/namespaces/default/configmaps"


def pod(name: str) -> dict[str, Any]:
    return (
        Manifest("v1", "Pod", name, "default").set("spec", pod_spec().container(cpu="1").to_dict()).to_dict()
    )


def configmap(name: str) -> dict[str, Any]:
    return Manifest("v1", "ConfigMap", name, "default").to_dict()


def relabel(rest: Rest, name: str, value: str) -> int:
    return rest.patch(
        f"{PODS}/{name}", {"metadata": {"labels": {"v": value}}}, "application/merge-patch+json"
    ).status


def test_conflict_on_the_next_writes_of_a_kind(rest: Rest, faults: Faults) -> None:
    rest.post(PODS, pod("p"))
    rest.post(CONFIGMAPS, configmap("c"))
    faults.conflict(times=2, resource="Pod")
    refused = rest.patch(f"{PODS}/p", {"metadata": {"labels": {"v": "1"}}}, "application/merge-patch+json")
    assert (refused.status, refused.reason) == (409, "Conflict")
    assert refused.body["message"].startswith('Operation cannot be fulfilled on pods "p"')
    cm = rest.get(f"{CONFIGMAPS}/c").body
    assert rest.put(f"{CONFIGMAPS}/c", cm).status == 200, "other kinds are untouched"
    assert [relabel(rest, "p", v) for v in ("2", "3")] == [409, 200]


@pytest.mark.parametrize(
    ("resource", "verbs", "want"),
    [
        pytest.param("pods", ("create",), [500, 201, 201], id="by-plural-and-verb"),
        pytest.param("configmaps", None, [201, 201, 201], id="other-resource"),
        pytest.param(None, ("delete",), [201, 201, 201], id="other-verb"),
    ],
)
def test_fail_matches_resource_and_verb(
    rest: Rest, faults: Faults, resource: str | None, verbs: tuple[str, ...] | None, want: list[int]
) -> None:
    faults.fail(500, resource=resource, verbs=verbs, times=1)
    assert [rest.post(PODS, pod(name)).status for name in "abc"] == want


def test_fail_on_a_schedule(rest: Rest, faults: Faults) -> None:
    faults.fail(500, verbs=("get",), schedule=[False, True, True, False])
    rest.post(PODS, pod("p"))
    assert [rest.get(f"{PODS}/p").status for _ in range(6)] == [200, 500, 500, 200, 200, 200]


def test_fail_with_a_seeded_probability_is_reproducible(apiserver: Cluster) -> None:
    rest = Rest(apiserver.url)
    rest.post(PODS, pod("p"))

    def run(seed: int) -> list[int]:
        rule = apiserver.faults.fail(500, verbs=("get",), probability=0.5, seed=seed)
        codes = [rest.get(f"{PODS}/p").status for _ in range(20)]
        apiserver.faults.remove(rule)
        return codes

    first, again, other = run(7), run(7), run(8)
    assert first == again
    assert first != other
    assert 0 < first.count(500) < 20


def test_failed_requests_change_nothing(rest: Rest, faults: Faults) -> None:
    faults.fail(500, verbs=("create",), times=1, message="etcd is down")
    reply = rest.post(PODS, pod("p"))
    assert (reply.status, reply.body["message"], reply.reason) == (500, "etcd is down", "InternalError")
    assert rest.get(f"{PODS}/p").status == 404


def test_expire_forces_410_on_the_next_list(rest: Rest, faults: Faults) -> None:
    faults.expire(times=1, resource="pods")
    first = rest.get(PODS)
    assert (first.status, first.reason) == (410, "Expired")
    assert rest.get(PODS).status == 200


def test_expire_on_a_watch_is_an_error_event(
    rest: Rest, faults: Faults, kube_client: client.ApiClient
) -> None:
    faults.expire(times=1, verbs=("watch",))
    with rest.watch(PODS) as stream:
        events = stream.rest()
    assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
    # The official client retries once after a 410, so one expiry is invisible to it...
    rest.post(PODS, pod("p"))
    faults.expire(times=1, verbs=("watch",))
    core = client.CoreV1Api(kube_client)
    rv = core.list_namespaced_pod("default").metadata.resource_version
    rest.post(PODS, pod("q"))
    watcher = watch.Watch()
    for event in watcher.stream(
        core.list_namespaced_pod, "default", resource_version=rv, _request_timeout=10
    ):
        assert event["object"].metadata.name == "q"
        watcher.stop()
    # ...but two in a row reach the caller.
    faults.expire(times=2, verbs=("watch",))
    with pytest.raises(client.ApiException) as expired:
        next(
            iter(
                watch.Watch().stream(
                    core.list_namespaced_pod, "default", resource_version=rv, _request_timeout=10
                )
            )
        )
    assert expired.value.status == 410


def raw_watch(url: str, path: str) -> bytes:
    """The raw bytes of a watch response, read until the server closes the connection."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(f"GET {path}?watch=true HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize("abrupt", [False, True], ids=["clean-end", "dropped-connection"])
def test_cut_watches_after_n_events(apiserver: Cluster, rest: Rest, faults: Faults, abrupt: bool) -> None:
    for name in "abc":
        rest.post(PODS, pod(name))
    faults.cut_watches(after=2, abrupt=abrupt)
    data = raw_watch(apiserver.url, PODS)
    names = [
        json.loads(line)["object"]["metadata"]["name"]
        for line in data.split(b"\r\n")
        if line.startswith(b"{")
    ]
    assert names == ["a", "b"]
    assert data.endswith(b"\r\n0\r\n\r\n") != abrupt, (
        "a clean cut ends the chunked stream; an abrupt one does not"
    )


def test_official_client_resumes_cut_watches_without_losing_or_repeating_events(
    apiserver: Cluster, rest: Rest, faults: Faults, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    since = core.list_namespaced_pod("default").metadata.resource_version
    names = [f"p{i}" for i in range(7)]
    for name in names:
        rest.post(PODS, pod(name))
    faults.cut_watches(after=2)
    watcher = watch.Watch()
    seen = []
    for event in watcher.stream(
        core.list_namespaced_pod, "default", resource_version=since, _request_timeout=10
    ):
        seen.append(event["object"].metadata.name)
        if len(seen) == len(names):
            watcher.stop()
    assert seen == names
    watches = apiserver.requests.find(verb="watch", resource="pods")
    assert len(watches) == 4, "7 events, 2 per stream"
    assert watches[0].request.query.get("resourceVersion") == since


def test_delay_is_bounded(faults: Faults) -> None:
    with pytest.raises(ValueError, match="tests do not sleep"):
        faults.delay(MAX_DELAY * 2)
    with pytest.raises(ValueError, match="probability"):
        faults.fail(500, probability=1.5)


def test_delay_slows_matching_requests_only(rest: Rest, faults: Faults, apiserver: Cluster) -> None:
    faults.delay(0.01, verbs=("list",), times=2)
    assert [rest.get(PODS).status for _ in range(3)] == [200, 200, 200]
    (rule,) = faults.rules()
    assert (rule.fired, rule.exhausted) == (2, True)
    assert len(apiserver.requests.find(verb="list", resource="pods")) == 3


@pytest.mark.parametrize(("code", "want_reason"), [(429, "TooManyRequests"), (500, "InternalError")])
def test_block_evictions(rest: Rest, faults: Faults, code: int, want_reason: str) -> None:
    rest.post(PODS, pod("p"))
    faults.block_evictions(times=1, code=code)
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}
    refused = rest.post(f"{PODS}/p/eviction", body)
    assert (refused.status, refused.reason) == (code, want_reason)
    assert rest.get(f"{PODS}/p").status == 200
    assert rest.post(f"{PODS}/p/eviction", body).status == 201
    assert rest.get(f"{PODS}/p").status == 404


def test_interceptors_see_every_request_and_may_refuse(rest: Rest, faults: Faults) -> None:
    seen: list[Request] = []

    def no_big_pods(request: Request) -> ApiError | None:
        seen.append(request)
        if request.verb == "create" and request.name.startswith("big"):
            return ApiError(403, "quota exceeded", "Forbidden")
        return None

    faults.intercept(no_big_pods)
    assert rest.post(PODS, pod("big-one")).status == 403
    assert rest.post(PODS, pod("small")).status == 201
    faults.remove(no_big_pods)
    assert rest.post(PODS, pod("big-two")).status == 201
    assert [(r.verb, r.resource, r.name) for r in seen] == [
        ("create", "pods", "big-one"),
        ("create", "pods", "small"),
    ]


def test_request_log_records_outcomes(rest: Rest, apiserver: Cluster) -> None:
    rest.post(PODS, pod("p"))
    rest.post(PODS, pod("p"))
    rest.get("/api/v1")
    creates = apiserver.requests.find(verb="create", resource="Pod")
    assert [(e.request.name, e.status) for e in creates] == [("p", 201), ("p", 409)]
    assert creates[0].request.body["metadata"]["name"] == "p"
    assert apiserver.requests.find(status=409)[0] == creates[1]
    discovery = [e for e in apiserver.requests if e.request.path == "/api/v1"]
    assert [(e.request.verb, e.status) for e in discovery] == [("", 200)]


def test_conflict_on_bindings(apiserver: Cluster, rest: Rest, faults: Faults) -> None:
    rest.post(PODS, pod("p"))
    faults.conflict(resource="pods/binding", verbs=("create",))
    binding = {"metadata": {"name": "p"}, "target": {"kind": "Node", "name": "n1"}}
    assert rest.post(f"{PODS}/p/binding", binding).status == 409
    assert rest.post(f"{PODS}/p/binding", binding).status == 201
    assert apiserver.requests.bindings() == [("default", "p", "n1")]
    assert len(apiserver.requests.find(resource="pods/binding")) == 2
