"""Metric-history mode: what a cluster really reported, replayed through HPA manifests.

The history is per-pod values of catalogue metrics over time (a CSV, or a Prometheus range query the CLI
turns into the same thing). Every 15 s the HPA reads, per pod, the newest value no older than the staleness
window (Prometheus's 5 minutes), as the adapter would have served it, and decides. The history cannot know
what more or fewer replicas would have reported, so by default (``conserve``) the load is taken as
conserved: with N pods observed and R replicas decided, each replica is given the observed per-pod mean
× N / R (queue depth, requests/s and busy time spread over more or fewer pods); ``conserve=False`` replays
the observed values as they are. Object and External metrics (totals) are replayed as observed.

CSV: ``timestamp,pod,metric,value`` (timestamp in seconds or ISO 8601; rows sorted by time), errors name the
file, line and field.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuscale.errors import ConfigError
from gpuscale.hpa import SYNC_PERIOD_SECONDS, Autoscaler, MetricUnavailable, ResourceSample, SelectedPod
from gpuscale.hpa.spec import CrossVersionObjectReference, HorizontalPodAutoscaler, MetricIdentifier
from gpuscale.metrics.catalogue import MetricDefinition, Term
from gpuscale.metrics.histograms import BUCKET_SUFFIX
from gpuscale.model import milli_value
from gpuscale.replay.traces import check_rows, csv_errors, parse_timestamp

_HEADER = ("timestamp", "pod", "metric", "value")
STALENESS_S = 300.0


Series = tuple[np.ndarray, np.ndarray]  # (times ascending, values)


def value_at(series: Series, t: float, *, staleness_s: float = STALENESS_S) -> float | None:
    """The newest value at or before ``t`` and not older than ``staleness_s``."""
    times, values = series
    i = int(np.searchsorted(times, t, side="right")) - 1
    return float(values[i]) if i >= 0 and t - times[i] <= staleness_s else None


@dataclass
class MetricHistory:
    """metric → pod → (times, values), times ascending; ``start``/``end`` span every sample.
    ``external``: metric → one series (``--external``), read by External metrics before ``series``."""

    series: dict[str, dict[str, Series]]
    start: float
    end: float
    external: dict[str, Series] = field(default_factory=dict)

    def with_external(self, external: Mapping[str, Series]) -> MetricHistory:
        return MetricHistory(self.series, self.start, self.end, {**self.external, **external})

    def has(self, metric: str) -> bool:
        return metric in self.series or metric in self.external

    def at(self, metric: str, t: float, *, staleness_s: float = STALENESS_S) -> dict[str, float]:
        """Each pod's newest value of ``metric`` at or before ``t`` and not older than ``staleness_s``."""
        out = {}
        for pod, (times, values) in self.series.get(metric, {}).items():
            i = int(np.searchsorted(times, t, side="right")) - 1
            if i >= 0 and t - times[i] <= staleness_s:
                out[pod] = float(values[i])
        return out

    def pods_at(self, t: float, *, staleness_s: float = STALENESS_S) -> set[str]:
        pods: set[str] = set()
        for metric in self.series:
            pods.update(self.at(metric, t, staleness_s=staleness_s))
        return pods


def history_from_samples(samples: Mapping[str, Mapping[str, list[tuple[float, float]]]]) -> MetricHistory:
    series: dict[str, dict[str, tuple[np.ndarray, np.ndarray]]] = {}
    start, end = np.inf, -np.inf
    for metric, pods in samples.items():
        for pod, points in pods.items():
            points = sorted(points)
            times = np.array([p[0] for p in points], dtype=np.float64)
            values = np.array([p[1] for p in points], dtype=np.float64)
            series.setdefault(metric, {})[pod] = (times, values)
            if len(times):
                start, end = min(start, times[0]), max(end, times[-1])
    if not np.isfinite(start):
        raise ValueError("the history has no samples")
    return MetricHistory(series, float(start), float(end))


