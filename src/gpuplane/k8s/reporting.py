"""The controller's reporting write paths: why pending workloads wait (a QuotaReserved=False
condition and an Event), and the ClusterQueues' and LocalQueues' status."""

from __future__ import annotations

from functools import partial

from gpuplane.core.session import Plan, Reason
from gpuplane.k8s import api as k8s
from gpuplane.k8s.api import ApiError
from gpuplane.k8s.plan_writes import Write, pending_writes
from gpuplane.k8s.queue_status import QueueObjects, QueueStatusWrite, queue_status_writes
from gpuplane.k8s.writing import Tools


class PendingReasons:
    """Writes the core's reason on each pending workload (owns ``written``: the reason and message
    last written on each workload, so an unchanged reason is not written again)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.written: dict[str, tuple[str, str]] = {}

    def forget(self, workload: str) -> None:
        """The workload left the pending state (admitted again, requeued, finished): a later reason
        is written even if it is the one written before."""
        self.written.pop(workload, None)

    def record(self, plan: Plan) -> None:
        """Write the plan's pending reasons that differ from those written, all at once."""
        get = partial(self.cache.get, "Workload")
        writes = pending_writes(get, plan, self.tools.now(), self.written)
        self.tools.each(partial(self._write, w) for w in writes)

    def _write(self, write: Write) -> None:
        pending = write.pending
        assert pending is not None
        try:
            written = self.api.replace(k8s.WORKLOADS, write.body, sub="status")
        except ApiError:
            # The session reports a reason once; the next pass looks at every one again.
            self.tools.invalidate("a pending condition was not written")
            return
        self.cache.upsert("Workload", written)
        self.written[pending.workload] = (pending.reason, pending.message)
        where = ""
        if pending.position is not None:
            where = f" (position {pending.position} in ClusterQueue {pending.cluster_queue})"
        self.tools.event(written, "Normal", Reason.PENDING, f"{pending.reason}{where}: {pending.message}")


class QueueStatuses:
    """Brings every ClusterQueue's and LocalQueue's status (counts, flavor usage, Active) up to
    date (owns ``dirty``: whether an object the status is derived from changed since it was last
    derived, or a write of it failed)."""

    def __init__(self, tools: Tools) -> None:
        self.tools = tools
        self.api = tools.api
        self.cache = tools.cache
        self.dirty = True

    def write(self) -> None:
        """Only the statuses that differ are written (:mod:`gpuplane.k8s.queue_status`). Nothing is
        computed when none of the objects they are derived from changed."""
        if not self.dirty:
            return
        self.dirty = False
        items = self.cache.items
        objects = QueueObjects(
            cluster_queues=items("ClusterQueue"),
            local_queues=items("LocalQueue"),
            workloads=items("Workload"),
            flavors=items("ResourceFlavor"),
            topologies=items("Topology"),
            admission_checks=items("AdmissionCheck"),
        )
        writes = queue_status_writes(objects, self.tools.now_seconds())
        self.tools.each(partial(self._write, w) for w in writes)

    def _write(self, write: QueueStatusWrite) -> None:
        body = {"status": write.status}
        try:
            if write.kind == "ClusterQueue":
                written = self.api.patch(k8s.CLUSTER_QUEUES, write.name, body, sub="status")
            else:
                written = self.api.patch(k8s.LOCAL_QUEUES, write.name, body, write.namespace, sub="status")
        except ApiError as err:
            if not err.not_found:
                self.tools.counters.add("queue_status_failures")
                self.dirty = True  # computed and written again next pass
            return
        self.cache.upsert(write.kind, written)
