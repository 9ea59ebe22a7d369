"""`gpuscale top nodes | pods | gpus | workloads`: kubectl-top for GPUs, with a verdict that says what the GPU
really does; ``workloads`` shows each Deployment's request rate now beside the adapter's forecast of it.

The composition root of the command (the only place that wires sources, the Kubernetes cache and the
pure layers together)::

    --scrape-url / --prometheus-url ─▶ MetricsSource ─┐ read_devices ─┬─ gpu_statuses ──────────────── gpus
                                                      │               ├─ gpu_statuses → node_statuses ─ nodes
                                                      │               └─ pod_statuses_of_readings ───── pods
    --kubeconfig ─▶ KubeCache (pod → node, labels) ───┘     build_snapshot (Triton terms) ─┘ (pods)
    --adapter-url ─▶ custom.metrics.k8s.io (pods, nodes; no per-GPU view) ─────────────── pods / nodes
                   └─ deployments/statefulsets: rate now + forecast (adapter/forecasts.py) ── workloads
                                     │
                          filter (-n/-A/-l) → sort (--sort-by) → render_top (table|wide|json|yaml)

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
import gc
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import Field, field_validator, model_validator

from gpuscale.cli.render_top import (
    FORMATTERS,
    SORT_KEYS,
    GpuTopList,
    RenderOptions,
    Scope,
    SourceStatus,
    View,
    WorkloadStatus,
    render,
    sort_items,
)
from gpuscale.config import Seconds
from gpuscale.errors import ConfigError, GpuscaleError, MetricNotFound, ObjectNotFound, SelectorError, SourceUnavailable
from gpuscale.metrics.attribution import Device
from gpuscale.metrics.devices import DEVICE_SERIES, GpuStatus, device_queries, gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import DiagnosisPolicy, GpuSignals, diagnose, diagnose_serving, load_policy
from gpuscale.metrics.rollups import (
    INFERENCE_METRICS,
    InferenceStats,
    NodeStatus,
    PodStatus,
    inference_stats,
    node_statuses,
    pod_statuses_of_readings,
)
from gpuscale.model import parse_quantity
from gpuscale.pipeline import cyclic_gc_paused
from gpuscale.policy_files import check_policies_dir
from gpuscale.selectors import LabelSelector
from gpuscale.settings import (
    CatalogueFiles,
    CommandSettings,
    KubeAccess,
    Logging,
    PrometheusConnection,
    add_arguments,
    group,
)
from gpuscale.sources.base import MetricsSource, SeriesValue, TargetHealth, TermQuery

if TYPE_CHECKING:
    import aiohttp

    from gpuscale.metrics.attribution import Attributor
    from gpuscale.metrics.catalogue import Catalogue
    from gpuscale.sources.kube import ClusterObjects

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
    scrape_url: list[str] = Field(
        default_factory=list,
        description="exporter /metrics URL to scrape (repeatable; as for the adapter, 'NAMESPACE/POD=URL' names "
        "the pod serving it)",
    )
    discover_exporters: bool = Field(
        False,
        description="find dcgm-exporter pods (app=nvidia-dcgm-exporter) and annotated inference pods through the "
        "Kubernetes API (--kubeconfig) and scrape each through the API server's pod proxy: no Prometheus and no "
        "route to pod IPs needed",
    )
    prometheus: PrometheusConnection = group(
        PrometheusConnection, url="read the exporters' series from this Prometheus instead"
    )
    adapter_url: str | None = Field(
        None,
        description="read pods and nodes from a running gpuscale adapter's custom metrics API "
        "(e.g. through 'kubectl proxy': http://127.0.0.1:8001); no per-GPU view",
    )
    kube: KubeAccess = group(KubeAccess, kubeconfig="kubeconfig: pod → node, pod and node labels, namespace checks")
    scrape_timeout: Seconds = Field(3.0, gt=0, description="timeout of one scrape or API request")
    rate_interval: Seconds = Field(
        1.0,
        ge=0,
        description="without --watch: when inference servers are scraped, scrape again after this long so "
        "request rates and the queue:compute ratio have a value (0 = one scrape)",
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, gt=0, description="largest exporter response accepted")
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


# --- what is shown -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """The resolved -n/-A/-l: ``namespace`` None = every namespace (or a cluster-scoped view)."""

    view: View
    namespace: str | None
    selector: LabelSelector | None
    cluster: ClusterObjects | None

    @property
    def scope(self) -> Scope:
        text = str(self.selector) if self.selector is not None and not self.selector.is_empty else None
        return Scope(namespace=self.namespace, all_namespaces=self.namespace is None, selector=text)

    def pod_in_scope(self, namespace: str, name: str) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.selector is None or self.selector.is_empty:
            return True
        info = self.cluster.pod(namespace, name) if self.cluster is not None else None
        return info is not None and self.selector.matches(info.labels)

    def node_in_scope(self, name: str) -> bool:
        if self.selector is None or self.selector.is_empty:
            return True
        labels = self.cluster.node_labels(name) if self.cluster is not None else None
        return labels is not None and self.selector.matches(labels)

    @property
    def narrows_pods(self) -> bool:
        """True when only some pods are asked for (-n, or -l on pods/gpus; -l on nodes selects nodes)."""
        if self.view == "nodes":
            return False
        return self.namespace is not None or (self.selector is not None and not self.selector.is_empty)

    def check_namespace(self) -> None:
        """ObjectNotFound for a namespace the Kubernetes API does not have (when one is known)."""
        cluster = self.cluster
        if cluster is None or not cluster.synced or self.namespace is None:
            return
        if self.namespace not in cluster.namespaces():
            raise ObjectNotFound(f'namespaces "{self.namespace}" not found')

    def nothing_found(self) -> MetricNotFound:
        what = {"gpus": "GPUs", "pods": "GPU pods", "nodes": "GPU nodes", "workloads": "workloads with a request rate"}
        where = ""
        namespaced = self.view in ("pods", "workloads")
        if self.namespace is not None:
            where = f' in namespace "{self.namespace}"'
        elif namespaced:
            where = " in any namespace"
        matching = f" matching -l {self.scope.selector}" if self.scope.selector else ""
        hint = " (use -A for every namespace)" if namespaced and self.namespace is not None else ""
        return MetricNotFound(f"no {what[self.view]} found{where}{matching}{hint}")


def _resolve_selection(settings: TopSettings, cluster: ClusterObjects | None) -> Selection:
    namespace = settings.namespace
    if namespace is None and not settings.all_namespaces and settings.view in ("pods", "workloads"):
        namespace = _context_namespace(settings.kubeconfig) if settings.kubeconfig else "default"
    if settings.view == "nodes":
        namespace = None  # NB: nodes are cluster-scoped; -n is accepted and ignored, as by kubectl top node
    selector = LabelSelector.parse(settings.selector) if settings.selector else None
    return Selection(settings.view, namespace, selector, cluster)


def _context_namespace(kubeconfig: str) -> str:
    """The current context's namespace in a kubeconfig, else "default" (as kubectl)."""
    from gpuscale.sources.kube import current_context, read_kubeconfig

    try:
        namespace = (current_context(read_kubeconfig(kubeconfig)) or {}).get("namespace")
    except GpuscaleError:
        return "default"  # NB: load_api_client reports a broken kubeconfig; here only the default matters
    return namespace if isinstance(namespace, str) and namespace else "default"


