"""A job's remaining runtime, predicted from the finished runs that share its features.

:class:`RuntimePredictor` keeps the runtimes of finished runs (:class:`RuntimeSample`) sorted per
feature key, from the most specific to the class:

====================================  =========  ==========================================
key                                   basis      what it groups
====================================  =========  ==========================================
(namespace, job name, pod-set shape)  ``name``   the reruns of one job at one size
(namespace, job name)                 ``name``   the reruns of one job, at any size
(namespace, pod-set shape)            ``team``   a team's jobs of one size
(queue)                               ``queue``  the jobs of one ClusterQueue
everything                            ``all``    every finished run
====================================  =========  ==========================================

:meth:`RuntimePredictor.predict` takes the first key with at least ``min_samples`` finished runs
(3Sigma's idea: predict from the most specific history that is large enough). With none, the
job's declared runtime (``declared``) is taken as exact, and without one a lognormal around
:data:`DEFAULT_RUNTIME_SECONDS` (spread :data:`DEFAULT_SIGMA`) is assumed. With
``prefer_declared`` a declared runtime comes right after the job name's own history.

The prediction is conditioned on attained service (Tiresias' idea): the remaining time of a job
that has run ``elapsed`` seconds comes from the runs that lasted longer than ``elapsed``, less
``elapsed`` (a job 3 h into a typical 4 h ends within about an hour). A job that has run longer
than nearly all its runs (fewer than :data:`OVERDUE_SHARE` of them, and at least one, lasted
longer), or past its declared runtime, is *overdue*: it gets a tail estimate, never 0. Its
remaining time follows a Pareto tail of index :data:`TAIL_INDEX` from its age: a job that has run
``t`` runs ``t * ((1 - u) ** (-1 / TAIL_INDEX) - 1)`` more at quantile ``u`` (with index 2, half of
them end within about 0.41 ``t`` more, nine in ten within 2.2 ``t``); ``t`` is at least
:data:`TAIL_FLOOR_SECONDS`. The basis then reads ``"<basis>, overdue"``.

``limit`` (the pod's ``activeDeadlineSeconds``, or another declared limit on the whole run)
caps every quantile at ``limit - elapsed``; a run already past its limit is being stopped and gets
:data:`LIMIT_GRACE_SECONDS` (Kubernetes' default termination grace period).

Pure: no clock. Cheap: a key's runtimes are appended as runs are learned and sorted when a
prediction next reads them (Timsort merges the appended tail in about one pass); a
prediction bisects its key's runtimes for ``elapsed`` and reads :data:`PSEUDO_SAMPLES` quantiles
from them, whatever their number; the prediction of a job that has not started (``elapsed == 0``)
is computed once per key until the key learns another run (past 50 runs: until it learned
:data:`REFRESH_SHARE` more).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import NormalDist

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample

PSEUDO_SAMPLES = 101  # quantiles of a prediction: u = 0, 0.01, ..., 1
DEFAULT_RUNTIME_SECONDS = 3600.0  # the assumed runtime's median, without history or a declared one
DEFAULT_SIGMA = 1.0  # spread (log) of the assumed runtime
OVERDUE_SHARE = 0.05  # a job that fewer than this share of its runs outlasted is overdue
TAIL_INDEX = 2.0  # Pareto index of an overdue job's tail
TAIL_FLOOR_SECONDS = 60.0  # the least age a tail estimate scales from
LIMIT_GRACE_SECONDS = 30.0  # what a run past its limit still takes: the termination grace period
# A key's prediction of a run not started stands until the key learned this share more runs: its
# quantiles move by about 1 / n per run learned, so past 50 runs a new one hardly moves them.
REFRESH_SHARE = 0.02

BASES = ("name", "team", "queue", "all", "declared", "assumed")
_LEVELS = tuple(i / (PSEUDO_SAMPLES - 1) for i in range(PSEUDO_SAMPLES))
_TAIL = tuple((1.0 - min(u, 0.999)) ** (-1.0 / TAIL_INDEX) - 1.0 for u in _LEVELS)
_ASSUMED = tuple(
    DEFAULT_RUNTIME_SECONDS * math.exp(DEFAULT_SIGMA * NormalDist().inv_cdf(min(max(float(u), 0.001), 0.999)))
    for u in _LEVELS
)


@dataclass(frozen=True, slots=True)
class Prediction:
    """A job's remaining runtime as a distribution, and where it came from."""

    quantiles: tuple[float, ...]  # remaining seconds at PSEUDO_SAMPLES evenly spaced quantiles, sorted
    basis: str  # "name" | "team" | "queue" | "all" | "declared" | "assumed" (", overdue" for a tail)
    samples: int  # finished runs behind it (0 for declared/assumed)

    def at(self, u: float) -> float:
        """Remaining seconds at quantile ``u`` in [0, 1] (linear between the stored quantiles)."""
        if not 0.0 <= u <= 1.0:
            raise ValueError(f"a quantile is in [0, 1], not {u}")
        q = self.quantiles
        pos = u * (len(q) - 1)
        lo = int(pos)
        if lo >= len(q) - 1:
            return q[-1]
        return q[lo] + (q[lo + 1] - q[lo]) * (pos - lo)

    @property
    def median(self) -> float:
        """Remaining seconds at the median."""
        return self.at(0.5)

    @property
    def overdue(self) -> bool:
        """Whether the job ran past (nearly) all its runs or its declared runtime: a tail estimate."""
        return self.basis.endswith(", overdue")