@csv_errors
def parse_history_csv(text: str, *, source: str) -> MetricHistory:
    text = text.removeprefix("\ufeff")
    check_rows(text, source=source)
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if tuple(header[:4]) != _HEADER:
        raise ConfigError(f"line 1: expected the header {','.join(_HEADER)} (got {','.join(header)!r})", path=source)
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {}
    last = -np.inf
    for line, row in enumerate(reader, 2):
        if not row or not "".join(row).strip():
            continue
        row = [c.strip() for c in row] + [""] * (4 - len(row))
        t = parse_timestamp(row[0], column="timestamp", line=line, source=source)
        if t < last:
            raise ConfigError(f"line {line}: timestamp goes back in time (rows must be sorted by time)", path=source)
        last = t
        for i, name in ((1, "pod"), (2, "metric")):
            if not row[i]:
                raise ConfigError(f"line {line}: {name} is missing", path=source)
        value = _value(row[3], line=line, source=source)
        samples.setdefault(row[2], {}).setdefault(row[1], []).append((t, value))
    if not samples:
        raise ConfigError("no samples in the history", path=source)
    return history_from_samples(samples)


def _value(text: str, *, line: int, source: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"line {line}: value is not a number (got {text!r})", path=source) from None
    if not np.isfinite(value):
        raise ConfigError(f"line {line}: value must be finite (got {text!r})", path=source)
    return value


@dataclass
class _Readings:
    history: MetricHistory
    t: float
    observed: int
    replicas: int
    conserve: bool

    def pods(self, metric: MetricIdentifier) -> Mapping[str, int]:
        values = self.history.at(metric.name, self.t)
        if not values:
            raise MetricUnavailable(f"no value of {metric.name} in the history at {self.t:g}s")
        if not self.conserve:
            return {pod: milli_value(v) for pod, v in values.items()}
        each = float(np.mean(list(values.values()))) * self.observed / max(self.replicas, 1)
        return {f"replica-{i}": milli_value(each) for i in range(self.replicas)}

    def _total(self, name: str) -> int:
        values = self.history.at(name, self.t)
        if not values:
            raise MetricUnavailable(f"no value of {name} in the history at {self.t:g}s")
        return milli_value(sum(values.values()))

    def object(self, described: CrossVersionObjectReference, metric: MetricIdentifier) -> int:
        return self._total(metric.name)

    def resource(self, name: str) -> Mapping[str, ResourceSample]:
        raise MetricUnavailable(f"a metric history has no pod readiness to judge resource {name} samples by")

    def external(self, metric: MetricIdentifier) -> int:
        fed = self.history.external.get(metric.name)
        if fed is None:
            return self._total(metric.name)
        value = value_at(fed, self.t)
        if value is None:
            raise MetricUnavailable(f"no value of {metric.name} in --external within 5 min before {self.t:g}s")
        return milli_value(value)


def check_history(history: MetricHistory, hpas: list[tuple[str, HorizontalPodAutoscaler]], *, source: str) -> None:
    """Every metric an HPA uses must be in the history: replaying an HPA without one of its metrics would
    answer a different question than the one asked."""
    for path, hpa in hpas:
        for i, spec in enumerate(hpa.spec.metrics):
            if not history.has(spec.metric_name):
                kind = spec.type.lower()
                have = ", ".join(sorted({*history.series, *history.external})) or "nothing"
                raise ConfigError(
                    f"HPA {hpa.name!r} ({path}) spec.metrics[{i}].{kind}.metric.name: {spec.metric_name!r} is not "
                    f"in the history (it has: {have}); add it, or --external {spec.metric_name}=@file.csv",
                    path=source,
                )


@csv_errors
def parse_series_csv(text: str, *, source: str) -> Series:
    """CSV ``timestamp,value`` (seconds or ISO 8601, sorted) → one series."""
    text = text.removeprefix("\ufeff")
    check_rows(text, source=source)
    reader = csv.reader(io.StringIO(text))
    header = [h.strip() for h in next(reader, [])]
    if header[:2] != ["timestamp", "value"]:
        raise ConfigError(f"line 1: expected the header timestamp,value (got {','.join(header)!r})", path=source)
    times: list[float] = []
    values: list[float] = []
    for line, row in enumerate(reader, 2):
        if not row or not "".join(row).strip():
            continue
        row = [c.strip() for c in row] + [""] * (2 - len(row))
        t = parse_timestamp(row[0], column="timestamp", line=line, source=source)
        if times and t < times[-1]:
            raise ConfigError(f"line {line}: timestamp goes back in time (rows must be sorted by time)", path=source)
        times.append(t)
        values.append(_value(row[1], line=line, source=source))
    if not times:
        raise ConfigError("no samples in the file", path=source)
    return np.asarray(times, dtype=np.float64), np.asarray(values, dtype=np.float64)


