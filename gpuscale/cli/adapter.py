"""`gpuscale adapter`: wire catalogue, sources, store, Kubernetes cache and the HTTP API together."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from aiohttp import web
from aiohttp.typedefs import Middleware

from gpuscale.adapter.answers import AnswerCache
from gpuscale.adapter.app import make_app
from gpuscale.adapter.asked_for import asked_for_middleware
from gpuscale.adapter.auth import DelegatedAuth
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
from gpuscale.adapter.forecasts import ForecastCollector, WorkloadForecasts
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.tls import ServerTLS
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.cli.adapter_rules import (
    CheckedStart,
    asked_for_wait_seconds,
    check_start,
    read_timeout,
    retry_after_seconds,
    scrape_history_seconds,
)
from gpuscale.cli.forecast_history import rate_history
from gpuscale.errors import ConfigError, one_line
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.refresh_scope import RefreshScope
from gpuscale.metrics.steps import Steps
from gpuscale.metrics.store import MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import ObjectRef, format_duration
from gpuscale.pipeline import Pipeline
from gpuscale.selectors import LabelSelector
from gpuscale.settings import AdapterSettings
from gpuscale.sources.base import MetricsSource, TargetHealth
from gpuscale.sources.exporter_discovery import DiscoveryRules, discover
from gpuscale.sources.hpas import HpaCache
from gpuscale.sources.kube import KubeCache
from gpuscale.sources.kubeconfig import load_api_client
from gpuscale.sources.promapi import PrometheusClient
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import target_resolver

if TYPE_CHECKING:
    from kubernetes_asyncio.client import ApiClient

    from gpuscale.sources.prometheus import PrometheusSource

log = logging.getLogger(__name__)

# NB: the event loop waits for the interpreter lock each time it comes back from the kernel (select, recv, send)
# while another thread (the Prometheus source's I/O loop) runs Python, up to this long per hand-over; the build
# runs on the loop itself, in slices (metrics/steps.py). At the default 5 ms, the loop's lag
# during a 10,000-GPU refresh with the build in a thread had p50 5.2 ms; at 1 ms 0.7 ms; at 0.2 ms 0.40–0.42 ms
# against 1.32–2.41 ms at 1 ms in the same spell (benchmarks/bench_refresh_lag.py, answers decoded in a thread,
# 2026-12-07), the refresh no slower: the lock changes hands only when the loop asks for it. `gpuscale adapter` sets it.
SWITCH_INTERVAL_S = 0.0002


@dataclass
class RunningAdapter:
    """A started adapter. ``stop`` releases what the start took (tasks, servers, authentication, source, HPA and
    watch caches, the API client) in the reverse order, from the one exit stack each step entered them on."""

    settings: AdapterSettings
    catalogue: Catalogue
    store: MetricsStore
    pipeline: Pipeline
    source: MetricsSource
    cluster: KubeCache | None
    url: str
    resources: contextlib.AsyncExitStack
    auth: DelegatedAuth | None = None
    scoped_refresh: ScopedRefresh | None = None
    urls: list[str] = field(default_factory=list)
    listening: list[str] = field(default_factory=list)  # what was really bound, for the log

    async def stop(self) -> None:
        await self.resources.aclose()


@dataclass
class ScopedRefresh:
    """The refresh narrowed to what is used (``--demand-driven``, metrics/refresh_scope.py): the HPA cache says what
    is referenced, the Prometheus source fetches only that, a request for anything else waits for one refresh that
    fetches it (adapter/asked_for.py)."""

    scope: RefreshScope
    hpas: HpaCache
    source: PrometheusSource

    def before_refresh(self) -> None:
        now = time.time()
        if self.hpas.synced:
            self.scope.set_referenced(self.hpas.references(), now=now)
            self.source.set_scope(self.scope.begin(now=now))
        else:
            # NB: no HPA list yet (starting, or list/watch refused): fetch everything rather than less than asked.
            self.source.set_scope(None)
            self.scope.begin_all()

    def middleware(self, cluster: KubeCache | None, refresh: Callable[[], Awaitable[None]]) -> Middleware:
        """Notes each metric request's scope; one not fetched yet waits for ``refresh``."""

        def note(metric: str, namespace: str | None) -> bool:
            known = cluster is None or not cluster.synced or namespace is None or namespace in cluster.namespaces()
            if not known:
                return True  # NB: the provider answers 404; a namespace that does not exist never joins a query
            return self.scope.note_request(metric, namespace, now=time.time())

        return asked_for_middleware(note, refresh)

    def note(self) -> str:
        """A /readyz note while the HPA list cannot be read ('' when it can)."""
        failing = [h for h in self.hpas.health() if not h.healthy]
        if not failing:
            return ""
        what = "refreshing every metric" if not self.hpas.synced else "refreshing what the last HPA list referenced"
        return f"HorizontalPodAutoscaler list/watch failing, {what} ({one_line(failing[0].error or 'no answer', 120)})"


