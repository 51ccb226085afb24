"""`gpuplane report chargeback` on a real Prometheus with hours of backfilled history, and from a simulation.

History (GPU-equivalents of the recording rules' per-pod series, sampled every minute):

=====  =========  =====  ==================  =========  ====  =========  ====
pod    namespace  team   when                allocated  busy  alloc GPU-h busy GPU-h
=====  =========  =====  ==================  =========  ====  =========  ====
p1     ml-a       alpha  the whole 3 h       2          1.5   6          4.5
p2     ml-a       alpha  the last hour       1          0.25  1          0.25
p3     ml-b       beta   the whole 3 h       4          1     12         3
=====  =========  =====  ==================  =========  ====  =========  ====

So alpha: 7 allocated = 4.75 busy + 2.25 idle; beta: 12 = 3 + 9; cluster 19. At 2 per GPU-hour
(beta 3): alpha costs 14, beta 36.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuplane.cli.app import build_app
from gpuplane.insight.chargeback import PricesError, build, from_simulation, load_prices, to_csv, to_html
from prometheus import Prometheus, PrometheusFactory

HOUR = 3600


def history(end: int) -> str:
    lines = []
    pods = (
        ("p1", "ml-a", "alpha", 2.0, 1.5, end - 3 * HOUR - 600),
        ("p2", "ml-a", "alpha", 1.0, 0.25, end - HOUR + 60),
        ("p3", "ml-b", "beta", 4.0, 1.0, end - 3 * HOUR - 600),
    )
    for metric, column in (("gpuplane:pod_gpus_allocated:sum", 3), ("gpuplane:pod_gpus_busy:sum", 4)):
        lines.append(f"# TYPE {metric} gauge")
        for pod in pods:
            name, ns, team, start = pod[0], pod[1], pod[2], pod[5]
            labels = f'namespace="{ns}",pod="{name}",team="{team}",cluster_queue="cq-{team}",local_queue="lq"'
            lines += [f"{metric}{{{labels}}} {pod[column]} {t}" for t in range(start, end + 1, 60)]
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture
def backfilled(prometheus_factory: PrometheusFactory) -> tuple[Prometheus, int]:
    end = (int(time.time()) // 60) * 60 - 600
    return prometheus_factory(backfill=history(end)), end


def report(tmp_path: Path, *args: str) -> tuple[int, str, str]:
    prices = tmp_path / "prices.yaml"
    prices.write_text("gpuHour: 2\ncurrency: EUR\ngroups: {beta: 3}\n")
    result = CliRunner().invoke(build_app(), ["report", "chargeback", *args, "--prices", str(prices)])
    return result.exit_code, result.stdout, result.stderr


def _rfc(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def test_per_team_numbers_reconcile(tmp_path: Path, backfilled: tuple[Prometheus, int]) -> None:
    prom, end = backfilled
    code, out, err = report(
        tmp_path,
        "--prometheus",
        prom.url,
        "--since",
        "3h",
        "--at",
        _rfc(end),
        "--group-by",
        "label:team",
        "-o",
        "json",
    )
    assert code == 0, err
    doc = json.loads(out)
    rows = {g["group"]: g for g in doc["groups"]}
    assert set(rows) == {"alpha", "beta"}
    assert rows["alpha"]["allocatedGpuHours"] == pytest.approx(7.0)
    assert rows["alpha"]["busyGpuHours"] == pytest.approx(4.75)
    assert rows["alpha"]["idleGpuHours"] == pytest.approx(2.25)
    assert rows["beta"]["allocatedGpuHours"] == pytest.approx(12.0)
    assert rows["beta"]["idleGpuHours"] == pytest.approx(9.0)
    assert rows["alpha"]["allocatedCost"] == pytest.approx(14.0)
    assert rows["beta"]["allocatedCost"] == pytest.approx(36.0)
    for row in rows.values():
        assert row["allocatedGpuHours"] == pytest.approx(row["busyGpuHours"] + row["idleGpuHours"])
    assert doc["clusterAllocatedGpuHours"] == pytest.approx(19.0)
    assert doc["total"]["allocatedGpuHours"] == pytest.approx(19.0)
    assert doc["reconciles"] is True
    assert doc["currency"] == "EUR"


def test_group_by_namespace_and_other_formats(tmp_path: Path, backfilled: tuple[Prometheus, int]) -> None:
    prom, end = backfilled
    base = ("--prometheus", prom.url, "--since", "3h", "--at", _rfc(end), "--group-by", "namespace")
    code, out, err = report(tmp_path, *base, "-o", "csv")
    assert code == 0, err
    lines = out.strip().splitlines()
    assert lines[0].startswith("group,allocatedGpuHours,busyGpuHours,idleGpuHours")
    assert [line.split(",")[0] for line in lines[1:]] == ["ml-b", "ml-a", "total"]
    code, out, _ = report(tmp_path, *base, "-o", "html")
    assert code == 0
    assert "<table>" in out and "ml-a" in out and "reconciles" in out  # noqa: PT018 - one rendered page
    code, out, _ = report(tmp_path, *base)
    assert code == 0
    assert "reconciles" in out
    assert "19.00" in out


@pytest.mark.parametrize(
    ("args", "want"),
    [
        (("--since", "3x"), "--since: expected a duration"),
        (("--group-by", "label:bad-name"), "--group-by: expected namespace, queue or label:NAME"),
        ((), "give either --prometheus URL or --simulation"),
    ],
    ids=["bad-window", "bad-label", "no-source"],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], want: str) -> None:
    source = () if not args else ("--prometheus", "http://127.0.0.1:9")
    code, _, err = report(tmp_path, *source, *args)
    assert code == 2
    assert want in err
    assert err.strip().count("\n") == 0


def test_unreachable_prometheus_is_one_line(tmp_path: Path) -> None:
    code, _, err = report(tmp_path, "--prometheus", "http://127.0.0.1:9", "--since", "1h")
    assert code == 2
    assert "cannot query Prometheus" in err


def test_prices_file_errors_name_the_field() -> None:
    assert load_prices("gpuHour: 2.5\ngroups: {a: 1}").for_group("a") == 1.0
    with pytest.raises(PricesError, match=r"groups\.a: expected a non-negative number"):
        load_prices("gpuHour: 1\ngroups: {a: -1}")
    with pytest.raises(PricesError, match="unknown field"):
        load_prices("price: 1")


def test_busy_is_capped_at_allocated_and_renderers_agree() -> None:
    report_ = build({"a": 1.0, "b": 2.0}, {"a": 1.5, "c": 0.5}, cluster_allocated=3.0)
    rows = {r.group: r for r in report_.rows}
    assert rows["a"].busy_gpu_hours == 1.0  # cannot be busier than what it holds
    assert rows["c"].allocated_gpu_hours == 0.0
    assert report_.reconciles
    assert not build({"a": 1.0}, {}, cluster_allocated=2.0).reconciles
    assert to_csv(report_).count("\n") == 5  # header, a, b, c, total
    assert "a" in to_html([report_])


def test_from_a_simulation_run(tmp_path: Path) -> None:
    summary = tmp_path / "sim.json"
    folder = tmp_path / "report"
    run = CliRunner().invoke(
        build_app(), ["simulate", "--days", "0.05", "-o", "json", "--report", str(folder)]
    )
    assert run.exit_code == 0, run.stderr
    doc = json.loads(run.stdout[run.stdout.index("{") :])
    summary.write_text(json.dumps(doc))
    page = (folder / "chargeback.html").read_text()
    assert 'href="chargeback.html"' in (folder / "index.html").read_text()
    for team in next(iter(doc["configurations"].values()))["teams"]:
        assert f"<td>{team}</td>" in page
    assert "DOES NOT" not in page
    reports = from_simulation(doc)
    assert set(reports) == set(doc["configurations"])
    for name, got in reports.items():
        assert got.reconciles, name
        teams = doc["configurations"][name]["teams"]
        assert {r.group for r in got.rows} == set(teams)
    code, out, err = report(tmp_path, "--simulation", str(summary), "-o", "json")
    assert code == 0, err
    assert all(r["reconciles"] for r in json.loads(out).values())
