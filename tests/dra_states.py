"""Helpers for the DRA tests: the cluster of tests/data/dra/cluster.yaml plus a test's own objects,
scheduled as `gpuplane schedule -f STATE --output json` does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpuplane.cli.schedule import plan_document
from gpuplane.core.session import Session, config_from_kueue
from gpuplane.model.loader import load_state

CLUSTER = Path(__file__).resolve().parent / "data" / "dra" / "cluster.yaml"
NOW = 1_767_225_600.0  # 2026-01-01


def template(name: str, requests: str, constraints: str = "") -> str:
    """A ResourceClaimTemplate in namespace team; ``requests`` is the YAML list of requests."""
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata: {{name: {name}, namespace: team}}
spec:
  spec:
    devices:
      requests: {requests}
      constraints: {constraints or "[]"}
"""


def claim(name: str, requests: str, status: str = "") -> str:
    return f"""
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {{name: {name}, namespace: team}}
spec:
  devices:
    requests: {requests}
{status}
"""


def workload(
    name: str, count: int, claims: str, *, at: int = 0, gpus: int = 0, annotations: str = "{}"
) -> str:
    """A Workload of ``count`` pods in queue q; ``claims`` is the YAML list of pod resourceClaims."""
    limits = f", limits: {{nvidia.com/gpu: '{gpus}'}}" if gpus else ""
    return f"""
apiVersion: kueue.x-k8s.io/v1beta2
kind: Workload
metadata: {{name: {name}, namespace: team, creationTimestamp: "2026-01-01T00:00:{at:02d}Z"}}
spec:
  queueName: q
  podSets:
  - name: main
    count: {count}
    template:
      metadata: {{annotations: {annotations}}}
      spec:
        resourceClaims: {claims}
        containers:
        - name: c
          resources: {{requests: {{cpu: "1"}}{limits}}}
"""


def schedule(*docs: str, cluster: str | None = None) -> dict[str, Any]:
    """The plan document for the cluster (or ``cluster``, its text) plus ``docs``, drained to a
    fixed point."""
    text = (cluster or CLUSTER.read_text()) + "".join(f"\n---\n{d}" for d in docs)
    state = load_state([("state.yaml", text)])
    session = Session(state, config_from_kueue(state.configuration), NOW, track_reasons=False)
    return plan_document(session.drain(NOW, max_cycles=None, until_quiet=True), 0.0, 0.0)


def admitted(doc: dict[str, Any], name: str) -> list[dict[str, Any]] | None:
    """The placement of workload team/NAME's first pod set, or None when it is not admitted."""
    for a in doc["admitted"]:
        if a["workload"] == f"team/{name}":
            placement: list[dict[str, Any]] = a["podSets"][0]["placement"]
            return placement
    return None


def pending(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in doc["pending"] if p["workload"] == f"team/{name}")


def devices(place: dict[str, Any], pod_claim: str = "gpu") -> list[str]:
    return [d["device"] for d in place["claims"][pod_claim]]