# --- the composition --------------------------------------------------------------------------------------------


@dataclass
class _Source:
    source: MetricsSource
    targets: dict[str, ObjectRef | None]  # the url → pod map the attributor reads (rediscovery updates it)
    before_refresh: Callable[[], None] | None


@dataclass
class _Servers:
    urls: list[str]
    listening: list[str]
    auth: DelegatedAuth | None


async def start_adapter(
    settings: AdapterSettings, *, catalogue: Catalogue | None = None, port_flags: dict[str, str] | None = None
) -> RunningAdapter:
    """Start serving, in named steps (``check_start``, ``make_cluster``, ``make_source``, ``make_scope``,
    ``make_forecasts``, ``make_pipeline``, ``make_servers``). Each step enters what it takes on one exit stack, so a
    failure at any step releases what the earlier ones took. ``port_flags`` names the flags a caller set the ports
    with, for a port already in use."""
    flags = {"insecure": "--insecure-port", "secure": "--secure-port", **(port_flags or {})}
    checked = check_start(settings, catalogue)
    catalogue = checked.catalogue
    started = time.time()
    async with contextlib.AsyncExitStack() as resources:
        api, cluster = await make_cluster(settings, resources)
        made = make_source(settings, checked, cluster)
        resources.push_async_callback(made.source.close)
        scoped = await make_scope(settings, catalogue, api, cluster, made.source, resources)
        store = MetricsStore()
        # NB: the watch cache reports per kind like a source per target: an API outage shows on /metrics.
        reporters: list = [made.source, *([cluster] if cluster else []), *([scoped.hpas] if scoped else [])]
        selfmetrics = AdapterMetrics(lambda: reporters)
        forecasts = make_forecasts(settings, catalogue, store, cluster, scoped, selfmetrics)
        provider = MetricsProvider(
            catalogue, store, cluster, retry_after_seconds=retry_after_seconds(settings), forecasts=forecasts
        )
        # NB: one answer cache for both ports' apps, its bodies for recent queries built by each refresh (answers.py)
        answers = AnswerCache(count=selfmetrics.count_answer)
        pipeline = make_pipeline(settings, catalogue, store, made, cluster, scoped, selfmetrics, provider, answers)
        ready = _readiness_of(store, cluster, made.source, catalogue, scoped, started=started)
        discovery = Discovery(
            catalogue,
            serve_custom=settings.serve_custom,
            serve_external=settings.serve_external,
            forecasts=tuple(FORECAST_METRICS) if forecasts is not None else (),
        )
        wait = asked_for_wait_seconds(settings)
        middlewares = (
            [] if scoped is None else [scoped.middleware(cluster, lambda: pipeline.refresh_soon(timeout=wait))]
        )

        def app(*first: Middleware) -> web.Application:
            return make_app(
                provider, discovery, selfmetrics, ready=ready, middlewares=[*first, *middlewares], answers=answers
            )

        servers = await make_servers(settings, checked, api, app, selfmetrics, resources, flags=flags)
        _run(resources, pipeline.run(), name="refresh")
        if checked.server_tls is not None and settings.tls_reload_interval > 0:
            _run(resources, _reload_serving_cert(checked.server_tls, settings.tls_reload_interval), name="serving-cert")
        return RunningAdapter(
            settings,
            catalogue,
            store,
            pipeline,
            made.source,
            cluster,
            servers.urls[0],
            resources.pop_all(),
            auth=servers.auth,
            scoped_refresh=scoped,
            urls=servers.urls,
            listening=servers.listening,
        )


