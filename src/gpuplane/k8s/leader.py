"""Leader election with a coordination.k8s.io/v1 Lease.

Only the replica holding the lease acts. A holder renews the lease every loop; a
candidate takes it over once ``renewTime + leaseDurationSeconds`` has passed. Every
write carries the lease's resourceVersion, so two replicas can never both win the
same term: the loser gets 409 Conflict and stays a follower.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuplane.k8s.api import LEASES, ApiError, KubeApi
from gpuplane.model.fields import lenient_timestamp


def micro_time(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


parse_time = lenient_timestamp


class LeaderElector:
    def __init__(
        self,
        api: KubeApi,
        identity: str,
        *,
        name: str = "gpuplane-controller",
        namespace: str = "gpuplane-system",
        lease_duration: float = 15.0,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.api = api
        self.identity = identity
        self.name = name
        self.namespace = namespace
        self.lease_duration = lease_duration
        self.clock = clock or time.time
        self.is_leader = False
        self.transitions = 0

    def _spec(self, now: float, previous: dict[str, Any] | None) -> dict[str, Any]:
        taking_over = previous is None or previous.get("holderIdentity") != self.identity
        spec = dict(previous or {})
        spec.update(
            {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self.lease_duration),
                "renewTime": micro_time(now),
            }
        )
        if taking_over:
            spec["acquireTime"] = micro_time(now)
            spec["leaseTransitions"] = int(spec.get("leaseTransitions", 0)) + (previous is not None)
        return spec

    def try_acquire_or_renew(self) -> bool:
        """One election step; returns whether this replica leads now."""
        now = self.clock()
        try:
            lease = self.api.get(LEASES, self.name, self.namespace)
        except ApiError as err:
            if not err.not_found:
                self.is_leader = False
                return False
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, None),
            }
            try:
                self.api.create(LEASES, body, self.namespace)
            except ApiError:
                self.is_leader = False
                return False
            self.is_leader = True
            return True
        spec = lease.get("spec", {}) or {}
        holder = spec.get("holderIdentity")
        renewed = parse_time(spec.get("renewTime")) or 0.0
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and renewed + duration > now:
            self.is_leader = False
            return False
        lease["spec"] = self._spec(now, spec)
        try:
            self.api.replace(LEASES, lease)
        except ApiError:
            self.is_leader = False
            return False
        if not self.is_leader:
            self.transitions += 1
        self.is_leader = True
        return True

    def release(self) -> None:
        """Give the lease up on a clean shutdown so a standby takes over at once."""
        if not self.is_leader:
            return
        try:
            lease = self.api.get(LEASES, self.name, self.namespace)
            if lease.get("spec", {}).get("holderIdentity") == self.identity:
                lease["spec"]["holderIdentity"] = None
                lease["spec"]["renewTime"] = micro_time(0)
                self.api.replace(LEASES, lease)
        except ApiError:
            pass
        self.is_leader = False
