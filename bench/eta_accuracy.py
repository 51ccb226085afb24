"""ETA accuracy of `gpuplane why` (insight.queue_eta) against the real starts, on the real core.

A virtual-time loop drives ``core.schedule`` on a frozen state rebuilt at every event (arrival or
finish): one ClusterQueue of 32 GPUs, workloads of 1/2/4/8 GPUs arriving at random (about 95 %
offered load), true runtimes lognormal (median 30 min, sigma 0.8) that the estimator never sees.
At each arrival the new workload's ETA is taken from ``insight.why.explain`` (runtimes learned from
the finished workloads so far); when it starts, the error is measured. Workloads are submitted
under job names that repeat (about 20 jobs a name; a name has its own size, and its runtimes spread
0.35 in log around its own typical runtime, the assumptions of the simulator's generator), so the
runtime predictor can learn a name's runtimes.

With ``--whole-nodes`` the 32 GPUs are 4 nodes of 8, and workloads of 8 or 16 GPUs are gangs of 1 or
2 pods that each take a whole node (the others, of 1, 2 or 4 GPUs, one pod, fragment the nodes): the
ETA of such a gang is the node replay; the errors on the gangs alone are reported too.

Reported, for waits over 5 minutes: the p50 and p90 of |predicted - actual| / actual wait, for
gpuplane's estimate and, as the baseline measured in the same run, position x median runtime /
average concurrency (what a user does with a queue position alone). The target is a p50 of at most 25 %.
Then, over all and by basis (what the asked job's own runtime would be predicted from when it was
asked: ``name``, ``team``, ``queue``, ``assumed``): the ETA's p50 relative error, the share of real
starts inside the range given (its 10th to 90th percentile: calibrated, about 80 %), and the p50
relative error of the median runtime the shared runtime predictor gives each job at its start.

    python3 bench/run.py eta-accuracy [-- --workloads 600 --seed 7 --whole-nodes]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import time
from dataclasses import dataclass, field

from rich.console import Console
from rich.table import Table

from gpuplane.core.config import SchedulerConfig
from gpuplane.core.scheduler import schedule
from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample
from gpuplane.insight.runtime_predictor import RuntimePredictor
from gpuplane.insight.why import explain
from gpuplane.model.objects import (
    Admission,
    ClusterQueue,
    ClusterState,
    Condition,
    FlavorQuotas,
    LocalQueue,
    Namespace,
    Node,
    PodSet,
    PodSetAssignment,
    PodTemplate,
    ResourceFlavor,
    ResourceGroup,
    ResourceQuota,
    Workload,
    frozen_map,
)

GPU = "nvidia.com/gpu"
CAPACITY = 32
SIZES = ((1, 0.4), (2, 0.3), (4, 0.2), (8, 0.1))
NODE_GPUS = 8
NODE_SIZES = ((1, 0.3), (2, 0.2), (4, 0.2), (8, 0.15), (16, 0.15))  # 8 and 16: whole-node gangs
MEDIAN_RUNTIME = 1800.0
SIGMA = 0.8
LONG_WAIT = 300.0


NAME_RUNS = 20.0  # mean jobs per job name (the simulator's RUNS_PER_NAME, an assumption)
NAME_SIGMA = 0.35  # spread (log) of the runtimes of one name (the simulator's NAME_SIGMA, an assumption)


@dataclass
class Job:
    name: str
    gpus: int
    arrival: float
    runtime: float
    start: float | None = None
    end: float | None = None
    predicted: float | None = None
    position: int | None = None
    low: float | None = None  # the range given with the ETA (absolute times)
    high: float | None = None
    basis: str = ""  # what the job's own runtime would be predicted from when it was asked
    predicted_runtime: float | None = None  # the median runtime predicted at its start
    runtime_basis: str = ""  # what that was predicted from


@dataclass
class World:
    jobs: dict[str, Job] = field(default_factory=dict)
    whole_nodes: bool = False

    def pods(self, job: Job) -> tuple[int, int]:
        """Pods of the job and GPUs per pod."""
        if self.whole_nodes and job.gpus >= NODE_GPUS:
            return job.gpus // NODE_GPUS, NODE_GPUS
        return 1, job.gpus

    def state(self, now: float) -> ClusterState:
        workloads = []
        for job in self.jobs.values():
            if job.arrival > now:
                continue
            conditions: list[Condition] = []
            admission = None
            pods, per_pod = self.pods(job)
            if job.start is not None:
                admission = Admission(
                    "cq",
                    (
                        PodSetAssignment(
                            "main", pods, frozen_map({GPU: "default"}), frozen_map({GPU: job.gpus})
                        ),
                    ),
                )
                conditions.append(Condition("QuotaReserved", True, "QuotaReserved", "", job.start))
                if job.end is not None and job.end <= now:
                    conditions.append(Condition("Finished", True, "Succeeded", "", job.end))
            workloads.append(
                Workload(
                    namespace="ns",
                    name=job.name,
                    uid=job.name,
                    creation=job.arrival,
                    priority=0,
                    pod_sets=(PodSet("main", pods, PodTemplate(requests=frozen_map({GPU: per_pod}))),),
                    queue_name="lq",
                    admission=admission,
                    conditions=tuple(conditions),
                )
            )
        group = ResourceGroup((GPU,), (FlavorQuotas("default", frozen_map({GPU: ResourceQuota(CAPACITY)})),))
        return ClusterState(
            namespaces=frozen_map({"ns": Namespace("ns")}),
            resource_flavors=frozen_map({"default": ResourceFlavor("default")}),
            cluster_queues=frozen_map({"cq": ClusterQueue("cq", (group,))}),
            local_queues=frozen_map({"ns/lq": LocalQueue("ns", "lq", "cq")}),
            workloads=tuple(workloads),
            nodes=self.nodes(),
        )

    def nodes(self) -> tuple[Node, ...]:
        if not self.whole_nodes:
            return ()
        labels = frozen_map({"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"})
        allocatable = frozen_map({GPU: NODE_GPUS, "cpu": 64, "pods": 110})
        return tuple(Node(f"n{i}", allocatable, labels) for i in range(CAPACITY // NODE_GPUS))


def generate(count: int, seed: int, sizes: tuple[tuple[int, float], ...] = SIZES) -> list[Job]:
    """Arrivals at 95 % load, sizes and runtimes as the module says, then the name each job was
    submitted under: about :data:`NAME_RUNS` jobs a name with Zipf popularity, a name having its own
    size (kept by 80 % of its runs) and typical runtime (its runs spread :data:`NAME_SIGMA` in log
    around it). As in the simulator's generator, the name is drawn last, from a stream of its own,
    given the job's size and runtime, so those are what they were without names. A workload is
    named ``train-<name>-<number>``, as a generated Job's Workload would be."""
    rng = random.Random(seed)
    mean_gpus = sum(g * p for g, p in sizes)
    mean_runtime = MEDIAN_RUNTIME * math.exp(SIGMA**2 / 2)
    rate = 0.95 * CAPACITY / (mean_gpus * mean_runtime)  # arrivals per second at 95 % load
    t = 0.0
    drawn = []
    for _ in range(count):
        t += rng.expovariate(rate)
        gpus = rng.choices([g for g, _ in sizes], [p for _, p in sizes])[0]
        runtime = rng.lognormvariate(math.log(MEDIAN_RUNTIME), SIGMA)
        drawn.append((t, gpus, runtime))
    names = random.Random(seed + 1)
    kinds = max(1, round(count / NAME_RUNS))
    between = math.sqrt(SIGMA**2 - NAME_SIGMA**2)
    typical = [names.gauss(math.log(MEDIAN_RUNTIME), between) for _ in range(kinds)]
    share = dict(sizes)
    own = names.choices([g for g, _ in sizes], [p for _, p in sizes], k=kinds)
    jobs = []
    for i, (arrival, gpus, runtime) in enumerate(drawn):
        weights = [
            math.exp(-0.5 * ((math.log(runtime) - typical[k]) / NAME_SIGMA) ** 2)
            / (k + 1)
            * (0.8 * (own[k] == gpus) + 0.2 * share[gpus])
            for k in range(kinds)
        ]
        kind = names.choices(range(kinds), weights)[0] if sum(weights) > 0 else 0
        jobs.append(Job(f"train-{_letters(kind)}-{i:05d}", gpus, arrival, runtime))
    return jobs


