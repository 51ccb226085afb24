"""MultiKueue's objects as the manager reads them: both versions' MultiKueueCluster, the config's
order, and one clear error naming the object and the field for each malformed one."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplane.model.errors import InputError
from gpuplane.model.multikueue import (
    LocationType,
    MultiKueueConfig,
    WorkerCluster,
    config_of_check,
    parse_config,
    parse_worker_cluster,
)


def cluster(spec: dict[str, Any], name: str = "eu") -> dict[str, Any]:
    return {"kind": "MultiKueueCluster", "metadata": {"name": name}, "spec": spec}


def test_both_versions_name_the_kubeconfig_the_same_way() -> None:
    v1beta2 = cluster({"clusterSource": {"kubeConfig": {"location": "eu-secret", "locationType": "Secret"}}})
    v1beta1 = cluster({"kubeConfig": {"location": "/etc/eu.kubeconfig", "locationType": "Path"}})
    assert parse_worker_cluster(v1beta2) == WorkerCluster("eu", "eu-secret", LocationType.SECRET)
    assert parse_worker_cluster(v1beta1) == WorkerCluster("eu", "/etc/eu.kubeconfig", LocationType.PATH)
    # Secret is the default, as in Kueue.
    plain = cluster({"clusterSource": {"kubeConfig": {"location": "eu-secret"}}})
    assert parse_worker_cluster(plain).location_type == LocationType.SECRET


@pytest.mark.parametrize(
    ("spec", "field", "words"),
    [
        ({}, "spec.clusterSource.kubeConfig", "no kubeConfig"),
        (
            {"clusterSource": {"kubeConfig": {}}},
            "spec.clusterSource.kubeConfig.location",
            "location is missing",
        ),
        (
            {"clusterSource": {"kubeConfig": {"location": "x", "locationType": "Vault"}}},
            "spec.clusterSource.kubeConfig.locationType",
            "neither Secret nor Path",
        ),
        (
            {"clusterSource": {"clusterProfileRef": {"name": "p"}}},
            "spec.clusterSource.clusterProfileRef",
            "not supported",
        ),
    ],
)
def test_a_malformed_cluster_is_one_error_naming_it(spec: dict[str, Any], field: str, words: str) -> None:
    with pytest.raises(InputError) as caught:
        parse_worker_cluster(cluster(spec))
    assert caught.value.obj == "MultiKueueCluster/eu"
    assert caught.value.field == field
    assert words in caught.value.message


def test_a_config_keeps_its_order_and_refuses_repeats() -> None:
    doc = {"metadata": {"name": "fleet"}, "spec": {"clusters": ["us", "eu"]}}
    assert parse_config(doc) == MultiKueueConfig("fleet", ("us", "eu"))
    with pytest.raises(InputError, match="listed twice"):
        parse_config({"metadata": {"name": "fleet"}, "spec": {"clusters": ["us", "us"]}})
    with pytest.raises(InputError, match="list of MultiKueueCluster names"):
        parse_config({"metadata": {"name": "fleet"}, "spec": {"clusters": "us"}})


def test_only_a_multikueue_check_names_a_config() -> None:
    def check(spec: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "mk"}, "spec": spec}

    assert config_of_check(check({"controllerName": "kueue.x-k8s.io/provisioning-request"})) is None
    mk = {"controllerName": "kueue.x-k8s.io/multikueue"}
    params = {"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "fleet"}
    assert config_of_check(check({**mk, "parameters": params})) == "fleet"
    with pytest.raises(InputError) as caught:
        config_of_check(check({**mk, "parameters": {**params, "kind": "ProvisioningRequestConfig"}}))
    assert caught.value.obj == "AdmissionCheck/mk"
