"""The adapter reads the recording rules: the same values from recorded series as from the raw DCGM series.

A real Prometheus scrapes dcgm-exporter's H100 scrape (tests/fixtures, served as-is on loopback, honor_labels as
deploy/monitoring's PodMonitor) and evaluates deploy/alerts/gpuscale-recording.rules.yaml (every second instead of every minute). The
adapter's pipeline (PrometheusSource → attribution → aggregation) runs once with the shipped catalogue and once
with deploy/alerts/metrics-recorded.yaml, which reads gpu_utilization, gpu_sm_active, gpu_tensor_active and
gpu_dram_active from the recording rules; every pod, node and namespace value must be the same.
"""

from __future__ import annotations

import time
from pathlib import Path

import aiohttp
import yaml
from aiohttp import web

from gpuscale.metrics.aggregation import build_snapshot, queries
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import DEFAULT_CATALOGUE_PATH, load_catalogue
from gpuscale.metrics.store import Snapshot
from gpuscale.model import ObjectRef
from gpuscale.sources.prometheus import PrometheusSource
from gpuscale.sources.targets import target_resolver
from tests.e2e.backends import Backends, free_port

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "dcgm" / "dcgm-exporter-h100-8gpu.prom"
RULES = ROOT / "deploy" / "alerts" / "gpuscale-recording.rules.yaml"
RECORDED = ROOT / "deploy" / "alerts" / "metrics-recorded.yaml"
METRICS = ("gpu_utilization", "gpu_sm_active", "gpu_tensor_active", "gpu_dram_active")


async def test_recorded_series_give_the_adapter_the_same_values_as_raw_ones(tmp_path):
    body = FIXTURE.read_bytes()

    async def exposition(_: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", exposition)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    raw, recorded = load_catalogue(DEFAULT_CATALOGUE_PATH), load_catalogue(RECORDED)
    try:
        async with Backends(tmp_path) as backends, aiohttp.ClientSession() as session:
            scrape = {
                "job_name": "dcgm-exporter",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }
            prom = await backends.prometheus([scrape], extra_args=["--web.enable-lifecycle"])
            config = yaml.safe_load(prom.config_path.read_text())
            config["global"]["evaluation_interval"] = "1s"
            # the shipped groups evaluate every minute; every second here, so the test waits seconds
            rules = yaml.safe_load(RULES.read_text())
            for group in rules["groups"]:
                group["interval"] = "1s"
            (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
            config["rule_files"] = [str(tmp_path / "rules.yaml")]
            prom.config_path.write_text(yaml.safe_dump(config))
            await prom.wait_until(lambda: _ok(session, prom.url + "/-/ready"), what="ready")
            async with session.post(prom.url + "/-/reload") as resp:
                assert resp.status == 200, await resp.text()

            async def recorded_ready() -> bool:
                names = ("gpuscale:gpu_sm_active:ratio", "gpuscale:gpu_utilization:percent", "DCGM_FI_PROF_SM_ACTIVE")
                counts = [len(await prom.query(n)) for n in names]
                return counts == [8, 8, 8]

            await prom.wait_until(recorded_ready, what="the recorded series of all 8 GPUs")
            snapshots = []
            for catalogue in (raw, recorded):
                source = PrometheusSource(prom.url, queries=queries(catalogue), timeout_seconds=5)
                try:
                    now = time.time()
                    await source.refresh(now=now)
                    assert all(h.healthy for h in source.health()), source.health()
                    snapshots.append(
                        build_snapshot(catalogue, source.read, Attributor(target_resolver({}, None)), now=now)
                    )
                finally:
                    await source.close()
            assert any(
                "gpuscale:gpu_sm_active:ratio" in q
                for q in PrometheusSource(prom.url, queries=queries(recorded)).promql
            )
    finally:
        await runner.cleanup()

    from_raw, from_recorded = snapshots
    for metric in METRICS:
        a = _values(from_raw, metric)
        b = _values(from_recorded, metric)
        assert a and a.keys() == b.keys(), (metric, sorted(a), sorted(b))
        for obj, value in a.items():
            assert abs(value - b[obj]) < 1e-9, (metric, obj, value, b[obj])
        kinds = {o.kind for o in a}
        assert {"pod", "node", "namespace"} <= {k.lower() for k in kinds}, (metric, kinds)
    # the fixture's numbers, through the recorded series: the util-trap pod at 100 % util, 37.6559 % SM activity
    (nim,) = [o for o in _values(from_recorded, "gpu_sm_active") if o.kind.lower() == "pod" and o.namespace == "nim"]
    assert abs(_values(from_recorded, "gpu_sm_active")[nim] - 37.6559) < 1e-9
    assert abs(_values(from_recorded, "gpu_utilization")[nim] - 100.0) < 1e-9


def _values(snapshot: Snapshot, metric: str) -> dict[ObjectRef, float]:
    return {obj: point.value for obj, point in snapshot.values.get(metric, {}).items()}


async def _ok(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url) as resp:
        return resp.status == 200
