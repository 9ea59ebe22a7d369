"""`gpuscale adapter`: wire catalogue, sources, store, Kubernetes cache and the HTTP API together."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from aiohttp import web

from gpuscale.adapter.app import make_app
from gpuscale.adapter.auth import AuthenticationFlags, DelegatedAuth
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.tls import ServerTLS, serving_cert_files
from gpuscale.errors import ConfigError
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import Catalogue, load_catalogue
from gpuscale.metrics.store import MetricsStore
from gpuscale.model import format_duration
from gpuscale.pipeline import Pipeline
from gpuscale.policy_files import check_policies_dir
from gpuscale.selectors import LabelSelector
from gpuscale.settings import AdapterSettings
from gpuscale.sources.base import MetricsSource, TargetHealth
from gpuscale.sources.discovery import DiscoveryRules, discover
from gpuscale.sources.kube import KubeCache, load_api_client
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import parse_scrape_targets, target_resolver

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
    urls: list[str] = field(default_factory=list)
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
        if self.cluster is not None:
            await self.cluster.stop()
        if self.api_client is not None:
            await self.api_client.close()  # type: ignore[attr-defined]


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
    if not explicit and not settings.discover_exporters and not settings.prometheus_url:
        raise ConfigError(
            "give at least one --scrape-url (an exporter /metrics URL), --discover-exporters or --prometheus-url"
        )
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
    if settings.prometheus_url:
        source = _prometheus_source(settings, catalogue)
    else:
        scrape = ScrapeSource(
            explicit,
            series=catalogue.series_names,
            windowed_series=catalogue.windowed_series,
            history_seconds=catalogue.longest_window + 2 * settings.refresh_interval,
            timeout_seconds=min(settings.scrape_timeout, settings.refresh_interval),
            max_body_bytes=settings.max_body_bytes,
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
    selfmetrics = AdapterMetrics(lambda: [source])
    pipeline = Pipeline(
        catalogue,
        source,
        store,
        Attributor(target_resolver(targets, cluster)),
        interval_seconds=settings.refresh_interval,
        on_refresh=selfmetrics.observe_refresh,
        before_refresh=before_refresh,
    )
    provider = MetricsProvider(catalogue, store, cluster, retry_after_seconds=max(1, round(settings.refresh_interval)))
    max_age = catalogue.defaults.max_age

    def ready() -> tuple[bool, str]:
        return readiness(
            store_ready=store.ready,
            cluster_synced=None if cluster is None else cluster.synced,
            health=source.health(),
            max_age=max_age,
            started=started,
            now=time.time(),
        )

    discovery = Discovery(catalogue, serve_custom=settings.serve_custom, serve_external=settings.serve_external)
    runners: list[web.AppRunner] = []
    urls: list[str] = []
    auth: DelegatedAuth | None = None
    server_tls: ServerTLS | None = None
    try:
        if settings.insecure_port is not None:
            # NB: plain HTTP is for local use: its own app, without authentication.
            plain = web.AppRunner(make_app(provider, discovery, selfmetrics, ready=ready), access_log=None)
            await plain.setup()
            runners.append(plain)
            site = web.TCPSite(plain, settings.bind_address, settings.insecure_port)
            await _listen(site, flags["insecure"], settings.bind_address, settings.insecure_port)
            urls.append(f"http://{_host(settings.bind_address)}:{_bound_port(site)}")
        if settings.https_port is not None:
            if api is None:
                raise ConfigError(
                    "--secure-port: delegated authentication needs the Kubernetes API; give --kubeconfig, run in a "
                    "cluster, or serve --insecure-port alone"
                )
            auth = DelegatedAuth(
                api,
                flags=AuthenticationFlags(
                    client_ca_file=settings.client_ca_file,
                    requestheader_client_ca_file=settings.requestheader_client_ca_file,
                    requestheader_allowed_names=settings.requestheader_allowed_names,
                    requestheader_username_headers=settings.requestheader_username_headers,
                    requestheader_uid_headers=settings.requestheader_uid_headers,
                    requestheader_group_headers=settings.requestheader_group_headers,
                    requestheader_extra_headers_prefix=settings.requestheader_extra_headers_prefix,
                ),
                authn_cache_ttl_seconds=settings.authn_cache_ttl,
                authz_cache_ttl_seconds=settings.authz_cache_ttl,
                allow_anonymous=settings.allow_anonymous,
            )
            await auth.start(sync_timeout=30.0)  # SourceUnavailable if the ConfigMap cannot be read
            files = serving_cert_files(
                cert_file=settings.tls_cert_file, key_file=settings.tls_private_key_file, cert_dir=settings.cert_dir
            )
            server_tls = ServerTLS(files.cert_file, files.key_file)
            auth.serve_tls(server_tls)
            secure = web.AppRunner(
                make_app(provider, discovery, selfmetrics, ready=ready, middlewares=[auth.middleware()]),
                access_log=None,
            )
            await secure.setup()
            runners.append(secure)
            site = web.TCPSite(secure, settings.bind_address, settings.https_port, ssl_context=server_tls.context)
            await _listen(site, flags["secure"], settings.bind_address, settings.https_port)
            urls.append(f"https://{_host(settings.bind_address)}:{_bound_port(site)}")
    except BaseException:
        for runner in runners:
            await runner.cleanup()
        if auth is not None:
            await auth.stop()
        await source.close()
        if cluster is not None:
            await cluster.stop()
        if api is not None:
            await api.close()
        raise
    running = RunningAdapter(
        settings, catalogue, store, pipeline, source, cluster, api, runners, urls[0], auth=auth, urls=urls
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
    health: Sequence[TargetHealth],
    max_age: float,
    started: float,
    now: float,
) -> tuple[bool, str]:
    """/readyz: ready, or not with what actually happened (how long, which source, why)."""
    since_start = format_duration(round(now - started))
    if not store_ready:
        return False, f"first refresh has not completed ({since_start} since the start)"
    if cluster_synced is False:
        return False, f"Kubernetes watch cache not synced ({since_start} since the start)"
    # NB: not ready only when nothing fresh can be served: a failing source keeps serving its last
    # values until they reach max-age, and readiness must not take a replica away before then.
    if health and all(h.last_success is None or now - h.last_success > max_age for h in health):
        failing = "; ".join(f"{h.target}: {h.error or 'no data'}" for h in health[:3])
        more = f"; and {len(health) - 3} more" if len(health) > 3 else ""
        answered = [h.last_success for h in health if h.last_success is not None]
        if not answered:
            return False, f"no source has answered since the start {since_start} ago ({failing}{more})"
        return False, (
            f"no source has answered for {format_duration(round(now - max(answered)))}, longer than the "
            f"max-age of {format_duration(max_age)} ({failing}{more})"
        )
    return True, ""


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


def _host(bind_address: str) -> str:
    return "127.0.0.1" if bind_address in ("0.0.0.0", "") else bind_address


def _bound_port(site: web.TCPSite) -> int:
    server = site._server  # NB: aiohttp exposes the bound socket only here; needed when port 0 was asked for
    assert server is not None
    return server.sockets[0].getsockname()[1]


def _prometheus_source(settings: AdapterSettings, catalogue: Catalogue) -> MetricsSource:
    from gpuscale.metrics.aggregation import queries
    from gpuscale.sources.prometheus import PrometheusSource

    assert settings.prometheus_url is not None
    return PrometheusSource(
        url=settings.prometheus_url,
        queries=queries(catalogue),
        bearer_token_file=settings.prometheus_token_file,
        ca_file=settings.prometheus_ca_file,
        client_cert=settings.prometheus_client_cert,
        client_key=settings.prometheus_client_key,
        insecure_skip_verify=settings.prometheus_insecure_skip_verify,
        timeout_seconds=min(settings.prometheus_timeout, settings.refresh_interval),
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
