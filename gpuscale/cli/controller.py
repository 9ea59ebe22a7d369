"""`gpuscale controller`: wire the watch caches, telemetry, planners, actuator, leader election and probes.

The composition root of the controller (ENGINEERING.md §1): nothing under ``gpuscale/controller`` builds
sources or clients; this module does, from ``ControllerSettings``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuscale.controller.actuator import KubeActuator
from gpuscale.controller.capacity import ExpanderPlanner, GangCapacityPlanner, NodePoolWeightsPlanner
from gpuscale.controller.drain import DrainPolicy
from gpuscale.controller.expander import unmeasured_pools
from gpuscale.controller.gangs import GANG_KINDS
from gpuscale.controller.health import HELD_BACK, RECORD, HealthPlanner
from gpuscale.controller.hints import HintsPlanner, HintsPolicy, idle_gpus, load_hints_policy
from gpuscale.controller.leader import LeaseElector
from gpuscale.controller.loop import Controller
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.controller.nodepool_weights import NODEPOOL
from gpuscale.controller.observe import TelemetryFeed
from gpuscale.controller.pools import PoolsPolicy, load_pools_policy, mean_activity_by_pool, pools_of
from gpuscale.controller.provisioning import PROVISIONING_KINDS
from gpuscale.controller.remediation_policy import RemediationPolicy, load_remediation_policy
from gpuscale.controller.telemetry import (
    TELEMETRY_SERIES,
    ClusterTelemetry,
    TelemetryHistory,
    mean_activity_by_node,
)
from gpuscale.controller.writes import ClusterView, Planner
from gpuscale.errors import ConfigError
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.devices import device_queries
from gpuscale.metrics.diagnosis import DiagnosisPolicy, load_policy
from gpuscale.policy_files import check_policies_dir
from gpuscale.pricing import PriceTable, load_prices
from gpuscale.selectors import LabelSelector
from gpuscale.settings import ControllerSettings
from gpuscale.sources.base import MetricsSource
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
from gpuscale.sources.exporter_discovery import DiscoveryRules, discover
from gpuscale.sources.kubeconfig import load_api_client
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.objects import ObjectCache, WatchSpec
from gpuscale.sources.promapi import check_credentials
from gpuscale.sources.targets import parse_scrape_targets, target_resolver

__all__ = ["RunningController", "start_controller"]

log = logging.getLogger("gpuscale.controller")

STATE_CONFIGMAP = "gpuscale-controller-state"
COMPONENT = "gpuscale-controller"  # the Events' source.component and the writes' fieldManager


def watch_specs(
    settings: ControllerSettings, pools_policy: PoolsPolicy, *, extra_kinds: Iterable[tuple[str, str]] = ()
) -> list[WatchSpec]:
    """The kinds the planners read (what RBAC must allow to list and watch: see deploy/controller).

    ``extra_kinds``: (apiVersion, kind) other planners read; a custom resource whose CRD is not installed stays
    empty rather than failing the start (only built-in ``v1`` kinds must be served)."""
    specs = [
        WatchSpec("v1", "Node"),
        WatchSpec("v1", "Pod"),
        WatchSpec("v1", "ConfigMap", namespace=settings.namespace, field_selector=f"metadata.name={STATE_CONFIGMAP}"),
    ]
    if settings.health and settings.health_actions.drain:
        specs.append(WatchSpec("policy/v1", "PodDisruptionBudget"))
    # NB: only this controller's own Events (what planners check to say a thing once).
    specs.append(WatchSpec("v1", "Event", field_selector=f"source={COMPONENT}"))
    if settings.expander:
        expander = pools_policy.expander
        specs.append(
            WatchSpec("v1", "ConfigMap", namespace=expander.namespace, field_selector=f"metadata.name={expander.name}")
        )
    if settings.expander and settings.karpenter_nodepool:
        # NB: optional: without Karpenter's CRDs the NodePools are simply none (and nothing is written)
        specs.append(WatchSpec(*NODEPOOL, optional=True))
    have = {(s.api_version, s.kind) for s in specs}
    if settings.gangs:
        extra_kinds = (*extra_kinds, *GANG_KINDS, *PROVISIONING_KINDS)
    for api_version, kind in extra_kinds:
        if (api_version, kind) not in have:
            have.add((api_version, kind))
            specs.append(WatchSpec(api_version, kind, optional=api_version != "v1"))
    return specs


@dataclass
class RunningController:
    controller: Controller
    cache: ObjectCache
    feed: TelemetryFeed
    elector: LeaseElector | None
    metrics: ControllerMetrics
    url: str
    runner: web.AppRunner
    closers: list[Callable[[], Awaitable[object]]] = field(default_factory=list)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def ready(self) -> list[str]:
        """Why this replica is not ready (empty when it is)."""
        problems = []
        if not self.cache.synced:
            missing = ", ".join(f"{k}: {e}" for k, e in sorted(self.cache.last_errors.items())) or "not listed yet"
            problems.append(f"watch caches not synced ({missing})")
        health = self.feed.health()
        if not health:
            problems.append("no telemetry target (no exporter URL given or discovered)")
        elif not any(h.healthy for h in health):
            failing = "; ".join(f"{h.target}: {h.error or 'no answer'}" for h in health[:3])
            problems.append(f"no telemetry source answered ({len(health)} failing: {failing})")
        last = self.controller.last
        if last is None:
            problems.append("no reconcile yet")
        elif last.error:
            problems.append(last.error)
        return problems

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.elector is not None:
            await self.elector.release()
        await self.runner.cleanup()
        for close in reversed(self.closers):
            with contextlib.suppress(Exception):  # NB: closing must not hide the error being reported
                await close()


def _identity(settings: ControllerSettings) -> str:
    return settings.identity or os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _sources(
    settings: ControllerSettings, view: ClusterView | None = None
) -> tuple[list[MetricsSource], Attributor, Callable[[], None] | None]:
    """The metric source, the attributor placing its series on nodes, and (with --discover-exporters) the hook
    that points the scrape source at the dcgm-exporter pods the watch cache holds before each refresh."""
    if settings.prometheus.url:
        from gpuscale.sources.promapi import PrometheusClient
        from gpuscale.sources.prometheus import PrometheusSource

        source: MetricsSource = PrometheusSource(
            PrometheusClient.connect(settings.prometheus, within=settings.interval),
            queries=device_queries(TELEMETRY_SERIES),
            fresh_within_seconds=max(60.0, 3 * settings.interval),
        )
        return [source], Attributor(target_resolver({}, None)), None
    from gpuscale.sources.scrape import ScrapeSource

    explicit = parse_scrape_targets(settings.scrape.scrape_url)
    scrape = ScrapeSource.from_flags(settings.scrape, explicit, series=set(TELEMETRY_SERIES))
    if not settings.scrape.discover_exporters or view is None:
        return [scrape], Attributor(target_resolver(explicit, None)), None
    targets = dict(explicit)
    exporters = _ExporterPods()
    rules = DiscoveryRules(LabelSelector.parse(settings.scrape.dcgm_exporter_selector), LabelSelector.nothing())

    def rediscover() -> None:
        selected = [
            PodInfo.from_object(p)
            for p in view.objects("v1", "Pod")
            if rules.dcgm_selector.matches((p.get("metadata") or {}).get("labels") or {})
        ]
        exporters.pods = StaticClusterObjects(pods=selected)
        targets.clear()
        targets.update(explicit)
        targets.update({u: owner for u, owner in discover(exporters.pods, rules).items() if u not in explicit})
        scrape.set_targets(targets)

    return [scrape], Attributor(target_resolver(targets, exporters)), rediscover  # type: ignore[arg-type]


def pool_activity(policy: PoolsPolicy) -> Callable[[ClusterView, ClusterTelemetry], dict[str, float]]:
    """pool → mean GPU activity of its reporting nodes now (what the expander ranks by), from the telemetry."""

    def activity(view: ClusterView, telemetry: ClusterTelemetry) -> dict[str, float]:
        return mean_activity_by_pool(view.objects("v1", "Node"), mean_activity_by_node(telemetry), policy=policy)

    return activity


class _ExporterPods:
    """The dcgm-exporter pods last discovered: what places a scraped URL on its pod and node."""

    def __init__(self) -> None:
        self.pods = StaticClusterObjects()

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self.pods.pod(namespace, name)

    def pod_at(self, ip: str, port: int) -> PodInfo | None:
        return self.pods.pod_at(ip, port)


def _observer(metrics: ControllerMetrics, hints_policy_idle_for: float, pool_labels: tuple[str, ...]):
    last: dict[str, float] = {}

    def observe(view: ClusterView, telemetry: ClusterTelemetry, now: float) -> None:
        idle = idle_gpus(telemetry, idle_for=hints_policy_idle_for)
        metrics.idle_gpus.clear()
        for node, count in idle.items():
            metrics.idle_gpus.labels(node).set(count)
        previous = last.get("at")
        if previous is not None and now > previous:
            metrics.idle_gpu_seconds.inc(sum(idle.values()) * (now - previous))
        last["at"] = now
        pools: dict[str, int] = {}
        remediated = held = 0
        reporting = {True: 0, False: 0}
        for name, node in telemetry.nodes.items():
            del name
            reporting[node.reporting] += 1
        for node in view.objects("v1", "Node"):
            meta = node.get("metadata") or {}
            labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
            if meta.get("name") in telemetry.nodes or labels.get("nvidia.com/gpu.present") == "true":
                pool = next((labels[k] for k in pool_labels if labels.get(k)), "")
                pools[pool] = pools.get(pool, 0) + 1
            remediated += 1 if RECORD in annotations and HELD_BACK not in annotations else 0
            held += 1 if HELD_BACK in annotations else 0
        metrics.pool_nodes.clear()
        for pool, count in pools.items():
            metrics.pool_nodes.labels(pool).set(count)
        metrics.pools.set(len(pools))
        metrics.remediated_nodes.set(remediated)
        metrics.held_back_nodes.set(held)
        for flag, count in reporting.items():
            metrics.telemetry_nodes.labels("true" if flag else "false").set(count)

    return observe


def _expander_evidence(metrics: ControllerMetrics, policy: PoolsPolicy, prices, activity):
    """Sets ``gpuscale_controller_expander_stale``: 1 while some pool with nodes has no fresh telemetry."""

    def observe(view: ClusterView, telemetry: ClusterTelemetry, now: float) -> None:
        pools = pools_of(view.objects("v1", "Node"), policy=policy, prices=prices)
        metrics.expander_stale.set(1 if unmeasured_pools(pools, activity(view, telemetry)) else 0)

    return observe


@dataclass
class ControllerPolicies:
    """The policy files the planners read, loaded (and the directory checked) before anything connects."""

    diagnosis: DiagnosisPolicy
    remediation: RemediationPolicy
    hints: HintsPolicy
    pools: PoolsPolicy
    prices: PriceTable


def load_controller_policies(settings: ControllerSettings) -> ControllerPolicies:
    policies = settings.files.policies
    if policies:
        check_policies_dir(policies)
    return ControllerPolicies(
        load_policy(policies),
        load_remediation_policy(policies),
        load_hints_policy(policies),
        load_pools_policy(policies),
        load_prices(policies),
    )


async def start_controller(settings: ControllerSettings) -> RunningController:
    """Start in named steps (``load_controller_policies``, ``make_watch``, ``make_feed``, ``make_planners``,
    ``make_elector``). Each step appends what it opens to ``closers``, so a failure at any step closes what the
    earlier ones opened, newest first, and ``RunningController.stop`` closes them the same way."""
    policies = load_controller_policies(settings)
    # NB: a bad token file is refused at start-up, not by a first refresh of a controller that then runs blind
    check_credentials(settings.prometheus)
    closers: list[Callable[[], Awaitable[object]]] = []
    try:
        rest, cache = await make_watch(settings, policies.pools, closers)
        identity = _identity(settings)
        sources, feed = make_feed(settings, policies, cache, closers)
        health_by_source = lambda: [  # noqa: E731
            *((s.name, h) for s in sources for h in s.health()),
            *((cache.name, h) for h in cache.health()),
        ]
        metrics = ControllerMetrics(health_by_source)
        metrics.dry_run.set(1 if settings.dry_run else 0)
        planners, observers = make_planners(settings, policies, metrics)
        actuator = KubeActuator(rest, dry_run=settings.dry_run, component=COMPONENT, instance=identity)
        elector = make_elector(settings, rest, identity)
        controller = Controller(
            view=cache,
            telemetry=feed,
            planners=planners,
            actuator=actuator,
            metrics=metrics,
            leadership=elector,
            acting=not settings.dry_run,
            observers=observers,
            interval_seconds=settings.interval,
        )
        running = RunningController(controller, cache, feed, elector, metrics, "", None, closers)  # type: ignore[arg-type]
        runner = await _serve(running, settings)
        running.runner = runner
        return running
    except BaseException:
        for close in reversed(closers):
            with contextlib.suppress(Exception):
                await close()
        raise


async def make_watch(
    settings: ControllerSettings, pools_policy: PoolsPolicy, closers: list[Callable[[], Awaitable[object]]]
) -> tuple[KubeRest, ObjectCache]:
    """The Kubernetes API client and the watch caches of the kinds the planners read (``watch_specs``)."""
    api = await load_api_client(settings.kube.kubeconfig)
    closers.append(api.close)
    rest = KubeRest(api)
    cache = ObjectCache(rest, watch_specs(settings, pools_policy))
    await cache.start()
    closers.append(cache.stop)
    return rest, cache


def make_feed(
    settings: ControllerSettings,
    policies: ControllerPolicies,
    cache: ObjectCache,
    closers: list[Callable[[], Awaitable[object]]],
) -> tuple[list[MetricsSource], TelemetryFeed]:
    """The telemetry sources and the feed that refreshes them into per-node history, as long as the remediation
    window and the idle rule need."""
    sources, attributor, rediscover = _sources(settings, cache)
    history = TelemetryHistory(
        window_seconds=policies.remediation.window,
        idle_below=policies.hints.idle.below,
        forget_after_seconds=max(3600.0, policies.hints.idle.for_seconds * 2),
    )
    feed = TelemetryFeed(
        sources,
        attributor,
        history,
        max_age_seconds=max(60.0, 3 * settings.interval),
        before_refresh=rediscover,
    )
    closers.append(feed.close)
    return sources, feed


def make_planners(
    settings: ControllerSettings, policies: ControllerPolicies, metrics: ControllerMetrics
) -> tuple[list[Planner], list[Callable[[ClusterView, ClusterTelemetry, float], None]]]:
    """The planners turned on (health, hints, gangs, expander, in that order) and the observers that export what
    each reconcile sees."""
    pools_policy, prices = policies.pools, policies.prices
    planners: list[Planner] = []
    health: HealthPlanner | None = None
    if settings.health:
        health = HealthPlanner(
            policies.remediation,
            policies.diagnosis,
            settings.health_actions,
            DrainPolicy(),
            identity=COMPONENT,
            state_namespace=settings.namespace,
            state_name=STATE_CONFIGMAP,
        )
        planners.append(health)
    if settings.hints:
        being_replaced = health.remediates if health is not None else None
        planners.append(HintsPlanner(policies.hints, settings.hint_actions, being_replaced=being_replaced))
    if settings.gangs and pools_policy.gangs.enabled:
        planners.append(GangCapacityPlanner(pools_policy, prices=prices))
    observers = [_observer(metrics, policies.hints.idle.for_seconds, policies.remediation.pool_labels)]
    if settings.expander and pools_policy.expander.enabled:
        activity = pool_activity(pools_policy)
        planners.append(ExpanderPlanner(pools_policy, prices=prices, activity=activity))
        if settings.karpenter_nodepool:
            managed = settings.karpenter_nodepool
            planners.append(NodePoolWeightsPlanner(pools_policy, prices=prices, activity=activity, managed=managed))
        observers.append(_expander_evidence(metrics, pools_policy, prices, activity))
    return planners, observers


def make_elector(settings: ControllerSettings, rest: KubeRest, identity: str) -> LeaseElector | None:
    """The Lease election (``--leader-elect``); none in a dry run."""
    # NB: a dry run writes nothing, the Lease included: it never competes with (or waits for) the acting replica.
    if not settings.leader_elect or settings.dry_run:
        return None
    return LeaseElector(
        rest,
        namespace=settings.namespace,
        name=settings.lease_name,
        identity=identity,
        lease_duration=settings.lease_duration,
        renew_deadline=settings.renew_deadline,
        retry_period=settings.retry_period,
    )


async def _serve(running: RunningController, settings: ControllerSettings) -> web.AppRunner:
    async def healthz(request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def readyz(request: web.Request) -> web.Response:
        problems = running.ready()
        if problems:
            return web.Response(status=503, text="not ready: " + "; ".join(problems) + "\n")
        return web.Response(text="ok\n")

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(running.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.bind_address, settings.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ConfigError(f"--port {settings.port}: cannot listen on {settings.bind_address}: {e.strerror}") from e
    host, port = runner.addresses[0][:2]
    running.url = f"http://{host}:{port}"
    return runner


async def _synced_or_stopped(cache: ObjectCache, stop: asyncio.Event, *, every: float) -> bool:
    """Wait for the caches' first sync (unready meanwhile, a warning every ``every`` seconds); False if stopped."""
    while not stop.is_set():
        stopped = asyncio.ensure_future(stop.wait())
        try:
            synced = asyncio.ensure_future(cache.wait_synced(timeout=every))
            await asyncio.wait([stopped, synced], return_when=asyncio.FIRST_COMPLETED)
            if synced.done():
                error = synced.exception()
                if error is None:
                    return True
                log.warning("%s; still waiting", error)
            else:
                synced.cancel()
        finally:
            stopped.cancel()
    return False


async def run_controller(settings: ControllerSettings, stop: asyncio.Event) -> None:
    running = await start_controller(settings)
    log.info(
        "controller serving probes and metrics on %s (dry-run=%s, leader-elect=%s)",
        running.url,
        settings.dry_run,
        running.elector is not None,
    )
    try:
        if not await _synced_or_stopped(running.cache, stop, every=max(30.0, 2 * settings.interval)):
            return
        wake = asyncio.Event()
        if running.elector is not None:
            running.tasks.append(asyncio.create_task(running.elector.run(stop), name="leader-election"))
            wake = running.elector.changed
        running.tasks.append(asyncio.create_task(running.controller.run(stop, wake=wake), name="reconcile"))
        await stop.wait()
        log.info("stopping: releasing the Lease and closing")
    finally:
        started = time.monotonic()
        await running.stop()
        log.info("stopped in %.2fs", time.monotonic() - started)
