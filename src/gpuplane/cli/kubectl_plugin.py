"""`kubectl gpuplane`: the kubectl plugin, installed as the console script ``kubectl-gpuplane``.

kubectl runs an executable named ``kubectl-gpuplane`` found on the ``PATH`` for ``kubectl gpuplane
...``, with the words that follow and kubectl's own environment (``KUBECONFIG`` included). This
module maps kubectl's flags (``--kubeconfig``, ``--context``, ``-n``/``--namespace``,
``-A``/``--all-namespaces``) onto gpuplane's commands; it decides nothing itself:

* ``why [KIND/]NAME``: ``gpuplane why NAME --kubeconfig K`` (:func:`gpuplane.cli.why.run_why`);
  ``job/train`` is the Workload of Job ``train``.
* ``queue``: the pending workloads with their position, reason and ETA: the view that the visibility
  API serves (:func:`gpuplane.k8s.visibility.view_of_state` on the state ``gpuplane why`` reads).
* ``top``: GPU-equivalents allocated to bound pods per team (``gpuplane.insight.usage``, as the
  exporter counts them), and, with ``--prometheus``, how many of them were busy on average over
  ``--window`` (the recording rule ``gpuplane:pod_gpus_busy:sum`` that ``gpuplane report
  chargeback`` reads).

The kubeconfig is kubectl's: ``--kubeconfig``, else ``$KUBECONFIG``, else ``~/.kube/config``; the
namespace is ``-n``, else the context's, else ``default``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from gpuplane import __version__
from gpuplane.cli.report import BUSY, ReportError, duration_seconds, gpu_hours
from gpuplane.cli.schedule import OutputFormat
from gpuplane.cli.why import run_why
from gpuplane.model.errors import InputError
from gpuplane.model.objects import ClusterState

PLUGIN = "kubectl-gpuplane"
DEFAULT_NAMESPACE = "default"

KubeconfigOption = Annotated[
    str | None,
    typer.Option(help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config), as kubectl takes it."),
]
ContextOption = Annotated[str | None, typer.Option(help="kubeconfig context, as kubectl takes it.")]
NamespaceOption = Annotated[
    str | None,
    typer.Option("--namespace", "-n", help="Namespace (default: the context's, else default)."),
]
AllNamespacesOption = Annotated[
    bool, typer.Option("--all-namespaces", "-A", help="Every namespace (queue and top).")
]
OutputOption = Annotated[OutputFormat, typer.Option("--output", "-o", help="json or table.")]


class PluginError(Exception):
    """Bad flags or an unreadable kubeconfig: one line on stderr, exit status 2."""


@dataclass(frozen=True)
class Target:
    """Where a plugin command reads: the kubeconfig (kubectl's), its context, and the namespace
    (``None`` with ``-A``)."""

    kubeconfig: str
    context: str | None
    namespace: str | None

    @property
    def scope(self) -> str:
        return "every namespace" if self.namespace is None else f"namespace {self.namespace}"


def kubeconfig_path(flag: str | None, environ: dict[str, str] | None = None) -> str:
    """kubectl's choice of kubeconfig: the flag, else ``$KUBECONFIG`` (a list of files, as kubectl
    merges them), else ``~/.kube/config``."""
    env = os.environ if environ is None else environ
    if flag:
        if not Path(flag).is_file():
            raise PluginError(f"--kubeconfig {flag}: no such file")
        return flag
    listed = env.get("KUBECONFIG", "")
    if listed:
        existing = [p for p in listed.split(os.pathsep) if p and Path(p).is_file()]
        if not existing:
            raise PluginError(f"KUBECONFIG={listed}: no such file")
        return os.pathsep.join(existing)
    home = Path(env.get("HOME") or Path.home())
    default = home / ".kube" / "config"
    if not default.is_file():
        raise PluginError(f"no kubeconfig: give --kubeconfig, set KUBECONFIG, or write {default}")
    return str(default)


def context_namespace(kubeconfig: str, context: str | None) -> str:
    """The namespace that ``context`` (or the current context) of ``kubeconfig`` names, as kubectl
    defaults ``-n`` to it; ``default`` when it names none."""
    from kubernetes import config as k8s_config  # noqa: PLC0415 - the client loads only when asked

    try:
        contexts, current = k8s_config.list_kube_config_contexts(config_file=kubeconfig)  # type: ignore[no-untyped-call]
    except Exception as err:  # an unreadable kubeconfig is one line, as kubectl says it
        raise PluginError(f"cannot read the kubeconfig {kubeconfig}: {err}".splitlines()[0]) from None
    chosen = current if context is None else next((c for c in contexts if c.get("name") == context), None)
    if chosen is None:
        raise PluginError(f'context "{context}" does not exist in {kubeconfig}')
    namespace = (chosen.get("context") or {}).get("namespace")
    return str(namespace) if namespace else DEFAULT_NAMESPACE


def target(
    kubeconfig: str | None, context: str | None, namespace: str | None, all_namespaces: bool
) -> Target:
    """kubectl's flags, resolved as kubectl resolves them."""
    path = kubeconfig_path(kubeconfig)
    if all_namespaces:
        if namespace is not None:
            raise PluginError("give -n NAMESPACE or -A, not both")
        return Target(path, context, None)
    return Target(path, context, namespace or context_namespace(path, context))


