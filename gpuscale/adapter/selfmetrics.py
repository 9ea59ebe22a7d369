"""The adapter's own /metrics (prometheus-client): requests, refreshes, and per-source freshness.

Source health is read at collection time (a custom collector), so freshness is exact when scraped
rather than as of the last refresh.
"""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuscale.buildinfo import register_build_info
from gpuscale.errors import one_line
from gpuscale.metrics.series import HealthReporter
from gpuscale.metrics.store import (
    BAD_TIMESTAMP,
    FUTURE_TIMESTAMP,
    NOT_FINITE,
    OUT_OF_RANGE,
    MetricsStore,
    Snapshot,
)

log = logging.getLogger(__name__)

# What each reason of gpuscale_adapter_values_dropped means, for the one log line per metric and reason.
_DROPPED_BECAUSE = {
    NOT_FINITE: "the source gave NaN or ±Inf",
    OUT_OF_RANGE: "outside the metric's range in the catalogue, or beyond what a Kubernetes quantity holds",
    BAD_TIMESTAMP: "the sample time is not a time (NaN, ±Inf, at or before 1970)",
    FUTURE_TIMESTAMP: "the sample time is ahead of this adapter's clock (a broken source or clock; check NTP)",
}


class _SourceCollector(Collector):
    def __init__(self, sources: Callable[[], Iterable[HealthReporter]], clock: Callable[[], float]) -> None:
        self._sources = sources
        self._clock = clock

    def collect(self):  # type: ignore[no-untyped-def]
        up = GaugeMetricFamily(
            "gpuscale_source_target_up", "1 if the last read of the target succeeded.", labels=["source", "target"]
        )
        age = GaugeMetricFamily(
            "gpuscale_source_freshness_seconds",
            "Seconds since the last successful read of the target (how old its newest data is).",
            labels=["source", "target"],
        )
        duration = GaugeMetricFamily(
            "gpuscale_source_last_duration_seconds", "Duration of the last read.", labels=["source", "target"]
        )
        series = GaugeMetricFamily(
            "gpuscale_source_series", "Series kept from the target's last read.", labels=["source", "target"]
        )
        errors = CounterMetricFamily(
            "gpuscale_source_errors", "Failed reads of the target.", labels=["source", "target"]
        )
        degraded = GaugeMetricFamily(
            "gpuscale_source_target_degraded",
            "1 if the target answers but its data is suspect (e.g. a GPU missing from its exporter).",
            labels=["source", "target"],
        )
        last_error = GaugeMetricFamily(
            "gpuscale_source_target_last_error_timestamp_seconds",
            "When the target's last problem was seen; kind is one word from a fixed set, message the reason.",
            labels=["source", "target", "kind", "message"],
        )
        failed_reads = CounterMetricFamily(
            "gpuscale_source_failed_reads",
            "Reads of part of the target that failed (a Prometheus source: one per query), by kind.",
            labels=["source", "target", "kind"],
        )
        dropped = CounterMetricFamily(
            "gpuscale_source_dropped_series",
            "Series left out of reads of the target that were used, by reason.",
            labels=["source", "target", "reason"],
        )
        now = self._clock()
        for source in self._sources():
            for h in source.health():
                labels = [source.name, h.target]
                up.add_metric(labels, 1.0 if h.healthy else 0.0)
                if h.last_success is not None:
                    age.add_metric(labels, max(0.0, now - h.last_success))
                if h.last_duration_seconds is not None:
                    duration.add_metric(labels, h.last_duration_seconds)
                series.add_metric(labels, float(h.series))
                errors.add_metric(labels, float(h.failures_total))
                degraded.add_metric(labels, 1.0 if h.degraded else 0.0)
                if h.last_error is not None and h.last_error_at is not None:
                    kind, message = h.last_error_kind or "error", one_line(h.last_error, 120)
                    last_error.add_metric([*labels, kind, message], h.last_error_at)
                for kind, n in h.failed_reads.items():
                    failed_reads.add_metric([*labels, kind], float(n))
                for reason, n in h.dropped_series.items():
                    dropped.add_metric([*labels, reason], float(n))
        yield from (up, age, duration, series, errors, degraded, last_error, failed_reads, dropped)


class _Pending(Collector):
    """Collected first: moves what the request path counted into the families before they are read."""

    def __init__(self, flush: Callable[[], None]) -> None:
        self._flush = flush

    def describe(self):  # type: ignore[no-untyped-def]
        return []

    def collect(self):  # type: ignore[no-untyped-def]
        self._flush()
        return []


REQUEST_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


_BOUNDS = (*REQUEST_BUCKETS, math.inf)


