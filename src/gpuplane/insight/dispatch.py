"""Which worker clusters a workload is nominated to, behind a MultiKueue manager.

Pure: the workers as the manager sees them, the policy and the time since the first nomination go
in; the nominated clusters and one sentence a user reads in ``gpuplane why`` come out. No clock, no
I/O. The live manager and the simulator (``gpuplane simulate --clusters N``) call the same function.

The three dispatchers::

    candidates = active workers whose labels carry every pair of the cluster selector

    AllAtOnce    every candidate at once (Kueue's default)
    Incremental  candidates sorted by name; the first 3, then 3 more each time a round of
                 5 minutes has run out (Kueue's incremental dispatcher)
    gpuplane     exactly one: the first of the spill-over order that fits now, else any that fits
                 now (the earliest predicted start, then the name), else the one with the earliest
                 predicted start; none when there is no candidate

Kueue copies the workload to every nominated worker; the first worker to admit it wins and the
other copies are deleted, after they may have started preemptions. The gpuplane dispatcher asks
first (each worker's own model: does the whole gang fit now, when would it start) and sends one
copy, so no preemption starts anywhere the workload will not run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

from gpuplane.insight.idle import format_duration

DispatchPolicy = Literal["AllAtOnce", "Incremental", "gpuplane"]
POLICIES: tuple[DispatchPolicy, ...] = get_args(DispatchPolicy)

# Kueue's Configuration names its dispatcher (multiKueue.dispatcherName); gpuplane's is its own.
DISPATCHER_NAMES: Mapping[DispatchPolicy, str] = {
    "AllAtOnce": "kueue.x-k8s.io/multikueue-dispatcher-all-at-once",
    "Incremental": "kueue.x-k8s.io/multikueue-dispatcher-incremental",
    "gpuplane": "gpuplane.dev/multikueue-dispatcher",
}

INCREMENTAL_BATCH = 3  # clusters added per round (Kueue's incremental dispatcher)
INCREMENTAL_ROUND_SECONDS = 300.0  # a round lasts 5 minutes (Kueue's incrementalDispatcherRoundTimeout)
RECHECK_SECONDS = 30.0  # how often the gpuplane dispatcher looks again at a copy still waiting


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One worker cluster as the manager sees it when it nominates.

    ``fits_now``: the whole workload can be admitted and placed there now. ``start_in_seconds``:
    its predicted start there, from now (``None``: unknown or never). ``note``: the worker's short
    reason when it does not fit (``"4 GPUs short"``).
    """

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    active: bool = True
    fits_now: bool = False
    start_in_seconds: float | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class Nomination:
    """The clusters a workload is nominated to, in order, and why (one sentence).

    ``next_round_in_seconds``: for the Incremental dispatcher, when more clusters will be added
    (``None`` when none are left, and for the other dispatchers).
    """

    clusters: tuple[str, ...]
    reason: str
    next_round_in_seconds: float | None = None


def parse_policy(text: str) -> DispatchPolicy:
    """A dispatcher by its short name (``AllAtOnce``, ``Incremental``, ``gpuplane``, any case) or
    by the name Kueue's Configuration gives it; a clear error for anything else."""
    wanted = text.strip()
    for policy in POLICIES:
        if wanted.lower() == policy.lower() or wanted == DISPATCHER_NAMES[policy]:
            return policy
    known = ", ".join(POLICIES)
    raise ValueError(f"unknown dispatcher {text!r} (use one of {known})")