def make_pipeline(
    settings: AdapterSettings,
    catalogue: Catalogue,
    store: MetricsStore,
    made: _Source,
    cluster: KubeCache | None,
    scoped: ScopedRefresh | None,
    selfmetrics: AdapterMetrics,
    provider: MetricsProvider,
    answers: AnswerCache,
) -> Pipeline:
    """The refresh loop: source → store every interval; each snapshot goes live with its prepared answers and
    forecasts at once, and a scoped refresh learns what the next one fetches."""
    forecasts = provider.forecasts
    return Pipeline(
        catalogue,
        made.source,
        store,
        Attributor(target_resolver(made.targets, cluster)),
        interval_seconds=settings.refresh_interval,
        on_refresh=_on_refresh(scoped, selfmetrics),
        before_refresh=scoped.before_refresh if scoped is not None else made.before_refresh,
        prepare=lambda snapshot: _both(
            answers.prepare(provider, snapshot), forecasts.prepare(snapshot) if forecasts is not None else None
        ),
        gather=forecasts.gather if forecasts is not None else None,
    )


async def make_cluster(
    settings: AdapterSettings, resources: contextlib.AsyncExitStack
) -> tuple[ApiClient | None, KubeCache | None]:
    """The Kubernetes API client and its watch cache, with a kubeconfig or in a cluster (else neither)."""
    if settings.kube.kubeconfig is None and not _in_cluster():
        if settings.discover_exporters:
            raise ConfigError("--discover-exporters needs the Kubernetes API: give --kubeconfig or run in a cluster")
        return None, None
    api = await load_api_client(settings.kube.kubeconfig)
    resources.push_async_callback(api.close)
    cluster = KubeCache(api)
    await cluster.start()
    resources.push_async_callback(cluster.stop)
    return api, cluster


def make_source(settings: AdapterSettings, checked: CheckedStart, cluster: KubeCache | None) -> _Source:
    """Prometheus (``--prometheus-url``), or the exporters scraped (``--scrape-url``, and with
    ``--discover-exporters`` the pods the watch cache finds, looked up again before each refresh)."""
    explicit, catalogue = checked.explicit, checked.catalogue
    targets = dict(explicit)
    if settings.prometheus.url:
        return _Source(_prometheus_source(settings, catalogue), targets, None)
    scrape = ScrapeSource.from_flags(
        settings.scrape,
        explicit,
        series=catalogue.series_names,
        windowed_series=catalogue.windowed_series,
        history_seconds=scrape_history_seconds(settings, catalogue),
        timeout_seconds=read_timeout("--scrape-timeout", settings.scrape.scrape_timeout, settings),
        publish_early=True,
        off_loop=True,
    )
    if not settings.scrape.discover_exporters:
        return _Source(scrape, targets, None)
    assert cluster is not None  # NB: make_cluster refuses --discover-exporters without the API
    rules = DiscoveryRules(
        LabelSelector.parse(settings.scrape.dcgm_exporter_selector), LabelSelector.parse(settings.triton_selector)
    )

    def rediscover() -> None:
        found = discover(cluster, rules) if cluster.synced else {}
        targets.clear()
        targets.update(explicit)
        targets.update({url: owner for url, owner in found.items() if url not in explicit})
        scrape.set_targets(targets)

    return _Source(scrape, targets, rediscover)


