"""The controller's runtime history and its ConfigMap: what a finished Workload teaches, the bounds
(size, retention, bytes), unreadable data, debounced writes, and two writers merging on a conflict.

The ConfigMap tests run against the API-server double (skipped on a real cluster)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from apiserver.server import ApiServerDouble
from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample
from gpuplane.k8s import api as k8s
from gpuplane.k8s import runtime_store
from gpuplane.k8s.api import KubeApi, load_api_client
from gpuplane.k8s.runtime_store import (
    CONFIG_MAP_NAME,
    DATA_KEY,
    FORMAT,
    HistoryFormatError,
    RuntimeHistory,
    RuntimeStore,
    decode,
    encode,
    sample_of,
)
from gpuplane.k8s.state import read_runtime_history

NOW = 1_780_000_000.0
NS = "gpuplane-system"
DAY = 86400.0


def _rfc(seconds: float) -> str:
    import datetime  # noqa: PLC0415

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def finished_workload(
    name: str = "job-train-resnet-x7k2p-1a2b3",
    *,
    admitted: float = NOW - 600,
    finished: float | None = NOW,
    uid: str = "0b7c1a52-3f5e-4b61-9d0e-6a7f8e9d0c1b",
    queue: str | None = "team-a-cq",
) -> dict[str, Any]:
    conditions = [
        {"type": "QuotaReserved", "status": "True", "lastTransitionTime": _rfc(admitted - 5)},
        {"type": "Admitted", "status": "True", "lastTransitionTime": _rfc(admitted)},
    ]
    if finished is not None:
        conditions.append({"type": "Finished", "status": "True", "lastTransitionTime": _rfc(finished)})
    status: dict[str, Any] = {"conditions": conditions}
    if queue is not None:
        status["admission"] = {
            "clusterQueue": queue,
            "podSetAssignments": [{"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": "h100"}}],
        }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "team-a", "uid": uid},
        "spec": {
            "queueName": "lq",
            "priorityClassName": "high",
            "podSets": [
                {
                    "name": "main",
                    "count": 2,
                    "template": {
                        "spec": {
                            "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]
                        }
                    },
                }
            ],
        },
        "status": status,
    }


def sample(name: str, seconds: float, finished_at: float) -> RuntimeSample:
    return RuntimeSample(JobFeatures("team-a", name, "cq", "", "1x nvidia.com/gpu=8"), seconds, finished_at)


# --- what a finished Workload teaches ------------------------------------------------------------


def test_a_finished_workload_gives_its_runtime_from_admission_and_its_features() -> None:
    found = sample_of(finished_workload())
    assert found is not None
    ident, learned = found
    assert ident == "0b7c1a523f5e4b61"
    assert learned.seconds == 600.0  # from Admitted, not QuotaReserved
    assert learned.finished_at == NOW
    assert learned.features == JobFeatures(
        "team-a", "train-resnet", "team-a-cq", "high", "2x nvidia.com/gpu=4"
    )


def test_only_quota_reserved_counts_when_there_is_no_admitted_condition() -> None:
    wl = finished_workload()
    wl["status"]["conditions"] = [c for c in wl["status"]["conditions"] if c["type"] != "Admitted"]
    found = sample_of(wl)
    assert found is not None
    assert found[1].seconds == 605.0


@pytest.mark.parametrize(
    "wl",
    [
        finished_workload(finished=None),  # still running
        finished_workload(queue=None),  # finished without an admission (deactivated while pending)
        finished_workload(finished=NOW - 900),  # finished before it was admitted: not a runtime
        {"metadata": {"name": "x"}, "status": {"conditions": "garbage"}},
        {
            "metadata": {"name": "x"},
            "spec": {"podSets": "nope"},
            "status": {
                "admission": {"clusterQueue": "cq"},
                "conditions": [
                    {"type": "Admitted", "status": "True", "lastTransitionTime": _rfc(NOW - 1)},
                    {"type": "Finished", "status": "True", "lastTransitionTime": _rfc(NOW)},
                ],
            },
        },
    ],
    ids=["running", "no-admission", "finished-first", "bad-conditions", "bad-spec"],
)
def test_no_sample_from_what_did_not_run_to_its_end(wl: dict[str, Any]) -> None:
    assert sample_of(wl) is None


# --- the stored form -----------------------------------------------------------------------------


def test_encode_and_decode_round_trip_with_each_feature_set_stored_once() -> None:
    entries = {f"id{i}": sample("train", 100.0 + i, NOW - i) for i in range(10)}
    entries["other"] = sample("eval", 5.5, NOW)
    text = encode(entries)
    assert decode(text) == entries
    doc = json.loads(text)
    assert doc["format"] == FORMAT
    assert len(doc["features"]) == 2
    assert doc["samples"][0][3] == "id9", "oldest first"


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        "[]",
        json.dumps({"format": "someone-else/v9", "features": [], "samples": []}),
        json.dumps({"format": FORMAT, "features": {}, "samples": []}),
        json.dumps({"format": FORMAT, "features": [["a", "b"]], "samples": []}),
        json.dumps({"format": FORMAT, "features": [["a", "b", "c", "d", "e"]], "samples": [[1, 2, 3, "x"]]}),
        json.dumps({"format": FORMAT, "features": [["a", "b", "c", "d", "e"]], "samples": [[0, -2, 3, "x"]]}),
        json.dumps(
            {"format": FORMAT, "features": [["a", "b", "c", "d", "e"]], "samples": [[0, "2", 3, "x"]]}
        ),
        json.dumps({"format": FORMAT, "features": [["a", "b", "c", "d", "e"]], "samples": [[0, 2, 3]]}),
    ],
    ids=["json", "list", "foreign", "features-map", "short-features", "index", "negative", "string", "short"],
)
def test_decode_refuses_what_is_not_a_history(text: str) -> None:
    with pytest.raises(HistoryFormatError):
        decode(text)


# --- the bounds ----------------------------------------------------------------------------------


def test_the_history_keeps_the_newest_samples_up_to_its_size() -> None:
    history = RuntimeHistory(size=3, retention_seconds=30 * DAY)
    assert history.add([(f"s{i}", sample("train", 10.0, NOW - 100 + i)) for i in range(5)], NOW) == 3
    assert [s.finished_at for s in history.samples()] == [NOW - 98, NOW - 97, NOW - 96]
    assert history.add([("old", sample("train", 10.0, NOW - 1000))], NOW) == 0, "older than every kept one"
    assert history.add([("s4", sample("train", 99.0, NOW))], NOW) == 0, "known by its id"
    assert history.add([("new", sample("train", 10.0, NOW))], NOW) == 1
    assert len(history) == 3
    assert history.samples()[-1].finished_at == NOW


def test_the_history_drops_samples_past_its_retention() -> None:
    history = RuntimeHistory(size=100, retention_seconds=7 * DAY)
    history.add(
        [("old", sample("train", 10.0, NOW - 8 * DAY)), ("new", sample("train", 10.0, NOW - DAY))], NOW
    )
    assert set(history.entries()) == {"new"}
    history.add([("newer", sample("train", 10.0, NOW))], NOW + 6.5 * DAY)
    assert set(history.entries()) == {"newer"}, "the day-old one is now past seven days"


def test_what_would_not_stay_is_known_before_it_is_read() -> None:
    history = RuntimeHistory(size=2, retention_seconds=DAY)
    assert not history.would_keep(NOW - 2 * DAY, NOW), "past the retention"
    assert history.would_keep(NOW - 100, NOW), "room left"
    history.add([("a", sample("train", 1.0, NOW - 50)), ("b", sample("train", 1.0, NOW - 40))], NOW)
    assert not history.would_keep(NOW - 100, NOW), "full, and older than every kept one"
    assert history.would_keep(NOW - 45, NOW)
    assert not RuntimeHistory(size=0).would_keep(NOW, NOW)


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="size"):
        RuntimeHistory(size=-1)
    with pytest.raises(ValueError, match="retention"):
        RuntimeHistory(retention_seconds=0)


# --- the ConfigMap, on the double ----------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(double: ApiServerDouble) -> Iterator[KubeApi]:
    assert double.kubeconfig_path is not None
    client = KubeApi(load_api_client(str(double.kubeconfig_path)), qps=None)
    client.create(k8s.NAMESPACES, {"metadata": {"name": NS}})
    yield client
    client.api_client.close()  # type: ignore[no-untyped-call]


def store(api: KubeApi, clock: Clock, *, size: int = 5000, flush: float = 60.0) -> RuntimeStore:
    return RuntimeStore(api, RuntimeHistory(size, 30 * DAY), namespace=NS, flush_seconds=flush, clock=clock)


def stored(api: KubeApi) -> dict[str, Any]:
    return api.get(k8s.CONFIG_MAPS, CONFIG_MAP_NAME, NS)


def workloads(count: int, start: int = 0) -> dict[str, dict[str, Any]]:
    out = {}
    for i in range(start, start + count):
        uid = f"{i:08x}-0000-4000-8000-000000000000"
        end = NOW - 1000 + i
        out[f"team-a/w{i}"] = finished_workload(f"train-{i}", admitted=end - 100, finished=end, uid=uid)
    return out


def test_a_new_store_starts_from_what_the_last_one_wrote(api: KubeApi) -> None:
    clock = Clock()
    first = store(api, clock)
    first.sync()  # nothing stored yet: starts empty, writes nothing
    assert first.loaded
    assert first.writes == 0
    objs = workloads(3)
    assert first.observe(objs, objs.get) == 3
    assert first.observe(objs, objs.get) == 0, "each Workload once"
    first.sync()
    assert first.writes == 1
    cm = stored(api)
    assert cm["metadata"]["labels"]["app.kubernetes.io/component"] == "runtime-history"
    assert len(decode(cm["data"][DATA_KEY])) == 3

    second = store(api, clock)  # a restarted controller
    second.sync()
    assert [s.features.name for s in second.samples()] == ["train"] * 3
    assert second.samples() == first.samples()
    assert not second.history.dirty, "nothing new to write"


def test_writes_are_debounced_and_the_last_one_happens_at_close(api: KubeApi) -> None:
    clock = Clock()
    s = store(api, clock, flush=60.0)
    s.sync()
    objs = workloads(4)
    keys = list(objs)
    s.observe(keys[:1], objs.get)
    s.sync()
    assert s.writes == 1, "the first sample is written at once"
    s.observe(keys[1:2], objs.get)
    clock.now += 30
    s.sync()
    assert s.writes == 1, "not twice within a minute"
    clock.now += 31
    s.sync()
    assert s.writes == 2
    s.sync()
    assert s.writes == 2, "nothing new"
    s.observe(keys[2:], objs.get)
    s.close()
    assert s.writes == 3
    assert len(decode(stored(api)["data"][DATA_KEY])) == 4


def test_the_stored_history_is_bounded_by_the_size(api: KubeApi) -> None:
    clock = Clock()
    s = store(api, clock, size=10)
    s.sync()
    objs = workloads(25)
    s.observe(objs, objs.get)
    s.close()
    kept = decode(stored(api)["data"][DATA_KEY])
    assert len(kept) == 10
    assert min(v.finished_at for v in kept.values()) == NOW - 1000 + 15, "the oldest went first"

    smaller = store(api, clock, size=4)  # restarted with a smaller size: the stored copy shrinks too
    smaller.sync()
    assert len(smaller.samples()) == 4
    assert len(decode(stored(api)["data"][DATA_KEY])) == 4


def test_a_history_too_big_for_a_config_map_drops_its_oldest(api: KubeApi, monkeypatch: Any) -> None:
    monkeypatch.setattr(runtime_store, "MAX_BYTES", 2000)
    clock = Clock()
    s = store(api, clock)
    s.sync()
    objs = workloads(60)
    s.observe(objs, objs.get)
    s.close()
    text = stored(api)["data"][DATA_KEY]
    assert len(text.encode()) <= 2000
    kept = decode(text)
    assert 0 < len(kept) < 60
    assert max(v.finished_at for v in kept.values()) == NOW - 1000 + 59, "the newest stay"


@pytest.mark.parametrize(
    "text",
    ["{corrupt", json.dumps({"format": "another/v2", "rows": [1, 2]})],
    ids=["corrupt", "foreign"],
)
def test_unreadable_data_is_a_warning_and_an_empty_start(
    api: KubeApi, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    api.create(
        k8s.CONFIG_MAPS,
        {"metadata": {"name": CONFIG_MAP_NAME, "namespace": NS}, "data": {DATA_KEY: text, "note": "kept"}},
        NS,
    )
    clock = Clock()
    s = store(api, clock)
    with caplog.at_level(logging.WARNING, logger="gpuplane.k8s.runtime_store"):
        s.sync()
    assert s.loaded
    assert s.samples() == ()
    assert any("not readable" in r.getMessage() for r in caplog.records)
    objs = workloads(2)
    s.observe(objs, objs.get)
    s.sync()
    cm = stored(api)
    assert len(decode(cm["data"][DATA_KEY])) == 2, "replaced by a readable history"
    assert cm["data"]["note"] == "kept", "other keys stay"


def test_a_config_map_without_the_key_gets_it_and_keeps_its_own(
    api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    api.create(
        k8s.CONFIG_MAPS, {"metadata": {"name": CONFIG_MAP_NAME, "namespace": NS}, "data": {"a": "b"}}, NS
    )
    s = store(api, Clock())
    with caplog.at_level(logging.WARNING, logger="gpuplane.k8s.runtime_store"):
        s.sync()
    assert any("has no key" in r.getMessage() for r in caplog.records)
    objs = workloads(1)
    s.observe(objs, objs.get)
    s.sync()
    assert stored(api)["data"]["a"] == "b"
    assert len(decode(stored(api)["data"][DATA_KEY])) == 1


def test_two_writers_merge_on_a_conflict(api: KubeApi) -> None:
    # Two leaders one after the other that both read the ConfigMap before either wrote (a lease
    # handed over mid-write): the second write fails on its resourceVersion, reads again and merges.
    clock = Clock()
    a, b = store(api, clock), store(api, clock)
    objs = workloads(3)
    a.observe(objs, objs.get)
    a.sync()
    b.sync()
    assert len(b.samples()) == 3
    more_a, more_b = workloads(2, start=10), workloads(2, start=20)
    a.observe(more_a, more_a.get)
    b.observe(more_b, more_b.get)
    assert a.flush()
    assert b.flush(), "after a 409: read again, merge, write"
    kept = decode(stored(api)["data"][DATA_KEY])
    assert len(kept) == 7
    assert {s.finished_at for s in kept.values()} >= {v.finished_at for v in b.samples()}


def test_creates_race_to_one_config_map(api: KubeApi) -> None:
    clock = Clock()
    a, b = store(api, clock), store(api, clock)
    a.sync()
    b.sync()  # both saw none
    one, two = workloads(1), workloads(1, start=5)
    a.observe(one, one.get)
    b.observe(two, two.get)
    assert a.flush()
    assert b.flush(), "AlreadyExists: read, merge, update"
    assert len(decode(stored(api)["data"][DATA_KEY])) == 2


def test_a_write_into_a_namespace_that_is_missing_waits_for_the_next_interval(
    api: KubeApi, double: ApiServerDouble
) -> None:
    clock = Clock()
    s = RuntimeStore(api, RuntimeHistory(), namespace="no-such-namespace-x", flush_seconds=60, clock=clock)
    s.sync()  # 404: no ConfigMap yet
    assert s.loaded
    objs = workloads(1)
    s.observe(objs, objs.get)
    assert not s.flush(), "the namespace is missing: a warning, no crash"
    assert s.history.dirty, "tried again later"
    assert len(double.requests.find(verb="create", resource="configmaps")) == 1, "not retried at once"


def test_size_zero_turns_the_history_off(api: KubeApi) -> None:
    s = store(api, Clock(), size=0)
    objs = workloads(2)
    assert s.observe(objs, objs.get) == 0
    s.sync()
    s.close()
    assert not s.loaded
    assert s.writes == 0


def test_the_commands_that_read_a_live_cluster_read_the_history_too(api: KubeApi) -> None:
    assert read_runtime_history(api, NS) == (), "none yet"
    s = store(api, Clock())
    objs = workloads(3)
    s.observe(objs, objs.get)
    s.sync()
    assert read_runtime_history(api, NS) == s.samples()
    assert read_runtime_history(api, "elsewhere") == ()
    cm = stored(api)
    cm["data"][DATA_KEY] = "{corrupt"
    api.replace(k8s.CONFIG_MAPS, cm)
    assert read_runtime_history(api, NS) == (), "unreadable: the ETA learns from what it sees"


def test_an_empty_history_is_seeded_once_after_the_first_list(
    api: KubeApi, caplog: pytest.LogCaptureFixture
) -> None:
    clock = Clock()
    objs = workloads(1)
    learned = sample_of(next(iter(objs.values())))
    assert learned is not None
    same_run = RuntimeSample(JobFeatures("team-a", "train", "", "", ""), 100.0, learned[1].finished_at + 2)
    calls: list[int] = []

    def seed() -> list[tuple[str, RuntimeSample]]:
        calls.append(1)
        return [("p1", sample("eval", 30.0, NOW - 50)), ("p2", same_run)]

    s = RuntimeStore(api, RuntimeHistory(), namespace=NS, flush_seconds=0, clock=clock, seed=seed)
    s.sync()  # first pass: reads (nothing stored) ...
    assert not calls
    s.observe(objs, objs.get)  # ... and learns the first list
    s.sync()  # second pass: seeds what the Workloads did not teach
    assert calls == [1]
    assert sorted(x.features.name for x in s.samples()) == ["eval", "train"]
    s.sync()
    assert calls == [1], "once"
    assert len(decode(stored(api)["data"][DATA_KEY])) == 2

    restarted = RuntimeStore(api, RuntimeHistory(), namespace=NS, flush_seconds=0, clock=clock, seed=seed)
    restarted.sync()
    restarted.sync()
    assert calls == [1], "a history that is not empty is not seeded again"

    def broken() -> list[tuple[str, RuntimeSample]]:
        raise OSError("connection refused")

    other = RuntimeStore(
        api, RuntimeHistory(), namespace="elsewhere", flush_seconds=0, clock=clock, seed=broken
    )
    with caplog.at_level(logging.WARNING, logger="gpuplane.k8s.runtime_store"):
        other.sync()
        other.sync()
    assert any("not seeded" in r.getMessage() for r in caplog.records)


def test_a_config_map_deleted_under_a_running_controller_is_written_again_whole(api: KubeApi) -> None:
    s = store(api, Clock(), flush=0)
    s.sync()
    objs = workloads(2)
    s.observe(list(objs)[:1], objs.get)
    s.sync()
    api.delete(k8s.CONFIG_MAPS, CONFIG_MAP_NAME, NS)
    s.observe(objs, objs.get)
    assert s.flush(), "the update's 404: read (none), then create"
    assert len(decode(stored(api)["data"][DATA_KEY])) == 2