@dataclass
class HistoryOutcome:
    name: str
    source: str
    observed_replica_hours: float
    hpa_replica_hours: float
    timeline: list[dict[str, float]] = field(default_factory=list)
    events: list[dict[str, object]] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "hpa": self.name,
            "source": self.source,
            "observed_replica_hours": round(self.observed_replica_hours, 4),
            "hpa_replica_hours": round(self.hpa_replica_hours, 4),
            "max_replicas": max((int(s["desired"]) for s in self.timeline), default=0),
            "scale_ups": sum(1 for e in self.events if e["to"] > e["from"]),  # type: ignore[operator]
            "scale_downs": sum(1 for e in self.events if e["to"] < e["from"]),  # type: ignore[operator]
            "timeline": self.timeline,
            "events": self.events,
        }


def replay_history(
    history: MetricHistory,
    hpa: HorizontalPodAutoscaler,
    *,
    source: str = "",
    conserve: bool = True,
    sync_s: float = SYNC_PERIOD_SECONDS,
    initial_replicas: int | None = None,
) -> HistoryOutcome:
    auto = Autoscaler(hpa)
    first = len(history.pods_at(history.start)) or hpa.min_replicas
    replicas = max(hpa.min_replicas, min(initial_replicas or first, hpa.spec.max_replicas))
    out = HistoryOutcome(hpa.name, source, 0.0, 0.0)
    t = history.start + sync_s
    while t <= history.end:
        observed = len(history.pods_at(t))
        readings = _Readings(history, t, observed, replicas, conserve)
        if conserve:
            pods = [SelectedPod(f"replica-{i}") for i in range(replicas)]
        else:
            pods = [SelectedPod(p) for p in sorted(history.pods_at(t))]
        d = auto.reconcile(t, spec_replicas=replicas, pods=pods, readings=readings)
        if d.rescale:
            why = "; ".join(
                f"{p.metric}={p.usage_milli / 1000:g}→{p.replicas}" if p.replicas is not None else p.error
                for p in d.proposals
            )
            out.events.append(
                {
                    "t": round(t - history.start, 3),
                    "from": replicas,
                    "to": d.desired_replicas,
                    "reason": d.reason,
                    "why": why,
                }
            )
            replicas = d.desired_replicas
        out.timeline.append({"t": round(t - history.start, 3), "observed": observed, "desired": replicas})
        out.observed_replica_hours += observed * sync_s / 3600.0
        out.hpa_replica_hours += replicas * sync_s / 3600.0
        t += sync_s
    return out


def promql_for(definition: MetricDefinition, *, window_s: float) -> str:
    """A per-pod PromQL expression for a catalogue metric, for a range query (``… by (pod)``).

    The same arithmetic as the catalogue's formula per object (see policies/metrics.yaml), with the pod as the
    object; a term's own ``prometheus`` expression is used as given.
    """
    window = f"{max(1, round(window_s))}s"

    def term(t: Term, how: str) -> str:
        if t.prometheus:
            return f"{how} by (pod) ({t.prometheus})"
        matchers = [f'{k}="{v}"' for k, v in sorted(t.match.items())]
        if t.input == "histogram_quantile":
            # NB: the quantile of the window's bucket increases, per pod and histogram family
            buckets = "|".join(f"{name}{BUCKET_SUFFIX}" for name in t.series)
            selector = "{" + ",".join([f'__name__=~"{buckets}"', *matchers]) + "}"
            return f"{how} by (pod) (histogram_quantile({t.quantile:g}, sum by (pod, le) (rate({selector}[{window}]))))"
        if len(t.series) == 1:
            selector = f"{t.series[0]}{{{','.join(matchers)}}}" if matchers else t.series[0]
        else:
            # NB: one selector over every name, not `sum(a) + sum(b)`: a binary operator keeps only the pods
            # present on both sides, so a vLLM pod would vanish from a term that also names Triton's series.
            names = "|".join(t.series)
            selector = "{" + ",".join([f'__name__=~"{names}"', *matchers]) + "}"
        if t.input == "rate":
            selector = f"rate({selector}[{window}])"
        elif t.input == "increase":
            selector = f"increase({selector}[{window}])"
        return f"{how} by (pod) ({selector})"

    numerator, denominator = definition.terms
    how = {"mean": "avg", "sum": "sum", "max": "max", "ratio": "sum"}[definition.aggregate]
    expr = term(numerator, how)
    if denominator is not None:
        expr = f"({expr}) / clamp_min({term(denominator, 'sum')}, {denominator.floor or 1e-9:g})"
    return f"({expr}) * {definition.scale:g}" if definition.scale != 1 else expr
