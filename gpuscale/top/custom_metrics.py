"""``AdapterCollector``: pods, nodes and workloads for ``gpuscale top --adapter-url``, read from a gpuscale
adapter's custom.metrics.k8s.io API (or any serving the same catalogue): values per pod and node, no
per-GPU view; workloads carry the adapter's request-rate forecast (adapter/forecasts.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from gpuscale.errors import ConfigError, ExpositionError, ObjectNotFound, SourceUnavailable
from gpuscale.metrics.diagnosis import DiagnosisPolicy, GpuSignals, diagnose, diagnose_serving
from gpuscale.metrics.rollups import INFERENCE_METRICS, InferenceStats, NodeStatus, PodStatus
from gpuscale.model import parse_quantity
from gpuscale.top.document import GpuTopList, SourceStatus, WorkloadStatus
from gpuscale.top.selection import Selection

if TYPE_CHECKING:
    import aiohttp

__all__ = ["AdapterCollector"]


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


def _named_values(body: dict[str, Any] | None) -> Iterator[tuple[str, float, dict[str, Any]]]:
    """A MetricValueList's (described object's name, value, item); items without either are left out."""
    for item in (body or {}).get("items") or []:
        name = (item.get("describedObject") or {}).get("name")
        try:
            value = parse_quantity(str(item.get("value", "")))
        except ValueError:
            continue
        if name:
            yield name, value, item


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
            for name, value, _ in _named_values(body):
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
        bodies, models = await asyncio.gather(
            asyncio.gather(*(self._get(path, label_selector=selector) for *_, path in asks)), self._forecast_models()
        )
        found: dict[tuple[str, str, str], dict[str, Any]] = {}
        for (ns, kind, field, _), body in zip(asks, bodies, strict=True):
            for name, value, item in _named_values(body):
                values = found.setdefault((ns, kind, name), {})
                values[field] = value
                if field == "forecast_requests_per_second" and isinstance(item.get("windowSeconds"), int | float):
                    values["horizon_seconds"] = float(item["windowSeconds"])  # a forecast's window is its horizon
        for key, values in found.items():
            if "forecast_requests_per_second" in values and key in models:
                values["forecast_model"] = models[key]
        return [
            WorkloadStatus(namespace=ns, kind=kind, name=name, **v) for (ns, kind, name), v in sorted(found.items())
        ]

    async def _forecast_models(self) -> dict[tuple[str, str, str], str]:
        """(namespace, kind, name) → the model making each served forecast, from the adapter's /metrics
        (``gpuscale_forecast_model``, docs/forecast.md); empty when /metrics cannot be read (an older adapter, another
        metrics API, a /metrics the credentials may not read): the column then shows none."""
        import aiohttp

        from gpuscale.metrics.exposition import parse_samples

        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"User-Agent": "gpuscale-top", "Accept": "application/json"})
        try:
            timeout = aiohttp.ClientTimeout(total=self.timeout_seconds)
            async with self._session.get(self.url + "/metrics", timeout=timeout) as resp:
                if resp.status != 200:
                    return {}
                text = await resp.text()
            samples = parse_samples(text, source=f"{self.url}/metrics")
        except (TimeoutError, aiohttp.ClientError, ValueError, ExpositionError):
            return {}
        return {
            (s.labels.get("namespace", ""), s.labels.get("kind", ""), s.labels.get("name", "")): s.labels["model"]
            for s in samples
            if s.name == "gpuscale_forecast_model" and s.value == 1 and "model" in s.labels
        }

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
