"""MultiKueue on a manager: which workers each waiting workload is nominated to, and its copies
there (the gpuplane dispatcher asks each worker about the whole batch at once)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpuplane.insight.dispatch import RECHECK_SECONDS, ClusterView, Nomination, nominate
from gpuplane.k8s.informer import object_key
from gpuplane.k8s.multikueue_fleet import (
    Fleet,
    FleetPart,
    check_message,
    cluster_selector,
    labels_of,
    pending_since,
    selector_matches,
    spill_order,
)
from gpuplane.k8s.multikueue_flow import WorkloadFlow
from gpuplane.k8s.multikueue_workers import RemoteObjects, fit_views
from gpuplane.model.conditions import condition_true
from gpuplane.model.multikueue import MultiKueueConfig

log = logging.getLogger(__name__)


class Nominations(FleetPart):
    """Nominates the waiting workloads' workers and copies them there (owns its pool of writers;
    the copies are written by the :class:`~gpuplane.k8s.multikueue_flow.WorkloadFlow` it is given)."""

    def __init__(self, fleet: Fleet, flow: WorkloadFlow, pool: ThreadPoolExecutor) -> None:
        super().__init__(fleet)
        self.flow = flow
        self._pool = pool
        self._rechecked_at = -1e18  # monotonic time of the last look at nominated workloads

    def nominate(
        self,
        waiting: list[tuple[dict[str, Any], str, MultiKueueConfig]],
        remotes: Mapping[str, RemoteObjects | None],
    ) -> None:
        """Nominate the waiting workloads' workers and copy them there (the gpuplane dispatcher asks
        each worker about the whole batch at once)."""
        now = self.clock()
        views: dict[str, dict[str, ClusterView]] = {}
        asked: set[str] = set()
        if self.settings.dispatcher == "gpuplane":
            # New workloads every pass; those nominated already (their copy waits on its worker) again
            # every RECHECK_SECONDS, in case another worker takes them now.
            # A copy that already holds quota on its worker is being admitted there: it never moves.
            recheck = self.monotonic() - self._rechecked_at >= RECHECK_SECONDS
            todo = [
                wl for wl, _, _ in waiting if not _nominated(wl) or (recheck and not self._held_on_worker(wl))
            ]
            if recheck:
                self._rechecked_at = self.monotonic()
            asked = {object_key(wl) for wl in todo}
            views = self._fit_views(todo, [cfg for _, _, cfg in waiting], now)
        list(self._pool.map(lambda item: self._nominate_one(item, views, asked, remotes, now), waiting))

    def _nominate_one(
        self,
        item: tuple[dict[str, Any], str, MultiKueueConfig],
        views: Mapping[str, Mapping[str, ClusterView]],
        asked: set[str],
        remotes: Mapping[str, RemoteObjects | None],
        now: float,
    ) -> None:
        """Nominate one workload's workers (its views given) and copy it there. gpuplane's dispatcher
        moves a waiting copy only to a worker that takes it now."""
        wl, check, cfg = item
        key = object_key(wl)
        status = wl.get("status") or {}
        already = list(status.get("nominatedClusterNames") or [])
        if self.settings.dispatcher == "gpuplane" and already:
            nomination = Nomination(tuple(already), "")
            moved = self._nomination(wl, check, cfg, views, now) if key in asked else None
            if moved is not None and list(moved.clusters) != already:
                target = views.get(moved.clusters[0], {}).get(key) if moved.clusters else None
                if target is not None and target.fits_now:
                    nomination = moved
        else:
            nomination = self._nomination(wl, check, cfg, views, now)
        chosen = list(nomination.clusters)
        said = check_message(wl, check)
        if (
            chosen != already or (nomination.reason and nomination.reason != said)
        ) and not self.flow.write_nomination(wl, check, chosen, nomination.reason or said):
            return
        for cluster in cfg.clusters:
            remote = remotes.get(cluster)
            if remote is None:
                continue
            present = key in remote.workloads
            if cluster in chosen and not present:
                self.flow.create_remote_workload(cluster, wl)
            elif cluster not in chosen and present:
                self.flow.delete_remote(cluster, wl)

    def _nomination(
        self,
        wl: dict[str, Any],
        check: str,
        cfg: MultiKueueConfig,
        views: Mapping[str, Mapping[str, ClusterView]],
        now: float,
    ) -> Nomination:
        key = object_key(wl)
        cluster_views = [
            views.get(c, {}).get(key) or self._plain_view(c) for c in cfg.clusters if c in self.fleet.clusters
        ]
        return nominate(
            self.settings.dispatcher,
            cluster_views,
            since_first_nomination_s=max(0.0, now - pending_since(wl, check, now)),
            cluster_selector=self._selector(wl),
            spill_order=spill_order(wl) or spill_order(self.flow.local_job(wl) or {}),
        )

    def _fit_views(
        self, todo: list[dict[str, Any]], configs: list[MultiKueueConfig], now: float
    ) -> dict[str, dict[str, ClusterView]]:
        """Where each workload of ``todo`` would be admitted now, packing the batch worker by worker
        in the configs' order (the most preferred first, as a MultiKueueConfig lists them): each
        worker is asked about the workloads no earlier worker takes now, in their queue order. A
        workload that fits nowhere now is then asked of every worker again, for its predicted start
        there (the costly question, so only for those)."""
        order = list(
            dict.fromkeys(c for cfg in sorted(set(configs), key=lambda c: c.name) for c in cfg.clusters)
        )
        views: dict[str, dict[str, ClusterView]] = {}
        remaining = list(todo)
        for name in order:
            asked = self._asked(name, remaining)
            if not asked:
                continue
            views[name] = fit_views(self.fleet.links[name], asked, self._labels(name), now, eta=False)
            taken = {key for key, view in views[name].items() if view.fits_now}
            remaining = [wl for wl in remaining if object_key(wl) not in taken]
        for name in order:
            asked = self._asked(name, remaining)
            if asked:
                link = self.fleet.links[name]
                views.setdefault(name, {}).update(fit_views(link, asked, self._labels(name), now))
        return views

    def _held_on_worker(self, wl: Mapping[str, Any]) -> bool:
        """Whether the copy on a worker it is nominated to holds quota there, as that worker's watch
        shows it now (fresher than the pass's snapshot)."""
        key = object_key(wl)
        for cluster in (wl.get("status") or {}).get("nominatedClusterNames") or []:
            link = self.fleet.links.get(cluster)
            remote = link.watch.remote.get("Workload", key) if link is not None and link.watch else None
            if remote is not None and condition_true(remote, "QuotaReserved"):
                return True
        return False

    def _labels(self, name: str) -> dict[str, str]:
        return labels_of(self.fleet.cluster_objects.get(name))

    def _asked(self, name: str, workloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Those of ``workloads`` whose cluster selector lets them go to worker ``name`` (none when
        there is no link to it)."""
        if name not in self.fleet.links:
            return []
        labels = self._labels(name)
        return [wl for wl in workloads if selector_matches(self._selector(wl), labels)]

    def _selector(self, wl: Mapping[str, Any]) -> dict[str, str]:
        """The workload's cluster selector: its own annotation, else its Job's (where users put it)."""
        return cluster_selector(wl) or cluster_selector(self.flow.local_job(wl) or {})

    def _plain_view(self, name: str) -> ClusterView:
        link = self.fleet.links.get(name)
        return ClusterView(
            name,
            labels_of(self.fleet.cluster_objects.get(name)),
            active=link is not None and link.connected,
            note="" if link is None else link.message,
        )


def _nominated(wl: Mapping[str, Any]) -> bool:
    return bool((wl.get("status") or {}).get("nominatedClusterNames"))
