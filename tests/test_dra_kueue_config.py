"""Kueue's Configuration read from its ConfigMap on a live cluster (issue 32: DRA charged against quota
on a live cluster): the document and its errors, the read, the controller's copy in its cache, the
state built from it, and claims charged for a Workload the live session is fed without a rebuild."""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any, cast

import pytest
import yaml

from dra_states import CLUSTER, NOW, template, workload
from gpuplane.core.session import config_from_kueue
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.clusterstate import read_cluster, state_objects, typed
from gpuplane.k8s.informer import Cache, object_key
from gpuplane.k8s.kueue_config import (
    CONFIG_KIND,
    DEFAULT_SOURCE,
    KUEUE_CONFIG_KEY,
    KueueConfigError,
    KueueConfigReader,
    KueueConfigSource,
    configuration_document,
    read_configuration,
)
from gpuplane.k8s.live_session import LiveSession
from gpuplane.model.loader import state_from_objects

CONFIG = """\
apiVersion: config.kueue.x-k8s.io/v1beta1
kind: Configuration
resources:
  deviceClassMappings:
  - name: example.com/gpus
    deviceClassNames: [gpu.example.com]
"""


def config_map(text: str | None, name: str = "kueue-manager-config") -> dict[str, Any]:
    data = {} if text is None else {KUEUE_CONFIG_KEY: text}
    return {"metadata": {"name": name, "namespace": "kueue-system"}, "data": data}


class FakeApi:
    """Answers GETs of ConfigMaps from ``objects`` (namespace, name) -> object, or raises ``error``;
    counts the GETs."""

    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]], error: ApiError | None = None) -> None:
        self.objects = objects
        self.error = error
        self.gets = 0

    def get(self, res: Any, name: str, namespace: str | None = None) -> dict[str, Any]:
        del res
        self.gets += 1
        if self.error is not None:
            raise self.error
        found = self.objects.get((namespace or "", name))
        if found is None:
            raise ApiError(404, "Not Found")
        return found

    def list(self, res: Any, namespace: str | None = None, **query: Any) -> dict[str, Any]:
        del res, namespace, query
        return {"items": []}


def api(fake: FakeApi) -> KubeApi:
    return cast(KubeApi, fake)


# --- the document -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
def test_a_configuration_of_either_version_is_read(version: str) -> None:
    doc = configuration_document(config_map(CONFIG.replace("v1beta1", version)), DEFAULT_SOURCE)
    assert doc is not None
    state = state_from_objects([doc])
    assert dict(state.configuration.device_class_mappings) == {"gpu.example.com": "example.com/gpus"}


def test_a_config_map_without_the_key_holds_no_configuration() -> None:
    assert configuration_document(config_map(None), DEFAULT_SOURCE) is None


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("resources: [unclosed", "not YAML"),
        ("- just\n- a list\n", "not a Configuration object"),
        ("apiVersion: v1\nkind: ConfigMap\n", "expected kind Configuration"),
        (CONFIG.replace("v1beta1", "v9"), "expected kind Configuration"),
        (CONFIG.replace("[gpu.example.com]", "[]"), "deviceClassNames: must name at least one DeviceClass"),
    ],
)
def test_a_malformed_configuration_is_one_error_naming_the_config_map(text: str, says: str) -> None:
    with pytest.raises(KueueConfigError) as caught:
        configuration_document(config_map(text), DEFAULT_SOURCE)
    message = str(caught.value)
    assert message.startswith(
        "ConfigMap kueue-system/kueue-manager-config (controller_manager_config.yaml): "
    )
    assert says in message
    assert "\n" not in message


# --- the read ------------------------------------------------------------------------------------


def test_read_from_kueues_config_map_or_a_named_one() -> None:
    fake = FakeApi(
        {
            ("kueue-system", "kueue-manager-config"): config_map(CONFIG),
            ("team", "other"): config_map(CONFIG.replace("example.com/gpus", "example.com/other")),
        }
    )
    doc = read_configuration(api(fake))
    assert doc is not None
    assert doc["resources"]["deviceClassMappings"][0]["name"] == "example.com/gpus"
    other = read_configuration(api(fake), KueueConfigSource("team", "other"))
    assert other is not None
    assert other["resources"]["deviceClassMappings"][0]["name"] == "example.com/other"
    assert read_configuration(api(fake), KueueConfigSource("team", "")) is None  # not read at all
    assert fake.gets == 2


@pytest.mark.parametrize("status", [404, 403])
def test_no_config_map_or_no_right_to_read_it_is_no_configuration(status: int) -> None:
    assert read_configuration(api(FakeApi({}, ApiError(status, "x")))) is None


def test_another_api_failure_is_raised() -> None:
    with pytest.raises(ApiError):
        read_configuration(api(FakeApi({}, ApiError(500, "Internal Server Error"))))


def test_read_cluster_lists_the_configuration_and_reports_a_malformed_one() -> None:
    good = FakeApi({("kueue-system", "kueue-manager-config"): config_map(CONFIG)})
    listed = read_cluster(api(good))
    assert [d["kind"] for d in listed[CONFIG_KIND]] == ["Configuration"]
    bad = FakeApi({("kueue-system", "kueue-manager-config"): config_map("resources: [unclosed")})
    problems: list[Any] = []
    listed = read_cluster(api(bad), problems=problems)
    assert listed[CONFIG_KIND] == []
    assert len(problems) == 1
    assert "ConfigMap kueue-system/kueue-manager-config" in str(problems[0])


