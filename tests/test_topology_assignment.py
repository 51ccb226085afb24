"""Topology assignments in both served shapes: v1beta1 ``domains`` and v1beta2 ``slices``."""

from __future__ import annotations

import pytest

from gpuplane.model.topology import Domain, assigned_domains, topology_assignment

HOST = "kubernetes.io/hostname"
RACK = "cloud.example.com/rack"

CASES = [
    pytest.param([HOST], [(("n1",), 2), (("n2",), 1)], id="two-hosts-uneven"),
    pytest.param([HOST], [(("n1",), 4), (("n2",), 4)], id="two-hosts-even"),
    pytest.param([RACK, HOST], [(("r1", "n1"), 1), (("r1", "n2"), 3)], id="one-rack-two-hosts"),
    pytest.param([HOST], [(("n1",), 8)], id="one-host"),
]


@pytest.mark.parametrize(("levels", "domains"), CASES)
@pytest.mark.parametrize("api_version", ["kueue.x-k8s.io/v1beta1", "kueue.x-k8s.io/v1beta2"])
def test_written_shape_reads_back(levels: list[str], domains: list[Domain], api_version: str) -> None:
    written = topology_assignment(levels, domains, api_version)

    assert assigned_domains(written) == domains
    assert ("slices" in written) == api_version.endswith("v1beta2")
    assert ("domains" in written) == api_version.endswith("v1beta1")


def test_v1beta2_shape_is_kueues() -> None:
    written = topology_assignment(
        [RACK, HOST], [(("r1", "n1"), 1), (("r1", "n2"), 3)], "kueue.x-k8s.io/v1beta2"
    )

    assert written == {
        "levels": [RACK, HOST],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [{"universal": "r1"}, {"individual": {"roots": ["n1", "n2"]}}],
                "podCounts": {"individual": [1, 3]},
            }
        ],
    }


def test_reads_prefix_and_suffix_of_individual_values() -> None:
    # As Kueue compresses hostnames such as pool-a-node-1.example, pool-a-node-2.example.
    assignment = {
        "levels": [HOST],
        "slices": [
            {
                "domainCount": 2,
                "valuesPerLevel": [
                    {"individual": {"prefix": "pool-a-node-", "suffix": ".example", "roots": ["1", "2"]}}
                ],
                "podCounts": {"universal": 2},
            }
        ],
    }

    assert assigned_domains(assignment) == [
        (("pool-a-node-1.example",), 2),
        (("pool-a-node-2.example",), 2),
    ]
