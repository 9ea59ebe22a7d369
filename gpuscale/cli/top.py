"""`gpuscale top nodes | pods | gpus | workloads`: kubectl-top for GPUs, with a verdict that says what the GPU
really does; ``workloads`` shows each Deployment's request rate now beside the adapter's forecast of it.

The composition root of the command: its flags, and the wiring of sources and the Kubernetes cache to
the parts in ``gpuscale/top/`` (collect, custom_metrics, selection, screen, render)::

    --scrape-url / --prometheus-url ─▶ MetricsSource ─┐ read_devices ─┬─ gpu_statuses ──────────────── gpus
                                                      │               ├─ gpu_statuses → node_statuses ─ nodes
                                                      │               └─ pod_statuses_of_readings ───── pods
    --kubeconfig ─▶ KubeCache (pod → node, labels) ───┘     build_snapshot (Triton terms) ─┘ (pods)
    --adapter-url ─▶ custom.metrics.k8s.io (pods, nodes; no per-GPU view) ─────────────── pods / nodes
                   └─ deployments/statefulsets: rate now + forecast (adapter/forecasts.py) ── workloads
                                     │
                 filter (-n/-A/-l: selection) → sort (--sort-by) → render (table|wide|json|yaml) → screen

One-shot by default; ``--watch`` refreshes in place (rich Live on a terminal, frames one after another
otherwise) until Ctrl-C or ``--iterations``. Errors are one line and a non-zero exit (``main`` prints
GpuscaleError): every source failed (each URL with its reason), an unknown namespace (with
``--kubeconfig``), nothing found in the asked scope. In ``--watch`` the first refresh must succeed; later
failures are shown in the frame and watching goes on.

NB: heavy modules (aiohttp, kubernetes_asyncio, rich, the adapter) are imported inside the functions that
use them: ``gpuscale`` builds every subcommand's flags at start, and ``top`` must not slow the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator, model_validator

from gpuscale.config import Seconds
from gpuscale.errors import SelectorError, SourceUnavailable
from gpuscale.metrics.devices import DEVICE_SERIES, device_queries
from gpuscale.metrics.diagnosis import DiagnosisPolicy, load_policy
from gpuscale.pipeline import cyclic_gc_paused
from gpuscale.policy_files import check_policies_dir
from gpuscale.selectors import LabelSelector
from gpuscale.settings import (
    CatalogueFiles,
    CommandSettings,
    ExporterScrape,
    KubeAccess,
    Logging,
    PrometheusConnection,
    add_arguments,
    group,
)
from gpuscale.sources.base import MetricsSource
from gpuscale.top.collect import Collector, SourcesCollector, inference_catalogue
from gpuscale.top.custom_metrics import AdapterCollector
from gpuscale.top.document import View
from gpuscale.top.render import FORMATTERS
from gpuscale.top.screen import Screen, show_frames, unless_stopped
from gpuscale.top.selection import Selection, resolve_selection
from gpuscale.top.sorting import SORT_KEYS

if TYPE_CHECKING:
    from gpuscale.metrics.catalogue import Catalogue
    from gpuscale.sources.cluster_index import ClusterObjects

__all__ = ["TopSettings", "add_top_arguments", "run_top"]

_VIEW_ALIASES = {"gpu": "gpus", "gpus": "gpus", "pod": "pods", "pods": "pods", "po": "pods"}
_VIEW_ALIASES |= {"node": "nodes", "nodes": "nodes", "no": "nodes"}
_VIEW_ALIASES |= {"workloads": "workloads", "workload": "workloads", "wl": "workloads"}


# --- settings ----------------------------------------------------------------------------------------


class TopOptions(CommandSettings):
    """The flags of ``gpuscale top`` (derived by ``settings.add_arguments``; short forms added below)."""

    # --- what to show ---
    namespace: str | None = Field(
        None,
        description="(-n) only pods (and their GPUs) of this namespace; for pods the default is the kubeconfig "
        "context's namespace, else 'default'",
    )
    all_namespaces: bool = Field(False, description="(-A) every namespace")
    selector: str | None = Field(
        None,
        description="(-l) label selector: pod labels for pods and gpus, node labels for nodes "
        "(needs --kubeconfig, or --adapter-url)",
    )
    sort_by: str | None = Field(
        None,
        description="name (default), node, util, sm, occupancy, tensor, dram, memory, power, temp, verdict; "
        "pods also gpus, queue, ratio, rps; nodes also gpus, pods",
    )
    output: str = Field("table", description="(-o) table, wide, json or yaml")
    headers: bool = Field(True, description="--no-headers prints the table without its header, legend and notes")
    watch: bool = Field(False, description="(-w) refresh in place until Ctrl-C")
    watch_interval: Seconds = Field(2.0, gt=0, description="time between refreshes with --watch")
    iterations: int | None = Field(None, gt=0, description="with --watch: stop after this many refreshes")
    # --- where data comes from ---
    scrape: ExporterScrape = group(
        ExporterScrape,
        scrape_url="exporter /metrics URL to scrape (repeatable; as for the adapter, 'NAMESPACE/POD=URL' names "
        "the pod serving it)",
        discover_exporters="find dcgm-exporter pods (--dcgm-exporter-selector) and annotated inference pods through "
        "the Kubernetes API (--kubeconfig) and scrape each through the API server's pod proxy: no Prometheus and no "
        "route to pod IPs needed",
        scrape_timeout="timeout of one scrape or API request",
    )
    # NB: 3 s, what top's Prometheus reads had before they had a deadline of their own (the scrape timeout's
    # default): top answers a person at a terminal, who is better served by a slow server's error than a long wait
    prometheus: PrometheusConnection = group(
        lambda: PrometheusConnection(timeout=3.0),
        url="read the exporters' series from this Prometheus instead",
        timeout="deadline of one refresh's Prometheus queries, bodies included",
    )
    adapter_url: str | None = Field(
        None,
        description="read pods and nodes from a running gpuscale adapter's custom metrics API "
        "(e.g. through 'kubectl proxy': http://127.0.0.1:8001); no per-GPU view",
    )
    kube: KubeAccess = group(KubeAccess, kubeconfig="kubeconfig: pod → node, pod and node labels, namespace checks")
    rate_interval: Seconds = Field(
        1.0,
        ge=0,
        description="without --watch: when inference servers are scraped, scrape again after this long so "
        "request rates and the queue:compute ratio have a value (0 = one scrape)",
    )
    files: CatalogueFiles = group(
        CatalogueFiles,
        config="metric catalogue YAML (default: metrics.yaml of --policies, else shipped); validated with "
        "--adapter-url too, where the adapter's own catalogue names the metrics",
    )
    logging: Logging = group(
        lambda: Logging(log_level="error"), log_level="debug, info, warning or error (logs go to stderr)"
    )


class TopSettings(TopOptions):
    view: View = Field(description="nodes, pods, gpus or workloads", json_schema_extra={"metavar": "VIEW"})

    @field_validator("view", mode="before")
    @classmethod
    def _alias(cls, value: Any) -> Any:
        if isinstance(value, str) and value not in _VIEW_ALIASES:
            raise ValueError(
                f"{value!r} is not a view; valid: nodes, pods, gpus, workloads (also node, no, pod, po, gpu, wl)"
            )
        return _VIEW_ALIASES.get(value, value) if isinstance(value, str) else value

    @model_validator(mode="after")
    def _check(self) -> TopSettings:
        # NB: messages start with the flag they are about (settings.from_arguments prefixes "--").
        given = {
            "scrape_url": self.scrape_url,
            "discover_exporters": self.discover_exporters,
            "prometheus_url": self.prometheus.url,
            "adapter_url": self.adapter_url,
        }
        kinds = [f for f, value in given.items() if value]
        if not kinds:
            raise ValueError(
                "scrape-url: give exporter URLs (--scrape-url URL), --discover-exporters, --prometheus-url or "
                "--adapter-url"
            )
        if len(kinds) > 1:
            raise ValueError(
                f"{kinds[1].replace('_', '-')}: give one source: --scrape-url, --discover-exporters, --prometheus-url "
                "or --adapter-url"
            )
        if self.discover_exporters and not self.kubeconfig:
            raise ValueError("discover-exporters: finds exporter pods through the Kubernetes API: give --kubeconfig")
        if self.adapter_url and self.view == "gpus":
            raise ValueError(
                "adapter-url: the per-GPU view is not available from the custom metrics API (it serves values per "
                "pod and node, not per GPU); read the exporters with --scrape-url or --prometheus-url"
            )
        if self.view == "workloads" and not self.adapter_url:
            raise ValueError(
                "adapter-url: the workloads view shows the request rate now and the adapter's forecast of it "
                "(docs/forecast.md), which needs the history a running adapter keeps: give --adapter-url"
            )
        if self.namespace and self.all_namespaces:
            raise ValueError("all-namespaces: give -A or -n NAMESPACE, not both")
        if self.iterations is not None and not self.watch:
            raise ValueError("iterations: only with --watch")
        if self.output not in FORMATTERS:
            raise ValueError(f"output: unknown format {self.output!r}; valid: {', '.join(FORMATTERS)}")
        if self.sort_by is not None and self.sort_by not in SORT_KEYS[self.view]:
            raise ValueError(
                f"sort-by: {self.sort_by!r} is not a sort key for {self.view}; valid: {', '.join(SORT_KEYS[self.view])}"
            )
        if self.selector is not None:
            try:
                LabelSelector.parse(self.selector)
            except SelectorError as e:
                raise ValueError(f"selector: {e}") from None
            if not (self.kubeconfig or self.adapter_url):
                what = "node" if self.view == "nodes" else "pod"
                raise ValueError(f"selector: -l needs {what} labels from the Kubernetes API: give --kubeconfig")
        return self


_SHORT_FLAGS: dict[str, dict[str, Any]] = {
    "-n": {"dest": "namespace"},
    "-A": {"dest": "all_namespaces", "action": "store_const", "const": True},
    "-l": {"dest": "selector"},
    "-o": {"dest": "output"},
    "-w": {"dest": "watch", "action": "store_const", "const": True},
}


def add_top_arguments(parser: argparse.ArgumentParser) -> None:
    """The positional view, every ``TopOptions`` flag, and the kubectl short forms (-n, -A, -l, -o, -w)."""
    parser.add_argument("view", metavar="VIEW", help="nodes, pods, gpus or workloads (also node, no, pod, po, gpu, wl)")
    add_arguments(parser, TopOptions)
    for flag, spec in _SHORT_FLAGS.items():
        parser.add_argument(flag, default=None, help=argparse.SUPPRESS, **spec)


# --- wiring --------------------------------------------------------------------------------------------


@dataclass
class _Opened:
    collector: Collector
    selection: Selection
    closers: list[Callable[[], Awaitable[None]]]


async def _open_cluster(
    settings: TopSettings, closers: list[Callable[[], Awaitable[None]]]
) -> tuple[ClusterObjects | None, Any]:
    """The cluster's objects (list once, or list+watch with --watch) and the ApiClient; (None, None) without
    --kubeconfig."""
    if not settings.kubeconfig:
        return None, None
    from gpuscale.sources.kube import KubeCache
    from gpuscale.sources.kubeconfig import load_api_client

    api = await load_api_client(settings.kubeconfig)
    closers.append(api.close)
    cache = KubeCache(api)
    if settings.watch:
        await cache.start()
        closers.append(cache.stop)
        await cache.wait_synced(timeout=max(10.0, 3 * settings.scrape_timeout))
    else:
        await cache.refresh_once()
    return cache, api


def _discovered_through_the_api(
    cluster: ClusterObjects, proxy: Any, scrape: Any, explicit: dict[str, Any], flags: ExporterScrape
) -> Callable[[], Awaitable[None]]:
    """``--discover-exporters``: before each refresh, the exporter pods the API lists, as pod-proxy URLs on
    ``scrape`` (and in ``explicit``, so each value belongs to its pod)."""
    from gpuscale.selectors import LabelSelector
    from gpuscale.settings import AdapterSettings
    from gpuscale.sources.exporter_discovery import DiscoveryRules, discover, through_pod_proxy

    rules = DiscoveryRules(
        LabelSelector.parse(flags.dcgm_exporter_selector),
        LabelSelector.parse(AdapterSettings.model_fields["triton_selector"].default),
    )

    async def rediscover() -> None:
        await proxy.refresh_token()
        found = through_pod_proxy(discover(cluster, rules), proxy.host)
        if not found:
            raise SourceUnavailable(
                proxy.host,
                f"no exporter pods found through the Kubernetes API (labels {rules.dcgm_selector} or "
                f'{rules.triton_selector}, or annotated gpuscale.io/scrape: "true"; Running, with a pod IP)',
            )
        explicit.clear()
        explicit.update(found)
        scrape.set_targets(found)

    return rediscover


def _metrics_sources(
    settings: TopSettings, inference: Catalogue | None, *, max_age: float, session: Any = None
) -> tuple[list[MetricsSource], Any]:
    """The sources and the url → pod map of explicit ``NAMESPACE/POD=URL`` targets."""
    from gpuscale.sources.targets import parse_scrape_targets

    if settings.prometheus.url:
        from gpuscale.metrics.aggregation import queries
        from gpuscale.sources.promapi import PrometheusClient
        from gpuscale.sources.prometheus import PrometheusSource

        terms = device_queries() + (queries(inference) if inference is not None else [])
        source: MetricsSource = PrometheusSource(
            PrometheusClient.connect(settings.prometheus, max_body_bytes=settings.max_body_bytes * 4),
            queries=terms,
            fresh_within_seconds=max_age,  # NB: a restarted Prometheus's old samples are not today's numbers
        )
        return [source], {}
    from gpuscale.sources.scrape import ScrapeSource

    explicit = parse_scrape_targets(settings.scrape.scrape_url)
    windowed = inference.windowed_series if inference is not None else frozenset()
    scrape = ScrapeSource.from_flags(
        settings.scrape,
        explicit,
        series=set(DEVICE_SERIES) | (inference.series_names if inference is not None else set()),
        windowed_series=windowed,
        history_seconds=(inference.longest_window if inference is not None else 60.0) + 2 * settings.watch_interval,
        session=session,
    )
    return [scrape], explicit


async def _open(settings: TopSettings, policy: DiagnosisPolicy) -> _Opened:
    from gpuscale.sources.promapi import check_credentials

    check_credentials(settings.prometheus)  # NB: refused before any connection
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        cluster, api = await _open_cluster(settings, closers)
        selection = resolve_selection(
            settings.view,
            namespace=settings.namespace,
            all_namespaces=settings.all_namespaces,
            selector=settings.selector,
            kubeconfig=settings.kubeconfig,
            cluster=cluster,
        )
        selection.check_namespace()
        if settings.adapter_url:
            adapter = AdapterCollector(
                settings.adapter_url, selection=selection, policy=policy, timeout_seconds=settings.scrape_timeout
            )
            closers.append(adapter.close)
            return _Opened(adapter, selection, closers)
        from gpuscale.metrics.attribution import Attributor
        from gpuscale.metrics.catalogue import load_catalogue
        from gpuscale.sources.targets import target_resolver

        catalogue = load_catalogue(settings.config, policies=settings.policies)
        inference = inference_catalogue(catalogue)
        proxy = None
        if settings.discover_exporters:
            from gpuscale.sources.kubeconfig import ApiServerSession

            proxy = ApiServerSession(api)
            closers.append(proxy.close)
        sources, explicit = _metrics_sources(
            settings, inference, max_age=catalogue.defaults.max_age, session=proxy.session if proxy else None
        )
        closers.extend(s.close for s in sources)
        before_refresh = None
        if proxy is not None:
            assert cluster is not None
            before_refresh = _discovered_through_the_api(cluster, proxy, sources[0], explicit, settings.scrape)
        collector = SourcesCollector(
            sources,
            Attributor(target_resolver(explicit, cluster)),
            selection=selection,
            policy=policy,
            inference=inference,
            max_age_seconds=catalogue.defaults.max_age,
            rate_interval_seconds=0.0 if settings.watch else settings.rate_interval,
            before_refresh=before_refresh,
        )
        return _Opened(collector, selection, closers)
    except BaseException:
        await _close_all(closers)
        raise


async def _close_all(closers: list[Callable[[], Awaitable[None]]]) -> None:
    for close in reversed(closers):
        with contextlib.suppress(Exception):  # NB: closing must not hide the error being reported
            await close()


# --- the command ---------------------------------------------------------------------------------------


async def run_top(settings: TopSettings, stop: asyncio.Event) -> None:
    """One frame, or frames every ``watch_interval`` until ``stop`` (Ctrl-C) or ``iterations``."""
    with cyclic_gc_paused():
        await _run_top(settings, stop)


async def _run_top(settings: TopSettings, stop: asyncio.Event) -> None:
    if settings.policies:
        check_policies_dir(settings.policies)
    policy = load_policy(settings.policies)
    if settings.adapter_url and (settings.config or settings.policies):
        from gpuscale.metrics.catalogue import load_catalogue

        load_catalogue(settings.config, policies=settings.policies)  # NB: a given file is never ignored
    finished, opened = await unless_stopped(_open(settings, policy), stop)
    if not finished or opened is None:
        return
    screen = Screen(
        policy,
        opened.selection.scope,
        output=settings.output,
        headers=settings.headers,
        watch=settings.watch,
        watch_interval=settings.watch_interval,
    )
    try:
        await show_frames(opened.collector, screen, stop, sort_by=settings.sort_by, iterations=settings.iterations)
    finally:
        screen.close()
        await _close_all(opened.closers)
