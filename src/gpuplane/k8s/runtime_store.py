"""The controller's runtime history: what it learned from the Workloads it saw finish, kept in the cluster.

Every Workload the controller's cache shows with ``Finished=True`` after an admission leaves one
:class:`~gpuplane.insight.runtime_history.RuntimeSample`: it ran from its admission (the
``Admitted`` condition's time, else ``QuotaReserved``'s) to its ``Finished`` condition's time, and
its features are :func:`~gpuplane.insight.runtime_history.features_of` it in the ClusterQueue of its
admission. The cache shows the Workloads this controller finished, those another replica or Kueue
finished, and, in the informer's first list, those that had finished before it started.

:class:`RuntimeHistory` holds the samples, bounded: at most ``size`` of them (the oldest go first)
and none that finished more than ``retention`` seconds ago. :class:`RuntimeStore` keeps them across
restarts in one ConfigMap of the controller's namespace (:data:`CONFIG_MAP_NAME`, key
:data:`DATA_KEY`, compact JSON, below :data:`MAX_BYTES`). A new leader reads it on its first pass;
new samples are written at most every ``flush`` seconds and on a clean shutdown, each write with the
resourceVersion last read as its precondition: a conflict reads the ConfigMap again, merges (samples
are known by their Workload's uid) and retries. Data that cannot be read (corrupt JSON, another
format) is reported once as a warning and the history starts empty; the controller never stops for it.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample, features_of
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError, KubeApi
from gpuplane.k8s.runtime_seed import not_learned
from gpuplane.model.conditions import ConditionType
from gpuplane.model.errors import InputError
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.kinds import parse_workload

log = logging.getLogger(__name__)

CONFIG_MAP_NAME = "gpuplane-runtime-history"
DATA_KEY = "runtime-history.json"
FORMAT = "gpuplane.dev/runtime-history/v1"
DEFAULT_SIZE = 5000  # samples kept
DEFAULT_RETENTION_SECONDS = 30 * 86400.0
DEFAULT_FLUSH_SECONDS = 60.0  # at most one write this often
MAX_BYTES = 900_000  # the encoded history stays below the API server's 1 MiB limit on a ConfigMap
ID_CHARS = 16  # a sample is known by the first hex digits of its Workload's uid
CONFLICT_RETRIES = 3
LABELS = {"app.kubernetes.io/name": "gpuplane", "app.kubernetes.io/component": "runtime-history"}


class HistoryFormatError(ValueError):
    """Stored data that is not a runtime history this version can read."""


def _true_since(conditions: Iterable[Any], ctype: str) -> float | None:
    """When the condition ``ctype`` became True (None when it is not True or has no readable time)."""
    for cond in conditions:
        if isinstance(cond, Mapping) and cond.get("type") == ctype and cond.get("status") == "True":
            return lenient_timestamp(cond.get("lastTransitionTime"))
    return None


def finished_at(obj: Mapping[str, Any]) -> float | None:
    """When a Workload object finished (its ``Finished`` condition's time), if it has."""
    return _true_since((obj.get("status") or {}).get("conditions") or [], ConditionType.FINISHED)


def sample_of(obj: Mapping[str, Any]) -> tuple[str, RuntimeSample] | None:
    """The id and the sample of a Workload object that finished after an admission; None for any
    other (pending, running, finished without an admission, or unreadable)."""
    status = obj.get("status") or {}
    conditions = status.get("conditions") or []
    finished = _true_since(conditions, ConditionType.FINISHED)
    if finished is None:
        return None
    started = _true_since(conditions, ConditionType.ADMITTED)
    if started is None:
        started = _true_since(conditions, ConditionType.QUOTA_RESERVED)
    queue = (status.get("admission") or {}).get("clusterQueue")
    if started is None or not queue or finished < started:
        return None
    try:
        wl = parse_workload(obj, "v1beta2", {})
    except (InputError, TypeError, ValueError, AttributeError):
        return None
    return sample_id(obj), RuntimeSample(features_of(wl, str(queue)), finished - started, finished)


def sample_id(obj: Mapping[str, Any]) -> str:
    """The id of a Workload's sample: the first hex digits of its uid (else its namespace/name)."""
    meta = obj.get("metadata") or {}
    uid = str(meta.get("uid") or "").replace("-", "")[:ID_CHARS]
    return uid or f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def encode(entries: Mapping[str, RuntimeSample]) -> str:
    """The stored form: each distinct set of features once, then one row per sample, oldest first:
    ``[features index, seconds, finished at, id]``."""
    index: dict[JobFeatures, int] = {}
    rows = []
    for ident, s in sorted(entries.items(), key=lambda kv: (kv[1].finished_at, kv[0])):
        i = index.setdefault(s.features, len(index))
        rows.append([i, s.seconds, s.finished_at, ident])  # exact: the same run read twice is equal
    features = [[f.namespace, f.name, f.queue, f.priority_class, f.shape] for f in index]
    return json.dumps({"format": FORMAT, "features": features, "samples": rows}, separators=(",", ":"))


def _number(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise HistoryFormatError(f"{what} is not a number: {value!r}")
    return float(value)


def decode(text: str) -> dict[str, RuntimeSample]:
    """The samples of a stored history by id; :class:`HistoryFormatError` when ``text`` is not one."""
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise HistoryFormatError(f"not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise HistoryFormatError(f"not a runtime history of format {FORMAT} (found {found!r})")
    features_raw, rows = doc.get("features"), doc.get("samples")
    if not isinstance(features_raw, list) or not isinstance(rows, list):
        raise HistoryFormatError("'features' and 'samples' must be lists")
    features = []
    for i, f in enumerate(features_raw):
        if not isinstance(f, list) or len(f) != 5 or not all(isinstance(x, str) for x in f):
            raise HistoryFormatError(f"features[{i}] is not five strings")
        features.append(JobFeatures(*f))
    out: dict[str, RuntimeSample] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != 4 or not isinstance(row[3], str):
            raise HistoryFormatError(f"samples[{i}] is not [features, seconds, finished at, id]")
        at = row[0]
        if isinstance(at, bool) or not isinstance(at, int) or not 0 <= at < len(features):
            raise HistoryFormatError(f"samples[{i}] names no features: {at!r}")
        seconds = _number(row[1], f"samples[{i}] seconds")
        if seconds < 0:
            raise HistoryFormatError(f"samples[{i}] has a negative runtime")
        out[row[3]] = RuntimeSample(features[at], seconds, _number(row[2], f"samples[{i}] finish time"))
    return out


class RuntimeHistory:
    """The samples learned so far, by id, bounded by ``size`` and ``retention_seconds``; whether it
    holds what the stored copy does not (``dirty``). Thread-safe: the controller adds, the insight
    worker reads :meth:`samples`."""

    def __init__(
        self, size: int = DEFAULT_SIZE, retention_seconds: float = DEFAULT_RETENTION_SECONDS
    ) -> None:
        if size < 0:
            raise ValueError(f"the runtime history's size must be at least 0, not {size}")
        if not retention_seconds > 0:
            raise ValueError(f"the runtime history's retention must be positive, not {retention_seconds}")
        self.size = size
        self.retention_seconds = retention_seconds
        self.dirty = False
        self._by_id: dict[str, RuntimeSample] = {}
        self._samples: tuple[RuntimeSample, ...] | None = ()
        self._oldest: float | None = None  # the oldest finish kept, once asked (None: not known)
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_id)

    def samples(self) -> tuple[RuntimeSample, ...]:
        """Every sample kept, oldest first (the same tuple until the history changes)."""
        with self._lock:
            if self._samples is None:
                self._samples = tuple(sorted(self._by_id.values(), key=lambda s: s.finished_at))
            return self._samples

    def knows(self, ident: str) -> bool:
        with self._lock:
            return ident in self._by_id

    def would_keep(self, finished_at: float, now: float) -> bool:
        """Whether a new sample that finished at ``finished_at`` would stay (within the retention,
        and newer than the oldest kept when the history is full)."""
        with self._lock:
            if finished_at < now - self.retention_seconds or self.size == 0:
                return False
            if len(self._by_id) < self.size:
                return True
            if self._oldest is None:
                self._oldest = min(s.finished_at for s in self._by_id.values())
            return finished_at > self._oldest

    def entries(self) -> dict[str, RuntimeSample]:
        with self._lock:
            return dict(self._by_id)

    def add(self, found: Iterable[tuple[str, RuntimeSample]], now: float) -> int:
        """Add the samples not known yet, then bound; how many of them stayed."""
        with self._lock:
            new = {i: s for i, s in found if i not in self._by_id}
            if not new:
                return 0
            before = len(self._by_id)
            self._by_id.update(new)
            self._bound(now)
            kept = sum(1 for i in new if i in self._by_id)
            if kept or len(self._by_id) != before:  # new ones stayed, or old ones went
                self.dirty = True
                self._samples = self._oldest = None
            return kept

    def merge(self, stored: Mapping[str, RuntimeSample], now: float) -> None:
        """Take in a stored copy; ``dirty`` afterwards when the stored copy differs from the result
        (samples only this replica has, or stored ones now dropped by the bounds)."""
        with self._lock:
            for ident, sample in stored.items():
                self._by_id.setdefault(ident, sample)
            self._bound(now)
            self._samples = self._oldest = None
            self.dirty = self._by_id.keys() != stored.keys()

    def drop_oldest(self, share: float) -> int:
        """Drop the oldest ``share`` of the samples (at least one); how many went."""
        with self._lock:
            count = max(1, math.ceil(len(self._by_id) * share))
            for ident, _ in sorted(self._by_id.items(), key=lambda kv: kv[1].finished_at)[:count]:
                del self._by_id[ident]
            self._samples = self._oldest = None
            return count

    def _bound(self, now: float) -> None:
        oldest = now - self.retention_seconds
        kept = {i: s for i, s in self._by_id.items() if s.finished_at >= oldest}
        if len(kept) > self.size:
            newest = sorted(kept.items(), key=lambda kv: (kv[1].finished_at, kv[0]))[len(kept) - self.size :]
            kept = dict(newest)
        self._by_id = kept


class RuntimeStore:
    """Keeps a :class:`RuntimeHistory` in one ConfigMap (see the module docstring). It owns the
    ConfigMap as last read or written (its resourceVersion is the next write's precondition, its
    other keys and labels are kept), whether the stored copy has been read, and when it last wrote."""

    def __init__(  # noqa: PLR0913 - keyword-only settings of one store
        self,
        api: KubeApi,
        history: RuntimeHistory,
        *,
        namespace: str,
        name: str = CONFIG_MAP_NAME,
        flush_seconds: float = DEFAULT_FLUSH_SECONDS,
        clock: Callable[[], float],
        seed: Callable[[], list[tuple[str, RuntimeSample]]] | None = None,
    ) -> None:
        if flush_seconds < 0:
            raise ValueError(f"the runtime history's write interval must be at least 0, not {flush_seconds}")
        self.api = api
        self.history = history
        self.namespace = namespace
        self.name = name
        self.flush_seconds = flush_seconds
        self.clock = clock
        self.seed = seed  # runs recorded elsewhere (Prometheus), for a history that starts empty
        self.loaded = False
        self._seed_due = False
        self.writes = 0
        self._stored: dict[str, Any] | None = None  # the ConfigMap as last read or written
        self._flushed_at = -math.inf
        self._read_failed_at = -math.inf

    @property
    def enabled(self) -> bool:
        return self.history.size > 0

    def samples(self) -> tuple[RuntimeSample, ...]:
        return self.history.samples()

    def observe(self, keys: Iterable[str], get: Callable[[str], dict[str, Any] | None]) -> int:
        """Learn from the Workloads ``keys`` (changed in the cache) that have finished; how many
        samples were new."""
        if not self.enabled:
            return 0
        found = []
        now = self.clock()
        for key in keys:
            obj = get(key)
            if obj is None or self.history.knows(sample_id(obj)):
                continue
            at = finished_at(obj)
            if at is not None and self.history.would_keep(at, now):  # parsed only then
                sample = sample_of(obj)
                if sample is not None:
                    found.append(sample)
        return self.history.add(found, now) if found else 0

    def sync(self) -> None:
        """Once per pass of the leader: read the stored copy until it has been read (after a failed
        read, again once the write interval has passed), then write what is new when a write is due."""
        if not self.enabled:
            return
        now = self.clock()
        if not self.loaded:
            if now - self._read_failed_at < self.flush_seconds:
                return
            if not self._read():
                self._read_failed_at = now
                return
            self.loaded = True
            log.info("runtime history: %d samples read from ConfigMap %s", len(self.history), self._where)
            self._seed_due = self.seed is not None and len(self.history) == 0
        elif self._seed_due:  # the pass after the first read: the first list has been learned
            self._seed_due = False
            self._seed_once(now)
        if self.history.dirty and now - self._flushed_at >= self.flush_seconds:
            self.flush()

    def _seed_once(self, now: float) -> None:
        assert self.seed is not None
        try:
            found = self.seed()
        except (OSError, ValueError) as err:
            log.warning("runtime history: not seeded: %s", err)
            return
        added = self.history.add(not_learned(found, self.history.samples()), now)
        log.info("runtime history: %d of %d runs seeded from Prometheus", added, len(found))

    def close(self) -> None:
        """Write what is new now (a clean shutdown); a failure is logged, never raised."""
        if self.enabled and self.history.dirty:
            try:
                self.flush()
            except Exception:  # shutting down: the finished Workloads are still in the cluster
                log.exception("runtime history: the last write failed")

    @property
    def _where(self) -> str:
        return f"{self.namespace}/{self.name}"

    def _read(self) -> bool:
        """Read the ConfigMap and merge it into the history; False when it could not be read."""
        try:
            obj = self.api.get(k8s.CONFIG_MAPS, self.name, self.namespace)
        except ApiError as err:
            if not err.not_found:
                log.warning("runtime history: cannot read ConfigMap %s: %s", self._where, err)
                return False
            self._stored = None
            self.history.merge({}, self.clock())
            return True
        self._stored = obj
        text = (obj.get("data") or {}).get(DATA_KEY)
        stored: dict[str, RuntimeSample] = {}
        if text is None:
            log.warning("runtime history: ConfigMap %s has no key %s; it is added", self._where, DATA_KEY)
        else:
            try:
                stored = decode(text)
            except HistoryFormatError as err:
                log.warning(
                    "runtime history: ConfigMap %s is not readable (%s); starting empty", self._where, err
                )
        self.history.merge(stored, self.clock())
        return True

    def _body(self) -> dict[str, Any]:
        """The ConfigMap to write: the stored one (other keys and labels kept) with the history."""
        entries = self.history.entries()
        text = encode(entries)
        while len(text.encode()) > MAX_BYTES and entries:
            dropped = self.history.drop_oldest(0.1)
            log.warning("runtime history: over %d bytes; the oldest %d samples dropped", MAX_BYTES, dropped)
            entries = self.history.entries()
            text = encode(entries)
        old = self._stored or {}
        meta = old.get("metadata") or {}
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "labels": {**(meta.get("labels") or {}), **LABELS},
        }
        if meta.get("annotations"):
            metadata["annotations"] = meta["annotations"]
        if meta.get("resourceVersion"):
            metadata["resourceVersion"] = meta["resourceVersion"]
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata,
            "data": {**(old.get("data") or {}), DATA_KEY: text},
        }
        if old.get("binaryData"):
            body["binaryData"] = old["binaryData"]
        return body

    def flush(self) -> bool:
        """Write the history now, with the last resourceVersion as precondition; on a conflict read
        it again, merge, and retry. False when it was not written (it is tried again later)."""
        for _ in range(CONFLICT_RETRIES + 1):
            self.history.dirty = False
            body = self._body()
            update = "resourceVersion" in body["metadata"]
            try:
                if update:
                    written = self.api.replace(k8s.CONFIG_MAPS, body)
                else:
                    written = self.api.create(k8s.CONFIG_MAPS, body, self.namespace)
            except ApiError as err:
                self.history.dirty = True
                # Changed or created meanwhile, or deleted (a create's 404: no such namespace).
                if err.conflict or (update and err.not_found):
                    if self._read():
                        continue
                    self._flushed_at = self.clock()
                    return False
                log.warning("runtime history: cannot write ConfigMap %s: %s", self._where, err)
                self._flushed_at = self.clock()
                return False
            self._stored = written
            self._flushed_at = self.clock()
            self.writes += 1
            return True
        log.warning(
            "runtime history: ConfigMap %s kept changing; the write is tried again later", self._where
        )
        self._flushed_at = self.clock()
        return False
