"""How ``gpuscale top`` reads one frame: the ``Collector`` protocol, and ``SourcesCollector``, which reads
per-GPU series from metrics sources (scrape, Prometheus) and builds the asked view from them.
(``AdapterCollector``, in custom_metrics.py, reads a running adapter's API instead.)"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.attribution import Device
from gpuscale.metrics.devices import gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import DiagnosisPolicy
from gpuscale.metrics.rollups import (
    INFERENCE_METRICS,
    InferenceStats,
    inference_stats,
    node_statuses,
    pod_statuses_of_readings,
)
from gpuscale.sources.base import MetricsSource, SeriesValue, TargetHealth, TermQuery
from gpuscale.top.document import GpuTopList, SourceStatus
from gpuscale.top.selection import Selection

if TYPE_CHECKING:
    from gpuscale.metrics.attribution import Attributor
    from gpuscale.metrics.catalogue import Catalogue

__all__ = ["Collector", "SourcesCollector", "inference_catalogue"]


def _source_status(h: TargetHealth) -> SourceStatus:
    return SourceStatus(target=h.target, healthy=h.healthy, error=h.error, last_success=h.last_success, series=h.series)


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
            items = selection.kept(gpu_statuses(readings, self.policy))
        elif selection.view == "nodes":
            items = selection.kept(node_statuses(gpu_statuses(readings, self.policy), self.policy))
        else:
            inference = self._inference(now)
            pods = pod_statuses_of_readings(readings, self.policy, inference=inference, node_of=self._node_of)
            items = selection.kept(pods)
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
