"""A MultiKueue manager as the console sees it: a state file with workloads dispatched to workers,
and the workers' MultiKueueCluster objects (health in the Active condition, the controller's
summary in an annotation). Shared by the console's fleet tests with and without a browser."""

from __future__ import annotations

import json
from typing import Any

from gpuplane.k8s.multikueue_fleet import SUMMARY_ANNOTATION
from manifests import documents
from why_cases import base, holder, pending

SMALL = {
    "cluster": "small",
    "active": True,
    "message": "connected",
    "quota": {"cpu": "64", "nvidia.com/gpu": "16"},
    "usage": {"cpu": "4", "nvidia.com/gpu": "12"},
    "pendingWorkloads": 3,
    "admittedWorkloads": 2,
}
BIG = {
    "cluster": "big",
    "active": False,
    "message": "ConnectionRefusedError: connection refused",
    "quota": {},
    "usage": {},
    "pendingWorkloads": 0,
    "admittedWorkloads": 0,
}


def manager_yaml() -> str:
    """``default/runs`` runs on worker ``small``; ``default/dispatching`` holds quota and is nominated
    to ``small`` and ``big``; ``default/w`` waits on the manager (no worker yet)."""
    runs = holder("runs", 4).set("status.clusterName", "small")
    dispatching = holder("dispatching", 2).set("status.nominatedClusterNames", ["small", "big"])
    return documents(*base(gpu_quota=8), runs, dispatching, pending(gpu=4, cpu="1"))


def worker_cluster(
    name: str, summary: dict[str, Any] | None, active: tuple[str, str] | None = None
) -> dict[str, Any]:
    """A MultiKueueCluster as the manager holds it: ``active`` is the Active condition's status and
    message (none written when ``None``)."""
    meta: dict[str, Any] = {"name": name}
    if summary is not None:
        meta["annotations"] = {SUMMARY_ANNOTATION: json.dumps(summary)}
    obj: dict[str, Any] = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "MultiKueueCluster",
        "metadata": meta,
        "spec": {
            "clusterSource": {"kubeConfig": {"locationType": "Secret", "location": f"{name}-kubeconfig"}}
        },
    }
    if active is not None:
        status, message = active
        obj["status"] = {
            "conditions": [
                {
                    "type": "Active",
                    "status": status,
                    "reason": "Active" if status == "True" else "ClientConnectionFailed",
                    "message": message,
                    "lastTransitionTime": "2026-03-01T09:00:00Z",
                }
            ]
        }
    return obj


def fleet_objects() -> list[dict[str, Any]]:
    return [
        worker_cluster("small", SMALL, ("True", "Connected")),
        worker_cluster("big", BIG, ("False", "connection refused")),
    ]
