"""Watches on the double: resourceVersions, selectors, bookmarks, 410 Expired, and the official client."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client, watch

from apiserver.rest import Rest
from apiserver.server import ApiServerDouble
from apiserver.store import Store
from manifests import Manifest, pod_spec

pytestmark = pytest.mark.usefixtures("double")  # tests of the double itself, never of a real cluster

PODS = "/api/v1/namespaces/default/pods"


def pod(name: str, **labels: str) -> dict[str, Any]:
    obj = Manifest("v1", "Pod", name, "default").set("spec", pod_spec().container(cpu="1").to_dict())
    for key, value in labels.items():
        obj.label(key, value)
    return obj.to_dict()


def summary(events: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(e["type"], e["object"]["metadata"].get("name", "")) for e in events]


def list_rv(rest: Rest, path: str = PODS) -> str:
    return str(rest.get(path).body["metadata"]["resourceVersion"])


def relabel(rest: Rest, name: str, **labels: str) -> None:
    reply = rest.patch(f"{PODS}/{name}", {"metadata": {"labels": labels}}, "application/merge-patch+json")
    assert reply.status == 200, reply.body


def test_watch_from_a_list_resource_version_replays_every_later_change(rest: Rest) -> None:
    rest.post(PODS, pod("old"))
    since = list_rv(rest)
    rest.post(PODS, pod("a"))
    relabel(rest, "a", x="1")
    rest.delete(f"{PODS}/a")
    with rest.watch(PODS, resourceVersion=since) as stream:
        assert stream.status == 200
        events = stream.take(3)
        rest.post(PODS, pod("b"))
        events += stream.take(1)
    assert summary(events) == [("ADDED", "a"), ("MODIFIED", "a"), ("DELETED", "a"), ("ADDED", "b")]
    versions = [int(e["object"]["metadata"]["resourceVersion"]) for e in events]
    assert versions == sorted(versions)
    assert versions[0] > int(since)
    assert all(e["object"]["kind"] == "Pod" and e["object"]["apiVersion"] == "v1" for e in events)


@pytest.mark.parametrize("resource_version", ["", "0"], ids=["unset", "zero"])
def test_watch_without_a_version_starts_with_the_current_objects(rest: Rest, resource_version: str) -> None:
    rest.post(PODS, pod("a"))
    rest.post(PODS, pod("b"))
    params = {"resourceVersion": resource_version} if resource_version else {}
    with rest.watch(PODS, **params) as stream:
        assert summary(stream.take(2)) == [("ADDED", "a"), ("ADDED", "b")]


def test_watch_follows_objects_in_and_out_of_a_label_selection(rest: Rest) -> None:
    since = list_rv(rest)
    rest.post(PODS, pod("a", team="x"))
    rest.post(PODS, pod("other", team="y"))
    relabel(rest, "a", team="y")
    relabel(rest, "a", team="x")
    rest.delete(f"{PODS}/a")
    with rest.watch(PODS, resourceVersion=since, labelSelector="team=x") as stream:
        events = stream.take(4)
    assert summary(events) == [("ADDED", "a"), ("DELETED", "a"), ("ADDED", "a"), ("DELETED", "a")]
    assert events[1]["object"]["metadata"]["labels"] == {"team": "x"}, "leaving shows the last matching state"


def test_a_node_watch_sees_pods_bound_to_it(rest: Rest) -> None:
    since = list_rv(rest, "/api/v1/pods")
    rest.post(PODS, pod("a"))
    rest.post(PODS, pod("b"))
    binding = {"metadata": {"name": "b"}, "target": {"kind": "Node", "name": "n1"}}
    assert rest.post(f"{PODS}/b/binding", binding).status == 201
    with rest.watch("/api/v1/pods", resourceVersion=since, fieldSelector="spec.nodeName=n1") as stream:
        assert summary(stream.take(1)) == [("ADDED", "b")]


def test_watch_of_one_named_object(rest: Rest) -> None:
    since = list_rv(rest)
    rest.post(PODS, pod("a"))
    rest.post(PODS, pod("b"))
    relabel(rest, "b", x="1")
    with rest.watch(f"{PODS}/b", resourceVersion=since) as stream:
        assert summary(stream.take(2)) == [("ADDED", "b"), ("MODIFIED", "b")]


def test_bookmarks_only_for_watches_that_ask(rest: Rest, store: Store) -> None:
    since = list_rv(rest)
    with (
        rest.watch(PODS, resourceVersion=since, allowWatchBookmarks="true") as asked,
        rest.watch(PODS, resourceVersion=since) as plain,
    ):
        rest.post(PODS, pod("a"))
        at = store.send_bookmarks()
        rest.post(PODS, pod("b"))
        bookmarked = asked.take(3)
        unasked = plain.take(2)
    assert summary(bookmarked) == [("ADDED", "a"), ("BOOKMARK", ""), ("ADDED", "b")]
    assert bookmarked[1]["object"] == {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"resourceVersion": str(at)},
    }
    assert summary(unasked) == [("ADDED", "a"), ("ADDED", "b")]


def test_send_initial_events_ends_with_a_marked_bookmark(rest: Rest) -> None:
    rest.post(PODS, pod("a"))
    params = {
        "sendInitialEvents": "true",
        "allowWatchBookmarks": "true",
        "resourceVersionMatch": "NotOlderThan",
    }
    with rest.watch(PODS, **params) as stream:
        events = stream.take(2)
    assert summary(events) == [("ADDED", "a"), ("BOOKMARK", "")]
    assert events[1]["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}


def test_watch_from_a_compacted_version_is_expired(rest: Rest, store: Store) -> None:
    since = list_rv(rest)
    rest.post(PODS, pod("a"))
    store.compact()
    with rest.watch(PODS, resourceVersion=since) as stream:
        assert stream.status == 200
        events = stream.rest()
    assert [e["type"] for e in events] == ["ERROR"]
    status = events[0]["object"]
    assert (status["kind"], status["code"], status["reason"]) == ("Status", 410, "Expired")
    with rest.watch(PODS, resourceVersion=str(store.resource_version)) as fresh:
        rest.post(PODS, pod("b"))
        assert summary(fresh.take(1)) == [("ADDED", "b")]


def test_history_window_expires_old_versions_on_its_own() -> None:
    with ApiServerDouble(history_limit=3) as double:
        rest = Rest(double.url)
        since = list_rv(rest)
        for name in "abcd":
            rest.post(PODS, pod(name))
        with rest.watch(PODS, resourceVersion=since) as stream:
            assert stream.take(1)[0]["object"]["code"] == 410
        recent = str(double.store.resource_version - 2)
        with rest.watch(PODS, resourceVersion=recent) as stream:
            assert summary(stream.take(2)) == [("ADDED", "c"), ("ADDED", "d")]
        assert double.server_errors == []


def test_watch_of_a_future_version_is_refused(rest: Rest, store: Store) -> None:
    with rest.watch(PODS, resourceVersion=str(store.resource_version + 100)) as stream:
        assert stream.take(1)[0]["object"]["code"] == 504


def test_watch_stream_ends_when_the_double_stops() -> None:
    double = ApiServerDouble().start()
    rest = Rest(double.url)
    with rest.watch(PODS) as stream:
        double.stop()
        assert stream.rest() == []


# --- the official client -------------------------------------------------------------------------------


def test_official_client_watch_streams_typed_events(rest: Rest, kube_client: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_client)
    since = core.list_namespaced_pod("default").metadata.resource_version
    rest.post(PODS, pod("a"))
    relabel(rest, "a", x="1")
    rest.delete(f"{PODS}/a")
    watcher = watch.Watch()
    seen = []
    for event in watcher.stream(
        core.list_namespaced_pod, "default", resource_version=since, _request_timeout=10
    ):
        seen.append((event["type"], event["object"].metadata.name, event["object"].metadata.labels))
        if len(seen) == 3:
            watcher.stop()
    assert seen == [("ADDED", "a", None), ("MODIFIED", "a", {"x": "1"}), ("DELETED", "a", {"x": "1"})]


def test_official_client_watch_receives_bookmarks(
    rest: Rest, store: Store, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    since = core.list_namespaced_pod("default").metadata.resource_version
    rest.post(PODS, pod("a"))
    watcher = watch.Watch()
    kinds = []
    at = 0
    stream = watcher.stream(
        core.list_namespaced_pod,
        "default",
        resource_version=since,
        allow_watch_bookmarks=True,
        _request_timeout=10,
    )
    for event in stream:
        kinds.append(event["type"])
        if event["type"] == "ADDED":
            at = store.send_bookmarks()  # the watch is open now
        else:
            watcher.stop()
    assert kinds == ["ADDED", "BOOKMARK"]
    assert watcher.resource_version == str(at)


def test_official_client_watch_raises_410_when_resuming_cannot_help(
    rest: Rest, store: Store, kube_client: client.ApiClient
) -> None:
    core = client.CoreV1Api(kube_client)
    since = core.list_namespaced_pod("default").metadata.resource_version
    rest.post(PODS, pod("a"))
    store.compact()
    with pytest.raises(client.ApiException) as expired:
        next(
            iter(
                watch.Watch().stream(
                    core.list_namespaced_pod, "default", resource_version=since, _request_timeout=10
                )
            )
        )
    assert expired.value.status == 410
