"""Where the console's snapshot comes from, and how a change reaches every open page.

Two sources publish into one :class:`SnapshotHub`:

* :class:`FileSource` loads state files (the same loader as ``gpuplane schedule``) and
  reloads them when a file changes on disk;
* :class:`KubeSource` keeps informers (list, then watch) on every kind the scheduler reads,
  plus Events, in the controller's cache, and rebuilds the snapshot after each burst of
  changes. One more informer follows the MultiKueueClusters of a MultiKueue manager (the
  Fleet panel); a change of them is swapped into the current snapshot without planning again.

Pages read the hub's current snapshot; the server-sent-event stream tells open pages when
its version moves. No browser request ever reaches the API server: one set of watches
serves every viewer.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuplane.core.session import config_from_kueue
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import MULTIKUEUE_CLUSTERS, KubeApi
from gpuplane.k8s.clusterstate import STATE_RESOURCES
from gpuplane.k8s.informer import Cache, Informer
from gpuplane.model.errors import InputError
from gpuplane.model.fields import lenient_timestamp
from gpuplane.model.loader import load_files, state_from_objects
from gpuplane.model.objects import ClusterState
from gpuplane.web.fleet import FleetWorker, fleet_of
from gpuplane.web.snapshot import ConsoleSnapshot, EventRecord, build_snapshot, explained, latest_time

log = logging.getLogger(__name__)


class SnapshotHub:
    """The latest snapshot, replaced whole; readers never see a half-built one (owns it, the
    version counter, and the fleet that every published snapshot carries).

    Every publish numbers the snapshot with the next version, so the event stream notices any
    change by comparing one integer. Reading needs no lock (one reference); publishing takes one,
    so a late explanation never replaces a newer plan (:meth:`publish_if_current`). The fleet
    (a MultiKueue manager's workers) changes apart from the plan: :meth:`publish_fleet` swaps it
    into the current snapshot, and every later snapshot carries it.
    """

    def __init__(self) -> None:
        self._snapshot: ConsoleSnapshot | None = None
        self._lock = threading.Lock()
        self._versions = 0
        self._fleet: tuple[FleetWorker, ...] | None = None  # None: no source follows a fleet

    def _set(self, snapshot: ConsoleSnapshot) -> ConsoleSnapshot:
        self._versions += 1
        fleet = snapshot.fleet if self._fleet is None else self._fleet
        self._snapshot = replace(snapshot, version=self._versions, fleet=fleet)
        return self._snapshot

    def publish(self, snapshot: ConsoleSnapshot) -> ConsoleSnapshot:
        with self._lock:
            return self._set(snapshot)

    def publish_if_current(self, base: ConsoleSnapshot, snapshot: ConsoleSnapshot) -> bool:
        """Publish ``snapshot`` only while ``base``'s plan is still the current one (a new fleet
        swapped in meanwhile does not count as a new plan)."""
        with self._lock:
            if self._snapshot is None or self._snapshot.plan is not base.plan:
                return False
            self._set(snapshot)
            return True

    def publish_fleet(self, fleet: tuple[FleetWorker, ...]) -> None:
        """The fleet as now listed: swapped into the current snapshot (a new version when it
        differs) and carried by every later one."""
        with self._lock:
            if fleet == self._fleet:
                return
            self._fleet = fleet
            if self._snapshot is not None and self._snapshot.fleet != fleet:
                self._set(self._snapshot)

    def current(self) -> ConsoleSnapshot | None:
        return self._snapshot

    @property
    def version(self) -> int:
        snap = self._snapshot
        return 0 if snap is None else snap.version


class Explainer:
    """Explains the newest published plan in the background, and publishes it explained.

    Explaining every pending workload (``gpuplane why``) costs several times the plan on a large
    cluster, so the plan is published first and its explanations follow in a later version; a
    plan replaced meanwhile is not explained at all.
    """

    def __init__(self, hub: SnapshotHub) -> None:
        self.hub = hub
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-explain", daemon=True)
        self._thread.start()

    def submit(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._wake.wait(1.0):
                continue
            self._wake.clear()
            base = self.hub.current()
            if base is None or base.explanations is not None:
                continue
            try:
                self.hub.publish_if_current(base, explained(base))
            except Exception:  # a bug in one explanation must not end live updates
                log.exception("explaining the plan failed")

    def stop(self) -> None:
        self._stop.set()


def snapshot_of_state(
    state: ClusterState, now: float, source: str, events: Sequence[EventRecord] = ()
) -> ConsoleSnapshot:
    return build_snapshot(state, config_from_kueue(state.configuration), now, events=events, source=source)


class FileSource:
    """State files, reloaded when their modification time changes.

    ``now`` is the latest time in the files unless ``now`` is given, as for ``gpuplane
    schedule``, so what the console shows equals that command's output for the same files.
    Each load publishes the plan already explained (a file is read once, not a stream).
    """

    def __init__(self, paths: Sequence[Path], hub: SnapshotHub, *, now: float | None = None) -> None:
        self.paths = list(paths)
        self.hub = hub
        self.now = now
        self._stamps: list[float] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _mtimes(self) -> list[float]:
        return [p.stat().st_mtime if p.exists() else -1.0 for p in self.paths]

    def load(self) -> ConsoleSnapshot:
        """Load and publish; raises :class:`InputError` on bad input."""
        stamps = self._mtimes()
        state = load_files([str(p) for p in self.paths]) if self.paths else ClusterState()
        now = latest_time(state) if self.now is None else self.now
        snap = explained(snapshot_of_state(state, now, ", ".join(p.name for p in self.paths)))
        self._stamps = stamps
        return self.hub.publish(snap)

    def reload_if_changed(self) -> bool:
        """Reload when a file changed; keeps the last good snapshot when the new input is bad."""
        if self._mtimes() == self._stamps:
            return False
        try:
            self.load()
        except (InputError, OSError) as err:
            log.warning("keeping the last good state: %s", err)
            self._stamps = self._mtimes()
            return False
        return True

    def start(self, interval: float = 1.0) -> None:
        def run() -> None:
            while not self._stop.wait(interval):
                self.reload_if_changed()

        self._thread = threading.Thread(target=run, name="console-files", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()


def event_record(obj: dict[str, Any]) -> EventRecord | None:
    """An Event object as the console keeps it, or ``None`` for one about another kind."""
    involved = obj.get("involvedObject") or obj.get("regarding") or {}
    kind = str(involved.get("kind", ""))
    if kind not in ("Workload", "Pod", "Job"):
        return None
    meta = obj.get("metadata", {})
    when = (
        lenient_timestamp(obj.get("lastTimestamp"))
        or lenient_timestamp(obj.get("eventTime"))
        or lenient_timestamp(obj.get("firstTimestamp"))
        or lenient_timestamp(meta.get("creationTimestamp"))
        or 0.0
    )
    return EventRecord(
        namespace=str(involved.get("namespace") or meta.get("namespace") or ""),
        involved_kind=kind,
        involved_name=str(involved.get("name", "")),
        type=str(obj.get("type", "")),
        reason=str(obj.get("reason", "")),
        message=str(obj.get("message") or obj.get("note") or ""),
        time=when,
        count=int(obj.get("count") or 1),
    )


def cluster_objects(cache: Cache) -> list[dict[str, Any]]:
    """The objects the scheduler reads, from the informer cache, with kind and apiVersion set."""
    objects: list[dict[str, Any]] = []
    for res in STATE_RESOURCES:
        for obj in cache.items(res.kind):
            if res.kind == "Pod" and not (
                obj.get("spec", {}).get("nodeName")
                and obj.get("status", {}).get("phase") in (None, "Pending", "Running")
            ):
                continue
            objects.append({**obj, "kind": res.kind, "apiVersion": obj.get("apiVersion") or res.api_version})
    return objects


@dataclass(frozen=True, slots=True)
class Pacing:
    """When a source rebuilds: after ``settle`` seconds of quiet, at most once per ``min_interval``."""

    settle: float = 0.2
    min_interval: float = 1.0


class KubeSource:
    """Informers on the cluster; a rebuild after every burst of changes (``settle`` seconds of quiet),
    at most one per ``min_interval`` seconds, since a rebuild of a large cluster takes a while."""

    def __init__(
        self,
        api: KubeApi,
        hub: SnapshotHub,
        *,
        pacing: Pacing | None = None,
        clock: Callable[[], float] = time.time,
        watch_timeout: int = 30,
    ) -> None:
        self.api = api
        self.hub = hub
        pacing = pacing or Pacing()
        self.settle = pacing.settle
        self.min_interval = pacing.min_interval
        self.clock = clock
        self.cache = Cache()
        self.informers = [
            Informer(api, res, self.cache, watch_timeout=watch_timeout)
            for res in (*STATE_RESOURCES, k8s.EVENTS)
        ]
        # The fleet has a cache of its own: its changes (every few seconds on a manager) swap the
        # fleet in, not plan again. Nothing waits for it: a console whose identity may not list
        # MultiKueueClusters (403, retried with back-off) shows no fleet.
        self.fleet_cache = Cache()
        self.fleet_informer = Informer(
            api, MULTIKUEUE_CLUSTERS, self.fleet_cache, watch_timeout=watch_timeout
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fleet_thread: threading.Thread | None = None
        self.explainer = Explainer(hub)

    def namespaces(self) -> list[str]:
        return [str(ns["metadata"]["name"]) for ns in self.cache.items("Namespace")]

    def rebuild(self) -> ConsoleSnapshot | None:
        skipped: list[InputError] = []
        try:
            state = state_from_objects(cluster_objects(self.cache), skipped=skipped)
        except InputError as err:
            log.warning("cluster state rejected: %s", err)
            return None
        for problem in skipped:
            log.warning("ignoring invalid object: %s", problem)
        events = [e for e in map(event_record, self.cache.items("Event")) if e is not None]
        snap = self.hub.publish(snapshot_of_state(state, self.clock(), "cluster", events))
        self.explainer.submit()
        return snap

    def publish_fleet(self) -> None:
        self.hub.publish_fleet(fleet_of(self.fleet_cache.items(MULTIKUEUE_CLUSTERS.kind)))

    def _follow_fleet(self) -> None:
        while not self._stop.is_set():
            if not self.fleet_cache.changed.wait(1.0):
                continue
            self.fleet_cache.changed.clear()
            try:
                self.publish_fleet()
            except Exception:  # a bad object must not end live updates
                log.exception("console fleet update failed")

    def start(self, wait: float = 30.0) -> None:
        """Start the informers, wait until each has listed once, publish, then follow changes."""
        self.hub.publish_fleet(())
        self.fleet_informer.start()
        self._fleet_thread = threading.Thread(target=self._follow_fleet, name="console-fleet", daemon=True)
        self._fleet_thread.start()
        for informer in self.informers:
            informer.start()
        deadline = time.monotonic() + wait
        for informer in self.informers:
            informer.synced.wait(max(0.0, deadline - time.monotonic()))
        self.cache.changed.clear()
        self.rebuild()

        def run() -> None:
            last = time.monotonic()
            while not self._stop.is_set():
                if not self.cache.changed.wait(1.0):
                    continue
                # Let a burst of watch events land before one rebuild.
                self._stop.wait(max(self.settle, self.min_interval - (time.monotonic() - last)))
                self.cache.changed.clear()
                last = time.monotonic()
                try:
                    self.rebuild()
                except Exception:  # a bug in one rebuild must not end live updates
                    log.exception("console snapshot rebuild failed")

        self._thread = threading.Thread(target=run, name="console-rebuild", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self.explainer.stop()
        self.fleet_informer.stop()
        for informer in self.informers:
            informer.stop()
