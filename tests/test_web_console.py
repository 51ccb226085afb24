"""The web console without a browser: authentication, RBAC filtering, headers, pages' numbers, CLI errors.

The app runs in-process under Starlette's TestClient on the ``web_scenario`` state. The
browser tests (``test_web_browser.py``, ``test_web_kube.py``) check what a person sees.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from gpuplane.cli.web import parse_listen
from gpuplane.core.config import config_from_kueue
from gpuplane.core.scheduler import schedule
from gpuplane.model.loader import load_files
from gpuplane.web import pages
from gpuplane.web.app import create_app
from gpuplane.web.auth import KubeAuthenticator, TokenFileAuthenticator, Viewer, bearer_token
from gpuplane.web.snapshot import latest_time
from gpuplane.web.sources import FileSource, SnapshotHub
from web_scenario import scenario_yaml

PAGES = (
    "/",
    "/queues",
    "/nodes",
    "/reports",
    "/workloads/team-a/pretrain",
    "/workloads/team-b/sweep-1",
    "/workloads/serving/llm-small",
)


class Tokens:
    """Viewers by token, as an authenticator (what RBAC would have decided)."""

    def __init__(self, viewers: dict[str, Viewer]) -> None:
        self.viewers = viewers

    def authenticate(self, token: str) -> Viewer | None:
        return self.viewers.get(token)


VIEWERS = {
    "admin": Viewer("admin"),
    "alice": Viewer("alice", ("team-a",), frozenset({"team-a", "serving"}), sees_nodes=True),
    "carol": Viewer("carol", (), frozenset(), sees_nodes=False),
    "dana": Viewer("dana", (), frozenset({"secret"}), sees_nodes=False),
}


@pytest.fixture(scope="module")
def state_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("web") / "state.yaml"
    path.write_text(scenario_yaml())
    return path


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    team = {"allocatedGpuHours": 30.0, "busyGpuHours": 12.0, "idleGpuHours": 18.0, "gpuBusyShare": 0.4}
    doc = {
        "scenario": "builtin",
        "gpus": 448,
        "days": 7,
        "workloads": 1000,
        "seed": 1,
        "configurations": {
            "stock": {"gpuAllocatedShare": 0.5, "waitP50Seconds": 600.0, "teams": {"a": team}},
            "gpuplane": {"gpuAllocatedShare": 0.75, "waitP50Seconds": 60.0, "teams": {"a": team, "b": team}},
        },
    }
    (folder / "summary.json").write_text(json.dumps(doc))
    (folder / "utilization.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    return folder


@pytest.fixture(scope="module")
def client(state_file: Path, reports: Path) -> Iterator[TestClient]:
    hub = SnapshotHub()
    FileSource([state_file], hub).load()
    with TestClient(create_app(hub, Tokens(VIEWERS), reports=[reports])) as test_client:
        yield test_client


def get(client: TestClient, path: str, token: str | None = None, **headers: str) -> Any:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.get(path, headers=headers)


@pytest.mark.parametrize("path", [*PAGES, "/events", "/reports/0/utilization.png"])
def test_no_token_or_a_wrong_one_is_401(client: TestClient, path: str) -> None:
    for token in (None, "not-a-token"):
        response = get(client, path, token)
        assert response.status_code == 401, (path, token)
        assert response.headers["www-authenticate"] == 'Bearer realm="gpuplane"'
    browser = get(client, path, None, accept="text/html")
    assert browser.status_code == 401
    assert 'id="login"' in browser.text  # a browser gets the sign-in form
    assert 'data-test="refused"' not in browser.text
    wrong = get(client, path, "not-a-token", accept="text/html")
    assert 'data-test="refused"' in wrong.text  # and is told when its token was refused


def test_the_cookie_carries_the_token_too(client: TestClient) -> None:
    client.cookies.set("gpuplane_token", "admin")
    try:
        assert client.get("/queues").status_code == 200
    finally:
        client.cookies.clear()
    assert bearer_token("Basic abc", "admin") is None  # a wrong scheme is not read as a token
    assert bearer_token(None, "tok") == "tok"


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH", "DELETE"])
@pytest.mark.parametrize("path", [*PAGES, "/events", "/login"])
def test_there_is_no_write_endpoint(client: TestClient, path: str, method: str) -> None:
    response = client.request(method, path, headers={"Authorization": "Bearer admin"})
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"


@pytest.mark.parametrize("path", [*PAGES, "/login"])
def test_every_page_is_served_with_a_strict_policy_and_no_inline_script(
    client: TestClient, path: str
) -> None:
    response = get(client, path, "admin")
    assert response.status_code == 200
    csp = response.headers["content-security-policy"]
    assert "script-src 'self'" in csp
    assert "default-src 'none'" in csp
    assert "unsafe-inline" not in csp
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    html = response.text
    scripts = re.findall(r"<script[^>]*>", html)
    assert scripts == ['<script src="/static/console.js" defer>']
    assert not re.search(r"<script[^>]*>\s*[^<\s]", html)  # no inline code
    assert not re.search(r"\son[a-z]+=", html)  # no event-handler attributes
    assert not re.search(r"\sstyle=", html)  # no inline style
    assert not re.search(r"(src|href)=\"(https?:)?//", html)  # nothing from another origin


def test_static_assets_are_vendored_in_the_package(client: TestClient) -> None:
    for asset in ("console.js", "console.css", "favicon.svg"):
        response = client.get(f"/static/{asset}")
        assert response.status_code == 200, asset
        text = response.text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # a namespace, not a fetch
        assert "http://" not in text
        assert "https://" not in text


def test_a_namespace_outside_the_viewers_rbac_is_absent_and_forbidden(client: TestClient) -> None:
    queues = get(client, "/queues", "alice").text
    assert "team-a/huge" in queues
    assert "serving/llm-big" in queues
    assert "secret" not in queues  # neither the workload nor its LocalQueue
    assert "team-b/" not in queues
    for path in ("/workloads/secret/secret-job", "/workloads/team-b/sweep-1"):
        response = get(client, path, "alice")
        assert response.status_code == 403, path
    assert get(client, "/workloads/team-a/nope", "alice").status_code == 404
    overview = get(client, "/", "alice").text
    assert "secret" not in overview
    nodes = get(client, "/nodes", "alice").text
    assert "another namespace" in nodes  # team-b's GPUs are shown as held, not by whom
    assert "team-b/finetune" not in nodes
    assert "team-b/finetune" in get(client, "/nodes", "admin").text


def test_blockers_in_hidden_namespaces_keep_their_kind_not_their_name(client: TestClient) -> None:
    page = get(client, "/workloads/secret/secret-job", "dana").text
    assert 'data-test="blockers"' in page
    assert "another namespace" in page
    assert "team-b/" not in page  # the team-b workloads holding the quota stay unnamed
    assert "team-b/" in get(client, "/workloads/secret/secret-job", "admin").text


def test_a_viewer_without_node_rights_gets_403_on_the_node_map(client: TestClient) -> None:
    assert get(client, "/nodes", "carol").status_code == 403
    overview = get(client, "/", "carol").text
    assert re.search(r'data-test="pending-count">0<', overview)


def test_the_pages_numbers_are_the_schedule_commands(client: TestClient, state_file: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuplane", "schedule", "-f", str(state_file), "--output", "json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    plan = json.loads(out.stdout)
    queues = get(client, "/queues", "admin").text
    for p in plan["pending"]:
        row = re.search(rf'<tr data-workload="{re.escape(p["workload"])}">(.*?)</tr>', queues, re.S)
        assert row is not None, p["workload"]
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
        assert cells[0] == str(p["localQueuePosition"])
        assert cells[1] == str(p["position"])
        assert p["reason"] in cells[6]
    overview = get(client, "/", "admin").text
    assert f'data-test="pending-count">{len(plan["pending"])}<' in overview


def test_the_snapshot_drain_equals_the_cores_schedule(state_file: Path) -> None:
    state = load_files([str(state_file)])
    now = latest_time(state)
    hub = SnapshotHub()
    snap = FileSource([state_file], hub).load()
    want = schedule(state, config_from_kueue(state.configuration), now, cycles=None)
    assert snap.plan.admitted == want.admitted
    assert snap.plan.pending == want.pending
    assert snap.plan.preempted == want.preempted


def test_lent_quota_adds_up_to_what_the_cohort_borrows(state_file: Path) -> None:
    hub = SnapshotHub()
    snap = FileSource([state_file], hub).load()
    data = pages.queues(snap, Viewer("admin"))
    research = next(r for r in data["roots"] if r.name == "research")
    lines = [line for cq in research.children for line in cq.lines if line.resource == "nvidia.com/gpu"]
    borrowed = sum(line.borrowed for line in lines)
    lent = sum(line.lent for line in lines)
    assert borrowed == 4  # team-b: 8 used on a quota of 4
    assert lent == borrowed
    team_a = next(cq for cq in research.children if cq.name == "team-a")
    assert next(line for line in team_a.lines if line.resource == "nvidia.com/gpu").lent == 4


def test_reports_show_the_summary_and_chargeback(client: TestClient) -> None:
    page = get(client, "/reports", "admin").text
    assert "builtin" in page
    assert "75.0 %" in page  # gpuplane's allocated share
    assert "50.0 %" in page  # b's share of the gpuplane bill: 30 of 60 GPU-hours
    plot = get(client, "/reports/0/utilization.png", "admin")
    assert plot.status_code == 200
    assert plot.headers["content-type"] == "image/png"
    assert get(client, "/reports/0/summary.json", "admin").status_code == 404  # plots only
    assert get(client, "/reports/7/utilization.png", "admin").status_code == 404


@pytest.mark.parametrize(
    ("values", "q", "want"),
    [
        pytest.param([], 50, None, id="empty"),
        pytest.param([5.0], 99, 5.0, id="one"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 50, 2.0, id="nearest-rank-median"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 90, 4.0, id="p90"),
    ],
)
def test_percentile(values: list[float], q: float, want: float | None) -> None:
    assert pages.percentile(values, q) == want


def test_token_file_users_see_everything(tmp_path: Path) -> None:
    path = tmp_path / "tokens.csv"
    path.write_text('# comment\nt1,alice,1,"team-a,ops"\nt2,bob\n')
    auth = TokenFileAuthenticator(path)
    assert auth.authenticate("t1") == Viewer("alice", ("team-a", "ops"))
    assert auth.authenticate("t2") == Viewer("bob")
    assert auth.authenticate("t3") is None
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="no tokens"):
        TokenFileAuthenticator(empty)


class ReviewApi:
    """A stand-in for the API server's TokenReview and SubjectAccessReview, counting calls."""

    def __init__(self, users: dict[str, str], grants: set[tuple[str, str, str]]) -> None:
        self.users = users  # token -> user
        self.grants = grants  # (user, resource, namespace or "")
        self.calls = 0

    def create(self, res: Any, body: dict[str, Any], namespace: str | None = None) -> dict[str, Any]:
        del namespace
        self.calls += 1
        if res.kind == "TokenReview":
            user = self.users.get(body["spec"]["token"])
            if user is None:
                return {"status": {"authenticated": False}}
            return {"status": {"authenticated": True, "user": {"username": user, "groups": ["g"]}}}
        attrs = body["spec"]["resourceAttributes"]
        key = (body["spec"]["user"], attrs["resource"], attrs.get("namespace", ""))
        return {"status": {"allowed": key in self.grants}}


