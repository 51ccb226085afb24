"""The result in words, before any table: what gpuplane gained over stock Kubernetes, and from what.

Every number comes from the run's summary document; nothing here is a threshold tuned to an
outcome. The first sentence compares ``gpuplane`` with ``stock`` on the same workloads:

* the work done (busy GPU-hours; "same work" within :data:`SAME_WORK` of each other);
* allocated GPU-hours (what the GPUs were held for);
* p95 queue wait;
* GPU-hours held by partly placed gangs and stranded quota, where stock had any.

The second names where it came from: the workload class whose busy share gained most, and, for
each ``gpuplane-no-<feature>`` configuration in the run (``--compare``), what turning that feature
off changes. A sweep gets one sentence on capacity at the wait target instead.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuplane.sim.auto_sweep import GOAL

SAME_WORK = 0.02  # busy GPU-hours within 2 % of each other read as "the same work"
FEATURES = {
    "gpuplane-no-sharing": "sharing (fractions, MIG)",
    "gpuplane-no-borrowing": "borrowing",
    "gpuplane-no-reaper": "the idle reaper",
    "gpuplane-no-backfill": "the backfill tier",
    "gpuplane-no-preemption": "preemption",
}


def duration(seconds: float | None) -> str:
    """A wait as people read it: 0 s, 38.0 min, 5.3 h, 2.4 d."""
    if seconds is None:
        return "-"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    if seconds < 86400 * 2:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _pct(value: float) -> str:
    return f"{100 * value:.1f} %"


def _change(new: float, old: float) -> float:
    return (new - old) / old if old else 0.0


def _work(gp: dict[str, Any], stock: dict[str, Any]) -> str:
    busy = _change(gp["busyGpuHours"], stock["busyGpuHours"])
    if abs(busy) <= SAME_WORK:
        work = "Same work"
    else:
        work = f"{abs(busy) * 100:.0f} % {'more' if busy > 0 else 'less'} work done (busy GPU-hours)"
    allocated = _change(gp["allocatedGpuHours"], stock["allocatedGpuHours"])
    if abs(allocated) < 0.005:
        return f"{work} on the same allocated GPU-hours"
    fewer = "fewer" if allocated < 0 else "more"
    return f"{work} on {abs(allocated) * 100:.0f} % {fewer} allocated GPU-hours"


def first_sentence(configs: dict[str, dict[str, Any]]) -> str:
    """gpuplane against stock, in one sentence."""
    gp, stock = configs["gpuplane"], configs["stock"]
    parts = [_work(gp, stock)]
    parts.append(f"p95 wait {duration(stock['waitP95Seconds'])} → {duration(gp['waitP95Seconds'])}")
    held = stock["deadlockedGpuHours"] - gp["deadlockedGpuHours"]
    if held > 0.5:
        parts.append(f"{held:,.0f} GPU-hours no longer held by partly placed gangs")
    stranded = stock["strandedQuotaGpuHours"] - gp["strandedQuotaGpuHours"]
    if stranded > 0.5:
        parts.append(f"{stranded:,.0f} GPU-hours of quota no longer stranded")
    return "; ".join(parts) + "."


def _best_class(gp: dict[str, Any], stock: dict[str, Any]) -> str | None:
    best: tuple[float, str, float, float] | None = None
    for klass, row in gp["classes"].items():
        old = stock["classes"].get(klass, {}).get("gpuBusyShare")
        new = row.get("gpuBusyShare")
        if old is None or new is None:
            continue
        if best is None or new - old > best[0]:
            best = (new - old, klass, old, new)
    if best is None or best[0] <= 0:
        return None
    _, klass, old, new = best
    return f"most from {klass} (busy share {_pct(old)} → {_pct(new)})"


def _features(configs: dict[str, dict[str, Any]]) -> list[str]:
    gp = configs["gpuplane"]
    out = []
    for name, feature in FEATURES.items():
        without = configs.get(name)
        if without is None:
            continue
        bits = []
        if gp["gpuBusyShare"] is not None and without["gpuBusyShare"] is not None:
            points = 100 * (gp["gpuBusyShare"] - without["gpuBusyShare"])
            bits.append(f"{points:+.1f} points of busy share")
        if without["waitP95Seconds"] != gp["waitP95Seconds"]:
            bits.append(f"p95 wait {duration(without['waitP95Seconds'])} without it")
        out.append(f"{feature} {', '.join(bits)}")
    return out


def headline(document: dict[str, Any]) -> str:
    """One sentence of result, then one of where it comes from ("" without stock and gpuplane)."""
    configs: dict[str, dict[str, Any]] = document["configurations"]
    if "gpuplane" not in configs or "stock" not in configs:
        return ""
    text = first_sentence(configs)
    sources = [s for s in (_best_class(configs["gpuplane"], configs["stock"]), *_features(configs)) if s]
    if sources:
        text += " Gains by class and feature: " + "; ".join(sources) + "."
    return text


def sweep_headline(document: dict[str, Any]) -> str:
    """Capacity at the wait target, stock against gpuplane, and the GPUs stock would need."""
    capacity: dict[str, float | None] = document["capacityAtWaitTarget"]
    bound: dict[str, str] = document["capacityBound"]
    target = duration(document["waitTargetSeconds"])

    def load(name: str) -> str:
        value = capacity.get(name)
        if value is None:
            low = min(point["load"] for point in document["sweep"])
            return f"below {low:g}"
        return f"{'at least ' if bound[name] == 'atLeast' else ''}{value:.2f}"

    if "stock" not in capacity or "gpuplane" not in capacity:
        return ""
    text = (
        f"At p95 wait ≤ {target}, the same {document['gpus']:,} GPUs serve an offered load of "
        f"{load('gpuplane')} under gpuplane and {load('stock')} under stock Kubernetes"
    )
    if "autoSweep" in document:
        return text + _auto_tail(document, load) + "."
    match = document.get("gpusToMatch", {}).get("gpuplane", {})
    if match.get("stockGpus") is not None:
        prefix = "at least " if match["bound"] == "atLeast" else "about "
        text += f"; stock would need {prefix}{match['stockGpus']:,} GPUs to match (scaled, not simulated)"
    return text + "."


def _gpus(document: dict[str, Any], name: str) -> str:
    """The GPUs ``name`` needs to match gpuplane (the auto sweep's simulated ``gpusToMatch``), or ""."""
    match = document.get("gpusToMatch", {}).get(name, {})
    if match.get("gpus") is None:
        return ""
    return f"{'more than ' if match['bound'] == 'atLeast' else ''}{match['gpus']:,}"


def _auto_tail(document: dict[str, Any], load: Callable[[str], str]) -> str:
    """The auto sweep's clauses: stock's GPUs to match, then the strongest peer and the ratio."""
    text = ""
    if gpus := _gpus(document, "stock"):
        text += f"; stock would need {gpus} GPUs to match (simulated, not scaled)"
    peer = document.get("strongestPeer")
    ratio = document.get("capacityRatioToGpuplane", {}).get(peer) if peer else None
    if peer and ratio:
        text += (
            f"; the strongest peer, {peer}, serves {load(peer)}: gpuplane serves {1 / ratio:.2f}x its load"
        )
        if gpus := _gpus(document, peer):
            text += f", and {peer} would need {gpus} GPUs to match"
        gap = document.get("peerGaps", {}).get(peer)
        if gap is not None and not gap["meetsGoal"]:
            text += (
                f"; short of {GOAL:g}x: {gap['feature']} adds {gap['capacityAdded']:.2f} of load to "
                f"{peer} over {gap['base']}"
            )
    return text
