"""Seeding the runtime history from Prometheus (kube-state-metrics' Job start and completion times),
against a stand-in that answers the two instant queries."""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from gpuplane.insight.runtime_history import JobFeatures, RuntimeSample
from gpuplane.k8s.runtime_seed import COMPLETION, START, not_learned, prometheus_samples

NOW = 1_780_000_000.0


def _vector(values: dict[tuple[str, str], float]) -> dict[str, Any]:
    result = [
        {"metric": {"namespace": ns, "job_name": job}, "value": [NOW, str(v)]}
        for (ns, job), v in values.items()
    ]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class Answers:
    """What the stand-in answers, by metric name in the query; the queries it was asked."""

    def __init__(self) -> None:
        self.by_metric: dict[str, Any] = {}
        self.asked: list[str] = []


@pytest.fixture
def prometheus() -> Iterator[tuple[str, Answers]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)["query"][0]
            answers.asked.append(query)
            metric = next((m for m in answers.by_metric if m in query), None)
            body = json.dumps(answers.by_metric[metric]).encode() if metric else b"{}"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", answers
    finally:
        server.shutdown()
        server.server_close()


def test_jobs_that_completed_give_their_runtime_by_namespace_and_job_name(prometheus: Any) -> None:
    url, answers = prometheus
    answers.by_metric[START] = _vector(
        {("team-a", "train-resnet-x7k2p"): NOW - 700, ("team-a", "running"): NOW - 50, ("team-b", "odd"): NOW}
    )
    answers.by_metric[COMPLETION] = _vector(
        {("team-a", "train-resnet-x7k2p"): NOW - 100, ("team-b", "odd"): NOW - 10, ("team-c", "lost"): NOW}
    )
    found = prometheus_samples(url, 7 * 86400)
    assert [s for _, s in found] == [
        RuntimeSample(JobFeatures("team-a", "train-resnet", "", "", ""), 600.0, NOW - 100)
    ], "a running job, one that completed before it started, one without a start: none"
    assert all("[604800s]" in q for q in answers.asked)
    again = prometheus_samples(url, 7 * 86400)
    assert [i for i, _ in again] == [i for i, _ in found], "the same job has the same id"


@pytest.mark.parametrize("answer", [{"status": "error", "error": "bad"}, {"status": "success", "data": {}}])
def test_an_answer_that_is_not_a_vector_is_an_error(prometheus: Any, answer: dict[str, Any]) -> None:
    url, answers = prometheus
    answers.by_metric[START] = answer
    with pytest.raises(ValueError, match="Prometheus answered"):
        prometheus_samples(url, 3600)


def test_a_prometheus_that_is_not_there_is_an_os_error() -> None:
    with pytest.raises(OSError, match=r"refused|Errno"):
        prometheus_samples("http://127.0.0.1:9/", 3600, timeout=2)


def test_runs_already_learned_from_their_workloads_are_not_seeded_again() -> None:
    def s(name: str, at: float) -> RuntimeSample:
        return RuntimeSample(JobFeatures("team-a", name, "", "", ""), 60.0, at)

    learned = [RuntimeSample(JobFeatures("team-a", "train", "cq", "", "1x"), 61.0, NOW + 3)]
    seeds = [("a", s("train", NOW)), ("b", s("train", NOW - 3600)), ("c", s("eval", NOW))]
    assert [i for i, _ in not_learned(seeds, learned)] == ["b", "c"]
