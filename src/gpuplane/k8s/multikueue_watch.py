"""A MultiKueue manager's watch of one worker: what the worker holds, kept by informers instead of
listed every pass.

:class:`WorkerWatch` keeps two caches of the worker:

- ``remote``: every Workload of the worker, and the jobs of the kinds MultiKueue carries that bear
  this manager's origin label. A change there wakes the manager's controller (the caches share
  its ``changed`` event), so a copy admitted on a worker is acted on at once, not on the next
  timed pass.
- ``state``: the rest of what a scheduling pass over the worker reads (nodes, pods, queues,
  flavors, ...), for the gpuplane dispatcher's question "would it be admitted there now"
  (:func:`gpuplane.k8s.multikueue_workers.fit_views`). It wakes no one.

Nothing is read from the caches before every informer has listed once (:meth:`WorkerWatch.synced`):
a cache that has not listed would hide copies that exist, and the manager would act on their
absence.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any

from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import KubeApi, Resource
from gpuplane.k8s.clusterstate import READ, state_objects
from gpuplane.k8s.informer import Cache, Informer, object_key
from gpuplane.k8s.kueue_config import CONFIG_KIND, KueueConfigError, read_configuration
from gpuplane.model import labels as keys

log = logging.getLogger(__name__)

KUEUE_CONFIG_SECONDS = 60.0  # how often a worker's Kueue Configuration is read again

# What a scheduling pass over a worker reads, besides its Workloads (the ``remote`` cache's).
STATE_READ = tuple(res for res in READ if res not in (k8s.WORKLOADS, k8s.JOBS))


class WorkerWatch:
    """Informers on one worker and the two caches they fill (module docstring); owns both, and the
    informers' threads (started by :meth:`start`, ended by :meth:`stop`)."""

    def __init__(
        self,
        api: KubeApi,
        origin: str,
        owners: Iterable[Resource],
        wake: threading.Event,
    ) -> None:
        selector = f"{keys.MULTIKUEUE_ORIGIN_LABEL}={origin}"
        self.owner_kinds = tuple(res.kind for res in owners)
        self.remote = Cache(changed=wake)
        self.state = Cache()
        self.origin = origin
        self.kueue_config: list[dict[str, Any]] = []  # the worker's Kueue Configuration, as last read
        self._config_read_at = -1e18
        self.informers = [
            Informer(api, k8s.WORKLOADS, self.remote),
            *(Informer(api, res, self.remote, label_selector=selector) for res in owners),
            *(Informer(api, res, self.state) for res in STATE_READ),
        ]

    def start(self) -> WorkerWatch:
        for informer in self.informers:
            informer.start()
        return self

    def stop(self) -> None:
        for informer in self.informers:
            informer.stop(0.0)  # cut every stream first, then wait for each
        for informer in self.informers:
            informer.stop()

    def synced(self, *, state: bool = False) -> bool:
        """Whether the remote informers (and, with ``state``, the state's too) have listed."""
        wanted = self.informers if state else self.informers[: 1 + len(self.owner_kinds)]
        return all(informer.synced.is_set() for informer in wanted)

    def copies(self) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, dict[str, Any]]]]:
        """This manager's Workloads on the worker (by origin label) by key, and its jobs by kind, then key."""
        workloads = {
            object_key(wl): wl
            for wl in self.remote.items("Workload")
            if ((wl.get("metadata") or {}).get("labels") or {}).get(keys.MULTIKUEUE_ORIGIN_LABEL)
            == self.origin
        }
        owners = {kind: {object_key(o): o for o in self.remote.items(kind)} for kind in self.owner_kinds}
        return workloads, owners

    def refresh_kueue_config(self, api: KubeApi, now: float) -> None:
        """Read the worker's Kueue Configuration (its ConfigMap) again, once every
        :data:`KUEUE_CONFIG_SECONDS` (``now``: monotonic seconds); a malformed one counts as none."""
        if now - self._config_read_at < KUEUE_CONFIG_SECONDS:
            return
        self._config_read_at = now
        try:
            doc = read_configuration(api)
        except KueueConfigError as err:
            log.debug("worker's Kueue configuration ignored: %s", err)
            doc = None
        self.kueue_config = [] if doc is None else [doc]

    def objects(self) -> list[dict[str, Any]]:
        """The worker's state, as a scheduling pass reads it (:func:`state_objects`), from the caches
        and the Kueue Configuration last read (:attr:`kueue_config`)."""

        def items(kind: str) -> list[dict[str, Any]]:
            if kind == CONFIG_KIND:
                return list(self.kueue_config)
            return (self.remote if kind == "Workload" else self.state).items(kind)

        return state_objects(items)
