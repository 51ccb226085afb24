"""Scenario files: the cluster, the teams and the workload classes a simulation runs.

A scenario is YAML. Every number in it is a *parameter* that says where its value comes from::

    gpusPerNode: {value: 8, source: "domain-facts §7: 8 H100 per node (AWS p5.48xlarge)"}
    duration: {lognormal: {median: 874, mean: 18006}, unit: s,
               source: "philly (acme cluster_summary.csv): GPU jobs, median 874 s, mean 18,006 s"}

A parameter is one of ``value`` (a constant), ``lognormal`` (``median`` and ``mean``),
``exponential`` (``mean``), ``uniform`` (``[low, high]``) or ``choice`` (``{value: weight}``), plus
``source``; time parameters also carry ``unit`` (``s``, ``min``, ``h`` or ``d``). A source is either
``assumed ...`` or names where the figure was published: one of the traces under ``../shared/traces``
(alibaba-openb, alibaba-pai, helios, philly, acme, pollux) or ``domain-facts``. Loading refuses a
parameter without one, so an unexplained number cannot slip into a result.

:func:`load_scenario` reads a file, :func:`builtin_scenario` the packaged one. Both raise
:class:`ScenarioError` naming the file and the field path of the first problem.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from gpuplane.model import mig

BUILTIN = "builtin.yaml"
UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
KNOWN_SOURCES = (
    "assumed",
    "alibaba-openb",
    "alibaba-pai",
    "helios",
    "philly",
    "acme",
    "pollux",
    "domain-facts",
)
TIERS = ("normal", "backfill")
DISTRIBUTIONS = ("value", "lognormal", "exponential", "uniform", "choice")
FloatArray = np.ndarray[Any, np.dtype[np.float64]]


class ScenarioError(ValueError):
    """A scenario that cannot be used; the message names the file and the field path."""


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Param:
    """One number or distribution, in base units (seconds for time), with its source."""

    kind: str  # value | lognormal | exponential | uniform | choice
    a: float = 0.0  # value, median, mean or low
    b: float = 0.0  # mean (lognormal) or high (uniform)
    choices: tuple[float, ...] = ()
    weights: tuple[float, ...] = ()
    source: str = ""

    @staticmethod
    def constant(value: float, source: str) -> Param:
        return Param("value", float(value), source=source)

    @property
    def mean(self) -> float:
        if self.kind in ("value", "exponential"):
            return self.a
        if self.kind == "lognormal":
            return self.b
        if self.kind == "uniform":
            return (self.a + self.b) / 2
        total = sum(self.weights)
        return sum(c * w for c, w in zip(self.choices, self.weights, strict=True)) / total

    def sample(self, rng: np.random.Generator, n: int) -> FloatArray:
        """``n`` draws (a constant repeats)."""
        if self.kind == "value":
            return np.full(n, self.a)
        if self.kind == "exponential":
            return rng.exponential(self.a, n)
        if self.kind == "uniform":
            return rng.uniform(self.a, self.b, n)
        if self.kind == "lognormal":
            # median = exp(mu), mean = exp(mu + sigma^2 / 2)
            mu = math.log(self.a)
            sigma = math.sqrt(2 * math.log(self.b / self.a)) if self.b > self.a else 0.0
            return rng.lognormal(mu, sigma, n)
        p = np.asarray(self.weights, dtype=float)
        return rng.choice(np.asarray(self.choices, dtype=float), size=n, p=p / p.sum())

    def describe(self, unit: str = "") -> str:
        """A short human form: ``lognormal median 874 s, mean 18006 s``."""
        u = f" {unit}" if unit else ""
        if self.kind == "value":
            return f"{self.a:g}{u}"
        if self.kind == "exponential":
            return f"exponential, mean {self.a:g}{u}"
        if self.kind == "uniform":
            return f"uniform {self.a:g}..{self.b:g}{u}"
        if self.kind == "lognormal":
            return f"lognormal, median {self.a:g}{u}, mean {self.b:g}{u}"
        parts = ", ".join(f"{c:g}: {w:g}" for c, w in zip(self.choices, self.weights, strict=True))
        return f"choice {{{parts}}}"


# ---------------------------------------------------------------------------
# The scenario
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Pool:
    """A group of identical nodes: one ResourceFlavor under gpuplane.

    ``mig_layout`` is the MIG instances of every GPU under gpuplane (``None``: whole GPUs); stock
    Kubernetes runs the same GPUs with MIG disabled.
    """

    name: str
    nodes: int
    gpus_per_node: int
    model: str
    gpu_memory_mib: int
    mig_layout: tuple[str, ...] | None = None
    cpu_milli: int = 0  # 0: not modelled
    memory_mib: int = 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def node_names(self) -> list[str]:
        return [f"{self.name}-{i:03d}" for i in range(self.nodes)]


@dataclass(frozen=True, slots=True)
class Failures:
    """Node failures: each node fails after an exponential time with mean ``mtbf`` (seconds),
    and comes back ``repair`` seconds later."""

    mtbf: float | None = None
    repair: float = 0.0


@dataclass(frozen=True, slots=True)
class Team:
    """A team: one namespace (stock) or one ClusterQueue in the cohort (gpuplane).

    ``floor`` weights split each pool's GPUs into nominal quotas; ``demand`` weights split the
    arrivals of every class between teams.
    """

    name: str
    floor: float
    demand: float


@dataclass(frozen=True, slots=True)
class Shape:
    """What one pod of a workload asks for, and where it may run.

    Exactly one of: ``gpus`` (whole GPUs per pod), ``fraction`` (a share of one GPU) or ``mig`` (a
    MIG profile). Stock Kubernetes gives a fraction or a MIG request one whole GPU.
    """

    weight: float
    pools: tuple[str, ...]
    pods: Param
    gpus: Param | None = None
    fraction: float | None = None
    mig: str | None = None


@dataclass(frozen=True, slots=True)
class Session:
    """An interactive session: active and idle stretches alternate, then an idle tail
    (left open after the work is done)."""

    active: Param
    idle: Param
    tail: Param


@dataclass(frozen=True, slots=True)
class WorkloadClass:
    """A kind of workload with its own arrivals, sizes, durations and GPU busy fraction.

    ``busy`` is SM activity while computing, as a share of the whole GPUs the pod would get under
    whole-GPU scheduling (for a fraction or a MIG request: a share of one GPU). ``checkpoint``
    (seconds) is how often progress is saved; ``stateless`` work (services, sessions) loses
    nothing when stopped and resumes where it was.
    """

    name: str
    tier: str
    shapes: tuple[Shape, ...]
    duration: Param
    startup: Param
    busy: Param
    gpu_time_share: Param | None = None
    arrivals_per_day: Param | None = None
    checkpoint: Param | None = None
    stateless: bool = False
    session: Session | None = None


DEFAULT_GRACE = Param("value", 30.0, source="domain-facts §5: terminationGracePeriodSeconds defaults to 30")


@dataclass(frozen=True, slots=True)
class Policies:
    """Policy settings: the idle reaper's threshold, stock's deadlock timeout, priorities."""

    reaper_idle: Param
    deadlock_timeout: Param
    eviction_grace: Param = DEFAULT_GRACE
    normal_priority: int = 100
    backfill_priority: int = 0


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    description: str
    days: float
    seed: int
    pools: tuple[Pool, ...]
    teams: tuple[Team, ...]
    classes: tuple[WorkloadClass, ...]
    policies: Policies
    failures: Failures = field(default_factory=Failures)
    warmup: float = 0.0  # seconds simulated before the measured window starts
    offered_load: Param | None = None
    sources: tuple[tuple[str, str, str], ...] = ()  # (field path, value, source), for reports

    @property
    def horizon(self) -> float:
        return self.days * 86400.0

    @property
    def gpus(self) -> int:
        return sum(p.gpus for p in self.pools)

    def pool(self, name: str) -> Pool:
        for p in self.pools:
            if p.name == name:
                return p
        raise KeyError(name)

    def with_days(self, days: float) -> Scenario:
        return replace(self, days=days)

    def with_seed(self, seed: int) -> Scenario:
        return replace(self, seed=seed)

    def with_load(self, load: float) -> Scenario:
        """The same scenario at another offered load (a fraction of installed GPUs).

        Only classes that arrive at their ``gpuTimeShare`` of the offered load scale with it; a
        class with a fixed ``arrivalsPerDay`` keeps its rate.
        """
        return replace(self, offered_load=Param.constant(load, "input: --load"))


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------


class _Reader:
    """Walks the parsed YAML with a field path for error messages and collects sources."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.sources: list[tuple[str, str, str]] = []

    def fail(self, path: str, message: str) -> ScenarioError:
        where = f"{self.origin}: {path}" if path else self.origin
        return ScenarioError(f"{where}: {message}")

    def mapping(self, node: Any, path: str) -> Mapping[str, Any]:
        if not isinstance(node, Mapping):
            raise self.fail(path, f"expected a mapping, got {type(node).__name__}")
        return node

    def sequence(self, node: Any, path: str) -> Sequence[Any]:
        if not isinstance(node, list) or not node:
            raise self.fail(path, "expected a non-empty list")
        return node

    def string(self, node: Mapping[str, Any], key: str, path: str, default: str | None = None) -> str:
        value = node.get(key, default)
        if not isinstance(value, str) or not value:
            raise self.fail(f"{path}.{key}", "expected a non-empty string")
        return value

    def number(self, value: Any, path: str, minimum: float | None = None, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise self.fail(path, f"expected a number, got {value!r}")
        if positive and value <= 0:
            raise self.fail(path, f"must be positive, got {value!r}")
        if minimum is not None and value < minimum:
            raise self.fail(path, f"must be at least {minimum:g}, got {value!r}")
        return float(value)

    def check_keys(self, node: Mapping[str, Any], path: str, allowed: Sequence[str]) -> None:
        unknown = sorted(set(node) - set(allowed))
        if unknown:
            where = f"{path}.{unknown[0]}" if path else unknown[0]
            raise self.fail(where, f"unknown field (known: {', '.join(allowed)})")

    def param(  # noqa: PLR0913  keyword-only flags, one per constraint on the value
        self,
        parent: Mapping[str, Any],
        key: str,
        path: str,
        *,
        time: bool = False,
        positive: bool = False,
        minimum: float | None = None,
        integer: bool = False,
    ) -> Param:
        where = f"{path}.{key}" if path else key
        if key not in parent:
            raise self.fail(where, "missing")
        node = self.mapping(parent[key], where)
        allowed = [*DISTRIBUTIONS, "source", "unit"] if time else [*DISTRIBUTIONS, "source"]
        self.check_keys(node, where, allowed)
        source = self._source(node, where)
        kinds = [k for k in DISTRIBUTIONS if k in node]
        if len(kinds) != 1:
            raise self.fail(where, f"needs exactly one of {', '.join(DISTRIBUTIONS)}")
        kind = kinds[0]
        scale = 1.0
        if time:
            unit = node.get("unit")
            if unit not in UNITS:
                raise self.fail(f"{where}.unit", f"expected one of {', '.join(UNITS)}, got {unit!r}")
            scale = UNITS[unit]
        read = {
            "value": self._value,
            "exponential": self._exponential,
            "lognormal": self._lognormal,
            "uniform": self._uniform,
            "choice": self._choice,
        }[kind]
        shown = read(node[kind], f"{where}.{kind}", _Bounds(positive, minimum, integer), source)
        param = shown
        if scale != 1.0:
            param = Param(
                shown.kind,
                shown.a * scale,
                shown.b * scale,
                tuple(c * scale for c in shown.choices),
                shown.weights,
                source,
            )
            # As read, in the file's unit: the base-unit value scaled back.
            shown = Param(
                param.kind,
                param.a / scale,
                param.b / scale,
                tuple(c / scale for c in param.choices),
                param.weights,
                source,
            )
        unit = node.get("unit", "") if time else ""
        self.sources.append((where, shown.describe(unit), source))
        return param

    def _source(self, node: Mapping[str, Any], where: str) -> str:
        """Where a parameter's value comes from: assumed, or a published trace or domain fact."""
        source = node.get("source")
        if not isinstance(source, str) or not source.strip():
            raise self.fail(f"{where}.source", "missing: every parameter says where its value comes from")
        low = source.lower()
        if not any(name in low for name in KNOWN_SOURCES):
            raise self.fail(
                f"{where}.source",
                "must be 'assumed ...' or name a published trace or domain-facts "
                f"({', '.join(KNOWN_SOURCES[1:])}), got {source!r}",
            )
        return source

    def _value(self, body: Any, at: str, bounds: _Bounds, source: str) -> Param:
        value = self.number(body, at, minimum=bounds.minimum, positive=bounds.positive)
        if bounds.integer and value != int(value):
            raise self.fail(at, f"expected an integer, got {body!r}")
        return Param("value", value, source=source)

    def _exponential(self, body: Any, at: str, _bounds: _Bounds, source: str) -> Param:
        mean = self.number(self.mapping(body, at).get("mean"), f"{at}.mean", positive=True)
        return Param("exponential", mean, source=source)

    def _lognormal(self, body: Any, at: str, _bounds: _Bounds, source: str) -> Param:
        body = self.mapping(body, at)
        self.check_keys(body, at, ("median", "mean"))
        median = self.number(body.get("median"), f"{at}.median", positive=True)
        mean = self.number(body.get("mean"), f"{at}.mean", positive=True)
        if mean < median:
            raise self.fail(at, "a lognormal's mean is never below its median")
        return Param("lognormal", median, mean, source=source)

    def _uniform(self, body: Any, at: str, bounds: _Bounds, source: str) -> Param:
        if not isinstance(body, list) or len(body) != 2:
            raise self.fail(at, "expected [low, high]")
        low_v = self.number(body[0], f"{at}[0]", minimum=bounds.minimum)
        high_v = self.number(body[1], f"{at}[1]", minimum=bounds.minimum)
        if high_v < low_v or (bounds.positive and low_v <= 0):
            raise self.fail(
                at, "expected 0 <= low <= high" if not bounds.positive else "expected 0 < low <= high"
            )
        return Param("uniform", low_v, high_v, source=source)

    def _choice(self, body: Any, at: str, bounds: _Bounds, source: str) -> Param:
        body = self.mapping(body, at)
        if not body:
            raise self.fail(at, "expected at least one value")
        values, weights = [], []
        for k, w in body.items():
            try:
                v = float(k)
            except (TypeError, ValueError):
                raise self.fail(f"{at}.{k}", "choice values must be numbers") from None
            if bounds.integer and v != int(v):
                raise self.fail(f"{at}.{k}", "expected an integer")
            if (bounds.positive and v <= 0) or (bounds.minimum is not None and v < bounds.minimum):
                raise self.fail(f"{at}.{k}", "value out of range")
            values.append(v)
            weights.append(self.number(w, f"{at}.{k}", positive=True))
        return Param("choice", choices=tuple(values), weights=tuple(weights), source=source)


@dataclass(frozen=True, slots=True)
class _Bounds:
    """What a parameter's values may be."""

    positive: bool
    minimum: float | None
    integer: bool


def _pool(r: _Reader, node: Any, path: str) -> Pool:
    node = r.mapping(node, path)
    r.check_keys(
        node, path, ("name", "nodes", "gpusPerNode", "model", "gpuMemoryMiB", "mig", "cpu", "memoryMiB")
    )
    name = r.string(node, "name", path)
    nodes = r.param(node, "nodes", path, minimum=0, integer=True)
    gpus = r.param(node, "gpusPerNode", path, positive=True, integer=True)
    memory = r.param(node, "gpuMemoryMiB", path, positive=True, integer=True)
    if {nodes.kind, gpus.kind, memory.kind} != {"value"}:
        raise r.fail(path, "nodes, gpusPerNode and gpuMemoryMiB must be constants (value: N)")
    layout: tuple[str, ...] | None = None
    if node.get("mig") is not None:
        where = f"{path}.mig"
        mig_node = r.mapping(node["mig"], where)
        r.check_keys(mig_node, where, ("layout", "source"))
        source = mig_node.get("source")
        if not isinstance(source, str) or not any(k in source.lower() for k in KNOWN_SOURCES):
            raise r.fail(f"{where}.source", "missing or not a known source")
        profiles = mig_node.get("layout")
        if not isinstance(profiles, list) or not profiles or not all(isinstance(p, str) for p in profiles):
            raise r.fail(f"{where}.layout", "expected a list of MIG profile names, e.g. [3g.40gb, 2g.20gb]")
        try:
            mig.parse_layout(",".join(profiles), memory.a / 1024)
        except mig.MigError as problem:
            raise r.fail(f"{where}.layout", str(problem)) from None
        layout = tuple(profiles)
        r.sources.append((where, ",".join(profiles) + " per GPU", source))
    cpu = memory_mib = 0
    if "cpu" in node:
        cpu = int(r.param(node, "cpu", path, positive=True).a * 1000)
    if "memoryMiB" in node:
        memory_mib = int(r.param(node, "memoryMiB", path, positive=True).a)
    return Pool(
        name=name,
        nodes=int(nodes.a),
        gpus_per_node=int(gpus.a),
        model=r.string(node, "model", path),
        gpu_memory_mib=int(memory.a),
        mig_layout=layout,
        cpu_milli=cpu,
        memory_mib=memory_mib,
    )


def _shape(r: _Reader, node: Any, path: str, pools: Mapping[str, Pool]) -> Shape:
    node = r.mapping(node, path)
    r.check_keys(node, path, ("weight", "pools", "pods", "gpus", "fraction", "mig"))
    weight = r.param(node, "weight", path, positive=True)
    if weight.kind != "value":
        raise r.fail(f"{path}.weight", "must be a constant")
    names = node.get("pools")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise r.fail(f"{path}.pools", "expected a non-empty list of pool names")
    for i, name in enumerate(names):
        if name not in pools:
            raise r.fail(f"{path}.pools[{i}]", f"unknown pool {name!r} (known: {', '.join(pools)})")
    pods = r.param(node, "pods", path, positive=True, integer=True)
    given = [k for k in ("gpus", "fraction", "mig") if k in node]
    if len(given) != 1:
        raise r.fail(path, "needs exactly one of gpus, fraction, mig")
    gpus: Param | None = None
    fraction: float | None = None
    profile: str | None = None
    if given[0] == "gpus":
        gpus = _shape_gpus(r, node, path, [pools[name] for name in names])
    elif given[0] == "fraction":
        fraction = r.param(node, "fraction", path, positive=True).a
        if not 0 < fraction < 1:
            raise r.fail(f"{path}.fraction", "must be in (0, 1)")
    else:
        profile = _shape_mig(r, node, path, [pools[name] for name in names])
    if fraction is not None or gpus is not None:
        for i, name in enumerate(names):
            if pools[name].mig_layout is not None:
                raise r.fail(f"{path}.pools[{i}]", f"pool {name} is MIG-partitioned: ask a mig profile there")
    return Shape(weight.a, tuple(names), pods, gpus, fraction, profile)


def _shape_gpus(r: _Reader, node: Mapping[str, Any], path: str, pools: list[Pool]) -> Param:
    """Whole GPUs per pod: a constant or a choice, each within every pool's nodes."""
    gpus = r.param(node, "gpus", path, positive=True, integer=True)
    most = max(gpus.choices) if gpus.kind == "choice" else gpus.a
    if gpus.kind not in ("value", "choice"):
        raise r.fail(f"{path}.gpus", "must be a constant or a choice")
    for pool in pools:
        if pool.mig_layout is None and pool.gpus_per_node < most:
            raise r.fail(
                f"{path}.gpus", f"a pod asks {most:g} GPUs; pool {pool.name} has {pool.gpus_per_node}"
            )
    return gpus


def _shape_mig(r: _Reader, node: Mapping[str, Any], path: str, pools: list[Pool]) -> str:
    """A MIG profile that every pool's layout has."""
    profile = node["mig"]
    if not isinstance(profile, str):
        raise r.fail(f"{path}.mig", "expected a MIG profile name")
    for pool in pools:
        layout = pool.mig_layout
        if layout is None or profile not in layout:
            raise r.fail(f"{path}.mig", f"pool {pool.name} has no {profile} instances")
    return profile


def _class(r: _Reader, node: Any, path: str, pools: Mapping[str, Pool]) -> WorkloadClass:
    node = r.mapping(node, path)
    r.check_keys(
        node,
        path,
        (
            "name",
            "description",
            "tier",
            "shapes",
            "gpuTimeShare",
            "arrivalsPerDay",
            "duration",
            "startup",
            "busy",
            "checkpoint",
            "stateless",
            "session",
        ),
    )
    name = r.string(node, "name", path)
    tier = node.get("tier", "normal")
    if tier not in TIERS:
        raise r.fail(f"{path}.tier", f"expected one of {', '.join(TIERS)}, got {tier!r}")
    shapes_node = r.sequence(node.get("shapes"), f"{path}.shapes")
    shapes = tuple(_shape(r, s, f"{path}.shapes[{i}]", pools) for i, s in enumerate(shapes_node))
    rate_keys = [k for k in ("gpuTimeShare", "arrivalsPerDay") if k in node]
    if len(rate_keys) != 1:
        raise r.fail(path, "needs exactly one of gpuTimeShare, arrivalsPerDay")
    share = r.param(node, "gpuTimeShare", path, minimum=0) if "gpuTimeShare" in node else None
    per_day = r.param(node, "arrivalsPerDay", path, minimum=0) if "arrivalsPerDay" in node else None
    stateless = node.get("stateless", False)
    if not isinstance(stateless, bool):
        raise r.fail(f"{path}.stateless", "expected true or false")
    checkpoint = None
    if node.get("checkpoint") is not None:
        if stateless:
            raise r.fail(f"{path}.checkpoint", "a stateless class has no checkpoints")
        checkpoint = r.param(node, "checkpoint", path, time=True, positive=True)
    session = _session(r, node, path, stateless) if node.get("session") is not None else None
    busy = r.param(node, "busy", path, minimum=0)
    top = busy.b if busy.kind == "uniform" else max(busy.choices) if busy.kind == "choice" else busy.a
    if busy.kind in ("lognormal", "exponential") or top > 1:
        raise r.fail(f"{path}.busy", "must be a constant, uniform or choice within [0, 1]")
    return WorkloadClass(
        name=name,
        tier=tier,
        shapes=shapes,
        duration=r.param(node, "duration", path, time=True, positive=True),
        startup=r.param(node, "startup", path, time=True, minimum=0),
        busy=busy,
        gpu_time_share=share,
        arrivals_per_day=per_day,
        checkpoint=checkpoint,
        stateless=stateless,
        session=session,
    )


def _session(r: _Reader, node: Mapping[str, Any], path: str, stateless: bool) -> Session:
    where = f"{path}.session"
    s = r.mapping(node["session"], where)
    r.check_keys(s, where, ("active", "idle", "tail"))
    session = Session(
        active=r.param(s, "active", where, time=True, positive=True),
        idle=r.param(s, "idle", where, time=True, positive=True),
        tail=r.param(s, "tail", where, time=True, minimum=0),
    )
    if not stateless:
        raise r.fail(f"{path}.stateless", "a class with sessions must be stateless")
    return session


def _cluster(r: _Reader, root: Mapping[str, Any]) -> tuple[list[Pool], Failures]:
    cluster = r.mapping(root.get("cluster"), "cluster")
    r.check_keys(cluster, "cluster", ("pools", "failures"))
    pools_list = [
        _pool(r, p, f"cluster.pools[{i}]")
        for i, p in enumerate(r.sequence(cluster.get("pools"), "cluster.pools"))
    ]
    if len({p.name for p in pools_list}) != len(pools_list):
        raise r.fail("cluster.pools", "pool names must be unique")
    if sum(p.gpus for p in pools_list) == 0:
        raise r.fail("cluster.pools", "the cluster has no GPUs")
    failures = Failures()
    if cluster.get("failures") is not None:
        f = r.mapping(cluster["failures"], "cluster.failures")
        r.check_keys(f, "cluster.failures", ("mtbf", "repair"))
        failures = Failures(
            mtbf=r.param(f, "mtbf", "cluster.failures", time=True, positive=True).mean,
            repair=r.param(f, "repair", "cluster.failures", time=True, positive=True).mean,
        )
    return pools_list, failures


def _teams(r: _Reader, root: Mapping[str, Any]) -> list[Team]:
    teams = []
    for i, item in enumerate(r.sequence(root.get("teams"), "teams")):
        where = f"teams[{i}]"
        t = r.mapping(item, where)
        r.check_keys(t, where, ("name", "floor", "demand"))
        floor = r.param(t, "floor", where, positive=True)
        demand = r.param(t, "demand", where, minimum=0) if "demand" in t else floor
        teams.append(Team(r.string(t, "name", where), floor.mean, demand.mean))
    if len({t.name for t in teams}) != len(teams):
        raise r.fail("teams", "team names must be unique")
    if sum(t.demand for t in teams) <= 0:
        raise r.fail("teams", "at least one team needs a positive demand")
    return teams


def _offered_load(r: _Reader, root: Mapping[str, Any], classes: tuple[WorkloadClass, ...]) -> Param | None:
    """The offered load: required when classes arrive by GPU-time share (whose shares add up to 1)."""
    if any(c.gpu_time_share is not None for c in classes):
        offered = r.param(root, "offeredLoad", "", positive=True)
        total = sum(c.gpu_time_share.mean for c in classes if c.gpu_time_share is not None)
        if abs(total - 1) > 0.01:
            raise r.fail("classes", f"gpuTimeShare values must add up to 1, they add up to {total:g}")
        return offered
    if "offeredLoad" in root:
        return r.param(root, "offeredLoad", "", positive=True)
    return None


def _policies(r: _Reader, root: Mapping[str, Any]) -> Policies:
    policies_node = r.mapping(root.get("policies"), "policies")
    r.check_keys(
        policies_node,
        "policies",
        ("reaperIdle", "deadlockTimeout", "evictionGrace", "normalPriority", "backfillPriority"),
    )
    for key in ("normalPriority", "backfillPriority"):
        value = policies_node.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise r.fail(f"policies.{key}", "expected an integer")
    policies = Policies(
        reaper_idle=r.param(policies_node, "reaperIdle", "policies", time=True, positive=True),
        deadlock_timeout=r.param(policies_node, "deadlockTimeout", "policies", time=True, positive=True),
        normal_priority=policies_node.get("normalPriority", 100),
        backfill_priority=policies_node.get("backfillPriority", 0),
    )
    if "evictionGrace" in policies_node:
        policies = replace(
            policies, eviction_grace=r.param(policies_node, "evictionGrace", "policies", time=True, minimum=0)
        )
    if policies.backfill_priority >= policies.normal_priority:
        raise r.fail("policies.backfillPriority", "must be below normalPriority")
    return policies


def parse_scenario(doc: Any, origin: str) -> Scenario:
    """Validate a parsed scenario document (see the module docstring)."""
    r = _Reader(origin)
    root = r.mapping(doc, "")
    r.check_keys(
        root,
        "",
        (
            "name",
            "description",
            "days",
            "warmup",
            "seed",
            "offeredLoad",
            "cluster",
            "teams",
            "classes",
            "policies",
        ),
    )
    name = r.string(root, "name", "")
    description = root.get("description", "")
    if not isinstance(description, str):
        raise r.fail("description", "expected a string")
    days = r.param(root, "days", "", positive=True)
    warmup = r.param(root, "warmup", "", time=True, minimum=0).mean if "warmup" in root else 0.0
    seed = root.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise r.fail("seed", f"expected a non-negative integer, got {seed!r}")
    pools_list, failures = _cluster(r, root)
    pools = {p.name: p for p in pools_list}
    teams = _teams(r, root)
    classes = tuple(
        _class(r, c, f"classes[{i}]", pools) for i, c in enumerate(r.sequence(root.get("classes"), "classes"))
    )
    if len({c.name for c in classes}) != len(classes):
        raise r.fail("classes", "class names must be unique")
    offered = _offered_load(r, root, classes)
    policies = _policies(r, root)
    named = {f"classes[{i}]": f"classes[{c.name}]" for i, c in enumerate(classes)}
    named |= {f"cluster.pools[{i}]": f"cluster.pools[{p.name}]" for i, p in enumerate(pools_list)}
    named |= {f"teams[{i}]": f"teams[{t.name}]" for i, t in enumerate(teams)}
    sources = tuple((_named_path(path, named), value, source) for path, value, source in r.sources)
    return Scenario(
        name=name,
        description=description.strip(),
        days=days.mean,
        warmup=warmup,
        seed=seed,
        pools=tuple(pools_list),
        teams=tuple(teams),
        classes=classes,
        policies=policies,
        failures=failures,
        offered_load=offered,
        sources=sources,
    )


def _named_path(path: str, named: Mapping[str, str]) -> str:
    """``classes[0].duration`` -> ``classes[training-gang].duration`` (for reports)."""
    head, bracket, rest = path.partition("]")
    return named[head + bracket] + rest if head + bracket in named else path


def _parse_yaml(text: str, origin: str) -> Any:
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as problem:
        mark = getattr(problem, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        reason = getattr(problem, "problem", None) or str(problem).splitlines()[0]
        raise ScenarioError(f"{origin}: {where}not valid YAML: {reason}") from None


def load_scenario(path: Path) -> Scenario:
    """Read and validate a scenario file."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as problem:
        raise ScenarioError(f"{path}: cannot read: {problem}") from None
    return parse_scenario(_parse_yaml(text, str(path)), str(path))


def builtin_scenario() -> Scenario:
    """The scenario that ships with gpuplane (``gpuplane simulate`` with no arguments)."""
    text = resources.files("gpuplane.sim").joinpath("scenarios", BUILTIN).read_text(encoding="utf-8")
    return parse_scenario(_parse_yaml(text, f"builtin scenario {BUILTIN}"), f"builtin scenario {BUILTIN}")
