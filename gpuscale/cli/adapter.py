"""`gpuscale adapter`: wire catalogue, sources, store, Kubernetes cache and the HTTP API together."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from aiohttp import web

from gpuscale.adapter.answers import AnswerCache
from gpuscale.adapter.app import make_app
from gpuscale.adapter.auth import AuthenticationFlags, DelegatedAuth
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.forecasts import METRICS as FORECAST_METRICS
from gpuscale.adapter.forecasts import ForecastCollector, WorkloadForecasts
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.refresh_scope import demand_middleware
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.tls import ServerTLS, serving_cert_files
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.errors import ConfigError, one_line
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import Catalogue, load_catalogue
from gpuscale.metrics.demand import DemandBook, DemandSettings
from gpuscale.metrics.refresh_scope import Demand
from gpuscale.metrics.store import MetricsStore, Snapshot
from gpuscale.metrics.workload_demand import WorkloadDemand
from gpuscale.model import format_duration
from gpuscale.pipeline import Pipeline
from gpuscale.policy_files import check_policies_dir
from gpuscale.selectors import LabelSelector
from gpuscale.settings import AdapterSettings
from gpuscale.sources.base import MetricsSource, TargetHealth
from gpuscale.sources.discovery import DiscoveryRules, discover
from gpuscale.sources.hpas import HpaCache
from gpuscale.sources.kube import KubeCache, load_api_client
from gpuscale.sources.promapi import PrometheusClient, check_credentials
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import parse_scrape_targets, target_resolver

if TYPE_CHECKING:
    from gpuscale.sources.prometheus import PrometheusSource

log = logging.getLogger(__name__)


@dataclass
class RunningAdapter:
    settings: AdapterSettings
    catalogue: Catalogue
    store: MetricsStore
    pipeline: Pipeline
    source: MetricsSource
    cluster: KubeCache | None
    api_client: object | None
    runners: list[web.AppRunner]
    url: str
    auth: DelegatedAuth | None = None
    demand: DemandDriven | None = None
    urls: list[str] = field(default_factory=list)
    listening: list[str] = field(default_factory=list)  # what was really bound, for the log
    tasks: list[asyncio.Task] = field(default_factory=list)

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in self.runners:
            await runner.cleanup()
        if self.auth is not None:
            await self.auth.stop()
        await self.source.close()
        if self.demand is not None:
            await self.demand.hpas.stop()
        if self.cluster is not None:
            await self.cluster.stop()
        if self.api_client is not None:
            await self.api_client.close()  # type: ignore[attr-defined]


@dataclass
class DemandDriven:
    """Demand-driven refresh wired up (metrics/refresh_scope.py): the HPA cache says what is referenced, the
    Prometheus source fetches only that, requests for anything else wait for one refresh that fetches it."""

    demand: Demand
    hpas: HpaCache
    source: PrometheusSource

    def before_refresh(self) -> None:
        now = time.time()
        if self.hpas.synced:
            self.demand.set_referenced(self.hpas.references(), now=now)
            self.source.set_scope(self.demand.begin(now=now))
        else:
            # NB: no HPA list yet (starting, or list/watch refused): fetch everything rather than less than asked.
            self.source.set_scope(None)
            self.demand.begin_all()

    def note(self) -> str:
        """A /readyz note while the HPA list cannot be read ('' when it can)."""
        failing = [h for h in self.hpas.health() if not h.healthy]
        if not failing:
            return ""
        what = "refreshing every metric" if not self.hpas.synced else "refreshing what the last HPA list referenced"
        return f"HorizontalPodAutoscaler list/watch failing, {what} ({one_line(failing[0].error or 'no answer', 120)})"


async def start_adapter(
    settings: AdapterSettings, *, catalogue: Catalogue | None = None, port_flags: dict[str, str] | None = None
) -> RunningAdapter:
    """Start serving. ``port_flags`` names the flags a caller set the ports with, for a port already in use."""
    flags = {"insecure": "--insecure-port", "secure": "--secure-port", **(port_flags or {})}
    if settings.policies:
        check_policies_dir(settings.policies)
    catalogue = catalogue or load_catalogue(settings.config, policies=settings.policies)
    started = time.time()
    explicit = parse_scrape_targets(settings.scrape_url)
    if not explicit and not settings.discover_exporters and not settings.prometheus.url:
        raise ConfigError(
            "give at least one --scrape-url (an exporter /metrics URL), --discover-exporters or --prometheus-url"
        )
    # NB: every file a flag names is read before anything connects or listens: a bad one ends the start (one line,
    # exit 2) instead of surfacing after --insecure-port already serves, or as a first refresh that never works.
    check_credentials(settings.prometheus)
    auth_flags = AuthenticationFlags(
        client_ca_file=settings.client_ca_file,
        requestheader_client_ca_file=settings.requestheader_client_ca_file,
        requestheader_allowed_names=settings.requestheader_allowed_names,
        requestheader_username_headers=settings.requestheader_username_headers,
        requestheader_uid_headers=settings.requestheader_uid_headers,
        requestheader_group_headers=settings.requestheader_group_headers,
        requestheader_extra_headers_prefix=settings.requestheader_extra_headers_prefix,
    )
    server_tls: ServerTLS | None = None
    if settings.https_port is not None:
        auth_flags.load()
        files = serving_cert_files(
            cert_file=settings.tls_cert_file, key_file=settings.tls_private_key_file, cert_dir=settings.cert_dir
        )
        server_tls = ServerTLS(files.cert_file, files.key_file)
    cluster: KubeCache | None = None
    api = None
    if settings.kubeconfig is not None or _in_cluster():
        api = await load_api_client(settings.kubeconfig)
        cluster = KubeCache(api)
        await cluster.start()
    elif settings.discover_exporters:
        raise ConfigError("--discover-exporters needs the Kubernetes API: give --kubeconfig or run in a cluster")
    store = MetricsStore()
    targets = dict(explicit)
    before_refresh = None
    demand: DemandDriven | None = None
    if settings.prometheus.url:
        source = _prometheus_source(settings, catalogue)
        if settings.demand_driven and api is not None:
            # NB: a forecast an HPA or a request names wants its rate metric in that namespace (refresh_scope.py)
            derived = (
                dict.fromkeys(FORECAST_METRICS, settings.forecast_rate_metric)
                if _forecasting(settings, cluster) and catalogue.get(settings.forecast_rate_metric) is not None
                else {}  # NB: an unknown rate metric is refused below, naming the flag
            )
            demand = DemandDriven(
                Demand(catalogue, keep_warm_seconds=settings.keep_warm, derived=derived), HpaCache(api), source
            )
            await demand.hpas.start()
            before_refresh = demand.before_refresh
    else:
        scrape = ScrapeSource(
            explicit,
            series=catalogue.series_names,
            windowed_series=catalogue.windowed_series,
            history_seconds=catalogue.longest_window + 2 * settings.refresh_interval,
            timeout_seconds=_capped("--scrape-timeout", settings.scrape_timeout, settings),
            max_body_bytes=settings.max_body_bytes,
            publish_early=True,
            off_loop=True,
        )
        source = scrape
        if settings.discover_exporters:
            assert cluster is not None
            rules = DiscoveryRules(
                LabelSelector.parse(settings.dcgm_exporter_selector), LabelSelector.parse(settings.triton_selector)
            )

            def rediscover() -> None:
                found = discover(cluster, rules) if cluster.synced else {}
                targets.clear()
                targets.update(explicit)
                targets.update({url: owner for url, owner in found.items() if url not in explicit})
                scrape.set_targets(targets)

            before_refresh = rediscover
    # NB: the watch cache reports per kind like a source per target: an API outage shows on /metrics.
    reporters: list = [source, *([cluster] if cluster is not None else []), *([demand.hpas] if demand else [])]
    selfmetrics = AdapterMetrics(lambda: reporters)
    forecasts = _forecasts(
        settings,
        catalogue,
        store,
        cluster,
        rate_namespaces=(lambda: demand.demand.fetching(settings.forecast_rate_metric)) if demand else lambda: None,
    )
    if forecasts is not None:
        selfmetrics.registry.register(ForecastCollector(forecasts))
        forecasts.count_dropped = selfmetrics.count_dropped

    def on_refresh(snapshot: Snapshot, seconds: float) -> None:
        if demand is not None:
            demand.demand.completed()
        selfmetrics.observe_refresh(snapshot, seconds)

    provider = MetricsProvider(
        catalogue,
        store,
        cluster,
        retry_after_seconds=max(1, round(settings.refresh_interval)),
        forecasts=forecasts,
    )
    # NB: one answer cache for both ports' apps, its bodies for recent queries built by each refresh (answers.py)
    answers = AnswerCache(count=selfmetrics.count_answer)
    pipeline = Pipeline(
        catalogue,
        source,
        store,
        Attributor(target_resolver(targets, cluster)),
        interval_seconds=settings.refresh_interval,
        on_refresh=on_refresh,
        before_refresh=before_refresh,
        prepare=lambda snapshot: _both(
            answers.prepare(provider, snapshot), forecasts.prepare(snapshot) if forecasts is not None else None
        ),
    )
    middlewares: list = []
    if demand is not None:
        # NB: a request waits at most one refresh (whose reads are bounded by the interval) plus its build.
        wait = 2 * settings.refresh_interval + 5

        def note(metric: str, namespace: str | None) -> bool:
            known = cluster is None or not cluster.synced or namespace is None or namespace in cluster.namespaces()
            if not known:
                return True  # NB: the provider answers 404; a namespace that does not exist never joins a query
            return demand.demand.note_request(metric, namespace, now=time.time())

        middlewares.append(demand_middleware(note, lambda: pipeline.refresh_soon(timeout=wait)))
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
            notes=[n for n in [demand.note() if demand is not None else ""] if n],
        )

    discovery = Discovery(
        catalogue,
        serve_custom=settings.serve_custom,
        serve_external=settings.serve_external,
        forecasts=tuple(FORECAST_METRICS) if forecasts is not None else (),
    )
    runners: list[web.AppRunner] = []
    urls: list[str] = []
    listening: list[str] = []
    rejections = RejectionLog(count=lambda reason: selfmetrics.rejected_requests.labels(reason).inc())
    auth: DelegatedAuth | None = None
    try:
        if settings.insecure_port is not None:
            # NB: plain HTTP is for local use: its own app, without authentication.
            plain = AdapterRunner(
                make_app(provider, discovery, selfmetrics, ready=ready, middlewares=middlewares, answers=answers),
                rejections=rejections,
                access_log=None,
            )
            await plain.setup()
            runners.append(plain)
            site = web.TCPSite(plain, settings.insecure_bind_address, settings.insecure_port)
            await _listen(site, flags["insecure"], settings.insecure_bind_address, settings.insecure_port)
            urls.append(f"http://{_host(settings.insecure_bind_address)}:{_bound_port(site)}")
            listening.append(f"http://{_bound_address(site)} (plain HTTP, no authentication)")
        if settings.https_port is not None:
            if api is None:
                raise ConfigError(
                    "--secure-port: delegated authentication needs the Kubernetes API; give --kubeconfig, run in a "
                    "cluster, or serve --insecure-port alone"
                )
            assert server_tls is not None
            auth = DelegatedAuth(
                api,
                flags=auth_flags,
                authn_cache_ttl_seconds=settings.authn_cache_ttl,
                authz_cache_ttl_seconds=settings.authz_cache_ttl,
                allow_anonymous=settings.allow_anonymous,
            )
            await auth.start(sync_timeout=30.0)  # SourceUnavailable if the ConfigMap cannot be read
            auth.serve_tls(server_tls)
            secure = AdapterRunner(
                make_app(
                    provider,
                    discovery,
                    selfmetrics,
                    ready=ready,
                    middlewares=[auth.middleware(), *middlewares],
                    answers=answers,
                ),
                rejections=rejections,
                access_log=None,
            )
            await secure.setup()
            runners.append(secure)
            site = web.TCPSite(secure, settings.bind_address, settings.https_port, ssl_context=server_tls.context)
            await _listen(site, flags["secure"], settings.bind_address, settings.https_port)
            urls.append(f"https://{_host(settings.bind_address)}:{_bound_port(site)}")
            listening.append(f"https://{_bound_address(site)} (delegated authentication)")
    except BaseException:
        for runner in runners:
            await runner.cleanup()
        if auth is not None:
            await auth.stop()
        await source.close()
        if demand is not None:
            await demand.hpas.stop()
        if cluster is not None:
            await cluster.stop()
        if api is not None:
            await api.close()
        raise
    running = RunningAdapter(
        settings,
        catalogue,
        store,
        pipeline,
        source,
        cluster,
        api,
        runners,
        urls[0],
        auth=auth,
        demand=demand,
        urls=urls,
        listening=listening,
    )
    running.tasks.append(asyncio.create_task(pipeline.run(), name="refresh"))
    if server_tls is not None and settings.tls_reload_interval > 0:
        task = _reload_serving_cert(server_tls, settings.tls_reload_interval)
        running.tasks.append(asyncio.create_task(task, name="serving-cert"))
    return running


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


def _both(first: Callable[[], None], second: Callable[[], None] | None) -> Callable[[], None]:
    """What two refresh preparations install, at once (the forecasts and the answers go live with the snapshot)."""
    if second is None:
        return first

    def install() -> None:
        first()
        second()

    return install


def _forecasting(settings: AdapterSettings, cluster: KubeCache | None) -> bool:
    """Forecast metrics need the workloads (the Kubernetes API)."""
    return settings.forecast and cluster is not None


def _forecasts(
    settings: AdapterSettings,
    catalogue: Catalogue,
    store: MetricsStore,
    cluster: KubeCache | None,
    *,
    rate_namespaces: Callable[[], frozenset[str] | None],
) -> WorkloadForecasts | None:
    """Forecast metrics need the workloads and a demand metric in the catalogue."""
    if not _forecasting(settings, cluster):
        return None
    assert cluster is not None
    metric = catalogue.get(settings.forecast_rate_metric)
    if metric is None:
        raise ConfigError(
            f"--forecast-rate-metric: {settings.forecast_rate_metric!r} is not in the metric catalogue "
            "(or turn forecasts off with --no-forecast)"
        )
    demand = DemandSettings(model=settings.forecast_model, min_history_s=settings.forecast_min_history)
    return WorkloadForecasts(
        WorkloadDemand(
            DemandBook(demand),
            store,
            cluster,
            rate_metric=metric.name,
            default_startup_s=settings.forecast_default_startup,
            # NB: a forecast is as old as its last step; the rate metric's own max-age plus one step
            max_age_s=catalogue.max_age(metric) + demand.step_s,
        ),
        rate_namespaces=rate_namespaces,
    )


def _prometheus_source(settings: AdapterSettings, catalogue: Catalogue) -> PrometheusSource:
    from gpuscale.metrics.aggregation import queries
    from gpuscale.sources.prometheus import PrometheusSource

    client = PrometheusClient.connect(
        settings.prometheus,
        timeout_seconds=_capped("--prometheus-timeout", settings.prometheus_timeout, settings),
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
        off_loop=True,
    )


def _capped(flag: str, timeout: float, settings: AdapterSettings) -> float:
    """A read may not outlast the refresh it belongs to; say so when a timeout the user gave is cut."""
    interval = settings.refresh_interval
    if timeout > interval and flag.removeprefix("--").replace("-", "_") in settings.model_fields_set:
        log.warning(
            "%s %s is longer than --refresh-interval %s: reads time out after %s",
            flag,
            format_duration(timeout),
            format_duration(interval),
            format_duration(interval),
        )
    return min(timeout, interval)


def _in_cluster() -> bool:
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


async def wait_ready(adapter: RunningAdapter, *, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not adapter.store.ready or (adapter.cluster is not None and not adapter.cluster.synced):
        if time.monotonic() > deadline:
            raise TimeoutError("adapter did not become ready")
        await asyncio.sleep(0.05)