def test_kube_authenticator_asks_rbac_per_namespace_and_caches() -> None:
    api = ReviewApi(
        {"ta": "alice", "tr": "root"},
        {("alice", "workloads", "a"), ("root", "workloads", ""), ("root", "nodes", "")},
    )
    clock = [0.0]
    auth = KubeAuthenticator(api, lambda: ["a", "b"], ttl=30, clock=lambda: clock[0])  # type: ignore[arg-type]
    alice = auth.authenticate("ta")
    assert alice == Viewer("alice", ("g",), frozenset({"a"}), sees_nodes=False)
    calls = api.calls
    assert auth.authenticate("ta") == alice
    assert api.calls == calls  # cached
    clock[0] = 31.0
    auth.authenticate("ta")
    assert api.calls > calls  # asked again after the TTL
    assert auth.authenticate("tr") == Viewer("root", ("g",), None, sees_nodes=True)
    assert auth.authenticate("nobody") is None


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuplane", "web", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "want"),
    [
        pytest.param([], "give --kubeconfig K", id="no-mode"),
        pytest.param(["-f", "STATE", "--listen", "nohost"], "--listen must be HOST:PORT", id="listen"),
        pytest.param(["-f", "STATE"], "needs --token-file", id="no-token-file"),
        pytest.param(
            ["-f", "STATE", "--no-auth", "--listen", "0.0.0.0:8080"], "loopback", id="no-auth-public"
        ),
        pytest.param(["-f", "BAD", "--no-auth"], "spec.podSets", id="bad-state"),
        pytest.param(["-f", "STATE", "--token-file", "MISSING"], "--token-file", id="missing-token-file"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(
    args: list[str], want: str, state_file: Path, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("apiVersion: kueue.x-k8s.io/v1beta2\nkind: Workload\nmetadata: {name: w}\nspec: {}\n")
    names = {"STATE": str(state_file), "BAD": str(bad), "MISSING": str(tmp_path / "none.csv")}
    result = run_cli(*(names.get(a, a) for a in args))
    assert result.returncode == 2, result.stderr
    assert want in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("text", "want"),
    [("127.0.0.1:8080", ("127.0.0.1", 8080)), ("[::1]:9000", ("::1", 9000)), (":80", ("127.0.0.1", 80))],
)
def test_parse_listen(text: str, want: tuple[str, int]) -> None:
    assert parse_listen(text) == want
