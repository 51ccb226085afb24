"""What `gpuplane why` says of a workload behind admission checks, and of one MultiKueue dispatched:
its checks' states and messages (the MultiKueue check's message says which workers it was nominated
to and why), and the worker cluster it runs on."""

from __future__ import annotations

from gpuplane.model.admission_checks import CheckState
from gpuplane.model.objects import Workload


def waiting_checks_message(wl: Workload, cluster_queue: str) -> str | None:
    """For a workload that holds quota and is not admitted: its checks that are not Ready, with their
    messages; None when there are none (it is admitted, or waits for nothing)."""
    if wl.condition_true("Admitted"):
        return None
    waiting = [c for c in wl.check_states if c.state != CheckState.READY]
    if not waiting:
        return None
    parts = [f"{c.name} {c.state}" + (f" ({c.message})" if c.message else "") for c in waiting]
    return f"quota reserved in ClusterQueue {cluster_queue}; waiting for admission checks: " + "; ".join(
        parts
    )


def worker_note(wl: Workload) -> str:
    """``; runs on worker cluster X (MultiKueue)`` for a dispatched workload, else nothing."""
    return f"; runs on worker cluster {wl.cluster_name} (MultiKueue)" if wl.cluster_name else ""
