"""One configuration's state of one job, shared by the engine and the parts it is made of.

The engine (:mod:`gpuplane.sim.engine`) moves a job through its life, the accounts
(:mod:`gpuplane.sim.accounts`) measure it and the forecaster (:mod:`gpuplane.sim.forecast`) predicts
when it starts; all three read and write the one :class:`JobRun` of each job.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuplane.sim.metrics import GroupStats
from gpuplane.sim.workloads import Job


@dataclass(slots=True)
class JobRun:
    """One configuration's state of one job."""

    job: Job
    stats: GroupStats
    per_pod: float
    busy_per_pod: float
    priority: int
    held: float = 0.0
    held_since: float = 0.0
    deadlocked: bool = False
    running_since: float | None = None
    progress: float = 0.0
    gen: int = 0
    first_start: float | None = None
    done: bool = False
    predicted: float | None = None
    pools: frozenset[str] = frozenset()
    pool: str = ""
    expected_end: float = 0.0
    predicted_low: float | None = None  # the range of the ETA: 10th and 90th percentile of the start
    predicted_high: float | None = None
    replayed: float | None = None  # the start the replay predicted, before the ranges' median
    asked_at: float = 0.0  # when the ETA was given
    eta_kind: str = ""  # which replay gave it: "queue" or "gang"
    basis: str = ""  # what its runtime was predicted from (the runtime predictor's basis)
    learning_since: float | None = None  # the start of a first run the history counts as running
    predicted_runtime: float | None = None  # the median runtime predicted at its first start

    @property
    def alloc(self) -> float:
        return self.per_pod * self.job.pods

    @property
    def busy_rate(self) -> float:
        return min(self.per_pod, self.busy_per_pod) * self.job.pods
