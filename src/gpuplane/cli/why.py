"""`gpuplane why NAME`: why a pod, job or workload is pending, what blocks it, the fix, the ETA.

Thin edge: read the state (files, or the API server with ``--kubeconfig``), run the core to
a fixed point as ``gpuplane schedule`` does, and print :func:`gpuplane.insight.why.explain`.
Bad input (a file, an unknown name) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from gpuplane.cli.schedule import OutputFormat, default_now
from gpuplane.core.session import config_from_kueue, schedule
from gpuplane.insight.bypass import bypassed_job_message
from gpuplane.insight.runtime_history import RuntimeSample
from gpuplane.insight.why import Explanation, NotFoundError, explain, resolve, split_reference
from gpuplane.model.errors import InputError
from gpuplane.model.fields import timestamp
from gpuplane.model.loader import load_files
from gpuplane.model.objects import ClusterState, Workload

if TYPE_CHECKING:
    from gpuplane.web.fleet import FleetWorker


def _read(path: str) -> bytes:
    if path == "-":
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def _cluster_state(
    kubeconfig: str, context: str | None, namespace: str, unreadable: list[str]
) -> ClusterState:
    """The cluster as these credentials may read it: a team member's token that may not list a
    kind cluster-wide reads it in ``namespace``, and what it cannot read is named in ``unreadable``."""
    from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - the client loads only when asked
    from gpuplane.k8s.state import read_state  # noqa: PLC0415

    api = KubeApi(load_api_client(kubeconfig, context))
    return read_state(api, namespace=namespace, unreadable=unreadable)


def _cluster_history(kubeconfig: str, context: str | None) -> tuple[RuntimeSample, ...]:
    """The runtimes the controller learned (its ConfigMap), where these credentials may read them."""
    from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - the client loads only when asked
    from gpuplane.k8s.state import read_runtime_history  # noqa: PLC0415

    return read_runtime_history(KubeApi(load_api_client(kubeconfig, context)))


def _cluster_fleet(kubeconfig: str, context: str | None, err: Console) -> tuple[FleetWorker, ...]:
    """The MultiKueue workers, when the cluster is a manager: none where these credentials may not
    list MultiKueueClusters or the kind is not installed; another failure is a note on stderr (the
    answer stands without the fleet)."""
    from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - the client loads only when asked
    from gpuplane.web.fleet import read_fleet  # noqa: PLC0415

    try:
        return read_fleet(KubeApi(load_api_client(kubeconfig, context)))
    except Exception as problem:  # the fleet is extra: any failure is one line
        err.print(f"note: the MultiKueue fleet cannot be read: {problem}".splitlines()[0], markup=False)
        return ()


def fleet_json(fleet: tuple[FleetWorker, ...], wl: Workload) -> dict[str, object]:
    """``"fleet"`` (each worker's summary) and ``"runsOn"`` for ``--output json``; nothing without
    a fleet."""
    from gpuplane.web.fleet import placement_of  # noqa: PLC0415

    if not fleet:
        return {}
    return {"fleet": [worker.to_json() for worker in fleet], "runsOn": placement_of(wl)}


def print_fleet(
    fleet: tuple[FleetWorker, ...], wl: Workload, gpu_resources: tuple[str, ...], console: Console
) -> None:
    """The Fleet section: one line per worker (health, GPUs used/quota, pending/admitted), and
    where this workload runs. Nothing without a fleet."""
    from gpuplane.web.fleet import count, placement_of  # noqa: PLC0415

    if not fleet:
        return
    table = Table(title="Fleet (MultiKueue workers)", title_justify="left")
    for col in ("worker", "health", "GPUs used/quota", "pending/admitted"):
        table.add_column(col, overflow="fold")
    for worker in fleet:
        gpus = worker.gpus(gpu_resources)
        table.add_row(
            worker.name,
            worker.health,
            "-" if gpus is None else f"{count(gpus[0])}/{count(gpus[1])}",
            "-" if worker.summary is None else f"{worker.pending}/{worker.admitted}",
        )
    console.print(table)
    where = placement_of(wl)
    console.print(f"{wl.key} runs on: {where}" if where else f"{wl.key} is not dispatched to a worker")


def _resolve(
    state: ClusterState, name: str, namespace: str, kubeconfig: str | None, context: str | None
) -> Workload:
    """:func:`resolve`; on a live cluster, a job that has no Workload because it went around
    gpuplane (queued, but created unsuspended) is said to have done so, with the fix."""
    try:
        return resolve(state, name, namespace)
    except NotFoundError:
        if not kubeconfig:
            raise
        from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415
        from gpuplane.k8s.guardrails import bypassed_job  # noqa: PLC0415

        kind, short = split_reference(name)
        try:
            found = bypassed_job(KubeApi(load_api_client(kubeconfig, context)), kind, short, namespace)
        except Exception:  # the hint is extra: when it cannot be had, the plain answer stands
            found = None
        if found is None:
            raise
        raise NotFoundError(bypassed_job_message(found.kind, found.key, found.queue)) from None


# Without these the core cannot decide for the workload (its queue, quota and flavors are unknown).
BLIND_WITHOUT = frozenset(("clusterqueues", "resourceflavors"))
UNKNOWN = "unknown"


def as_recorded(wl: Workload, found: Explanation) -> Explanation:
    """What the Workload itself says, for credentials that cannot read the queue configuration:
    the reason the controller recorded in its ``QuotaReserved`` condition, or its admission. The
    core's own decision would be made on a cluster with no queues, and say so wrongly."""
    cond = wl.condition("QuotaReserved")
    if wl.admission is not None:
        reason, message = "Admitted", f"quota reserved in ClusterQueue {wl.admission.cluster_queue}"
    elif cond is not None and not cond.status and cond.reason:
        reason, message = cond.reason, f"{cond.message} (recorded by the controller on the Workload)"
    else:
        reason, message = "Pending", "the controller has recorded no reason on the Workload yet"
    basis = f"{UNKNOWN}: the queue configuration cannot be read with these credentials"
    return replace(
        found,
        cluster_queue=wl.admission.cluster_queue if wl.admission is not None else found.cluster_queue,
        position_in_cluster_queue=None,
        position_in_local_queue=None,
        eta=replace(found.eta, seconds=None, low=None, high=None, basis=basis),
        reason=reason,
        message=message,
        blockers=(),
        fix="for the full answer (position, ETA, what blocks it) ask an admin to let you read "
        "ClusterQueues and ResourceFlavors, or to run `gpuplane why` for you",
    )


def _from_one(position: int | None) -> int | None:
    """A position as people count it: 1 is next. The insight (and Kueue's visibility API, which
    serves it) counts from 0; every output for people (``why``, Events, the console) counts from 1."""
    return None if position is None else position + 1


def print_explanation(found: Explanation, console: Console) -> None:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    eta = found.eta
    if eta.seconds is None:
        when = UNKNOWN if eta.basis.startswith(UNKNOWN) else "never by itself"
    else:
        when = f"in {eta.seconds:.0f}s (between {eta.low:.0f}s and {eta.high:.0f}s)"
    rows = [
        ("workload", found.workload),
        ("cluster queue", found.cluster_queue or "-"),
        ("local queue", found.local_queue or "-"),
        (
            "position",
            "-"
            if found.position_in_cluster_queue is None
            else f"{_from_one(found.position_in_cluster_queue)} in ClusterQueue, "
            f"{_from_one(found.position_in_local_queue)} in LocalQueue (1 is next)",
        ),
        ("reason", found.reason),
        ("message", found.message),
        ("starts", when),
        ("eta basis", eta.basis),
        ("fix", found.fix),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if found.blockers:
        blockers = Table(title="Blocked by", title_justify="left")
        for col in ("kind", "name", "detail"):
            blockers.add_column(col, overflow="fold")
        for b in found.blockers:
            blockers.add_row(b.kind, b.name, b.detail)
        console.print(blockers)


def run_why(
    name: str,
    namespace: str,
    files: list[str],
    kubeconfig: str | None,
    context: str | None,
    output: OutputFormat,
    now: str | None,
) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if bool(files) == bool(kubeconfig):
        err.print("error: give either -f STATE or --kubeconfig K", markup=False)
        return 2
    unreadable: list[str] = []
    history: tuple[RuntimeSample, ...] = ()
    try:
        if kubeconfig:
            try:
                state = _cluster_state(kubeconfig, context, namespace, unreadable)
                history = _cluster_history(kubeconfig, context)
            except Exception as problem:  # any transport or configuration failure is one line
                err.print(f"error: cannot read the cluster: {problem}".splitlines()[0], markup=False)
                return 2
            at = time.time() if now is None else timestamp(now, "--now")
        else:
            state = load_files(files, read=_read)
            at = default_now(state) if now is None else timestamp(now, "--now")
        wl = _resolve(state, name, namespace, kubeconfig, context)
        config = config_from_kueue(state.configuration)
        plan = schedule(state, config, at, cycles=None)
        found = explain(state, plan, at, wl.key, config, history=history)
        if BLIND_WITHOUT & set(unreadable):
            found = as_recorded(wl, found)
        fleet = _cluster_fleet(kubeconfig, context, err) if kubeconfig else ()
    except (InputError, NotFoundError, OSError) as problem:
        err.print(f"error: {problem}", markup=False)
        return 2
    if unreadable:
        err.print(
            "note: these credentials may not read "
            + ", ".join(unreadable)
            + "; the answer comes from what they can read (ask an admin for the rest)",
            markup=False,
        )
    if output is OutputFormat.json:
        answer = found.to_json()
        for field in ("positionInClusterQueue", "positionInLocalQueue"):
            answer[field] = _from_one(answer[field])
        if unreadable:
            answer["unreadable"] = unreadable
        answer.update(fleet_json(fleet, wl))
        sys.stdout.write(json.dumps(answer, indent=1) + "\n")
    else:
        out = Console(highlight=False)
        print_explanation(found, out)
        print_fleet(fleet, wl, config.devices.whole_resources, out)
    return 0


def register(app: typer.Typer) -> None:
    """Add the ``why`` command to ``app``."""

    @app.command("why")
    def why_command(
        name: Annotated[
            str,
            typer.Argument(
                help="[KIND/]NAME as kubectl spells it: job/train, pod/train-0, workload/w; bare: a Workload."
            ),
        ],
        namespace: Annotated[str, typer.Option("--namespace", "-n", help="Namespace of NAME.")] = "default",
        file: Annotated[
            list[str] | None,
            typer.Option(
                "--file", "-f", help="Cluster state file(s), as for gpuplane schedule; - for stdin."
            ),
        ] = None,
        kubeconfig: Annotated[
            str | None, typer.Option(help="Read the state from this cluster instead of files.")
        ] = None,
        context: Annotated[str | None, typer.Option(help="kubeconfig context.")] = None,
        output: Annotated[
            OutputFormat, typer.Option("--output", "-o", help="json or table.")
        ] = OutputFormat.table,
        now: Annotated[
            str | None,
            typer.Option(help="The current time (RFC 3339); default: the latest time in the files, or now."),
        ] = None,
    ) -> None:
        """Why a workload is pending: reason, blocking objects, the fix, queue position and ETA."""
        try:
            code = run_why(name, namespace, file or [], kubeconfig, context, output, now)
        except Exception as bug:  # the one place a bug becomes a single line, never a traceback
            typer.echo(f"internal error: {type(bug).__name__}: {bug}", err=True)
            raise typer.Exit(1) from None
        raise typer.Exit(code)