def read_cluster(where: Target, unreadable: list[str]) -> ClusterState:
    """The state ``gpuplane why`` reads, with these credentials (namespaced kinds they may not list
    cluster-wide are read in ``where``'s namespace and named in ``unreadable``)."""
    from gpuplane.k8s.api import KubeApi, load_api_client  # noqa: PLC0415 - the client loads only when asked
    from gpuplane.k8s.state import read_state  # noqa: PLC0415

    try:
        api = KubeApi(load_api_client(where.kubeconfig, where.context))
        return read_state(api, namespace=where.namespace, unreadable=unreadable)
    except InputError:
        raise
    except Exception as problem:  # any transport or configuration failure is one line
        raise PluginError(f"cannot read the cluster: {problem}".splitlines()[0]) from None


def _note_unreadable(unreadable: list[str], err: Console) -> None:
    if unreadable:
        err.print(
            "note: these credentials may not read " + ", ".join(unreadable) + "; the answer comes from "
            "what they can read",
            markup=False,
        )


# --- queue --------------------------------------------------------------------------------------


def queue_rows(state: ClusterState, namespace: str | None, now: float) -> list[dict[str, Any]]:
    """The pending workloads of ``namespace`` (every one with ``None``), in ClusterQueue order: the
    items of the visibility API's ``PendingWorkloadsSummary``, positions counted from 1."""
    from gpuplane.k8s.visibility import view_of_state  # noqa: PLC0415 - the client loads only when asked

    view = view_of_state(state, now)
    rows = []
    for found in view.explanations:
        if found.position_in_cluster_queue is None:
            continue
        ns, _, name = found.workload.partition("/")
        if namespace is not None and ns != namespace:
            continue
        eta = found.eta
        rows.append(
            {
                "namespace": ns,
                "workload": name,
                "clusterQueue": found.cluster_queue or "",
                "localQueue": (found.local_queue or "").partition("/")[2],
                "positionInClusterQueue": found.position_in_cluster_queue + 1,
                "positionInLocalQueue": None
                if found.position_in_local_queue is None
                else found.position_in_local_queue + 1,
                "reason": found.reason,
                "message": found.message,
                "etaSeconds": eta.seconds,
            }
        )
    rows.sort(key=lambda r: (r["clusterQueue"], r["positionInClusterQueue"]))
    return rows


def _eta_text(seconds: float | None) -> str:
    return "never by itself" if seconds is None else f"{seconds:.0f}s"