def _letters(k: int) -> str:
    return "".join(chr(ord("a") + (k // 26**p) % 26) for p in (2, 1, 0))


def features(world: World, job: Job) -> JobFeatures:
    """The job's features, as the controller reads them from its Workload."""
    pods, per_pod = world.pods(job)
    return JobFeatures("ns", job_name_of(job.name), "cq", "", f"{pods}x {GPU}={per_pod}")


def job_name_of(name: str) -> str:
    return name.rsplit("-", 1)[0]


def run(count: int, seed: int, whole_nodes: bool = False) -> tuple[list[Job], float]:
    world = World(whole_nodes=whole_nodes)
    jobs = generate(count, seed, NODE_SIZES if whole_nodes else SIZES)
    events: list[tuple[float, int, str]] = [(j.arrival, 1, j.name) for j in jobs]
    heapq.heapify(events)
    for job in jobs:
        world.jobs[job.name] = job
    config = SchedulerConfig()
    learned = RuntimePredictor()  # what the job's own runtime would be predicted from, as the live ETA learns
    started = time.perf_counter()
    while events:
        now, kind, name = heapq.heappop(events)
        batch = [(kind, name)]
        while events and events[0][0] == now:  # one decision per instant
            _, kind, other = heapq.heappop(events)
            batch.append((kind, other))
        for kind, other in batch:
            if kind == 0:  # a finish
                done = world.jobs[other]
                learned.add(RuntimeSample(features(world, done), done.runtime, now))
        state = world.state(now)
        plan = schedule(state, config, now, cycles=None)
        for decision in plan.admitted:
            job = world.jobs[decision.workload.partition("/")[2]]
            if job.start is None:
                job.start = now
                job.end = now + job.runtime
                own = learned.predict(features(world, job))
                job.predicted_runtime, job.runtime_basis = own.median, own.basis.split(",")[0]
                heapq.heappush(events, (job.end, 0, job.name))
        arrived = world.jobs[name]
        if arrived.arrival == now and arrived.start is None:
            found = explain(state, plan, now, f"ns/{name}", config)
            if found.eta.seconds is not None:
                arrived.predicted = now + found.eta.seconds
            if found.eta.low is not None and found.eta.high is not None:
                arrived.low, arrived.high = now + found.eta.low, now + found.eta.high
            arrived.basis = learned.predict(features(world, arrived)).basis.split(",")[0]
            arrived.position = found.position_in_cluster_queue
    return jobs, time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def basis_table(jobs: list[Job]) -> Table:
    """gpuplane's ETA over waits past 5 minutes (median relative error, and the share of real
    starts inside the range given), and the median relative error of the runtime predicted at each
    job's start, over all and by basis (what the job's runtime was predicted from: the history of
    its name, of its team at its size, of its queue, or nothing yet)."""
    eta: dict[str, list[tuple[float, bool]]] = {}
    runtime: dict[str, list[float]] = {}
    for job in jobs:
        if job.start is None:
            continue
        if job.predicted_runtime is not None and job.runtime > 0:
            error = abs(job.predicted_runtime - job.runtime) / job.runtime
            for basis in ("all", job.runtime_basis):
                runtime.setdefault(basis, []).append(error)
        wait = job.start - job.arrival
        if job.predicted is None or wait <= LONG_WAIT:
            continue
        inside = job.low is not None and job.high is not None and job.low <= job.start <= job.high
        for basis in ("all", job.basis):
            eta.setdefault(basis, []).append((abs(job.predicted - job.start) / wait, inside))
    table = Table(title="gpuplane's ETA and the runtime predictor by basis (ETA: waits > 5 min)")
    for column in ("basis", "ETA err p50", "coverage p10-p90", "waited", "runtime err p50", "started"):
        table.add_column(column)
    for basis in sorted(set(eta) | set(runtime), key=lambda b: (b != "all", b)):
        rows = eta.get(basis, [])
        errors = [e for e, _ in rows]
        runs = runtime.get(basis, [])
        table.add_row(
            basis,
            f"{percentile(errors, 0.5):.1%}" if errors else "",
            f"{sum(i for _, i in rows) / len(rows):.1%}" if rows else "",
            str(len(rows)),
            f"{percentile(runs, 0.5):.1%}" if runs else "",
            str(len(runs)),
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", type=int, default=500)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--whole-nodes", action="store_true", help="4 nodes of 8 GPUs, whole-node gangs")
    args = parser.parse_args()
    jobs, seconds = run(args.workloads, args.seed, args.whole_nodes)
    finished_runtimes = [j.runtime for j in jobs if j.start is not None]
    median_runtime = statistics.median(finished_runtimes)
    mean_gpus = statistics.mean(j.gpus for j in jobs)
    concurrency = CAPACITY / mean_gpus
    ours: list[float] = []
    gangs: list[float] = []
    baseline: list[float] = []
    for job in jobs:
        if job.start is None or job.predicted is None:
            continue
        wait = job.start - job.arrival
        if wait <= LONG_WAIT:
            continue
        ours.append(abs(job.predicted - job.start) / wait)
        if args.whole_nodes and job.gpus >= NODE_GPUS:
            gangs.append(ours[-1])
        naive = ((job.position or 0) + 1) * median_runtime / concurrency
        baseline.append(abs(naive - wait) / wait)
    table = Table(title=f"ETA error on waits over {LONG_WAIT:.0f} s ({len(ours)} of {len(jobs)} workloads)")
    for col in ("estimate", "p50 error", "p90 error"):
        table.add_column(col)
    table.add_row("gpuplane (queue_eta)", f"{percentile(ours, 0.5):.1%}", f"{percentile(ours, 0.9):.1%}")
    if gangs:
        table.add_row(
            f"gpuplane, whole-node gangs only ({len(gangs)})",
            f"{percentile(gangs, 0.5):.1%}",
            f"{percentile(gangs, 0.9):.1%}",
        )
    table.add_row(
        "baseline: position x median / concurrency",
        f"{percentile(baseline, 0.5):.1%}",
        f"{percentile(baseline, 0.9):.1%}",
    )
    console = Console()
    console.print(table)
    console.print(basis_table(jobs))
    ratio = percentile(ours, 0.5) / percentile(baseline, 0.5)
    console.print(
        f"p50 error ratio gpuplane/baseline: {ratio:.2f}; target p50 <= 25 %: "
        f"{'met' if percentile(ours, 0.5) <= 0.25 else 'NOT met'}; loop wall time {seconds:.1f} s"
    )


if __name__ == "__main__":
    main()
