"""Cross-object checks on a parsed ClusterState.

Errors carry ``obj`` as ``Kind/key`` so the loader can point at the document that
defined the object.
"""

from __future__ import annotations

from gpuplane.model.errors import InputError
from gpuplane.model.objects import ClusterState


def api_server_rejections(state: ClusterState) -> list[InputError]:
    """Problems a real API server refuses but Kueue's scheduler itself tolerates.

    Kueue's own scheduler tests build ClusterQueues with a ``borrowingLimit`` and no
    cohort (the webhook that refuses them is bypassed), and the scheduler simply
    ignores the limit. ``gpuplane schedule`` therefore reports these as warnings, and
    as errors under ``--strict``.
    """
    found: list[InputError] = []
    for cq in sorted(state.cluster_queues.values(), key=lambda q: q.name):
        for gi, group in enumerate(cq.resource_groups):
            if not group.covered_resources:
                found.append(
                    InputError(
                        "coveredResources must list at least one resource",
                        obj=f"ClusterQueue/{cq.name}",
                        field=f"spec.resourceGroups[{gi}].coveredResources",
                    )
                )
        if cq.cohort:
            continue
        for gi, group in enumerate(cq.resource_groups):
            for fi, flavor in enumerate(group.flavors):
                for ri, (rname, quota) in enumerate(flavor.resources.items()):
                    rpath = f"spec.resourceGroups[{gi}].flavors[{fi}].resources[{ri}]"
                    for limit, value in (
                        ("borrowingLimit", quota.borrowing_limit),
                        ("lendingLimit", quota.lending_limit),
                    ):
                        if value is not None:
                            found.append(
                                InputError(
                                    f"{limit} for {rname!r} needs the ClusterQueue to be in a cohort "
                                    "(set spec.cohortName)",
                                    obj=f"ClusterQueue/{cq.name}",
                                    field=f"{rpath}.{limit}",
                                )
                            )
    return found


def validate_state(state: ClusterState) -> None:
    """Raise InputError for structures Kueue would refuse.

    A dangling reference is not one of them: a LocalQueue whose ClusterQueue does not exist
    (yet), or a ClusterQueue that names a missing ResourceFlavor, is a normal state of a live
    cluster. The scheduler keeps such queues inactive and schedules everything else.
    """
    _check_cohort_cycles(state)


def _check_cohort_cycles(state: ClusterState) -> None:
    done: set[str] = set()
    for start in sorted(state.cohorts):
        path: list[str] = []
        on_path: set[str] = set()
        node: str | None = start
        while node is not None and node not in done:
            if node in on_path:
                cycle = [*path[path.index(node) :], node]
                raise InputError(
                    "cohort cycle: " + " -> ".join(cycle),
                    obj=f"Cohort/{node}",
                    field="spec.parentName",
                )
            on_path.add(node)
            path.append(node)
            cohort = state.cohorts.get(node)
            node = cohort.parent if cohort is not None else None
        done.update(path)
