"""History from a Prometheus-compatible range API (Prometheus, VictoriaMetrics, Thanos, Mimir): ``fetch_history``.

What is asked, and why it stays bounded
---------------------------------------
* **Which GPUs.** One ``/api/v1/label/Hostname/values`` call lists the nodes with DCGM series in the window;
  the range queries then go out in **series batches** (``series_batch`` nodes per query, as
  ``FIELD{Hostname=~"n1|n2|…"}``) and **time chunks** (at most ``max_points`` steps per query: Prometheus
  refuses more than 11,000 points per series). Each answer is decoded straight into the History's float32
  arrays and dropped, so memory is the grid (GPUs × steps × fields × 4 bytes) plus one answer.
* **Refusals split the work.** A "too many samples / points / series" answer (HTTP 422 or 400 from
  Prometheus' ``query.max-samples``, VictoriaMetrics' ``-search.max*``) halves the chunk — first the node
  batch, then the time range — and asks again; at one node and one step it stops with the server's words.
* **Retries.** Timeouts, refused connections and HTTP 429/5xx are retried ``retries`` times with doubling
  backoff; then ``SourceUnavailable`` names the server, the query and the last error (exit 2, one line).
* **Identity.** Six instant queries at the window's end, each ``last_over_time(X[window])`` so pods gone
  before the end still answer: ``kube_pod_owner``, ``kube_replicaset_owner`` and ``kube_job_owner`` (pod →
  ReplicaSet → Deployment, pod → Job → CronJob), ``kube_pod_container_resource_requests`` of
  ``nvidia_com_gpu`` (GPUs requested, summed over containers), ``kube_node_labels`` (the pool), and
  ``kube_pod_status_ready_time - kube_pod_start_time`` (each pod's measured cold start). Without
  kube-state-metrics, ``owners`` may come from the Kubernetes API (the CLI passes what it listed); pods known
  to neither are bare pods, and the report says so.
* **Which pod held a GPU.** The DCGM pod labels per series (``metrics/attribution``: ``exported_pod`` over
  ``pod`` over ``pod_name``); a pod whose name matches ``exporter_pod_pattern`` is the exporter itself
  (Prometheus' target labels on an idle GPU), not a workload.

* **Honest hours.** A range query fills a gap in a series with the last sample for up to the server's lookback
  (5 min in Prometheus; VictoriaMetrics' can be far longer: a pod sampled for 12.5 h once counted as 22.4 h). So
  one more query per batch and chunk says where each GPU had a real sample: ``count_over_time(
  DCGM_FI_DEV_GPU_UTIL{…}[w])`` evaluated a millisecond after each step, ``w`` = the larger of the step and the
  scrape interval (measured first: the most samples any GPU has in an hour, ``max(count_over_time(…[1h]))``).
  Every field of a GPU is blanked (NaN: not sampled, counted nowhere) at the steps without one. Each sample then
  counts the one interval that follows it (until the next scrape was due), so a run of n samples counts
  n × interval; and because the windows sit a millisecond off the grid, no sample on the grid lies on a window's
  edge, where Prometheus 2 (closed on the left) and VictoriaMetrics (open) would disagree: both servers give the
  same hours.
Visible gaps, never silent numbers: partial answers (``warnings``, VictoriaMetrics' ``isPartial``), a window
that begins before the oldest sample (retention), a field no GPU reports — each becomes a line of
``History.gaps``, which every report format prints.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

import numpy as np

from gpuscale.errors import ConfigError, SourceUnavailable
from gpuscale.metrics.attribution import Target, attribute
from gpuscale.metrics.history import FIELD_ALIASES, FIELDS, History, Owner, PodRef, clean, in_cluster, pool_of
from gpuscale.model import format_duration
from gpuscale.sources.bounded import size_text
from gpuscale.sources.promapi import PrometheusClient, TooManySamples

DEFAULT_EXPORTER_POD = r"(nvidia-)?dcgm-exporter.*"
PRESENCE = "_present"  # the pseudo-field: steps where a GPU had a real sample (``count_over_time``)


_MAX_GPUS_PER_POD = 1024  # a GPU request above this is a broken series, not a pod's request

# What raw mode holds per grid step, measured (docs/report.md "Memory"): the History's arrays, and the report's
# working arrays (activity, busy and sampled flags per GPU; per pod held/busy/FB; per workload demand).
BYTES_PER_STEP = 64  # the grid's times, decay weights, hour blocks and timeline, whatever the fleet
BYTES_PER_GPU_STEP = 4 + 1 + 20  # the pod index (int32), presence (bool), the report's working arrays
BYTES_PER_FIELD_STEP = 4  # one float32 per field a GPU reports


@dataclass(slots=True)
class GridBudget:
    """Raw mode's memory, counted before it is allocated: the grid is GPUs × steps × fields, and a server (or a
    file) decides the GPUs. Each new GPU and each field array is reserved first; past ``limit_bytes`` the run
    stops with one line that says how to fit (ConfigError: the flag's limit, exit 2), never an out-of-memory kill.
    """

    limit_bytes: int
    steps: int
    gpus: int = 0
    arrays: int = 0
    field_names: set[str] = dataclass_field(default_factory=set)

    def check(self, *, gpus: int, arrays: int, fields: int, what: str = "the history") -> None:
        """Refuses when ``gpus`` GPUs holding ``arrays`` field arrays in all (``fields`` distinct) would not fit."""
        need = self.steps * (BYTES_PER_STEP + gpus * BYTES_PER_GPU_STEP + arrays * BYTES_PER_FIELD_STEP)
        if need > self.limit_bytes:
            raise ConfigError(
                f"{what} needs {need / 2**30:,.1f} GiB for {gpus:,} GPU(s) × {self.steps:,} steps × {fields} field(s), "
                f"over --memory-budget {size_text(self.limit_bytes)}: use --mode summary, a shorter --window or a "
                "coarser --step (or raise --memory-budget)"
            )

    def reserve_gpu(self) -> None:
        self.check(gpus=self.gpus + 1, arrays=self.arrays, fields=len(self.field_names))
        self.gpus += 1

    def reserve_field(self, name: str) -> None:
        self.check(gpus=self.gpus, arrays=self.arrays + 1, fields=len(self.field_names | {name}))
        self.arrays += 1
        self.field_names.add(name)


@dataclass(frozen=True, slots=True)
class FetchOptions:
    """How a history is fetched; the client's deadline per query is the command's (``--prometheus-timeout``)."""

    retries: int = 3
    backoff_seconds: float = 1.0
    max_points: int = 10_000
    scrape_interval: float | None = None
    """Seconds between an exporter's samples; None: measured from the server (``measure_scrape_interval``)."""
    max_response_bytes: int = 128 * 1024 * 1024
    """A bigger answer is refused (not decoded): a 300 MB answer took 5.8 GB of memory to decode."""
    memory_budget_bytes: int = 1536 * 1024 * 1024
    """What the History and the report's working arrays may take (``GridBudget``); past it, a one-line refusal."""
    series_batch: int = 50
    concurrency: int = 4
    exporter_pod_pattern: str = DEFAULT_EXPORTER_POD

    def client_limits(self) -> dict[str, Any]:
        """The ``PrometheusClient`` keyword arguments of a fetch: its retries and body cap."""
        return {
            "retries": self.retries,
            "backoff_seconds": self.backoff_seconds,
            "max_body_bytes": self.max_response_bytes,
            "max_body_flag": "--max-response-size",
            "too_large_hint": "narrow --window, raise --step or lower --series-batch",
        }


def regex_alternatives(values: Iterable[str]) -> str:
    return "|".join(re.escape(v).replace("\\", "\\\\").replace('"', '\\"') for v in values)


class Progress:
    """A progress bar on a terminal (rich), nothing otherwise."""

    def __init__(self, total: int, *, enabled: bool) -> None:
        self._bar = None
        self._total = total
        if enabled and total:
            from rich.console import Console
            from rich.progress import Progress as RichProgress

            # NB: on stderr: stdout carries the report (often piped into a file or jq)
            self._bar = RichProgress(transient=True, console=Console(stderr=True))
            self._task = self._bar.add_task("fetching history", total=total)
            self._bar.start()

    def advance(self) -> None:
        if self._bar is not None:
            self._bar.advance(self._task)

    def add(self, more: int) -> None:
        """``more`` steps of work found on the way (the total grows)."""
        if self._bar is not None and more:
            self._total += more
            self._bar.update(self._task, total=self._total)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


async def fetch_history(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    options: FetchOptions,
    progress: bool | None = None,
) -> History:
    """The DCGM fields and workload identity over [start, end) at ``step`` (module docstring)."""
    start = float(np.floor(start / step) * step)
    steps = int(np.ceil((end - start) / step))
    history = History(start=start, step_seconds=step, steps=steps, source=client.display_url)
    state = _Decoder(history, options)
    state.budget.check(gpus=0, arrays=0, fields=0, what="the time grid alone")
    nodes = await client.label_values(
        "Hostname", match='{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_.*|DCGM_FI_DEV_FB_USED"}', start=start, end=end
    )
    await _preflight(client, state.budget, at=start + steps * step)
    batches: list[list[str] | None] = (
        [nodes[i : i + options.series_batch] for i in range(0, len(nodes), options.series_batch)] if nodes else [None]
    )
    if not nodes:
        history.gaps.append("no Hostname label on the DCGM series: fetched without series batching")
    chunk = options.max_points * step
    chunks = [(t, min(t + chunk, start + steps * step)) for t in np.arange(start, start + steps * step, chunk)]
    names = [(fld, name) for fld, name in FIELDS.items()] + [
        (fld, alias) for fld, aliases in FIELD_ALIASES.items() for alias in aliases
    ]
    work = [
        (fld, name, batch, c)
        for fld, name in [*names, (PRESENCE, FIELDS["gpu_util_percent"])]
        for batch in batches
        for c in chunks
    ]
    bar = Progress(len(work), enabled=sys.stderr.isatty() if progress is None else progress)
    interval = options.scrape_interval or await measure_scrape_interval(client, start=start, end=start + steps * step)
    if interval is None:
        history.gaps.append(
            "scrape interval not measurable (no GPU with two samples in an hour): hours assume one sample per step"
        )
    state.presence_window = max(step, interval or step)
    semaphore = asyncio.Semaphore(options.concurrency)

    async def one(fld: str, name: str, batch: list[str] | None, c: tuple[float, float]) -> None:
        async with semaphore:
            await _fetch_split(client, state, fld, name, batch, c[0], c[1], step)
        bar.advance()

    try:
        await asyncio.gather(*(one(*w) for w in work))
        await identity(client, history, at=start + steps * step, window=steps * step)
    finally:
        bar.close()
    state.finish(names)
    history.gaps += [f"partial answer: {w}" for w in client.warnings]
    return history


async def _preflight(client: PrometheusClient, budget: GridBudget, *, at: float) -> None:
    """Refuses a grid that cannot fit before anything is fetched: the DCGM series per field at the window's end
    (one instant query, the server's lookback only) are the fleet as it is now. GPUs gone before the end are not
    counted here; the decoder's reservations catch them as they arrive."""
    names = "|".join(dict.fromkeys([*FIELDS.values(), *(a for aliases in FIELD_ALIASES.values() for a in aliases)]))
    try:
        result = await client.query(f'count by (__name__) ({{__name__=~"{names}"}})', at=at)
    except TooManySamples:
        return  # NB: a server too loaded to count is asked the real queries, which split; the decoder still counts
    per_name = {_labels(r).get("__name__", ""): _number(r) or 0.0 for r in result}
    counts = [int(min(c, 2**40)) for c in per_name.values() if c > 0]
    if counts:
        budget.check(gpus=max(counts), arrays=sum(counts), fields=len(counts), what="the history (DCGM series now)")


async def _fetch_split(
    client: PrometheusClient,
    state: _Decoder,
    fld: str,
    name: str,
    batch: list[str] | None,
    t0: float,
    t1: float,
    step: float,
) -> None:
    selector = f'{name}{{Hostname=~"{regex_alternatives(batch)}"}}' if batch else name
    shift = 0.0
    if fld == PRESENCE:
        # a millisecond after each step, so that a sample on the grid falls inside a window, never on its edge
        selector = f"count_over_time({selector}[{round(state.presence_window * 1000)}ms])"  # NB: PromQL: no 59.5s
        shift = 0.001
    try:
        # NB: end is the last step's start: query_range includes both ends.
        result = await client.query_range(selector, start=t0 + shift, end=t1 - step + shift, step=step)
    except TooManySamples as e:
        if batch and len(batch) > 1:
            half = len(batch) // 2
            for part in (batch[:half], batch[half:]):
                await _fetch_split(client, state, fld, name, part, t0, t1, step)
            return
        if t1 - t0 > step:
            mid = t0 + np.floor((t1 - t0) / step / 2) * step
            await _fetch_split(client, state, fld, name, batch, t0, mid, step)
            await _fetch_split(client, state, fld, name, batch, mid, t1, step)
            return
        raise SourceUnavailable(
            client.display_url,
            f"refuses even one step of {name} for one node: {e} (raise its limits)",
            kind="too_large",
        ) from None
    state.add(fld, name, result, shift=shift)


# NB: fields every GPU reports at each scrape, any of them: a fleet exporting only the profiling fields (no
# DCGM_FI_DEV_GPU_UTIL) had no measured interval, and a step longer than the interval counted a sample as a step.
# One count per name joined by ``or``: a name regex would give two series the same labels once the name is dropped.
_PER_SCRAPE = tuple(FIELDS[f] for f in ("gpu_util_percent", "sm_active", "gr_engine_active", "fb_used_mib"))


async def measure_scrape_interval(client: PrometheusClient, *, start: float, end: float) -> float | None:
    """Seconds between one exporter's samples: an hour over the most samples any GPU has in it, the most of the
    window's last, middle and first hour (a GPU sampled all that hour gives the interval; the window's edge can cut
    one sample off an hour). The range is a millisecond short of the hour: Prometheus 2 closes it on both ends, and
    samples on the minute would count 61 in it (summary mode's hours are samples × this interval)."""
    hour = min(3600.0, end - start)
    best = 0.0
    for at in (end, (start + end + hour) / 2, start + hour):
        counts = (f"count_over_time({name}[{round(hour * 1000) - 1}ms])" for name in _PER_SCRAPE)
        promql = f"max({' or '.join(counts)})"
        result = await client.query(promql, at=at)
        for r in result:
            count = _number(r)
            best = max(best, count) if count is not None and np.isfinite(count) else best
    return hour / best if best >= 2 else None


class _Decoder:
    """Places range-query answers on the History's grid."""

    def __init__(self, history: History, options: FetchOptions) -> None:
        self.h = history
        self.budget = GridBudget(limit_bytes=options.memory_budget_bytes, steps=history.steps)
        self.dropped_series = 0  # a result entry that is not {"metric": {…}, "values": […]}
        self.dropped_points = 0  # a point that is no [number, "number"] pair, or out of time order
        self.outside = 0  # a point whose timestamp is not in the window
        self._exporter = re.compile(options.exporter_pod_pattern)
        self._gpus: dict[tuple[str, ...], Any] = {}
        self._seen: dict[str, int] = {}
        self.first_sample = np.inf
        self.presence_window = history.step_seconds  # widened to the scrape interval once measured
        self._present: dict[tuple[str, ...], np.ndarray] = {}  # GPU → steps with a real sample (see ``finish``)

    def add(self, fld: str, name: str, result: list[Any], *, shift: float = 0.0) -> None:
        h = self.h
        for series in result:
            labels, values = matrix_series(series)
            if labels is None:
                self.dropped_series += 1
                continue
            if not values:
                continue
            ts, vs, dropped = matrix_points(values)
            self.dropped_points += dropped
            if not ts.size:
                continue
            device = attribute(name, labels, Target(url=""))
            pod_ref = device.pod
            if pod_ref is not None and self._exporter.fullmatch(pod_ref.name):
                pod_ref = None  # the exporter's own target labels on an idle GPU
            key = device.key[:4]
            gpu = self._gpus.get(key)
            if gpu is None:
                self.budget.reserve_gpu()
                uuid = device.key[2] or "?"
                mig = labels.get("GPU_I_ID")
                gpu = self._gpus[key] = h.new_gpu(
                    f"{uuid}/{mig}" if mig else uuid,
                    node=in_cluster(device.node or labels.get("instance", "unknown"), labels),
                    product=labels.get("modelName") or None,
                    mig_profile=labels.get("GPU_I_PROFILE") or None,
                )
            vs = clean(vs)
            with np.errstate(invalid="ignore"):
                idx = np.rint((ts - shift - h.start) / h.step_seconds)
            ok = (idx >= 0) & (idx < h.steps)  # NB: a NaN or ±inf timestamp compares False: outside
            self.outside += int(ts.size - ok.sum())
            idx, vs = idx[ok].astype(np.int64), vs[ok]
            if idx.size:
                self.first_sample = min(self.first_sample, float(ts[ok][0]))
            if fld == PRESENCE:
                present = self._present.setdefault(key, np.zeros(h.steps, dtype=bool))
                present[idx[vs > 0]] = True
                continue
            arr = gpu.values.get(fld)
            if arr is None:
                self.budget.reserve_field(fld)
                arr = gpu.values[fld] = h.empty_field()
            fill = np.isnan(arr[idx])  # NB: an alias never overwrites the newer spelling's samples
            arr[idx[fill]] = vs[fill]
            if pod_ref is not None:
                pi = h.pod_index(PodRef(in_cluster(pod_ref.namespace or "", labels), pod_ref.name))
                gpu.pod[idx] = pi
            self._seen[fld] = self._seen.get(fld, 0) + 1

    def finish(self, names: list[tuple[str, str]]) -> None:
        h = self.h
        if self.dropped_series or self.dropped_points or self.outside:
            h.gaps.append(
                f"malformed answers: {self.dropped_series} series without a label map or value list, "
                f'{self.dropped_points} point(s) not a [timestamp, "value"] pair or out of time order (duplicates '
                f"included) and {self.outside} point(s) outside the window were dropped"
            )
        blanked = 0
        for key, present in self._present.items():
            gpu = self._gpus.get(key)
            if gpu is None or present.all():
                continue
            gap = ~present
            for arr in gpu.values.values():
                blanked += int((~np.isnan(arr[gap])).sum())
                arr[gap] = np.nan  # NB: the server's lookback filled these steps; no sample was taken
        if blanked:
            h.gaps.append(
                f"{blanked} value(s) the server filled across gaps in the samples were not counted "
                f"(no sample within {format_duration(self.presence_window)} before the step)"
            )
        if not h.gpus:
            h.gaps.append("no DCGM series in the window: is dcgm-exporter scraped by this server?")
            return
        missing = sorted({FIELDS[f] for f, _ in names if f not in self._seen})
        if missing:
            h.gaps.append(f"not reported by any GPU: {', '.join(missing)}")
        if np.isfinite(self.first_sample) and self.first_sample > h.start + 2 * h.step_seconds:
            lost = self.first_sample - h.start
            h.gaps.append(
                f"no samples in the first {format_duration(lost)} of the window: the server's retention (or the "
                "exporters' start) is shorter than the window"
            )


def matrix_series(series: Any) -> tuple[dict[str, str] | None, list[Any]]:
    """A range answer's series as (labels, points); labels None when it is no series at all. Labels that are not
    strings are left out: they cannot name a GPU or a pod."""
    if not isinstance(series, dict) or not isinstance(series.get("metric", {}), dict):
        return None, []
    values = series.get("values")
    if values is None:
        values = []
    if not isinstance(values, list):
        return None, []
    metric = series.get("metric", {})
    return {k: v for k, v in metric.items() if isinstance(k, str) and isinstance(v, str)}, values


def matrix_points(values: list[Any]) -> tuple[np.ndarray, np.ndarray, int]:
    """Timestamps (float64) and values (float64, NaN/Inf kept for ``clean``) of a series' ``[t, "v"]`` pairs, in
    strictly increasing time; how many points were dropped (not such a pair, or not after the one before)."""
    try:
        # NB: the fast path, one numpy conversion per column: values must all be strings (Prometheus' encoding),
        # so a number, a bool or a list inferred into another dtype goes the slow way and is dropped there
        ts = np.array([p[0] for p in values])
        raw = np.array([p[1] for p in values])
        if ts.ndim != 1 or ts.dtype.kind not in "if" or raw.ndim != 1 or raw.dtype.kind != "U":
            raise ValueError("not [number, string] pairs")
        ts, vs = ts.astype(np.float64), raw.astype(np.float64)
        dropped = 0
    except (ValueError, TypeError, IndexError, KeyError, OverflowError):
        ts, vs, dropped = _points_one_by_one(values)
    if ts.size > 1 and not (np.diff(ts) > 0).all():
        # keep a point only when it is later than every point before it: duplicates and rewinds are dropped
        with np.errstate(invalid="ignore"):
            later = np.concatenate(([True], ts[1:] > np.maximum.accumulate(ts)[:-1]))
        dropped += int(ts.size - later.sum())
        ts, vs = ts[later], vs[later]
    return ts, vs, dropped


def _points_one_by_one(values: list[Any]) -> tuple[np.ndarray, np.ndarray, int]:
    ts: list[float] = []
    vs: list[float] = []
    for p in values:
        t, v = _pair(p)
        if t is not None and v is not None:
            ts.append(t)
            vs.append(v)
    return np.array(ts, dtype=np.float64), np.array(vs, dtype=np.float64), len(values) - len(ts)


def _pair(point: Any) -> tuple[float | None, float | None]:
    if not isinstance(point, list) or len(point) != 2:
        return None, None
    t, v = point
    if isinstance(t, bool) or not isinstance(t, int | float) or not isinstance(v, str):
        return None, None
    try:
        return float(t), float(v)
    except (ValueError, OverflowError):
        return None, None


def _number(sample: Any) -> float | None:
    """The value of an instant answer's ``{"metric": …, "value": [t, "v"]}``; None when it is not one."""
    if not isinstance(sample, dict):
        return None
    _, v = _pair(sample.get("value"))
    return v


def _labels(sample: Any) -> dict[str, str]:
    metric = sample.get("metric") if isinstance(sample, dict) else None
    if not isinstance(metric, dict):
        return {}
    return {k: v for k, v in metric.items() if isinstance(k, str) and isinstance(v, str)}


def _pod_of(labels: Mapping[str, str]) -> PodRef | None:
    for pod_key, ns_key in (("exported_pod", "exported_namespace"), ("pod", "namespace")):
        if labels.get(pod_key) and labels.get(ns_key):
            return PodRef(in_cluster(labels[ns_key], labels), labels[pod_key])
    return None


async def identity(client: PrometheusClient, history: History, *, at: float, window: float) -> None:
    """Owners, GPU requests and node pools from kube-state-metrics, when the server has them."""
    w = format_duration(window)
    owners, rs_owners, job_owners, requests, node_labels, startups = await asyncio.gather(
        client.query(f"last_over_time(kube_pod_owner[{w}])", at=at),
        client.query(f"last_over_time(kube_replicaset_owner[{w}])", at=at),
        client.query(f"last_over_time(kube_job_owner[{w}])", at=at),
        client.query(f'last_over_time(kube_pod_container_resource_requests{{resource="nvidia_com_gpu"}}[{w}])', at=at),
        client.query(f"last_over_time(kube_node_labels[{w}])", at=at),
        # the cold start each pod paid: Ready time − start time (kube-state-metrics ≥ 2.x)
        client.query(
            f"last_over_time(kube_pod_status_ready_time[{w}]) - on(cluster, namespace, pod) "
            f"last_over_time(kube_pod_start_time[{w}])",
            at=at,
        ),
    )
    # A ReplicaSet's Deployment, a Job's CronJob: the workload whose history is the union of its pods'.
    parents: dict[tuple[str, str, str], tuple[str, str]] = {}
    for kind, key, series in (("ReplicaSet", "replicaset", rs_owners), ("Job", "job_name", job_owners)):
        for s in series:
            m = _labels(s)
            ns = in_cluster(m.get("exported_namespace") or m.get("namespace") or "", m)
            if ns and m.get(key) and m.get("owner_kind") not in (None, "", "<none>"):
                parents[(kind, ns, m[key])] = (m["owner_kind"], m.get("owner_name", ""))
    if isinstance(getattr(history, "parents", None), dict):  # summary mode maps its per-owner sums through them
        history.parents.update(parents)  # type: ignore[attr-defined]
    for s in owners:
        m = _labels(s)
        ref = _pod_of(m)
        if ref is None:
            continue
        kind, name = m.get("owner_kind", ""), m.get("owner_name", "")
        if kind in ("", "<none>"):
            history.owners[ref] = Owner("Pod", ref.name)
            continue
        kind, name = parents.get((kind, ref.namespace, name), (kind, name))
        history.owners[ref] = Owner(kind, name)
    for s in requests:
        ref, gpus = _pod_of(_labels(s)), _number(s)
        # NB: a request is a whole, small number of GPUs; anything else is a broken series, not a request
        if ref is not None and gpus is not None and 0 <= gpus <= _MAX_GPUS_PER_POD:
            history.requests[ref] = history.requests.get(ref, 0.0) + gpus
    for s in startups:
        ref, seconds = _pod_of(_labels(s)), _number(s)
        # NB: a pod restarted later than it turned Ready gives a negative time: unknown
        if ref is not None and seconds is not None and 0 <= seconds < 86400:
            history.startups[ref] = seconds
    for s in node_labels:
        m = _labels(s)
        node, pool = in_cluster(m.get("node") or "", m), pool_of(m)
        if node and pool:
            history.node_pools[node] = pool
    if not owners:
        history.gaps.append("no kube_pod_owner (kube-state-metrics) in the window: owners from the Kubernetes API")
    if not requests:
        history.gaps.append("no GPU requests from kube-state-metrics: requests are the GPUs seen per pod")