def print_queue(rows: list[dict[str, Any]], where: Target, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps({"items": rows}, indent=1) + "\n")
        return
    console = Console(highlight=False, width=200)
    if not rows:
        console.print(f"No pending workloads in {where.scope}.", markup=False)
        return
    table = Table(box=None, pad_edge=False, header_style="")
    columns = (["NAMESPACE"] if where.namespace is None else []) + [
        "WORKLOAD",
        "CLUSTERQUEUE",
        "LOCALQUEUE",
        "POSITION",
        "REASON",
        "ETA",
    ]
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        cells = [row["namespace"]] if where.namespace is None else []
        cells += [
            row["workload"],
            row["clusterQueue"],
            row["localQueue"],
            str(row["positionInClusterQueue"]),
            row["reason"],
            _eta_text(row["etaSeconds"]),
        ]
        table.add_row(*cells)
    console.print(table)


# --- top ----------------------------------------------------------------------------------------


def allocated_by_team(state: ClusterState, namespace: str | None) -> dict[str, tuple[float, int]]:
    """GPU-equivalents bound pods hold now, and how many pods, per team (the pod's ``team`` label,
    else its namespace's, else ``none``), as the exporter's ``gpuplane_pod_gpus_allocated`` counts."""
    from gpuplane.core.session import config_from_kueue  # noqa: PLC0415
    from gpuplane.insight.usage import pod_allocations  # noqa: PLC0415

    config = config_from_kueue(state.configuration)
    gpus: dict[str, float] = defaultdict(float)
    pods: dict[str, int] = defaultdict(int)
    for held in pod_allocations(state, config.devices):
        if namespace is not None and held.namespace != namespace:
            continue
        gpus[held.team] += held.gpus
        pods[held.team] += 1
    return {team: (gpus[team], pods[team]) for team in gpus}


