"""Fault injection and the request log: how tests make the double misbehave, and see what was called.

Modelled on Kueue's client interceptors: every request is described by a :class:`Request` before it is
handled; :class:`Faults` holds rules that match requests and decide, per request, whether to answer with
an error, delay, or cut a watch short. Each rule has a budget (``times``), an optional probability drawn
from a seeded generator, or an explicit ``schedule`` (one bool per matching request), so every run is
reproducible. Arbitrary interceptors (``intercept(fn)``) run first and may refuse a request.

Injected latency is real time on the server thread, so it is bounded (:data:`MAX_DELAY`): tests stay
fast and never sleep for long.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import STALE, ApiError, conflict

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
MAX_DELAY = 0.25  # seconds; the sum of all delays applied to one request


@dataclass(frozen=True)
class Request:
    """One API request as the double understood it. ``verb`` is the Kubernetes verb ("" for discovery)."""

    method: str
    path: str
    verb: str = ""
    group: str = ""
    version: str = ""
    resource: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    kind: str = ""
    query: Mapping[str, str] = field(default_factory=dict)
    body: Any = None
    content_type: str = ""
    user_agent: str = ""

    @property
    def is_write(self) -> bool:
        return self.verb in WRITE_VERBS


@dataclass(frozen=True)
class Exchange:
    """A request and the HTTP status it was answered with (200 for a watch that started streaming)."""

    request: Request
    status: int


def _names(resource: str | Iterable[str] | None) -> frozenset[str] | None:
    if resource is None:
        return None
    return frozenset({resource} if isinstance(resource, str) else resource)


@dataclass(frozen=True)
class Match:
    """Which requests a rule applies to. ``None`` matches anything.

    ``resource`` names a resource the way kubectl does: plural (``pods``), plural.group (``jobs.batch``)
    or kind (``Pod``).
    """

    verbs: frozenset[str] | None = None
    resources: frozenset[str] | None = None
    subresource: str | None = None
    namespace: str | None = None
    name: str | None = None

    def __call__(self, request: Request) -> bool:
        if self.verbs is not None and request.verb not in self.verbs:
            return False
        if self.resources is not None:
            names = {request.resource, f"{request.resource}.{request.group}", request.kind}
            if request.subresource:
                names |= {f"{request.resource}/{request.subresource}"}
            if not names & self.resources:
                return False
        if self.subresource is not None and request.subresource != self.subresource:
            return False
        if self.namespace is not None and request.namespace != self.namespace:
            return False
        return self.name is None or request.name == self.name


def matching(
    *,
    verbs: Iterable[str] | None = None,
    resource: str | Iterable[str] | None = None,
    subresource: str | None = None,
    namespace: str | None = None,
    name: str | None = None,
) -> Match:
    return Match(None if verbs is None else frozenset(verbs), _names(resource), subresource, namespace, name)


@dataclass
class Rule:
    """A fault: when a matching request comes and the trigger fires, ``error`` answers it.

    Trigger: ``schedule`` (one entry per matching request; exhausted means never again) if given,
    otherwise ``probability`` (seeded), in either case limited to ``times`` firings when set.
    """

    match: Match
    error: Callable[[Request], ApiError] | None = None
    delay: float = 0.0
    cut_after: int | None = None  # watch streams end after this many events
    abrupt: bool = False  # cut by dropping the connection instead of ending the stream cleanly
    times: int | None = None
    probability: float = 1.0
    schedule: deque[bool] | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    fired: int = 0

    def fires(self, request: Request) -> bool:
        """Whether this rule applies to ``request``; consumes one use of its budget when it does."""
        if not self.match(request):
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        if self.schedule is not None:
            hit = self.schedule.popleft() if self.schedule else False
        else:
            hit = self.probability >= 1.0 or self.rng.random() < self.probability
        if hit:
            self.fired += 1
        return hit

    @property
    def exhausted(self) -> bool:
        return (self.times is not None and self.fired >= self.times) or (
            self.schedule is not None and not self.schedule
        )


Interceptor = Callable[[Request], ApiError | None]


@dataclass(frozen=True)
class Decision:
    delay: float = 0.0
    error: ApiError | None = None


class Faults:
    """The fault hooks of one double. Thread-safe; rules apply to requests that start after they are added."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._interceptors: list[Interceptor] = []

    # --- building rules ----------------------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self._rules.append(rule)
        return rule

    def remove(self, rule: Rule | Interceptor) -> None:
        with self._lock:
            if isinstance(rule, Rule):
                self._rules.remove(rule)
            else:
                self._interceptors.remove(rule)

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._interceptors.clear()

    def intercept(self, interceptor: Interceptor) -> Interceptor:
        """Call ``interceptor`` with every request first; an ApiError it returns answers the request."""
        with self._lock:
            self._interceptors.append(interceptor)
        return interceptor

    def fail(
        self,
        code: int = 500,
        *,
        verbs: Iterable[str] | None = None,
        resource: str | Iterable[str] | None = None,
        subresource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        times: int | None = None,
        probability: float = 1.0,
        seed: int = 0,
        schedule: Iterable[bool] | None = None,
        reason: str = "",
        message: str = "injected fault",
    ) -> Rule:
        """Answer matching requests with ``code`` (a Status with ``reason`` and ``message``)."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        return self.add(
            Rule(
                matching(
                    verbs=verbs, resource=resource, subresource=subresource, namespace=namespace, name=name
                ),
                error=lambda _request: ApiError(code, message, reason),
                times=times,
                probability=probability,
                schedule=None if schedule is None else deque(schedule),
                rng=random.Random(seed),
            )
        )

    def conflict(
        self,
        times: int = 1,
        *,
        resource: str | Iterable[str] | None = None,
        verbs: Iterable[str] = ("update", "patch"),
    ) -> Rule:
        """The next ``times`` matching writes fail with 409 Conflict, as if another writer got there first.

        Updates and patches by default; pass ``verbs`` to include others, e.g.
        ``conflict(resource="pods/binding", verbs=("create",))`` for bindings.
        """

        def stale(request: Request) -> ApiError:
            name = request.name or ((request.body or {}).get("metadata") or {}).get("name", "")
            plural = f"{request.resource}/{request.subresource}" if request.subresource else request.resource
            return conflict(plural, request.group, name, STALE)

        return self.add(Rule(matching(verbs=verbs, resource=resource), error=stale, times=times))

    def expire(
        self,
        times: int = 1,
        *,
        resource: str | Iterable[str] | None = None,
        verbs: Iterable[str] = ("list", "watch"),
    ) -> Rule:
        """The next ``times`` matching lists answer 410 Expired; watches get an ERROR event with 410."""
        message = "The resourceVersion for the provided watch is too old."
        return self.add(
            Rule(
                matching(verbs=verbs, resource=resource),
                error=lambda _r: ApiError(410, message, "Expired"),
                times=times,
            )
        )

    def delay(
        self,
        seconds: float,
        *,
        verbs: Iterable[str] | None = None,
        resource: str | Iterable[str] | None = None,
        times: int | None = None,
    ) -> Rule:
        """Slow matching requests down by ``seconds`` (at most :data:`MAX_DELAY` in all)."""
        if not 0 < seconds <= MAX_DELAY:
            raise ValueError(f"injected latency must be within (0, {MAX_DELAY}] seconds: tests do not sleep")
        return self.add(Rule(matching(verbs=verbs, resource=resource), delay=seconds, times=times))

    def cut_watches(
        self,
        after: int,
        *,
        resource: str | Iterable[str] | None = None,
        abrupt: bool = False,
        times: int | None = None,
    ) -> Rule:
        """End every matching watch stream after ``after`` events (``abrupt``: drop the connection)."""
        if after < 0:
            raise ValueError("after must be >= 0")
        return self.add(
            Rule(matching(verbs=("watch",), resource=resource), cut_after=after, abrupt=abrupt, times=times)
        )

    def block_evictions(
        self, times: int | None = None, *, code: int = 429, namespace: str | None = None
    ) -> Rule:
        """Refuse evictions as a PodDisruptionBudget would (429), or with another code such as 500."""
        message = "Cannot evict pod as it would violate the pod's disruption budget."
        reason = "TooManyRequests" if code == 429 else ""
        details = {
            "causes": [
                {"reason": "DisruptionBudget", "message": "The disruption budget needs more healthy pods"}
            ]
        }
        return self.add(
            Rule(
                matching(verbs=("create",), resource="pods", subresource="eviction", namespace=namespace),
                error=lambda _r: ApiError(code, message, reason, details if code == 429 else {}),
                times=times,
            )
        )

    # --- applying them (called by the server) -------------------------------------------------------

    def decide(self, request: Request) -> Decision:
        """What to do with a request: the delay to add and the error to answer with, if any."""
        with self._lock:
            interceptors = list(self._interceptors)
        for interceptor in interceptors:
            refusal = interceptor(request)
            if refusal is not None:
                return Decision(error=refusal)
        delay = 0.0
        with self._lock:
            for rule in self._rules:
                if rule.cut_after is not None:
                    continue
                if rule.error is None and rule.delay and rule.fires(request):
                    delay += rule.delay
                elif rule.error is not None and rule.fires(request):
                    return Decision(min(delay, MAX_DELAY), rule.error(request))
        return Decision(min(delay, MAX_DELAY))

    def watch_cut(self, request: Request) -> Rule | None:
        """The cut rule for a watch stream that is about to start, if any (consumes its budget)."""
        with self._lock:
            for rule in self._rules:
                if rule.cut_after is not None and rule.fires(request):
                    return rule
        return None

    def rules(self) -> list[Rule]:
        with self._lock:
            return list(self._rules)


class RequestLog:
    """Every request the double answered, in arrival order; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._exchanges: list[Exchange] = []

    def record(self, exchange: Exchange) -> None:
        with self._lock:
            self._exchanges.append(exchange)

    def __iter__(self) -> Iterator[Exchange]:
        with self._lock:
            return iter(list(self._exchanges))

    def __len__(self) -> int:
        with self._lock:
            return len(self._exchanges)

    def clear(self) -> None:
        with self._lock:
            self._exchanges.clear()

    def find(
        self,
        *,
        verb: str | None = None,
        resource: str | None = None,
        subresource: str | None = None,
        namespace: str | None = None,
        name: str | None = None,
        status: int | None = None,
    ) -> list[Exchange]:
        """Exchanges whose request matches every given field (``resource`` as in :class:`Match`)."""
        wanted = matching(
            verbs=None if verb is None else (verb,),
            resource=resource,
            subresource=subresource,
            namespace=namespace,
            name=name,
        )
        return [e for e in self if wanted(e.request) and (status is None or e.status == status)]

    def bindings(self) -> list[tuple[str, str, str]]:
        """Successful bindings as (namespace, pod, node), in order."""
        found = []
        for exchange in self.find(verb="create", resource="pods", subresource="binding"):
            if 200 <= exchange.status < 300:
                target = (exchange.request.body or {}).get("target") or {}
                found.append((exchange.request.namespace, exchange.request.name, str(target.get("name", ""))))
        return found
