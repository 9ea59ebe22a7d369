"""Where the controller's GPU telemetry comes from: metric sources (embedded scrape or Prometheus) → device
readings → ``TelemetryHistory`` → ``ClusterTelemetry``, once per reconcile.

The same reading path as ``gpuscale top`` (``metrics.devices.read_devices`` over a source's term query), plus the
PCIe replay counter the health planner needs (``TELEMETRY_SERIES``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

from gpuscale.controller.telemetry import TELEMETRY_SERIES, ClusterTelemetry, TelemetryHistory
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.devices import read_devices
from gpuscale.metrics.series import MetricsSource, SeriesValue, TargetHealth, TermQuery

__all__ = ["TelemetryFeed"]


class TelemetryFeed:
    """Refreshes ``sources`` and folds their device readings into ``history``. ``max_age_seconds``: readings older
    than this are ignored (an exporter that stopped answering makes its node ``reporting=False``)."""

    def __init__(
        self,
        sources: Sequence[MetricsSource],
        attributor: Attributor,
        history: TelemetryHistory,
        *,
        max_age_seconds: float = 60.0,
        before_refresh: Callable[[], None] | None = None,
    ) -> None:
        self.sources = list(sources)
        self.before_refresh = before_refresh  # e.g. exporter discovery from the watch cache
        self.attributor = attributor
        self.history = history
        self.max_age_seconds = max_age_seconds
        self.refreshes = 0

    def read(self, query: TermQuery) -> list[SeriesValue]:
        if len(self.sources) == 1:
            return self.sources[0].read(query)
        return [v for s in self.sources for v in s.read(query)]

    async def refresh(self, *, now: float) -> ClusterTelemetry:
        if self.before_refresh is not None:
            self.before_refresh()
        await asyncio.gather(*(s.refresh(now=now) for s in self.sources))
        self.attributor.begin_refresh()
        readings = read_devices(self.read, self.attributor, series=TELEMETRY_SERIES)
        self.refreshes += 1
        return self.history.observe(readings, now=now, max_age_seconds=self.max_age_seconds)

    def health(self) -> list[TargetHealth]:
        return [h for s in self.sources for h in s.health()]

    async def close(self) -> None:
        for source in self.sources:
            await source.close()
