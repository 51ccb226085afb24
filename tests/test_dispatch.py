"""The MultiKueue dispatchers (gpuplane.insight.dispatch): which workers a workload is nominated to."""

from __future__ import annotations

import pytest

from gpuplane.insight.dispatch import (
    DISPATCHER_NAMES,
    ClusterView,
    nominate,
    parse_policy,
)


def view(name: str, **kw: object) -> ClusterView:
    return ClusterView(name, **kw)  # type: ignore[arg-type]


def test_inactive_clusters_are_never_nominated_by_any_dispatcher() -> None:
    clusters = [view("a", active=False, fits_now=True), view("b", fits_now=False, start_in_seconds=60)]
    for policy in ("AllAtOnce", "Incremental", "gpuplane"):
        assert nominate(policy, clusters, since_first_nomination_s=0).clusters == ("b",)


def test_no_active_cluster_nominates_none_and_says_so() -> None:
    result = nominate("gpuplane", [view("a", active=False)], since_first_nomination_s=0)
    assert result.clusters == ()
    assert "no worker cluster is active" in result.reason


def test_selector_filters_first_and_names_the_labels_when_nothing_matches() -> None:
    clusters = [view("eu", labels={"region": "eu"}, fits_now=True), view("us", labels={"region": "us"})]
    for policy in ("AllAtOnce", "Incremental", "gpuplane"):
        got = nominate(policy, clusters, since_first_nomination_s=0, cluster_selector={"region": "us"})
        assert got.clusters == ("us",)
    none = nominate("AllAtOnce", clusters, since_first_nomination_s=0, cluster_selector={"region": "ap"})
    assert none.clusters == ()
    assert "region=ap" in none.reason


def test_all_at_once_nominates_every_candidate() -> None:
    clusters = [view(name) for name in ("c", "a", "b")]
    got = nominate("AllAtOnce", clusters, since_first_nomination_s=0)
    assert got.clusters == ("a", "b", "c")
    assert got.next_round_in_seconds is None


def test_incremental_three_then_three_more_each_five_minutes_in_name_order() -> None:
    clusters = [view(f"w{i}") for i in (7, 1, 5, 3, 2, 6, 4)]
    first = nominate("Incremental", clusters, since_first_nomination_s=0)
    assert first.clusters == ("w1", "w2", "w3")
    assert first.next_round_in_seconds == 300
    assert "4 more in 5m" in first.reason
    # A round ends once it has lasted more than five minutes (Kueue compares with <=).
    assert nominate("Incremental", clusters, since_first_nomination_s=300).clusters == ("w1", "w2", "w3")
    second = nominate("Incremental", clusters, since_first_nomination_s=301)
    assert second.clusters == ("w1", "w2", "w3", "w4", "w5", "w6")
    third = nominate("Incremental", clusters, since_first_nomination_s=601)
    assert third.clusters == tuple(f"w{i}" for i in range(1, 8))
    assert third.next_round_in_seconds is None


def test_gpuplane_nominates_one_cluster_where_the_gang_fits_and_says_why_not_elsewhere() -> None:
    clusters = [
        view("worker-a", note="4 GPUs short", start_in_seconds=1800),
        view("worker-b", fits_now=True, start_in_seconds=0),
    ]
    got = nominate("gpuplane", clusters, since_first_nomination_s=0)
    assert got.clusters == ("worker-b",)
    assert got.reason == "nominated worker-b: the gang fits there now; worker-a: 4 GPUs short"


def test_gpuplane_prefers_the_spill_order_among_fitting_clusters() -> None:
    clusters = [view("a", fits_now=True), view("b", fits_now=True), view("c", fits_now=False)]
    got = nominate("gpuplane", clusters, since_first_nomination_s=0, spill_order=("c", "b", "a"))
    assert got.clusters == ("b",)
    assert "spill-over" in got.reason
    # Fitting clusters outside the spill order still win over a listed one that does not fit.
    got = nominate("gpuplane", clusters, since_first_nomination_s=0, spill_order=("c",))
    assert got.clusters == ("a",)


def test_gpuplane_ties_among_fitting_clusters_break_on_start_then_name() -> None:
    clusters = [
        view("b", fits_now=True, start_in_seconds=0),
        view("a", fits_now=True, start_in_seconds=5),
        view("c", fits_now=True, start_in_seconds=0),
    ]
    assert nominate("gpuplane", clusters, since_first_nomination_s=0).clusters == ("b",)


def test_gpuplane_without_a_fit_takes_the_earliest_predicted_start() -> None:
    clusters = [
        view("a", start_in_seconds=3600, note="8 GPUs short"),
        view("b", start_in_seconds=600),
        view("c", start_in_seconds=None, note="no node large enough"),
    ]
    got = nominate("gpuplane", clusters, since_first_nomination_s=0)
    assert got.clusters == ("b",)
    assert "starts soonest there (in 10m)" in got.reason
    assert "c: no node large enough" in got.reason


def test_gpuplane_with_no_prediction_anywhere_still_nominates_one_in_order() -> None:
    clusters = [view("b"), view("a")]
    assert nominate("gpuplane", clusters, since_first_nomination_s=0).clusters == ("a",)
    got = nominate("gpuplane", clusters, since_first_nomination_s=0, spill_order=("b",))
    assert got.clusters == ("b",)


def test_gpuplane_never_nominates_more_than_one() -> None:
    clusters = [view(f"w{i}", fits_now=i % 2 == 0, start_in_seconds=float(i)) for i in range(9)]
    for elapsed in (0.0, 301.0, 10_000.0):
        assert len(nominate("gpuplane", clusters, since_first_nomination_s=elapsed).clusters) == 1


def test_bad_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown dispatcher"):
        nominate("Random", [view("a")], since_first_nomination_s=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="since_first_nomination_s"):
        nominate("AllAtOnce", [view("a")], since_first_nomination_s=-1)
    with pytest.raises(ValueError, match="repeat"):
        nominate("AllAtOnce", [view("a"), view("a")], since_first_nomination_s=0)


def test_policies_parse_from_short_and_kueue_names() -> None:
    assert parse_policy("allatonce") == "AllAtOnce"
    assert parse_policy(DISPATCHER_NAMES["Incremental"]) == "Incremental"
    assert parse_policy("gpuplane") == "gpuplane"
    with pytest.raises(ValueError, match="unknown dispatcher 'x'"):
        parse_policy("x")
