"""Each workload's demand, horizon and capacity, gathered once per refresh into the DemandBook.

Pure (the store and the watch cache are read through protocols; nothing here does I/O), so every consumer that
forecasts — the adapter's forecast metrics, `gpuscale top` — reads workloads the same way:

    demand    the sum over the workload's pods of a catalogue rate metric (``inference_requests_per_second``):
              pods with no fresh value do not count; a workload with pods but no fresh value at all is a gap
              (nothing is recorded), one with no pods serves 0; the newest sample time of the values summed goes
              with it, so a rate whose samples did not advance (a stopped exporter's last value, fresh until its
              max-age) is no new step (DemandBook.observe's ``sampled_at``)
    horizon   annotation gpuscale.io/startup-seconds, else the median over its Ready pods of
              Ready − status.startTime (measured start-up), else the configured default
    capacity  annotation gpuscale.io/capacity-requests-per-second (requests/s one replica serves at its target)
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from gpuscale.metrics.demand import DemandBook
from gpuscale.metrics.steps import STEP, Steps, finish
from gpuscale.metrics.store import MetricsReader
from gpuscale.model import DEPLOYMENT, POD, STATEFULSET, ObjectRef

log = logging.getLogger(__name__)

STARTUP_ANNOTATION = "gpuscale.io/startup-seconds"
CAPACITY_ANNOTATION = "gpuscale.io/capacity-requests-per-second"


class Workloads(Protocol):
    """What forecasting needs of the watch cache (sources/cluster_index.ClusterObjects satisfies it)."""

    @property
    def synced(self) -> bool: ...

    def namespaces(self) -> frozenset[str]: ...

    def pods(self, namespace: str | None = None) -> list[Any]: ...

    def workloads(self, kind: str, namespace: str) -> list[Any]: ...

    def workload(self, kind: str, namespace: str, name: str) -> Any | None: ...

    def pods_of(self, workload: Any) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Inputs:
    rate: float | None  # None: no fresh value this refresh (a gap)
    horizon_s: float
    horizon_source: str  # annotation | measured | default
    capacity: float | None
    # the newest sample the rate was computed from (None with no pods: a 0 needs no sample); a rate whose samples
    # are no newer than the last recorded is the same reading again, not a new one (DemandBook.observe)
    sampled_at: float | None = None


# What each annotation may say (inclusive, in its unit); anything else is ignored, with one log line naming the
# workload. NB: a capacity below a milli-request per second is no rate a quantity can say, and the desired replicas
# (rate ÷ capacity) would run past a quantity's range ("1e-12" served 9.2e15 replicas); a start-up beyond a day is
# no start-up a forecast could bridge, and its window (seconds, an int64 in the API) must stay a number.
ANNOTATION_RANGES = {STARTUP_ANNOTATION: (0.001, 86_400.0), CAPACITY_ANNOTATION: (0.001, 1e12)}


def _number(text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def measured_startup(pods: Iterable[Any]) -> float | None:
    """Median of Ready − status.startTime over the pods that have both (seconds), or None."""
    startups = [
        p.ready_at - p.started_at
        for p in pods
        if getattr(p, "ready_at", None) is not None
        and getattr(p, "started_at", None) is not None
        and p.ready_at >= p.started_at
    ]
    return statistics.median(startups) if startups else None


def owners(namespace: str, pods: Iterable[Any]) -> dict[ObjectRef, list[Any]]:
    """Pods by the Deployment or StatefulSet that owns them, in one pass.

    NB: matching every workload's selector against every pod is O(workloads × pods) per refresh (seconds at
    thousands of workloads in a namespace). The controller reference says it directly: a StatefulSet's pods name
    it; a Deployment's pods name its ReplicaSet ``<deployment>-<pod-template-hash>``, and carry that hash as a label.
    """
    return finish(owners_steps(namespace, pods))


def owners_steps(namespace: str, pods: Iterable[Any]) -> Steps[dict[ObjectRef, list[Any]]]:
    """``owners`` in steps (metrics/steps.py): a namespace may hold thousands of pods (5.6 ms at 4,000)."""
    out: dict[ObjectRef, list[Any]] = {}
    for seen, pod in enumerate(pods, 1):
        if not seen % STEP:
            yield
        if pod.owner is None:
            continue
        kind, name = pod.owner
        if kind == "StatefulSet":
            key = ObjectRef(STATEFULSET, name, namespace)
        elif (
            kind == "ReplicaSet" and (template := pod.labels.get("pod-template-hash")) and name.endswith(f"-{template}")
        ):
            key = ObjectRef(DEPLOYMENT, name[: -len(template) - 1], namespace)
        else:
            continue
        out.setdefault(key, []).append(pod)
    return out


class WorkloadDemand:
    def __init__(
        self,
        book: DemandBook,
        store: MetricsReader,
        cluster: Workloads,
        *,
        rate_metric: str,
        default_startup_s: float,
        max_age_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.book = book
        self.store = store
        self.cluster = cluster
        self.rate_metric = rate_metric
        self.default_startup_s = default_startup_s
        self.max_age_s = max_age_s
        self.clock = clock
        self.inputs: dict[ObjectRef, Inputs] = {}
        self.last_seconds = 0.0
        self._ignored: dict[tuple[ObjectRef, str], str] = {}  # (workload, annotation) → the text logged as ignored

    def _annotation(self, workload: Any, key: str) -> float | None:
        """The annotation's number, or None when absent or not a number in ``ANNOTATION_RANGES`` (logged once per
        workload and text, not at every refresh)."""
        text = (getattr(workload, "annotations", None) or {}).get(key)
        if text is None:
            return None
        value = _number(text)
        low, high = ANNOTATION_RANGES[key]
        if low <= value <= high:  # NB: False for NaN
            return value
        ref = (ObjectRef(workload.kind, workload.name, workload.namespace), key)
        if self._ignored.get(ref) != text:
            if len(self._ignored) > 10_000:
                self._ignored.clear()  # NB: bounded; at worst a workload's line is said again
            self._ignored[ref] = text
            log.warning(
                "%s %s/%s: annotation %s=%r is not a number from %g to %g; ignored",
                workload.kind,
                workload.namespace,
                workload.name,
                key,
                str(text)[:64],
                low,
                high,
            )
        return None

    def _inputs(self, reader: MetricsReader, workload: Any, now: float, owned: dict[ObjectRef, list[Any]]) -> Inputs:
        key = ObjectRef(workload.kind, workload.name, workload.namespace)
        pods = owned.get(key)
        if pods is None:
            pods = self.cluster.pods_of(workload)  # NB: O(pods in the namespace): only for pods owned otherwise
        refs = [ObjectRef(POD, p.name, p.namespace) for p in pods]
        points = reader.points(self.rate_metric, refs)
        fresh = [p for p in points.values() if not p.stale and p.timestamp >= now - self.max_age_s]
        rate = sum(p.value for p in fresh) if fresh else (0.0 if not pods else None)
        sampled_at = max(p.timestamp for p in fresh) if fresh else None
        horizon, source = self._annotation(workload, STARTUP_ANNOTATION), "annotation"
        if horizon is None:
            horizon, source = measured_startup(pods), "measured"
        if horizon is None:
            horizon, source = self.default_startup_s, "default"
        return Inputs(rate, horizon, source, self._annotation(workload, CAPACITY_ANNOTATION), sampled_at)

    def observe(
        self,
        reader: MetricsReader | None = None,
        *,
        now: float | None = None,
        namespaces: Collection[str] | None = None,
    ) -> None:
        """One refresh: the inputs of every workload in ``namespaces`` (None: every namespace) into the book.

        ``reader``: where the rates are read (default: the store given at construction; the adapter passes the
        snapshot being built, in the refresh's steps). ``now``: the refresh's time (default: the clock).
        Workloads outside ``namespaces`` are not read at all: demand-driven refresh fetches the rate only where
        a forecast is wanted, and elsewhere there would be nothing to read but the cost of listing the pods.
        """
        finish(self.observe_steps(reader, now=now, namespaces=namespaces))

    def observe_steps(
        self,
        reader: MetricsReader | None = None,
        *,
        now: float | None = None,
        namespaces: Collection[str] | None = None,
    ) -> Steps[None]:
        """``observe`` in steps (metrics/steps.py): a workload's inputs, or one workload into the book, per step.
        ``last_seconds`` is then the wall time from the first step to the last."""
        if not self.cluster.synced:
            return
        started = time.perf_counter()
        reader = reader if reader is not None else self.store
        now = now if now is not None else self.clock()
        present = self.cluster.namespaces()
        wanted = present if namespaces is None else present & frozenset(namespaces)
        inputs: dict[ObjectRef, Inputs] = {}
        for namespace in sorted(wanted):
            pods = self.cluster.pods(namespace)
            yield
            owned = yield from owners_steps(namespace, pods)
            for kind in (DEPLOYMENT, STATEFULSET):
                for w in self.cluster.workloads(kind, namespace):
                    inputs[ObjectRef(kind, w.name, w.namespace)] = self._inputs(reader, w, now, owned)
                    yield
        self.inputs = inputs
        rates = {k: i.rate for k, i in inputs.items() if i.rate is not None}
        yield from self.book.observe_steps(
            now,
            rates,
            {k: i.horizon_s for k, i in inputs.items()},
            {k: i.capacity for k, i in inputs.items() if i.capacity is not None},
            sampled_at={k: i.sampled_at for k, i in inputs.items() if i.sampled_at is not None},
        )
        self.last_seconds = time.perf_counter() - started

    def backfill(
        self, history: Mapping[ObjectRef, Sequence[tuple[float, float]]], *, namespaces: Collection[str]
    ) -> int:
        """Warm the book from a recorded rate (e.g. a Prometheus range query): ``history`` is pod → (time, requests/s)
        samples, sorted. Each workload of ``namespaces`` that the book has no history of yet is fed its pods' summed
        rate at every recorded time, oldest first, as refreshes then would have (each sample a new reading), so
        its forecast can be served from the first live refresh instead of ``min_history_s`` later. Returns the
        workloads warmed. NB: only the pods that exist now are summed (the history of a pod gone since is not
        attributed); a workload the book already has is left alone (its live readings are newer)."""
        if not self.cluster.synced:
            return 0
        readings: dict[float, dict[ObjectRef, float]] = {}
        horizons: dict[ObjectRef, float] = {}
        capacities: dict[ObjectRef, float] = {}
        for namespace in sorted(frozenset(namespaces) & self.cluster.namespaces()):
            owned = owners(namespace, self.cluster.pods(namespace))
            for kind in (DEPLOYMENT, STATEFULSET):
                for w in self.cluster.workloads(kind, namespace):
                    key = ObjectRef(kind, w.name, w.namespace)
                    if key in self.book:
                        continue
                    pods = owned.get(key)
                    if pods is None:
                        pods = self.cluster.pods_of(w)
                    series = [history[ref] for p in pods if (ref := ObjectRef(POD, p.name, p.namespace)) in history]
                    if not series:
                        continue
                    for samples in series:
                        for t, v in samples:
                            if math.isfinite(v) and v >= 0:
                                at = readings.setdefault(t, {})
                                at[key] = at.get(key, 0.0) + v
                    inputs = self._inputs(self.store, w, self.clock(), owned)
                    horizons[key] = inputs.horizon_s
                    if inputs.capacity is not None:
                        capacities[key] = inputs.capacity
        for t in sorted(readings):
            rates = readings[t]
            self.book.observe(t, rates, horizons, capacities, sampled_at=dict.fromkeys(rates, t))
        return len(horizons)