def busy_by_team(prometheus: str, namespace: str | None, window: str, now: float) -> dict[str, float]:
    """GPUs busy per team, on average over ``window`` before ``now``: the chargeback's GPU-hours of
    ``gpuplane:pod_gpus_busy:sum`` over the window, divided by its length."""
    seconds = duration_seconds(window, "--window")
    step = max(1, min(60, seconds // 10))
    series = BUSY if namespace is None else f'{BUSY}{{namespace="{namespace}"}}'
    hours = gpu_hours(prometheus, series, "team", seconds, step, now)
    return {team: value * 3600 / seconds for team, value in hours.items()}


def top_rows(allocated: dict[str, tuple[float, int]], busy: dict[str, float] | None) -> list[dict[str, Any]]:
    teams = sorted(set(allocated) | set(busy or {}))
    rows = []
    for team in teams:
        gpus, pods = allocated.get(team, (0.0, 0))
        row: dict[str, Any] = {"team": team, "pods": pods, "gpusAllocated": round(gpus, 3)}
        row["gpusBusy"] = None if busy is None else round(busy.get(team, 0.0), 3)
        rows.append(row)
    return rows


def print_top(rows: list[dict[str, Any]], where: Target, window: str, output: OutputFormat) -> None:
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps({"items": rows}, indent=1) + "\n")
        return
    console = Console(highlight=False, width=200)
    if not rows:
        console.print(f"No pod holds a GPU in {where.scope}.", markup=False)
        return
    table = Table(box=None, pad_edge=False, header_style="")
    for column in ("TEAM", "PODS", "GPUS ALLOCATED", f"GPUS BUSY ({window} avg)"):
        table.add_column(column, justify="left")
    for row in rows:
        busy = "-" if row["gpusBusy"] is None else f"{row['gpusBusy']:g}"
        table.add_row(row["team"], str(row["pods"]), f"{row['gpusAllocated']:g}", busy)
    console.print(table)


# --- the app ------------------------------------------------------------------------------------


def _guarded(run: Callable[[Console], int]) -> None:
    """Run one command: bad input is one line and status 2, a bug one line and status 1."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    try:
        code = run(err)
    except (PluginError, ReportError, InputError, OSError) as problem:
        err.print(f"error: {problem}", markup=False)
        raise typer.Exit(2) from None
    except typer.Exit:
        raise
    except Exception as bug:  # the one place a bug becomes a single line, never a traceback
        err.print(f"internal error: {type(bug).__name__}: {bug}", markup=False)
        raise typer.Exit(1) from None
    raise typer.Exit(code)


def build_plugin() -> typer.Typer:
    """A fresh ``kubectl-gpuplane`` app (a new object per call, no shared state)."""
    app = typer.Typer(name="kubectl gpuplane", no_args_is_help=True, add_completion=False)

    @app.callback()
    def _root() -> None:
        """gpuplane from kubectl: why a job waits, the queues, GPUs per team."""

    @app.command("version")
    def version_command() -> None:
        """Print the gpuplane version."""
        typer.echo(f"{PLUGIN} (gpuplane {__version__})")

    @app.command("why")
    def why_command(
        name: Annotated[
            str, typer.Argument(help="[KIND/]NAME as kubectl spells it: job/train, pod/train-0, workload/w.")
        ],
        kubeconfig: KubeconfigOption = None,
        context: ContextOption = None,
        namespace: NamespaceOption = None,
        all_namespaces: AllNamespacesOption = False,
        output: OutputOption = OutputFormat.table,
    ) -> None:
        """Why a workload is pending: reason, what blocks it, the fix, queue position and ETA."""

        def run(_: Console) -> int:
            if all_namespaces:
                raise PluginError("why names one object: give -n NAMESPACE, not -A")
            where = target(kubeconfig, context, namespace, False)
            assert where.namespace is not None
            return run_why(name, where.namespace, [], where.kubeconfig, where.context, output, None)

        _guarded(run)

    @app.command("queue")
    def queue_command(
        kubeconfig: KubeconfigOption = None,
        context: ContextOption = None,
        namespace: NamespaceOption = None,
        all_namespaces: AllNamespacesOption = False,
        output: OutputOption = OutputFormat.table,
    ) -> None:
        """Pending workloads in queue order: position in their ClusterQueue, reason and ETA."""

        def run(err: Console) -> int:
            where = target(kubeconfig, context, namespace, all_namespaces)
            unreadable: list[str] = []
            state = read_cluster(where, unreadable)
            _note_unreadable(unreadable, err)
            print_queue(queue_rows(state, where.namespace, time.time()), where, output)
            return 0

        _guarded(run)

    @app.command("top")
    def top_command(
        kubeconfig: KubeconfigOption = None,
        context: ContextOption = None,
        namespace: NamespaceOption = None,
        all_namespaces: AllNamespacesOption = False,
        prometheus: Annotated[
            str | None,
            typer.Option(help="Prometheus base URL with gpuplane's recording rules, for GPUs busy."),
        ] = None,
        window: Annotated[str, typer.Option(help="Busy GPUs are averaged over this window.")] = "5m",
        output: OutputOption = OutputFormat.table,
    ) -> None:
        """GPUs allocated to bound pods per team now, and busy (with --prometheus)."""

        def run(err: Console) -> int:
            where = target(kubeconfig, context, namespace, all_namespaces)
            duration_seconds(window, "--window")
            unreadable: list[str] = []
            state = read_cluster(where, unreadable)
            _note_unreadable(unreadable, err)
            busy = (
                None if prometheus is None else busy_by_team(prometheus, where.namespace, window, time.time())
            )
            print_top(top_rows(allocated_by_team(state, where.namespace), busy), where, window, output)
            return 0

        _guarded(run)

    return app


def main() -> None:
    """Console-script entry point of ``kubectl-gpuplane``."""
    build_plugin()(prog_name="kubectl gpuplane")


if __name__ == "__main__":
    main()
