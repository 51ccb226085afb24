"""Warnings to a Slack-compatible incoming webhook, delivered off the reaper's loop.

``SlackNotifier.send(message)`` only enqueues and returns at once; one background thread posts the
messages in order. A ``429`` waits for its ``Retry-After`` (seconds) and tries again; any other failure
(a 5xx, a refused connection, a receiver that hangs past ``timeout``) backs off exponentially up to
``max_backoff`` and tries again (the notifier's ``Retry``). A message is dropped only after
``max_attempts`` tries (default: keep trying) or when the notifier is closed without ``drain``. So a
slow or failing receiver delays no reclaim decision and loses no warning.

The body is Slack's: ``{"text": ..., "blocks": [...]}`` with a header, one section of fields naming the
pod, owner, GPUs, idle time and reclaim time, and a context line saying how to keep the session.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpuplane.insight import idle

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class IdleNotice:
    namespace: str
    pod: str
    owner_kind: str
    owner_name: str
    gpus: int
    idle_seconds: float
    reclaim_at: float
    reclaimed: bool = False


def slack_body(warning: IdleNotice) -> dict[str, Any]:
    """The webhook body for one warning (or reclaim notice)."""
    idle_for = idle.format_duration(warning.idle_seconds)
    at = idle.format_time(warning.reclaim_at)
    where = f"{warning.namespace}/{warning.pod}"
    owner = f"{warning.owner_kind} {warning.owner_name}"
    if warning.reclaimed:
        text = f"Reclaimed {warning.gpus} idle GPU(s) of {where} ({owner}): idle for {idle_for}."
        title = "Idle GPUs reclaimed"
    else:
        text = f"{where} ({owner}) has left {warning.gpus} GPU(s) idle for {idle_for}; reclaim at {at}."
        title = "Idle GPUs will be reclaimed"
    keep = (
        f"To keep it, use the GPU, or annotate the {warning.owner_kind} with "
        f"`{idle.KEEP_UNTIL_ANNOTATION}: <RFC 3339 time>` (or `{idle.OPT_OUT_ANNOTATION}: disabled`)."
    )
    return {
        "text": text,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title}},
            {
                "type": "section",
                "fields": [
                    {"type": "mrkdwn", "text": f"*Pod*\n{where}"},
                    {"type": "mrkdwn", "text": f"*Owner*\n{owner}"},
                    {"type": "mrkdwn", "text": f"*GPUs*\n{warning.gpus}"},
                    {"type": "mrkdwn", "text": f"*Idle for*\n{idle_for}"},
                    {"type": "mrkdwn", "text": f"*Reclaim at*\n{at}"},
                ],
            },
            {"type": "context", "elements": [{"type": "mrkdwn", "text": keep}]},
        ],
    }


@dataclass(frozen=True, slots=True)
class Retry:
    """How a notifier retries: exponential backoff from ``backoff`` up to ``max_backoff`` seconds, a
    server's ``Retry-After`` honoured up to ``max_retry_after``, and at most ``max_attempts`` tries
    (``None``: until it is sent)."""

    backoff: float = 1.0
    max_backoff: float = 60.0
    max_retry_after: float = 300.0
    max_attempts: int | None = None


class SlackNotifier:
    """An ordered, retrying, non-blocking sender to one incoming-webhook URL."""

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 10.0,
        retry: Retry | None = None,
    ) -> None:
        self.url = url
        self.timeout = timeout
        self.retry = retry or Retry()
        self.sent = 0
        self.attempts = 0
        self.dropped = 0
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper-notifier", daemon=True)
        self._thread.start()

    def send(self, warning: IdleNotice) -> None:
        """Queue one message; never blocks."""
        self._queue.put(slack_body(warning))

    def pending(self) -> int:
        return self._queue.qsize()

    def close(self, drain: float = 0.0) -> None:
        """Stop the sender, after waiting up to ``drain`` seconds for the queue to empty."""
        if drain > 0:
            done = threading.Event()

            def wait_empty() -> None:
                self._queue.join()
                done.set()

            threading.Thread(target=wait_empty, daemon=True).start()
            done.wait(drain)
        self._closing.set()
        self._queue.put(None)
        self._thread.join(timeout=self.timeout + 1.0)

    def _run(self) -> None:
        while True:
            body = self._queue.get()
            try:
                if body is None or self._closing.is_set():
                    return
                self._deliver(body)
            finally:
                self._queue.task_done()

    def _deliver(self, body: dict[str, Any]) -> None:
        delay = self.retry.backoff
        tries = 0
        while not self._closing.is_set():
            tries += 1
            self.attempts += 1
            wait = self._post(body)
            if wait is None:
                self.sent += 1
                return
            if self.retry.max_attempts is not None and tries >= self.retry.max_attempts:
                break
            if wait < 0:  # not a 429: back off
                wait, delay = delay, min(delay * 2, self.retry.max_backoff)
            self._closing.wait(wait)
        self.dropped += 1
        log.warning("idle warning not delivered after %d attempts: %s", tries, body.get("text"))

    def _post(self, body: dict[str, Any]) -> float | None:
        """POST once. None: delivered; a number >= 0: 429, retry after that many seconds; -1: failed."""
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                response.read()
        except urllib.error.HTTPError as err:
            if err.code == 429:
                retry = self.retry
                return _retry_after(err.headers.get("Retry-After"), retry.backoff, retry.max_retry_after)
            log.info("webhook answered %s", err.code)
            return -1.0
        except (OSError, ValueError) as err:  # refused, reset, timed out
            log.info("webhook unreachable: %s", err)
            return -1.0
        return None


def _retry_after(value: str | None, default: float, cap: float) -> float:
    """Retry-After in seconds (the HTTP-date form is not used by Slack; it falls back to ``default``)."""
    try:
        return min(cap, max(0.0, float(value))) if value is not None else default
    except ValueError:
        return default


Notify = Callable[[IdleNotice], None]
