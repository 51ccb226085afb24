"""The features a runtime is learned by: job names without generated suffixes, and pod-set shapes."""

from __future__ import annotations

import pytest

from gpuplane.insight.runtime_history import base_name, features_of, job_name
from gpuplane.model.objects import PodSet, PodTemplate, Workload


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("train-resnet-x7k2p", "train-resnet"),  # generateName
        ("train-resnet-20261201", "train-resnet"),  # a date
        ("train-resnet-run-3", "train-resnet"),  # a run number
        ("eval-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0", "eval"),  # a UUID
        ("bert-large", "bert-large"),  # a word, not a generated suffix (it has vowels)
        ("llama-7b-sft", "llama-7b-sft"),
        ("x7k2p", "x7k2p"),  # nothing but a suffix: kept
    ],
)
def test_base_name_drops_only_generated_suffixes(name: str, base: str) -> None:
    assert base_name(name) == base


def _workload(name: str, count: int = 4) -> Workload:
    template = PodTemplate(requests={"nvidia.com/gpu": 1})
    return Workload("team-a", name, "uid", 0.0, 0, (PodSet("main", count, template),), priority_class="batch")


def test_features_of_a_derived_workload_name_its_job() -> None:
    features = features_of(_workload("job-train-resnet-x7k2p-1a2b3"), "team-a-cq")
    assert features.name == "train-resnet"
    assert features.namespace == "team-a"
    assert features.queue == "team-a-cq"
    assert features.priority_class == "batch"
    assert features.shape == "4x nvidia.com/gpu=1"
    assert job_name(_workload("notebook-ab")) == "notebook-ab"
