"""Client-side rate limiting of API requests (QPS and burst), as client-go's token bucket.

Kept apart from :mod:`gpuplane.kube.client` so that the command line can read the defaults without
importing the Kubernetes client.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

DEFAULT_QPS = 1000.0
DEFAULT_BURST = 2000


class RateLimiter:
    """A token bucket, as client-go's: ``burst`` requests at once, then ``qps`` per second.

    :meth:`acquire` blocks until a token is free and is safe to call from many threads. Tokens are
    handed out in call order (each caller reserves the next slot under the lock, then waits for it
    outside), so a thread never starves. ``clock`` and ``sleep`` are injectable for tests.
    """

    def __init__(
        self,
        qps: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if qps <= 0 or burst < 1:
            raise ValueError(f"qps must be > 0 and burst >= 1 (got qps={qps}, burst={burst})")
        self.qps = qps
        self.burst = burst
        self.clock = clock
        self.sleep = sleep
        self._lock = threading.Lock()
        self._tokens = float(burst)
        self._updated = clock()

    def acquire(self) -> float:
        """Take one token, waiting for it if the bucket is empty; returns the seconds waited."""
        with self._lock:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._updated) * self.qps)
            self._updated = now
            self._tokens -= 1.0  # may go below zero: that reserves a slot in the future
            wait = 0.0 if self._tokens >= 0 else -self._tokens / self.qps
        if wait > 0:
            self.sleep(wait)
        return wait