def nominate(
    policy: DispatchPolicy,
    clusters: Sequence[ClusterView],
    *,
    since_first_nomination_s: float,
    cluster_selector: Mapping[str, str] | None = None,
    spill_order: Sequence[str] = (),
) -> Nomination:
    """The workers a workload is nominated to under ``policy`` (see the module's table).

    ``since_first_nomination_s``: seconds since the workload was first nominated (0 at the first
    call); only the Incremental dispatcher reads it. ``cluster_selector``: labels a worker must
    carry (data locality). ``spill_order``: the gpuplane dispatcher's preferred order; workers not
    named in it come after, by name.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown dispatcher {policy!r} (use one of {', '.join(POLICIES)})")
    if not math.isfinite(since_first_nomination_s) or since_first_nomination_s < 0:
        raise ValueError(
            f"since_first_nomination_s must be a finite number >= 0, not {since_first_nomination_s!r}"
        )
    names = [cluster.name for cluster in clusters]
    if len(set(names)) != len(names):
        raise ValueError(f"worker cluster names repeat: {sorted(names)}")
    selector = dict(cluster_selector or {})
    candidates = [
        cluster
        for cluster in clusters
        if cluster.active and all(cluster.labels.get(key) == value for key, value in selector.items())
    ]
    if not candidates:
        return Nomination((), _no_candidate(clusters, selector))
    if policy == "AllAtOnce":
        chosen = tuple(sorted(cluster.name for cluster in candidates))
        return Nomination(chosen, f"nominated every active worker at once: {', '.join(chosen)}")
    if policy == "Incremental":
        return _incremental(candidates, since_first_nomination_s)
    return _gpuplane(candidates, spill_order)


def _no_candidate(clusters: Sequence[ClusterView], selector: Mapping[str, str]) -> str:
    if not any(cluster.active for cluster in clusters):
        return "no worker nominated: no worker cluster is active"
    if selector:
        wanted = ",".join(f"{key}={value}" for key, value in sorted(selector.items()))
        return f"no worker nominated: no active worker cluster has the labels {wanted}"
    return "no worker nominated: no worker cluster is active"  # pragma: no cover - unreachable


def _incremental(candidates: Sequence[ClusterView], elapsed: float) -> Nomination:
    """Kueue's incremental dispatcher: a new round starts once the last one has lasted more than
    ``INCREMENTAL_ROUND_SECONDS``, each adding the next ``INCREMENTAL_BATCH`` names in order."""
    ordered = sorted(cluster.name for cluster in candidates)
    rounds = max(1, math.ceil(elapsed / INCREMENTAL_ROUND_SECONDS))
    chosen = tuple(ordered[: rounds * INCREMENTAL_BATCH])
    left = len(ordered) - len(chosen)
    next_round = rounds * INCREMENTAL_ROUND_SECONDS - elapsed if left else None
    more = f"; {left} more in {format_duration(next_round)}" if next_round is not None else ""
    return Nomination(
        chosen,
        f"nominated {', '.join(chosen)} (round {rounds} of the incremental dispatcher){more}",
        next_round,
    )


def _gpuplane(candidates: Sequence[ClusterView], spill_order: Sequence[str]) -> Nomination:
    rank = {name: i for i, name in enumerate(dict.fromkeys(spill_order))}

    def start_key(cluster: ClusterView) -> tuple[float, str]:
        start = cluster.start_in_seconds
        return (math.inf if start is None else start, cluster.name)

    fitting = [cluster for cluster in candidates if cluster.fits_now]
    if fitting:
        preferred = [cluster for cluster in fitting if cluster.name in rank]
        if preferred:
            best = min(preferred, key=lambda cluster: rank[cluster.name])
            why = "the gang fits there now, first in the spill-over order"
        else:
            best = min(fitting, key=start_key)
            why = "the gang fits there now"
    else:
        known = [cluster for cluster in candidates if cluster.start_in_seconds is not None]
        if known:
            best = min(known, key=start_key)
            assert best.start_in_seconds is not None
            why = f"nothing fits now; it starts soonest there (in {format_duration(best.start_in_seconds)})"
        else:
            best = min(candidates, key=lambda cluster: (rank.get(cluster.name, len(rank)), cluster.name))
            why = "no worker can say when the gang would start; it is first in order"
    others = [
        _why_not(cluster) for cluster in sorted(candidates, key=lambda c: c.name) if cluster is not best
    ]
    tail = f"; {'; '.join(others)}" if others else ""
    return Nomination((best.name,), f"nominated {best.name}: {why}{tail}")


def _why_not(cluster: ClusterView) -> str:
    if cluster.fits_now:
        return f"{cluster.name} fits too"
    if cluster.note:
        return f"{cluster.name}: {cluster.note}"
    if cluster.start_in_seconds is not None:
        return f"{cluster.name} starts it in {format_duration(cluster.start_in_seconds)}"
    return f"{cluster.name} cannot say when"