class AdapterMetrics:
    """The adapter's registry. Per-request counts (``observe_request``, ``count_answer``) are kept in plain
    dictionaries and added to their families when the registry is collected: prometheus-client's ``inc`` and
    ``observe`` take a lock each, ~5 µs of every request in all; a scrape sees the same values."""

    def __init__(self, sources: Callable[[], Iterable[HealthReporter]], *, clock: Callable[[], float] = time.time):
        self.registry = CollectorRegistry()
        self._children: dict[tuple, object] = {}
        self._pending_requests: dict[tuple[str, str, int], int] = {}
        self._pending_seconds: dict[str, list[float]] = {}  # group → observations per bucket, then their sum
        self._pending_answers: dict[str, int] = {}
        self.registry.register(_Pending(self._flush))  # NB: before the families, so it is collected before them
        register_build_info(self.registry)
        self.requests = Counter(
            "gpuscale_adapter_requests",
            "Metrics API requests by API group, resource and HTTP code.",
            ["group", "resource", "code"],
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "gpuscale_adapter_request_duration_seconds",
            "Metrics API request latency.",
            ["group"],
            buckets=REQUEST_BUCKETS,
            registry=self.registry,
        )
        self.answers = Counter(
            "gpuscale_adapter_answers",
            "Metrics API answers by how their body was had: prepared (built by the refresh before the first request "
            "for it), cached (built for an earlier request in the same state) or computed (by this request).",
            ["how"],
            registry=self.registry,
        )
        self.rejected_requests = Counter(
            "gpuscale_adapter_rejected_requests",
            "Requests the HTTP layer rejected before the API saw them (malformed), by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.refresh_seconds = Histogram(
            "gpuscale_refresh_duration_seconds",
            "Duration of one source → store refresh.",
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.refresh_timestamp = Gauge(
            "gpuscale_refresh_timestamp_seconds", "Time of the last completed refresh.", registry=self.registry
        )
        self.devices = Gauge("gpuscale_store_devices", "GPUs/series devices in the store.", registry=self.registry)
        self.series = Gauge(
            "gpuscale_store_series", "Series values folded in the last refresh.", registry=self.registry
        )
        self.dropped_values = Counter(
            "gpuscale_adapter_values_dropped",
            "Values left out of the answers, per refresh, by metric and reason (not_finite, out_of_range, "
            "bad_timestamp, future_timestamp): the objects they describe answer as if they had none.",
            ["metric", "reason"],
            registry=self.registry,
        )
        self._dropped_seen: set[tuple[str, str]] = set()  # (metric, reason) said in the log already
        self.registry.register(_SourceCollector(sources, clock))

    def count_answer(self, how: str) -> None:
        pending = self._pending_answers
        count = pending.get(how)
        if count is None:
            self._child(self.answers, how)  # NB: the series exists (and its _created time) from its first answer
            count = 0
        pending[how] = count + 1

    def observe_request(self, group: str, resource: str, status: int, started: float) -> None:
        """Count and time one metrics API request (``started``: its ``time.perf_counter()``)."""
        seconds = time.perf_counter() - started
        key = (group, resource, status)
        count = self._pending_requests.get(key)
        if count is None:
            self._child(self.requests, group, resource, str(status))
            count = 0
        self._pending_requests[key] = count + 1
        buckets = self._pending_seconds.get(group)
        if buckets is None:
            self._child(self.request_seconds, group)
            buckets = self._pending_seconds[group] = [0.0] * (len(_BOUNDS) + 1)
        buckets[bisect_left(_BOUNDS, seconds)] += 1  # NB: the first bucket whose bound is >= seconds, as observe()
        buckets[-1] += seconds

    def _flush(self) -> None:
        requests, self._pending_requests = self._pending_requests, {}
        for (group, resource, status), count in requests.items():
            self._child(self.requests, group, resource, str(status)).inc(count)
        answers, self._pending_answers = self._pending_answers, {}
        for how, count in answers.items():
            self._child(self.answers, how).inc(count)
        durations, self._pending_seconds = self._pending_seconds, {}
        for group, buckets in durations.items():
            child = self._child(self.request_seconds, group)
            for bucket, count in zip(child._buckets, buckets, strict=False):  # NB: per bucket, not cumulative
                if count:
                    bucket.inc(count)
            child._sum.inc(buckets[-1])

    def _child(self, family: Counter | Histogram, *labels: str):  # type: ignore[no-untyped-def]
        # NB: ``labels()`` takes a lock and validates on every call; a few µs of each request, saved here.
        key = (id(family), labels)
        child = self._children.get(key)
        if child is None:
            if len(self._children) > 10_000:  # resource names come from URLs: bound it
                self._children.clear()
            child = self._children[key] = family.labels(*labels)
        return child

    def observe_refresh(self, snapshot: Snapshot, seconds: float) -> None:
        self.refresh_seconds.observe(seconds)
        self.refresh_timestamp.set(snapshot.taken_at)
        self.devices.set(snapshot.device_count)
        self.series.set(snapshot.series_count)
        self.count_dropped(snapshot.dropped)

    def count_dropped(self, dropped: Mapping[tuple[str, str], int]) -> None:
        """Count values left out by (metric, reason); the first time a metric loses values for a reason, say so
        once in the log (a bad series stays bad for every refresh: a line each time would drown the log)."""
        for (metric, reason), count in dropped.items():
            self.dropped_values.labels(metric, reason).inc(count)
            if (metric, reason) not in self._dropped_seen:
                self._dropped_seen.add((metric, reason))
                log.warning(
                    "%s: %d value(s) left out of the answers: %s (%s; counted in gpuscale_adapter_values_dropped_total "
                    "from now on, not logged again)",
                    metric,
                    count,
                    reason,
                    _DROPPED_BECAUSE.get(reason, reason),
                )


__all__ = ["AdapterMetrics", "MetricsStore"]
