"""--discover-exporters: the controller scrapes the dcgm-exporter pods its pod cache holds, and places each GPU on
the exporter pod's node (no Hostname label needed)."""

from __future__ import annotations

from gpuscale.cli.controller import _sources
from gpuscale.controller.observe import TelemetryFeed
from gpuscale.controller.telemetry import TelemetryHistory
from gpuscale.settings import ControllerSettings
from gpuscale.sim.exporters import SimExporters
from tests.controller.harness import START, start_harness


async def test_exporters_found_through_the_api_drive_remediation(tmp_path):
    h = await start_harness(tmp_path, nodes=3)
    # NB: dcgm-exporter without its Hostname label (`-n`): only the pod's node can place the GPUs.
    bare = SimExporters(hostname_label=None)
    await bare.start(h.exporters.scenario, clock=h.clock)
    h.closers.append(bare.stop)
    try:
        for obj in bare.kube_objects():
            if obj["kind"] in ("Namespace", "Pod", "DaemonSet"):
                h.api.apply(obj)
        settings = ControllerSettings(discover_exporters=True)
        sources, attributor, rediscover = _sources(settings, h.cache)
        h.closers.append(sources[0].close)
        h.controller.telemetry = TelemetryFeed(sources, attributor, TelemetryHistory(), before_refresh=rediscover)
        await h.reconcile()
        assert sorted(h.controller.telemetry.sources[0].urls) == sorted(bare.dcgm_urls.values())
        assert sorted(h.controller.last.planned) == ["health"]
        bare.sim.override_gpu("gpu-02", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        assert h.node("gpu-02")["spec"]["unschedulable"] is True
        assert h.clock() > START
    finally:
        await h.close()
