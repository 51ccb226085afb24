"""What ``gpuplane simulate-capacity`` concludes from its runs: what each buffer costs against the
wait it saves, and which configuration is the default.

**The buffer's account.** Every configuration with a buffer is compared with its twin without one
(``gpuplane`` and ``gpuplane-static-buffer`` with ``gpuplane-no-warm-buffer``, ``stock-placeholders``
with ``stock``), on the same arrivals: the GPU-hours and GPU-dollars it pays more (the idle buffer,
and the on-demand price of the work that ran on buffer nodes), against the p95 and mean wait it
saves.

**The default** is the configuration that costs least at equal p95 wait: of the configurations
whose p95 wait is within :data:`EQUAL_WAIT_SHARE` of the best one's (or :data:`EQUAL_WAIT_MINUTES`,
whichever is more), the one that paid the fewest GPU-dollars.
"""

from __future__ import annotations

from dataclasses import asdict, fields
from typing import Any

from gpuplane.sim.capacity import CONFIGURATIONS, CapacityResult, compare
from gpuplane.sim.capacity_scenario import CapacityScenario

# p95 waits within 10 % of each other read as equal: one configuration's p95 moves by more than
# that between seeds (gpuplane's default run: 5.4-6.2 min over seeds 1, 2, 3 and 7) ...
EQUAL_WAIT_SHARE = 0.10
EQUAL_WAIT_MINUTES = 0.1  # ... or within 6 s
TWINS = {
    "gpuplane": "gpuplane-no-warm-buffer",
    "gpuplane-static-buffer": "gpuplane-no-warm-buffer",
    "stock-placeholders": "stock",
}


def with_twins(configurations: tuple[str, ...]) -> tuple[str, ...]:
    """``configurations`` plus the twin of each buffered one, in order, each once."""
    out = list(configurations)
    for name in configurations:
        twin = TWINS.get(name)
        if twin is not None and twin not in out:
            out.append(twin)
    return tuple(out)


def buffer_account(results: dict[str, CapacityResult]) -> dict[str, dict[str, Any]]:
    """Per buffered configuration: what it pays more than its twin, and the wait it saves."""
    out: dict[str, dict[str, Any]] = {}
    for name, twin_name in TWINS.items():
        mine, twin = results.get(name), results.get(twin_name)
        if mine is None or twin is None:
            continue
        out[name] = {
            "comparedWith": twin_name,
            "bufferIdleGpuHours": mine.buffer_gpu_hours,
            "bufferIdleDollars": mine.buffer_dollars,
            "extraGpuHours": round(mine.gpu_hours_paid - twin.gpu_hours_paid, 1),
            "extraDollars": round(mine.gpu_dollars - twin.gpu_dollars, 1),
            "waitP95SavedMinutes": round(twin.wait_p95_minutes - mine.wait_p95_minutes, 1),
            "waitMeanSavedMinutes": round(twin.wait_mean_minutes - mine.wait_mean_minutes, 1),
            "bufferUses": mine.buffer_uses,
        }
    return out


def cheapest_at_equal_wait(results: list[CapacityResult]) -> str:
    """The configuration that costs least among those whose p95 wait equals the best (within
    :data:`EQUAL_WAIT_SHARE` or :data:`EQUAL_WAIT_MINUTES`, whichever is more)."""
    if not results:
        raise ValueError("no results to choose from")
    best = min(r.wait_p95_minutes for r in results)
    equal = [
        r for r in results if r.wait_p95_minutes <= best + max(EQUAL_WAIT_MINUTES, EQUAL_WAIT_SHARE * best)
    ]
    return min(equal, key=lambda r: (r.gpu_dollars, r.configuration)).configuration


def capacity_document(
    scenario: CapacityScenario, configurations: tuple[str, ...] = CONFIGURATIONS
) -> dict[str, Any]:
    """Run ``configurations`` (and the twins their buffer accounts need) and say what they show."""
    names = with_twins(configurations)
    runs = {r.configuration: r for r in compare(scenario, names)}
    results = [runs[n] for n in configurations]
    default = cheapest_at_equal_wait(results)
    stock = runs.get("stock")
    chosen = runs[default]
    document: dict[str, Any] = {
        "scenario": {f.name: getattr(scenario, f.name) for f in fields(scenario)},
        "pools": [asdict(p) | {"spotPrice": round(scenario.spot_price(p), 4)} for p in scenario.pools()],
        "queues": [{"name": q.name, "quota": dict(q.quota)} for q in scenario.queues()],
        "results": [asdict(r) for r in results],
        "warmBuffer": buffer_account(runs),
        "defaultConfiguration": default,
        "defaultRule": (
            f"fewest GPU-dollars among p95 waits within {100 * EQUAL_WAIT_SHARE:g} % "
            f"(at least {60 * EQUAL_WAIT_MINUTES:g} s) of the best"
        ),
    }
    if stock is not None:
        document["defaultAgainstStock"] = {
            "dollarsSaved": round(stock.gpu_dollars - chosen.gpu_dollars, 1),
            "dollarsSavedShare": round(1 - chosen.gpu_dollars / stock.gpu_dollars, 4)
            if stock.gpu_dollars
            else None,
            "waitP95NoWorse": chosen.wait_p95_minutes <= stock.wait_p95_minutes,
        }
    return document