def _keys(features: JobFeatures) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The keys of ``features``, most specific first, each with its basis."""
    ns, name = features.namespace, features.name
    keys: list[tuple[str, tuple[str, ...]]] = []
    if name:
        keys.append(("name", ("name+shape", ns, name, features.shape)))
        keys.append(("name", ("name", ns, name)))
    keys.append(("team", ("team", ns, features.shape)))
    keys.append(("queue", ("queue", features.queue)))
    keys.append(("all", ("all",)))
    return tuple(keys)


class Runs:
    """The runtimes of the finished runs of one key, sorted when read (a run learned is appended,
    and the list sorted again only when a prediction reads it: Timsort takes a sorted list with a
    few runs appended in about one pass), and its not-started prediction (``fresh``), made again
    when the key has learned more than :data:`REFRESH_SHARE` more runs than it was made from (for
    fewer than 1 / REFRESH_SHARE runs: every run)."""

    __slots__ = ("fresh", "fresh_until", "ordered", "runtimes")

    def __init__(self) -> None:
        self.runtimes: list[float] = []
        self.ordered = True
        self.fresh: Prediction | None = None
        self.fresh_until = 0  # the most runs ``fresh`` stands for

    def add(self, seconds: float) -> None:
        """Learn one run of ``seconds`` (checked by the caller)."""
        self.runtimes.append(seconds)
        self.ordered = False

    def sorted(self) -> list[float]:
        """The runtimes, in order."""
        if not self.ordered:
            self.runtimes.sort()
            self.ordered = True
        return self.runtimes

    def not_started(self, basis: str) -> Prediction:
        """The prediction of a run not started yet: :data:`PSEUDO_SAMPLES` quantiles of the
        runtimes, made again once the key learned enough more runs."""
        n = len(self.runtimes)
        if self.fresh is None or n > self.fresh_until:
            self.fresh = _quantiles(self.sorted(), 0, 0.0, basis, n)
            self.fresh_until = n + int(n * REFRESH_SHARE)
        return self.fresh


class RuntimePredictor:
    """Runtimes learned from finished runs, by feature: per key (see the module), the sorted
    runtimes of the runs that finished, added one by one or in a batch."""

    def __init__(self, samples: Iterable[RuntimeSample] = (), *, min_samples: int = 5) -> None:
        if min_samples < 1:
            raise ValueError(f"min_samples must be at least 1, not {min_samples}")
        self.min_samples = min_samples
        self._runs: dict[tuple[str, ...], Runs] = {}
        for sample in samples:
            self.add(sample)

    def __len__(self) -> int:
        """Finished runs learned."""
        runs = self._runs.get(("all",))
        return len(runs.runtimes) if runs is not None else 0

    def add(self, sample: RuntimeSample) -> None:
        """Learn one finished run (a negative or non-finite runtime is an error)."""
        seconds = checked_runtime(sample.seconds)
        for runs in self.runs_of(sample.features):
            runs.add(seconds)

    def runs_of(self, features: JobFeatures) -> tuple[Runs, ...]:
        """The runs of each key of ``features``, most specific first, made empty where none was
        learned yet: a caller that learns many runs of the same features keeps them and adds to
        each (after :func:`checked_runtime`) instead of calling :meth:`add`."""
        found = []
        for _, key in _keys(features):
            runs = self._runs.get(key)
            if runs is None:
                runs = self._runs[key] = Runs()
            found.append(runs)
        return tuple(found)

    def count(self, features: JobFeatures) -> tuple[str, int]:
        """The basis a prediction for ``features`` would take from history, and its finished runs
        (``("", 0)`` when no key has enough)."""
        for basis, key in _keys(features):
            runs = self._runs.get(key)
            if runs is not None and len(runs.runtimes) >= self.min_samples:
                return basis, len(runs.runtimes)
        return "", 0

    def predict(
        self,
        features: JobFeatures,
        elapsed: float = 0.0,
        *,
        declared: float | None = None,
        limit: float | None = None,
        prefer_declared: bool = False,
    ) -> Prediction:
        """The remaining runtime of a job with ``features`` that has run ``elapsed`` seconds
        (0: not started), with its declared runtime and its limit on the whole run, if any.

        ``prefer_declared``: a declared runtime is taken over every history but the job name's
        own (the reruns of this job know better than its author; its author knows better than
        its team or queue)."""
        elapsed = max(0.0, float(elapsed))
        found = self._from_history(features, elapsed, names_only=prefer_declared and declared is not None)
        if found is None:
            found = _declared(declared, elapsed) if declared is not None else _assumed(elapsed)
        if limit is not None:
            if not limit > 0.0:  # NaN too
                raise ValueError(f"a limit is a number of seconds > 0, not {limit!r}")
            found = _capped(found, limit - elapsed)
        return found

    def _from_history(self, features: JobFeatures, elapsed: float, *, names_only: bool) -> Prediction | None:
        for basis, key in _keys(features):
            if names_only and basis != "name":
                return None
            runs = self._runs.get(key)
            if runs is None or len(runs.runtimes) < self.min_samples:
                continue
            if elapsed <= 0.0:
                return runs.not_started(basis)
            runtimes = runs.sorted()
            n = len(runtimes)
            first_longer = bisect.bisect_right(runtimes, elapsed)
            longer = n - first_longer
            if longer < max(1, math.ceil(OVERDUE_SHARE * n)):
                return _tail(elapsed, f"{basis}, overdue", n)
            return _quantiles(runtimes, first_longer, elapsed, basis, n)
        return None


def checked_runtime(seconds: float) -> float:
    """``seconds`` as a runtime: a finite number >= 0 (else a ValueError)."""
    value = float(seconds)
    if not math.isfinite(value) or value < 0.0:
        raise ValueError(f"a runtime is a finite number of seconds >= 0, not {seconds!r}")
    return value


def learn_into(holders: Iterable[Runs], seconds: float) -> None:
    """Learn one run of ``seconds`` (checked by the caller) into each of ``holders`` (the
    :meth:`RuntimePredictor.runs_of` of its features): :meth:`Runs.add` for each, in one call."""
    for runs in holders:
        runs.runtimes.append(seconds)
        runs.ordered = False


def _quantiles(runtimes: Sequence[float], first: int, elapsed: float, basis: str, samples: int) -> Prediction:
    """What is left of ``runtimes[first:]`` (sorted, all longer than ``elapsed``) at each level:
    :data:`PSEUDO_SAMPLES` reads of the list, whatever its length."""
    last = len(runtimes) - 1
    span = last - first
    places = [(pos, int(pos)) for pos in [first + u * span for u in _LEVELS]]
    values = tuple(
        runtimes[lo] - elapsed
        if lo >= last
        else runtimes[lo] + (runtimes[lo + 1] - runtimes[lo]) * (pos - lo) - elapsed
        for pos, lo in places
    )
    return Prediction(values, basis, samples)


def _tail(elapsed: float, basis: str, samples: int) -> Prediction:
    """The tail estimate of an overdue job (see the module): never 0."""
    age = max(elapsed, TAIL_FLOOR_SECONDS)
    return Prediction(tuple(age * x if x > 0.0 else age * _TAIL[1] / 2 for x in _TAIL), basis, samples)


def _declared(declared: float, elapsed: float) -> Prediction:
    if not math.isfinite(declared) or declared < 0.0:
        raise ValueError(f"a declared runtime is a finite number of seconds >= 0, not {declared!r}")
    if elapsed >= declared:
        return _tail(elapsed, "declared, overdue", 0)
    return Prediction((declared - elapsed,) * PSEUDO_SAMPLES, "declared", 0)


def _assumed(elapsed: float) -> Prediction:
    if elapsed <= 0.0:
        return Prediction(_ASSUMED, "assumed", 0)
    first = bisect.bisect_right(_ASSUMED, elapsed)
    if PSEUDO_SAMPLES - first < max(1, math.ceil(OVERDUE_SHARE * PSEUDO_SAMPLES)):
        return _tail(elapsed, "assumed, overdue", 0)
    return _quantiles(_ASSUMED, first, elapsed, "assumed", 0)


def _capped(found: Prediction, left: float) -> Prediction:
    """``found`` with no quantile past ``left`` seconds (the limit's grace when it has passed)."""
    left = left if left > 0.0 else LIMIT_GRACE_SECONDS
    if found.quantiles[-1] <= left:
        return found
    return Prediction(tuple(min(q, left) for q in found.quantiles), found.basis, found.samples)
