"""A controller wired to the simulated Kubernetes API (over HTTP) and simulated dcgm-exporters, one reconcile at a
time: the real caches, telemetry feed, planners and actuator, with a manual clock and no timers."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from kubernetes_asyncio.config import new_client_from_config

from gpuscale.controller.actuator import KubeActuator
from gpuscale.controller.health import HealthActions, HealthPlanner
from gpuscale.controller.loop import Controller, Leadership, ReconcileResult
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.controller.observe import TelemetryFeed
from gpuscale.controller.remediation_policy import RemediationPolicy, load_remediation_policy
from gpuscale.controller.telemetry import TELEMETRY_SERIES, TelemetryHistory
from gpuscale.controller.writes import Planner
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.sim.exporters import ManualClock, SimExporters
from gpuscale.sim.gpu_activity import H100_SXM
from gpuscale.sim.gpu_nodes import SimNode
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import SimWorkload
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.objects import ObjectCache, WatchSpec
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import target_resolver

NAMESPACE = "gpuscale"
START = 1_790_000_000.0


def scenario(nodes: int, *, gpus: int = 2, pool: str = "gpu-a", workloads: tuple[SimWorkload, ...] = ()) -> Scenario:
    return Scenario(
        nodes=tuple(
            SimNode.build(
                f"gpu-{i:02d}", hardware=H100_SXM, gpu_count=gpus, labels={"eks.amazonaws.com/nodegroup": pool}
            )
            for i in range(nodes)
        ),
        workloads=workloads,
    )


@dataclass
class Harness:
    api: SimKubeApi
    exporters: SimExporters
    clock: ManualClock
    rest: KubeRest
    cache: ObjectCache
    controller: Controller
    actuator: KubeActuator
    closers: list[Any] = field(default_factory=list)

    async def reconcile(self, *, advance: float = 15.0) -> ReconcileResult:
        self.clock.advance(advance)
        await self.cache.refresh_once()
        return await self.controller.reconcile_once()

    async def reconcile_until_recovered(self) -> ReconcileResult:
        """Two reconciles: the first sees the node clean, the second comes after recovery.healthy_for (2 min)."""
        await self.reconcile()
        return await self.reconcile(advance=120.0)

    def node(self, name: str) -> dict[str, Any]:
        node = self.api.get("v1", "Node", name)
        assert node is not None
        return node

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.api.list("v1", "Event") if (e.get("involvedObject") or {}).get("name") == name]

    def writes_seen(self) -> list[tuple[str, str]]:
        """(method, path without query) of every write the API received, in order."""
        return [(r.method, r.path_qs.split("?")[0]) for r in self.api.requests if r.method != "GET"]

    async def close(self) -> None:
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):
                await close()


async def start_harness(
    tmp_path: Any,
    *,
    nodes: int = 3,
    dry_run: bool = False,
    actions: HealthActions | None = None,
    policy: RemediationPolicy | None = None,
    api: SimKubeApi | None = None,
    leadership: Leadership | None = None,
    extra_planners: tuple[Planner, ...] = (),
    watch: tuple[WatchSpec, ...] = (),
    specs: list[WatchSpec] | None = None,
    seed: tuple[dict[str, Any], ...] = (),
    workloads: tuple[SimWorkload, ...] = (),
) -> Harness:
    """``specs`` replaces the default watch specs; ``seed`` objects (CRDs, namespaces) are created first."""
    closers: list[Any] = []
    clock = ManualClock(START)
    own_api = api is None
    api = api or SimKubeApi()
    if own_api:
        await api.start()
        closers.append(api.stop)
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for obj in seed:
            api.create(obj)
    exporters = SimExporters()
    await exporters.start(scenario(nodes, workloads=workloads), clock=clock)
    closers.append(exporters.stop)
    if own_api:
        for obj in exporters.kube_objects():
            if obj["kind"] in ("Node", "Namespace") or (workloads and obj["kind"] == "Pod"):
                api.apply(obj)
    kubeconfig = api.write_kubeconfig(tmp_path / f"kubeconfig-{len(list(tmp_path.iterdir()))}")
    client = await new_client_from_config(config_file=kubeconfig)
    closers.append(client.close)
    rest = KubeRest(client)
    specs = specs or [
        WatchSpec("v1", "Node"),
        WatchSpec("v1", "Pod"),
        WatchSpec("v1", "ConfigMap", namespace=NAMESPACE),
        WatchSpec("policy/v1", "PodDisruptionBudget"),
        WatchSpec("v1", "Event", field_selector="source=gpuscale-controller"),
        *watch,
    ]
    cache = ObjectCache(rest, specs)
    closers.append(cache.stop)
    urls = {url: None for url in exporters.dcgm_urls.values()}
    source = ScrapeSource(urls, series=set(TELEMETRY_SERIES), timeout_seconds=5.0, clock=clock)
    closers.append(source.close)
    history = TelemetryHistory(window_seconds=600.0)
    feed = TelemetryFeed([source], Attributor(target_resolver(urls, None)), history, max_age_seconds=60.0)
    planner = HealthPlanner(
        policy or load_remediation_policy(),
        load_policy(),
        actions or HealthActions(),
        state_namespace=NAMESPACE,
    )
    actuator = KubeActuator(rest, dry_run=dry_run, backoff_seconds=0.01, clock=clock)
    controller = Controller(
        view=cache,
        telemetry=feed,
        planners=[planner, *extra_planners],
        actuator=actuator,
        metrics=ControllerMetrics(),
        leadership=leadership,
        clock=clock,
    )
    return Harness(api, exporters, clock, rest, cache, controller, actuator, closers)