async def make_scope(
    settings: AdapterSettings,
    catalogue: Catalogue,
    api: ApiClient | None,
    cluster: KubeCache | None,
    source: MetricsSource,
    resources: contextlib.AsyncExitStack,
) -> ScopedRefresh | None:
    """The refresh narrowed to what HPAs reference and requests ask for (``--demand-driven``): only with
    --prometheus-url, whose queries can name namespaces, and the Kubernetes API, which lists the HPAs."""
    if not settings.prometheus.url or not settings.demand_driven or api is None:
        return None
    # NB: a forecast an HPA or a request names wants its rate metric in that namespace (refresh_scope.py)
    derived = (
        dict.fromkeys(FORECAST_METRICS, settings.forecast_rate_metric)
        if _forecasting(settings, cluster) and catalogue.get(settings.forecast_rate_metric) is not None
        else {}  # NB: an unknown rate metric is refused by make_forecasts, naming the flag
    )
    scope = RefreshScope(catalogue, keep_warm_seconds=settings.keep_warm, derived=derived)
    scoped = ScopedRefresh(scope, HpaCache(api), cast("PrometheusSource", source))  # NB: --prometheus-url
    await scoped.hpas.start()
    resources.push_async_callback(scoped.hpas.stop)
    return scoped


def make_forecasts(
    settings: AdapterSettings,
    catalogue: Catalogue,
    store: MetricsStore,
    cluster: KubeCache | None,
    scoped: ScopedRefresh | None,
    selfmetrics: AdapterMetrics,
    *,
    clock: Callable[[], float] = time.time,
) -> WorkloadForecasts | None:
    """The forecast_* metrics (docs/forecast.md): they need the workloads (the Kubernetes API) and the request-rate
    metric in the catalogue; with a scoped refresh the rate is read only where a forecast is wanted. ``clock``:
    what a served value's age is measured against (a test's own)."""
    if not _forecasting(settings, cluster):
        return None
    assert cluster is not None
    metric = catalogue.get(settings.forecast_rate_metric)
    if metric is None:
        raise ConfigError(
            f"--forecast-rate-metric: {settings.forecast_rate_metric!r} is not in the metric catalogue "
            "(or turn forecasts off with --no-forecast)"
        )
    rate = DemandSettings(model=settings.forecast_model, min_history_s=settings.forecast_min_history)
    forecasts = WorkloadForecasts(
        WorkloadDemand(
            DemandBook(rate),
            store,
            cluster,
            rate_metric=metric.name,
            default_startup_s=settings.forecast_default_startup,
            # NB: a forecast is as old as its last step; the rate metric's own max-age plus one step
            max_age_s=catalogue.max_age(metric) + rate.step_s,
            clock=clock,
        ),
        rate_namespaces=(lambda: scoped.scope.fetching(metric.name)) if scoped is not None else lambda: None,
        history=rate_history(settings, catalogue, metric, cluster, rate) if settings.prometheus.url else None,
    )
    selfmetrics.registry.register(ForecastCollector(forecasts))
    forecasts.count_dropped = selfmetrics.count_dropped
    return forecasts


async def make_servers(
    settings: AdapterSettings,
    checked: CheckedStart,
    api: ApiClient | None,
    app: Callable[..., web.Application],
    selfmetrics: AdapterMetrics,
    resources: contextlib.AsyncExitStack,
    *,
    flags: dict[str, str],
) -> _Servers:
    """The plain-HTTP port (``--insecure-port``: local use, no authentication) and the HTTPS port with delegated
    authentication (TokenReview, SubjectAccessReview, the front proxy's client certificates)."""
    servers = _Servers([], [], None)
    rejections = RejectionLog(count=lambda reason: selfmetrics.rejected_requests.labels(reason).inc())
    if settings.insecure_port is not None:
        address, port = settings.insecure_bind_address, settings.insecure_port
        site = await _serve(AdapterRunner(app(), rejections=rejections, access_log=None), address, port, resources)
        await _listen(site, flags["insecure"], address, port)
        servers.urls.append(f"http://{_host(address)}:{_bound_port(site)}")
        servers.listening.append(f"http://{_bound_address(site)} (plain HTTP, no authentication)")
    if settings.https_port is None:
        return servers
    if api is None:
        raise ConfigError(
            "--secure-port: delegated authentication needs the Kubernetes API; give --kubeconfig, run in a "
            "cluster, or serve --insecure-port alone"
        )
    assert checked.server_tls is not None
    auth = DelegatedAuth(
        api,
        flags=settings.authentication,
        authn_cache_ttl_seconds=settings.authn_cache_ttl,
        authz_cache_ttl_seconds=settings.authz_cache_ttl,
        allow_anonymous=settings.allow_anonymous,
    )
    servers.auth = auth
    resources.push_async_callback(auth.stop)
    await auth.start(sync_timeout=30.0)  # SourceUnavailable if the ConfigMap cannot be read
    auth.serve_tls(checked.server_tls)
    runner = AdapterRunner(app(auth.middleware()), rejections=rejections, access_log=None)
    address, port = settings.bind_address, settings.https_port
    site = await _serve(runner, address, port, resources, ssl_context=checked.server_tls.context)
    await _listen(site, flags["secure"], address, port)
    servers.urls.append(f"https://{_host(address)}:{_bound_port(site)}")
    servers.listening.append(f"https://{_bound_address(site)} (delegated authentication)")
    return servers