_I = TypeVar("_I", GpuStatus, PodStatus, NodeStatus)


def _wanted(selection: Selection, item: GpuStatus | PodStatus | NodeStatus) -> bool:
    if isinstance(item, NodeStatus):
        return selection.node_in_scope(item.name)
    if isinstance(item, PodStatus):
        return selection.pod_in_scope(item.namespace, item.name)
    if not selection.narrows_pods:
        return True  # NB: the gpus view shows idle GPUs too unless pods are narrowed down
    return item.pod is not None and item.namespace is not None and selection.pod_in_scope(item.namespace, item.pod)


def _finish(selection: Selection, items: list[_I]) -> list[_I]:
    """Items in scope; MetricNotFound when none are."""
    everything = not selection.narrows_pods and (selection.selector is None or selection.selector.is_empty)
    kept = items if everything else [i for i in items if _wanted(selection, i)]  # NB: -A: 5,000 pods, no test each
    if not kept:
        raise selection.nothing_found()
    return kept


def _source_status(h: TargetHealth) -> SourceStatus:
    return SourceStatus(target=h.target, healthy=h.healthy, error=h.error, last_success=h.last_success, series=h.series)


# --- collectors --------------------------------------------------------------------------------------


class Collector(Protocol):
    """Reads its sources once and answers with the items of one view."""

    async def collect(self, *, first: bool) -> GpuTopList: ...