# --- the controller's copy -----------------------------------------------------------------------


def test_the_reader_keeps_the_configuration_in_the_cache_and_reads_again_when_due(
    caplog: pytest.LogCaptureFixture,
) -> None:
    objects = {("kueue-system", "kueue-manager-config"): config_map(CONFIG)}
    fake = FakeApi(objects)
    cache = Cache()
    reader = KueueConfigReader(api(fake), DEFAULT_SOURCE, period=60.0)
    reader.refresh(cache, 0.0)
    assert [d["kind"] for d in cache.items(CONFIG_KIND)] == ["Configuration"]
    assert cache.take_changes() == {CONFIG_KIND: {"kueue-manager-config"}}
    reader.refresh(cache, 30.0)  # not due
    assert fake.gets == 1
    reader.refresh(cache, 61.0)  # due, unchanged: nothing noted
    assert fake.gets == 2
    assert cache.take_changes() == {}

    objects[("kueue-system", "kueue-manager-config")] = config_map("resources: [unclosed")
    with caplog.at_level(logging.ERROR, logger="gpuplane.k8s.kueue_config"):
        reader.refresh(cache, 122.0)
        reader.refresh(cache, 183.0)
    assert cache.items(CONFIG_KIND) == []  # a malformed one counts as none
    assert cache.take_changes() == {CONFIG_KIND: {"kueue-manager-config"}}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, errors  # once per distinct error
    assert "ConfigMap kueue-system/kueue-manager-config" in errors[0]

    fake.error = ApiError(503, "Service Unavailable")
    reader.refresh(cache, 244.0)  # a failing server: tried again next time, nothing changed
    assert reader.due <= 244.0


# --- the state, and a Workload fed to the live session --------------------------------------------


def _quota_cluster(gpus: int) -> str:
    text = CLUSTER.read_text().replace(
        "coveredResources: [cpu, nvidia.com/gpu]", "coveredResources: [cpu, nvidia.com/gpu, example.com/gpus]"
    )
    return text.replace(
        "      - {name: nvidia.com/gpu, nominalQuota: 100}",
        "      - {name: nvidia.com/gpu, nominalQuota: 100}\n"
        f"      - {{name: example.com/gpus, nominalQuota: {gpus}}}",
    )


class Store:
    """Objects by kind and key, as the informer cache hands them to the live session."""

    def __init__(self, text: str) -> None:
        self.objects: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
        for doc in yaml.safe_load_all(text):
            if doc:
                self.add(doc)

    def add(self, doc: dict[str, Any]) -> str:
        kind = doc["kind"]
        if kind == CONFIG_KIND:
            doc = {**doc, "metadata": {"name": "kueue-manager-config"}}
        key = object_key(doc)
        self.objects[kind][key] = doc
        return key

    def items(self, kind: str) -> list[dict[str, Any]]:
        return list(self.objects.get(kind, {}).values())

    def get(self, kind: str, key: str) -> dict[str, Any] | None:
        return self.objects.get(kind, {}).get(key)


GPUS = "[{name: gpus, exactly: {deviceClassName: gpu.example.com, count: 2}}]"
CLAIM = "[{name: gpu, resourceClaimTemplateName: two}]"


def test_the_live_state_charges_claims_under_the_configurations_mappings() -> None:
    store = Store(_quota_cluster(2) + "\n---\n" + CONFIG + "\n---\n" + template("two", GPUS))
    store.add(yaml.safe_load(workload("a", 1, CLAIM)))
    state = state_from_objects(state_objects(store.items))
    (wl,) = state.workloads
    assert dict(wl.pod_sets[0].template.claim_quota) == {"example.com/gpus": 2}


def test_a_workload_fed_to_the_live_session_is_charged_as_a_rebuild_charges_it() -> None:
    store = Store(_quota_cluster(2) + "\n---\n" + CONFIG + "\n---\n" + template("two", GPUS))
    store.add(yaml.safe_load(workload("a", 1, CLAIM)))
    live = LiveSession(lambda state: config_from_kueue(state.configuration))
    session = live.sync(store.items, store.get, {}, NOW)
    plan = session.drain(NOW)
    assert [d.workload for d in plan.admitted] == ["team/a"]

    # b arrives later and is fed as an event: its claim is charged, and the quota (2) is spent.
    key = store.add(yaml.safe_load(workload("b", 1, CLAIM, at=1)))
    session = live.sync(store.items, store.get, {"Workload": {key}}, NOW + 1)
    assert live.fed == 1, live.last_rebuild_reason
    plan = session.drain(NOW + 1)
    assert not plan.admitted
    (waiting,) = [p for p in plan.pending if p.workload == "team/b"]
    assert "example.com/gpus" in waiting.message


def test_a_configuration_change_rebuilds_the_live_session() -> None:
    store = Store(_quota_cluster(2) + "\n---\n" + template("two", GPUS))
    live = LiveSession(lambda state: config_from_kueue(state.configuration))
    live.sync(store.items, store.get, {}, NOW)
    store.add(yaml.safe_load(CONFIG))
    live.sync(store.items, store.get, {CONFIG_KIND: {"kueue-manager-config"}}, NOW + 1)
    assert live.rebuilds == 2
    assert "Configuration" in live.last_rebuild_reason


def test_typed_keeps_the_configurations_api_version() -> None:
    doc = typed(yaml.safe_load(CONFIG), CONFIG_KIND)
    assert doc["apiVersion"] == "config.kueue.x-k8s.io/v1beta1"