async def _serve(
    runner: web.AppRunner, address: str, port: int, resources: contextlib.AsyncExitStack, **site_options: Any
) -> web.TCPSite:
    """The runner set up (and cleaned up with the rest) and its site, not yet listening."""
    await runner.setup()
    resources.push_async_callback(runner.cleanup)
    return web.TCPSite(runner, address, port, **site_options)


def _run(resources: contextlib.AsyncExitStack, work: Coroutine[Any, Any, None], *, name: str) -> None:
    """``work`` as a task, cancelled (and awaited) first when the adapter stops."""
    task = asyncio.create_task(work, name=name)

    async def cancel() -> None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    resources.push_async_callback(cancel)


def _on_refresh(scoped: ScopedRefresh | None, selfmetrics: AdapterMetrics) -> Callable[[Snapshot, float], None]:
    def on_refresh(snapshot: Snapshot, seconds: float) -> None:
        if scoped is not None:
            scoped.scope.completed()
        selfmetrics.observe_refresh(snapshot, seconds)

    return on_refresh


def _readiness_of(
    store: MetricsStore,
    cluster: KubeCache | None,
    source: MetricsSource,
    catalogue: Catalogue,
    scoped: ScopedRefresh | None,
    *,
    started: float,
) -> Callable[[], tuple[bool, str]]:
    """/readyz of this adapter: ``readiness`` of its store, cache, source and scope, now."""
    max_age = catalogue.defaults.max_age

    def ready() -> tuple[bool, str]:
        return readiness(
            store_ready=store.ready,
            cluster_synced=None if cluster is None else cluster.synced,
            health=source.health(),
            kubernetes=cluster.health() if cluster is not None else (),
            max_age=max_age,
            started=started,
            now=time.time(),
            notes=[n for n in [scoped.note() if scoped is not None else ""] if n],
        )

    return ready


def readiness(
    *,
    store_ready: bool,
    cluster_synced: bool | None,
    kubernetes: Sequence[TargetHealth] = (),
    health: Sequence[TargetHealth],
    max_age: float,
    started: float,
    now: float,
    notes: Sequence[str] = (),
) -> tuple[bool, str]:
    """/readyz: ready, or not with what actually happened (how long, which source, why)."""
    since_start = format_duration(round(now - started))
    if not store_ready:
        return False, f"first refresh has not completed ({since_start} since the start)"
    if cluster_synced is False:
        return False, f"Kubernetes watch cache not synced ({since_start} since the start)"

    # NB: not ready only when nothing fresh can be served: a failing source keeps serving its last
    # values until they reach max-age, and readiness must not take a replica away before then.
    def summary(problems: Sequence[TargetHealth]) -> str:
        shown = "; ".join(f"{h.target}: {one_line(h.error or h.degraded or 'no data', 120)}" for h in problems[:3])
        return shown + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")

    if health and all(h.last_success is None or now - h.last_success > max_age for h in health):
        failing, more = summary(health), ""
        answered = [h.last_success for h in health if h.last_success is not None]
        if not answered:
            return False, f"no source has answered since the start {since_start} ago ({failing}{more})"
        return False, (
            f"no source has answered for {format_duration(round(now - max(answered)))}, longer than the "
            f"max-age of {format_duration(max_age)} ({failing}{more})"
        )
    notes = list(notes)
    problems = [h for h in health if not h.healthy or h.degraded]
    if problems:
        # Ready (the last good values are still served) — but say what is wrong, before it turns stale.
        notes.append(f"{len(problems)} of {len(health)} targets failing or degraded: {summary(problems)}")
    api_down = [h for h in kubernetes if not h.healthy]
    if api_down:
        # NB: pods, labels and workloads are served from the watch cache as last seen.
        shown = "; ".join(f"{h.target}: {one_line(h.error or 'no answer', 100)}" for h in api_down[:3])
        notes.append(f"Kubernetes API not answering, serving pods and workloads from the cache ({shown})")
    return True, "; ".join(notes)