class SourcesCollector:
    """Per-GPU data from MetricsSources (scrape, Prometheus): devices → statuses → the asked view.

    The Triton values of the pods view come from the adapter's catalogue terms, aggregated exactly as the
    adapter does (``build_snapshot``) — only the inference metrics, the GPU ones are the records' own.
    """

    def __init__(
        self,
        sources: list[MetricsSource],
        attributor: Attributor,
        *,
        selection: Selection,
        policy: DiagnosisPolicy,
        inference: Catalogue | None,
        max_age_seconds: float,
        rate_interval_seconds: float = 0.0,
        clock: Callable[[], float] = time.time,
        before_refresh: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.before_refresh = before_refresh
        self.sources = sources
        self.attributor = attributor
        self.selection = selection
        self.policy = policy
        self.inference = inference
        self.max_age_seconds = max_age_seconds
        self.rate_interval_seconds = rate_interval_seconds
        self.clock = clock

    def read(self, query: TermQuery) -> list[SeriesValue]:
        if len(self.sources) == 1:
            return self.sources[0].read(query)
        return [v for s in self.sources for v in s.read(query)]

    async def _refresh(self) -> list[SourceStatus]:
        if self.before_refresh is not None:
            await self.before_refresh()
        await asyncio.gather(*(s.refresh(now=self.clock()) for s in self.sources))
        health = [h for s in self.sources for h in s.health()]
        # NB: a Prometheus with one failed query of twenty is unhealthy but has data: only "nothing at all" fails.
        if not any(h.healthy or h.series for h in health):
            failures = "; ".join(f"{h.target}: {h.error or 'no answer'}" for h in health)
            raise SourceUnavailable("no source reachable", failures)
        return [_source_status(h) for h in health]

    def _serves_rates(self) -> bool:
        windowed = self.inference.windowed_series if self.inference is not None else ()
        return any(self.read(TermQuery(series=(name,))) for name in windowed)

    async def collect(self, *, first: bool) -> GpuTopList:
        statuses = await self._refresh()
        if first and self.rate_interval_seconds > 0 and self._serves_rates():
            # NB: a rate needs two scrapes; one short pause gives a one-shot `top pods` its queue:compute ratio.
            await asyncio.sleep(self.rate_interval_seconds)
            statuses = await self._refresh()
        return self.build(statuses, now=self.clock())

    def build(self, statuses: list[SourceStatus], *, now: float) -> GpuTopList:
        """Everything after "the data arrived": pure given the sources' current values."""
        self.attributor.begin_refresh()
        selection = self.selection
        keep = None
        if selection.view == "pods" or selection.narrows_pods:
            # NB: only GPUs held by pods in scope are read and diagnosed (idle GPUs are a quarter of a busy cluster).
            keep = self._held_in_scope
        readings = read_devices(self.read, self.attributor, keep=keep)
        readings = [r for r in readings if now - r.sampled_at <= self.max_age_seconds]
        items: list[Any]
        if selection.view == "gpus":
            items = _finish(selection, gpu_statuses(readings, self.policy))
        elif selection.view == "nodes":
            items = _finish(selection, node_statuses(gpu_statuses(readings, self.policy), self.policy))
        else:
            inference = self._inference(now)
            pods = pod_statuses_of_readings(readings, self.policy, inference=inference, node_of=self._node_of)
            items = _finish(selection, pods)
        return GpuTopList(view=selection.view, generated_at=now, scope=selection.scope, sources=statuses, items=items)

    def _held_in_scope(self, device: Device) -> bool:
        owner = device.pod
        return owner is not None and self.selection.pod_in_scope(owner.namespace or "", owner.name)

    def _inference(self, now: float) -> dict[Any, InferenceStats]:
        if self.inference is None:
            return {}
        from gpuscale.metrics.aggregation import build_snapshot

        snapshot = build_snapshot(self.inference, self.read, self.attributor, now=now)
        return inference_stats(snapshot.values, now=now, max_age_seconds=self.max_age_seconds)

    def _node_of(self, namespace: str, name: str) -> str | None:
        cluster = self.selection.cluster
        info = cluster.pod(namespace, name) if cluster is not None else None
        return info.node_name if info is not None else None


def inference_catalogue(catalogue: Catalogue) -> Catalogue | None:
    """The catalogue's inference metrics only (what the pods view reads besides the GPU records)."""
    from gpuscale.metrics.catalogue import Catalogue

    metrics = [m for m in catalogue if m.name in set(INFERENCE_METRICS.values())]
    return Catalogue(defaults=catalogue.defaults, metrics=metrics) if metrics else None


# --- the adapter's custom metrics API ------------------------------------------------------------------

CUSTOM_API = "/apis/custom.metrics.k8s.io/v1beta2"

# Catalogue metric → (GpuSignals field, scale from the served unit). NB: names and units of the shipped
# policies/metrics.yaml (the public contract); gpu_memory_utilization gives FB_FREE from FB_USED below.
ADAPTER_SIGNALS: dict[str, tuple[str, float]] = {
    "gpu_utilization": ("gpu_util_percent", 1.0),
    "gpu_sm_active": ("sm_active", 0.01),
    "gpu_sm_occupancy": ("sm_occupancy", 0.01),
    "gpu_tensor_active": ("tensor_active", 0.01),
    "gpu_dram_active": ("dram_active", 0.01),
    "gpu_memory_used_bytes": ("fb_used_mib", 1 / 1048576),
    "gpu_power_watts": ("power_watts", 1.0),
}
MEMORY_SHARE = "gpu_memory_utilization"
ADAPTER_NOTE = (
    "read from the custom metrics API: values per pod or node, not per GPU (no GPU count, temperature, "
    "throttling or Xid); verdicts use the utilisation signals only"
)


Values = dict[str, dict[str, float]]  # object name → metric → value
# the adapter's workload metrics (adapter/forecasts.py) → WorkloadStatus fields
WORKLOAD_METRICS = {
    "workload_requests_per_second": "requests_per_second",
    "forecast_requests_per_second": "forecast_requests_per_second",
    "forecast_requests_per_second_p90": "forecast_p90_requests_per_second",
    "forecast_desired_replicas": "forecast_replicas",
}


class AdapterCollector:
    """Pods and nodes from a gpuscale adapter (or any custom.metrics.k8s.io serving the same catalogue)."""

    def __init__(
        self,
        url: str,
        *,
        selection: Selection,
        policy: DiagnosisPolicy,
        timeout_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.url = url.rstrip("/")
        self.selection = selection
        self.policy = policy
        self.timeout_seconds = timeout_seconds
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._stale: set[str] = set()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _get(self, path: str, *, label_selector: str | None = None) -> dict[str, Any] | None:
        """The JSON body; None for 404 (no such metric/value) and 503 (stale); errors for the rest."""
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"User-Agent": "gpuscale-top", "Accept": "application/json"})
        params = {"labelSelector": label_selector} if label_selector else None
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
            async with self._session.get(self.url + path, params=params, timeout=timeout) as resp:
                status = resp.status
                body = await resp.json(content_type=None) if resp.content_length != 0 else None
        except TimeoutError as e:
            raise SourceUnavailable(self.url, f"timed out after {self.timeout_seconds:g}s") from e
        except aiohttp.ClientError as e:
            raise SourceUnavailable(self.url, f"{type(e).__name__}: {e}") from e
        except ValueError as e:  # NB: not JSON (a proxy's HTML page): not a metrics API
            raise SourceUnavailable(self.url, f"{path}: the answer is not JSON") from e
        message = body.get("message", "") if isinstance(body, dict) else ""
        if status == 200 and isinstance(body, dict):
            return body
        if status == 404:
            if message.startswith("namespaces "):
                raise ObjectNotFound(message)
            return None
        if status == 503:
            self._stale.add(path.rsplit("/", 1)[-1])
            return None
        if status == 400:
            raise ConfigError(f"--adapter-url {self.url}: {message or 'bad request'}")
        raise SourceUnavailable(self.url, f"{path}: HTTP {status} {message}".rstrip())

    async def _check_api(self) -> None:
        if await self._get(CUSTOM_API) is None:
            raise SourceUnavailable(self.url, f"no {CUSTOM_API.removeprefix('/apis/')} API here (HTTP 404)")

    async def _values(self, paths: Iterable[tuple[str, str]], selector: str | None) -> Values:
        """GET every (metric, path) concurrently; object name → metric → value."""
        pairs = list(paths)
        bodies = await asyncio.gather(*(self._get(p, label_selector=selector) for _, p in pairs))
        out: Values = {}
        for (metric, _), body in zip(pairs, bodies, strict=True):
            for item in (body or {}).get("items") or []:
                name = (item.get("describedObject") or {}).get("name")
                try:
                    value = parse_quantity(str(item.get("value", "")))
                except ValueError:
                    continue
                if name:
                    out.setdefault(name, {})[metric] = value
        return out

    async def _namespaces(self, *extra: str) -> list[str]:
        if self.selection.namespace is not None:
            return [self.selection.namespace]
        metrics = ("gpu_memory_used_bytes", "gpu_utilization", "inference_queue_depth", *extra)
        found = await self._values(((m, f"{CUSTOM_API}/namespaces/*/metrics/{m}") for m in metrics), None)
        return sorted(found)

    def _signals(self, values: dict[str, float]) -> GpuSignals:
        fields: dict[str, Any] = {f: values[m] * scale for m, (f, scale) in ADAPTER_SIGNALS.items() if m in values}
        used, share = fields.get("fb_used_mib"), values.get(MEMORY_SHARE)
        if used is not None and share is not None and share > 0:
            fields["fb_free_mib"] = max(0.0, used * 100 / share - used)
        return GpuSignals(**fields)

    async def collect(self, *, first: bool) -> GpuTopList:
        if first:
            await self._check_api()
        self._stale.clear()
        selection = self.selection
        selector = selection.scope.selector
        metrics = [*ADAPTER_SIGNALS, MEMORY_SHARE]
        items: list[Any]
        if selection.view == "workloads":
            items = await self._workloads(selector)
        elif selection.view == "nodes":
            values = await self._values(((m, f"{CUSTOM_API}/nodes/*/{m}") for m in metrics), selector)
            items = [self._node(name, v) for name, v in sorted(values.items())]
        else:
            metrics += list(INFERENCE_METRICS.values())
            namespaces = await self._namespaces()
            per_namespace = await asyncio.gather(
                *(
                    self._values([(m, f"{CUSTOM_API}/namespaces/{ns}/pods/*/{m}") for m in metrics], selector)
                    for ns in namespaces
                )
            )
            items = [
                self._pod(ns, name, v)
                for ns, values in zip(namespaces, per_namespace, strict=True)
                for name, v in sorted(values.items())
            ]
        now = self.clock()
        notes = [ADAPTER_NOTE]
        if self._stale:
            notes.append(f"stale values left out (their source is failing): {', '.join(sorted(self._stale))}")
        if not items:
            raise selection.nothing_found()
        status = SourceStatus(target=self.url, healthy=True, last_success=now, series=len(items))
        return GpuTopList(
            view=selection.view, generated_at=now, scope=selection.scope, sources=[status], notes=notes, items=items
        )

    async def _workloads(self, selector: str | None) -> list[WorkloadStatus]:
        """Each Deployment/StatefulSet's rate now and forecast (adapter/forecasts.py), -l on workload labels."""
        namespaces = await self._namespaces("inference_requests_per_second")
        asks = [
            (ns, kind, field, f"{CUSTOM_API}/namespaces/{ns}/{resource}/*/{metric}")
            for ns in namespaces
            for resource, kind in (("deployments.apps", "Deployment"), ("statefulsets.apps", "StatefulSet"))
            for metric, field in WORKLOAD_METRICS.items()
        ]
        bodies = await asyncio.gather(*(self._get(path, label_selector=selector) for *_, path in asks))
        found: dict[tuple[str, str, str], dict[str, float]] = {}
        for (ns, kind, field, _), body in zip(asks, bodies, strict=True):
            for item in (body or {}).get("items") or []:
                name = (item.get("describedObject") or {}).get("name")
                try:
                    value = parse_quantity(str(item.get("value", "")))
                except ValueError:
                    continue
                if not name:
                    continue
                values = found.setdefault((ns, kind, name), {})
                values[field] = value
                if field == "forecast_requests_per_second" and isinstance(item.get("windowSeconds"), int | float):
                    values["horizon_seconds"] = float(item["windowSeconds"])  # a forecast's window is its horizon
        return [
            WorkloadStatus(namespace=ns, kind=kind, name=name, **v) for (ns, kind, name), v in sorted(found.items())
        ]

    def _pod(self, namespace: str, name: str, values: dict[str, float]) -> PodStatus:
        signals = self._signals(values)
        stats = {f: values[m] for f, m in INFERENCE_METRICS.items() if m in values}
        cluster = self.selection.cluster
        info = cluster.pod(namespace, name) if cluster is not None else None
        inference = InferenceStats(**stats) if stats else None
        return PodStatus(
            namespace=namespace,
            name=name,
            node=info.node_name if info is not None else None,
            gpus=None,
            signals=signals,
            verdict=diagnose(signals, self.policy),
            serving=diagnose_serving(inference.serving(), signals, self.policy)
            if inference is not None and inference.serves_llm
            else None,
            inference=inference,
        )

    def _node(self, name: str, values: dict[str, float]) -> NodeStatus:
        return NodeStatus(name=name, signals=self._signals(values))


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
    from gpuscale.sources.kube import KubeCache, load_api_client

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
    cluster: ClusterObjects, proxy: Any, scrape: Any, explicit: dict[str, Any]
) -> Callable[[], Awaitable[None]]:
    """``--discover-exporters``: before each refresh, the exporter pods the API lists, as pod-proxy URLs on
    ``scrape`` (and in ``explicit``, so each value belongs to its pod)."""
    from gpuscale.selectors import LabelSelector
    from gpuscale.settings import AdapterSettings
    from gpuscale.sources.discovery import DiscoveryRules, discover, through_pod_proxy

    defaults = AdapterSettings.model_fields
    rules = DiscoveryRules(
        LabelSelector.parse(defaults["dcgm_exporter_selector"].default),
        LabelSelector.parse(defaults["triton_selector"].default),
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
            PrometheusClient.connect(
                settings.prometheus, timeout_seconds=settings.scrape_timeout, max_body_bytes=settings.max_body_bytes * 4
            ),
            queries=terms,
            fresh_within_seconds=max_age,  # NB: a restarted Prometheus's old samples are not today's numbers
        )
        return [source], {}
    from gpuscale.sources.scrape import ScrapeSource

    explicit = parse_scrape_targets(settings.scrape_url)
    windowed = inference.windowed_series if inference is not None else frozenset()
    scrape = ScrapeSource(
        explicit,
        series=set(DEVICE_SERIES) | (inference.series_names if inference is not None else set()),
        windowed_series=windowed,
        history_seconds=(inference.longest_window if inference is not None else 60.0) + 2 * settings.watch_interval,
        timeout_seconds=settings.scrape_timeout,
        max_body_bytes=settings.max_body_bytes,
        session=session,
    )
    return [scrape], explicit


