"""The controller reading its telemetry from a real Prometheus (what deploy/controller runs): a real Prometheus
scrapes the simulated dcgm-exporters every second; the controller's Prometheus source (built by the CLI's own
``_sources``) finds the fatal Xid and the node is remediated, then restored once Prometheus sees it cleared."""

from __future__ import annotations

import time

import pytest

from gpuscale.cli.controller import _sources
from gpuscale.controller.observe import TelemetryFeed
from gpuscale.controller.telemetry import TelemetryHistory
from gpuscale.settings import ControllerSettings
from tests.controller.harness import start_harness
from tests.e2e.backends import Backends, host_port, static_job

pytestmark = pytest.mark.e2e


async def test_remediation_from_prometheus(tmp_path):
    h = await start_harness(tmp_path, nodes=2)
    try:
        async with Backends(tmp_path / "backends") as backends:
            targets = [host_port(u) for u in h.exporters.dcgm_urls.values()]
            prometheus = await backends.prometheus([static_job("dcgm", targets)])
            await prometheus.wait_ready(targets=len(targets), series="DCGM_FI_DEV_XID_ERRORS")
            settings = ControllerSettings(prometheus_url=prometheus.url, scrape_timeout=5.0, interval=1.0)
            sources, attributor, _ = _sources(settings)
            h.controller.telemetry = TelemetryFeed(sources, attributor, TelemetryHistory(), max_age_seconds=60)
            h.closers.append(sources[0].close)
            await h.reconcile()
            assert h.writes_seen() == [], "healthy through Prometheus too"

            h.exporters.sim.override_gpu("gpu-01", 1, last_xid=79, xid_window=((79, 1),))
            await prometheus.wait_scraped_after(time.time())
            await h.reconcile()
            node = h.node("gpu-01")
            assert node["spec"]["unschedulable"] is True
            assert next(c for c in node["status"]["conditions"] if c["type"] == "GpuHealthy")["reason"] == "XidFatal"

            h.exporters.sim.clear_overrides()
            await prometheus.wait_scraped_after(time.time())
            await h.reconcile_until_recovered()
            assert not h.node("gpu-01")["spec"].get("unschedulable")
    finally:
        await h.close()