async def _reload_serving_cert(server_tls: ServerTLS, interval: float) -> None:
    """Pick up a renewed serving certificate (cert-manager, a rotated Secret) without a restart."""
    while True:
        await asyncio.sleep(interval)
        # NB: in the event loop, not a thread: two files of a few KB, read every few seconds.
        server_tls.reload_serving_cert()


async def _listen(site: web.TCPSite, flag: str, address: str, port: int) -> None:
    try:
        await site.start()
    except OSError as e:
        reason = e.strerror or str(e)
        hint = " (another process is listening there; choose another port)" if e.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"{flag}: cannot listen on {address}:{port}: {reason}{hint}") from None


def _bound_address(site: web.TCPSite) -> str:
    server = site._server  # NB: see _bound_port
    assert server is not None
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _host(bind_address: str) -> str:
    return "127.0.0.1" if bind_address in ("0.0.0.0", "") else bind_address


def _bound_port(site: web.TCPSite) -> int:
    server = site._server  # NB: aiohttp exposes the bound socket only here; needed when port 0 was asked for
    assert server is not None
    return server.sockets[0].getsockname()[1]


def _both(first: Steps[Callable[[], None]], second: Steps[Callable[[], None]] | None) -> Steps[Callable[[], None]]:
    """Two refresh preparations one after the other; what installs both at once (the forecasts and the answers go
    live with the snapshot)."""
    install_first = yield from first
    if second is None:
        return install_first
    install_second = yield from second

    def install() -> None:
        install_first()
        install_second()

    return install


def _forecasting(settings: AdapterSettings, cluster: KubeCache | None) -> bool:
    """Forecast metrics are served when asked for and the workloads can be read (the Kubernetes API)."""
    return settings.forecast and cluster is not None


def _prometheus_source(settings: AdapterSettings, catalogue: Catalogue) -> PrometheusSource:
    from gpuscale.metrics.aggregation import queries
    from gpuscale.sources.prometheus import PrometheusSource

    client = PrometheusClient.connect(
        settings.prometheus,
        within=read_timeout("--prometheus-timeout", settings.prometheus.timeout, settings),
        max_body_bytes=settings.prometheus_max_response_size,
        max_body_flag="--prometheus-max-response-size",
    )
    return PrometheusSource(
        client,
        queries=queries(catalogue),
        max_label_sets=settings.prometheus_max_label_sets,
        max_label_sets_flag="--prometheus-max-label-sets",
        fresh_within_seconds=max(catalogue.max_age(m) for m in catalogue.metrics),
        decode_in="process" if settings.prometheus_decode_process else "thread",
        off_loop=True,  # NB: on the serving loop, no better for requests (docs/benchmarks.md, issue 36)
    )


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def wait_ready(adapter: RunningAdapter, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not adapter.store.ready or (adapter.cluster is not None and not adapter.cluster.synced):
        if time.monotonic() > deadline:
            raise TimeoutError("adapter did not become ready")
        await asyncio.sleep(0.05)