async def _open(settings: TopSettings, policy: DiagnosisPolicy) -> _Opened:
    from gpuscale.sources.promapi import check_credentials

    check_credentials(settings.prometheus)  # NB: refused before any connection
    closers: list[Callable[[], Awaitable[None]]] = []
    try:
        cluster, api = await _open_cluster(settings, closers)
        selection = _resolve_selection(settings, cluster)
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
            from gpuscale.sources.kube import ApiServerSession

            proxy = ApiServerSession(api)
            closers.append(proxy.close)
        sources, explicit = _metrics_sources(
            settings, inference, max_age=catalogue.defaults.max_age, session=proxy.session if proxy else None
        )
        closers.extend(s.close for s in sources)
        before_refresh = None
        if proxy is not None:
            assert cluster is not None
            before_refresh = _discovered_through_the_api(cluster, proxy, sources[0], explicit)
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


# --- the screen ----------------------------------------------------------------------------------------


class Screen:
    """Where frames go: stdout once; with --watch a rich Live on a terminal, frames in sequence otherwise."""

    def __init__(self, settings: TopSettings, policy: DiagnosisPolicy, selection: Selection) -> None:
        from rich.console import Console

        self.settings = settings
        self.policy = policy
        self.selection = selection
        self.console = Console(highlight=False, soft_wrap=False)
        self.terminal = self.console.is_terminal
        self.structured = settings.output in ("json", "yaml")
        self._live: Any = None
        self._frames = 0
        self._last: GpuTopList | None = None

    def _width(self) -> int | None:
        if self.structured:
            return None
        if self.terminal:
            return self.console.width
        return None  # NB: piped, as kubectl: whole names for grep and awk (notes still wrap at 120)

    def _title(self, doc: GpuTopList) -> str:
        from gpuscale.model import rfc3339

        return f"Every {self.settings.watch_interval:g}s: gpuscale top {doc.view}    {rfc3339(doc.generated_at)}"

    def show(self, doc: GpuTopList, *, problem: str | None = None) -> None:
        self._last = doc
        if problem:
            doc = doc.model_copy(update={"notes": [*doc.notes, problem]})
        options = RenderOptions(self.policy, self.selection.scope, width=self._width(), headers=self.settings.headers)
        rendered = render(doc, self.settings.output, options)
        watch = self.settings.watch
        if self.structured:
            prefix = "---\n" if self.settings.output == "yaml" and watch else ""
            self._write(prefix + rendered.plain())
        elif watch and self.terminal:
            from rich.console import Group
            from rich.live import Live
            from rich.text import Text

            frame = Group(Text(self._title(doc), style="dim"), rendered.rich_text())
            if self._live is None:
                self._live = Live(console=self.console, auto_refresh=False, redirect_stderr=False)
                self._live.start()
            self._live.update(frame, refresh=True)
        elif self.terminal:
            self.console.print(rendered.rich_text(), end="")
        else:
            title = f"{self._title(doc)}\n\n" if watch and self.settings.headers else ""
            self._write(("\n" if self._frames else "") + title + rendered.plain())
        self._frames += 1

    def problem(self, error: GpuscaleError) -> None:
        """A refresh after the first failed: keep the last frame, say why (or print to stderr)."""
        text = f"refresh failed: {error}"
        if self._last is not None and (self.terminal or not self.structured) and self.settings.headers:
            self.show(self._last, problem=text)
        else:
            print(f"gpuscale top: {text}", file=sys.stderr, flush=True)

    @staticmethod
    def _write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# --- the command ---------------------------------------------------------------------------------------

_T = TypeVar("_T")


async def _unless_stopped(work: Awaitable[_T], stop: asyncio.Event) -> tuple[bool, _T | None]:
    """Run ``work`` unless ``stop`` is set first (then cancel it): (finished, result)."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return False, None
    return True, task.result()


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
    finished, opened = await _unless_stopped(_open(settings, policy), stop)
    if not finished or opened is None:
        return
    screen = Screen(settings, policy, opened.selection)
    try:
        frames = 0
        while True:
            try:
                finished, doc = await _unless_stopped(opened.collector.collect(first=frames == 0), stop)
            except GpuscaleError as e:
                if frames == 0:
                    raise
                screen.problem(e)
                finished, doc = True, None
            if not finished:
                break
            if doc is not None:
                sorted_doc = doc.model_copy(update={"items": sort_items(doc.view, doc.items, settings.sort_by)})
                screen.show(sorted_doc)
            frames += 1
            if not settings.watch or (settings.iterations is not None and frames >= settings.iterations):
                break
            gc.collect()  # NB: in the idle time between frames (see cyclic_gc_paused)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), settings.watch_interval)
            if stop.is_set():
                break
    finally:
        screen.close()
        await _close_all(opened.closers)
