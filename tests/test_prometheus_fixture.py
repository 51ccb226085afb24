"""The real Prometheus fixture: backfilled history and live scrapes of the DCGM stand-in."""

from __future__ import annotations

import time
import urllib.request

from dcgm_fixture import DcgmExporter
from prometheus import PrometheusFactory


def test_backfilled_history_is_queried_at_a_chosen_time(prometheus_factory: PrometheusFactory) -> None:
    start = int(time.time()) - 4 * 3600
    lines = ["# TYPE DCGM_FI_PROF_GR_ENGINE_ACTIVE gauge"]
    for minute in range(0, 240, 5):
        value = 0.9 if minute < 120 else 0.002
        lines.append(
            f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{pod="nb-0",namespace="a"}} {value} {start + minute * 60}'
        )
    prom = prometheus_factory(backfill="\n".join(lines) + "\n")
    early = prom.query("max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[1h])", time=start + 90 * 60)
    late = prom.query("max_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE[1h])", time=start + 235 * 60)
    assert float(early[0]["value"][1]) == 0.9
    assert float(late[0]["value"][1]) == 0.002


def test_scrapes_both_label_spellings_of_dcgm_exporter(prometheus_factory: PrometheusFactory) -> None:
    with DcgmExporter() as dcgm:
        dcgm.set("DCGM_FI_DEV_GPU_UTIL", 40, gpu=0, node="n1", namespace="a", pod="p0")
        dcgm.set("DCGM_FI_DEV_GPU_UTIL", 60, gpu=1, node="n1", namespace="b", pod="p1", exported=True)
        dcgm.set(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            0.25,
            gpu=2,
            node="n1",
            namespace="a",
            pod="p2",
            mig_profile="1g.10gb",
            mig_instance=3,
        )
        with urllib.request.urlopen(f"http://{dcgm.target}/metrics", timeout=5) as response:
            text = response.read().decode()
        assert "# TYPE DCGM_FI_DEV_GPU_UTIL gauge" in text
        assert 'exported_pod="p1"' in text
        assert 'GPU_I_PROFILE="1g.10gb"' in text
        prom = prometheus_factory(scrape_targets=[dcgm.target])
        plain = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{pod="p0"}')
        exported = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{exported_pod="p1"}')
        mig = prom.wait_for('DCGM_FI_PROF_GR_ENGINE_ACTIVE{GPU_I_PROFILE="1g.10gb"}')
    assert float(plain[0]["value"][1]) == 40
    assert exported[0]["metric"]["exported_namespace"] == "b"
    assert mig[0]["metric"]["pod"] == "p2"
