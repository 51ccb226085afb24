"""`gpuplane doctor`'s queue checks: what makes a queue admit nothing, or borrow from nobody.

Pure checks over a :class:`ClusterState`, each finding naming the objects and the fix:

* ``flavor-missing`` (error): a ClusterQueue or Cohort gives quota in a ResourceFlavor that does not
  exist; Kueue marks the queue inactive (``FlavorNotFound``) and it admits nothing;
* ``cluster-queue-missing`` (error): a LocalQueue points at a ClusterQueue that does not exist; its
  workloads stay pending (Kueue: ``ClusterQueueDoesNotExist``);
* ``resource-uncovered`` (error): a workload queued to a ClusterQueue is charged for a resource that
  the queue's resource groups do not cover (a request, or ``gpuplane.dev/gpu-fraction`` for a share
  of a GPU); Kueue never admits it;
* ``cohort-unknown`` (warning): a ClusterQueue names a cohort that no Cohort object defines and no
  other queue names. Kueue then makes the cohort implicitly, so a typo leaves the queue alone in a
  cohort of its own, with nobody to borrow from or lend to.

Objects the loader refused (a ClusterQueue with a malformed quota or a resource covered by two of its
groups, a cohort cycle) are not here: the command
reports each of them as a finding of its own (``invalid-object``) and checks the rest.
"""

from __future__ import annotations

from collections import defaultdict

from gpuplane.insight.doctor import Finding
from gpuplane.model.objects import ClusterQueue, ClusterState, ResourceGroup

# Requests Kueue does not hold quota for unless a queue covers them.
_NEVER_COUNTED = frozenset(("pods",))


def queue_findings(state: ClusterState) -> list[Finding]:
    """Every queue finding, by check and object."""
    findings = [
        *_missing_flavors(state),
        *_missing_cluster_queues(state),
        *_uncovered_requests(state),
        *_unknown_cohorts(state),
    ]
    return sorted(findings, key=lambda f: (f.check, f.objects))


def _flavor_names(groups: tuple[ResourceGroup, ...]) -> list[str]:
    return [f.name for g in groups for f in g.flavors]


def _missing_flavors(state: ClusterState) -> list[Finding]:
    owners: list[tuple[str, tuple[ResourceGroup, ...]]] = [
        (f"ClusterQueue/{name}", cq.resource_groups) for name, cq in state.cluster_queues.items()
    ]
    owners += [(f"Cohort/{name}", c.resource_groups) for name, c in state.cohorts.items()]
    out = []
    for owner, groups in sorted(owners):
        missing = sorted({n for n in _flavor_names(groups) if n not in state.resource_flavors})
        if missing:
            out.append(
                Finding(
                    "error",
                    "flavor-missing",
                    (owner, *(f"ResourceFlavor/{n}" for n in missing)),
                    f"gives quota in ResourceFlavor {', '.join(missing)}, which does not exist: the queue "
                    "is inactive (FlavorNotFound) and admits nothing",
                    f"create the ResourceFlavor {missing[0]}, or correct the flavor's name in the queue",
                )
            )
    return out


def _missing_cluster_queues(state: ClusterState) -> list[Finding]:
    return [
        Finding(
            "error",
            "cluster-queue-missing",
            (f"LocalQueue/{key}", f"ClusterQueue/{lq.cluster_queue}"),
            f"points at ClusterQueue {lq.cluster_queue}, which does not exist: its workloads are "
            "never admitted",
            f"create ClusterQueue {lq.cluster_queue}, or point the LocalQueue at an existing one",
        )
        for key, lq in sorted(state.local_queues.items())
        if lq.cluster_queue not in state.cluster_queues
    ]


def _covered(cq: ClusterQueue) -> set[str]:
    return {r for g in cq.resource_groups for r in g.covered_resources}


def _uncovered_requests(state: ClusterState) -> list[Finding]:
    uncovered: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))  # cq -> res -> wls
    for wl in state.workloads:
        if wl.finished or wl.admission is not None or wl.queue_name is None:
            continue
        lq = state.local_queues.get(f"{wl.namespace}/{wl.queue_name}")
        cq = state.cluster_queues.get(lq.cluster_queue) if lq is not None else None
        if cq is None:
            continue
        covered = _covered(cq)
        for resource in sorted(
            {r for ps in wl.pod_sets for r, q in ps.template.quota_requests.items() if q > 0}
        ):
            if resource not in covered and resource not in _NEVER_COUNTED:
                uncovered[cq.name][resource].append(wl.key)
    out = []
    for cq_name, by_resource in sorted(uncovered.items()):
        for resource, workloads in sorted(by_resource.items()):
            shown = ", ".join(workloads[:3]) + (
                f" and {len(workloads) - 3} more" if len(workloads) > 3 else ""
            )
            out.append(
                Finding(
                    "error",
                    "resource-uncovered",
                    (f"ClusterQueue/{cq_name}", *(f"Workload/{w}" for w in workloads[:3])),
                    f"{len(workloads)} pending workload(s) request {resource}, which the queue does not "
                    f"cover ({shown}): they are never admitted",
                    f"add {resource} to a resource group's coveredResources with a quota in each of its "
                    "flavors, or drop the request from the workloads",
                )
            )
    return out


def _unknown_cohorts(state: ClusterState) -> list[Finding]:
    members: dict[str, list[str]] = defaultdict(list)
    for name, cq in state.cluster_queues.items():
        if cq.cohort:
            members[cq.cohort].append(name)
    parents = {c.parent for c in state.cohorts.values() if c.parent}
    out = []
    for cohort, queues in sorted(members.items()):
        if cohort in state.cohorts or cohort in parents or len(queues) > 1:
            continue
        known = sorted(set(members) - {cohort} | set(state.cohorts))
        hint = f" (cohorts in use: {', '.join(known)})" if known else ""
        out.append(
            Finding(
                "warning",
                "cohort-unknown",
                (f"ClusterQueue/{queues[0]}",),
                f"cohort {cohort} is named by this queue alone and no Cohort object defines it: the queue "
                f"has nobody to borrow from or lend to{hint}",
                "correct the cohort's name, or create the Cohort if the queue is meant to be alone in it",
            )
        )
    return out
