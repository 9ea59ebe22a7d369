"""``--mode summary``: the TSDB summarises the raw samples, gpuscale combines the summaries (fleets whose samples do
not fit one machine: 100,000 GPUs × 30 days × one sample a minute is 4.3 billion samples).

Every figure comes from raw samples through range selectors — never a subquery ``F[C:S]``, which evaluates ``F``
on a grid and fills each gap from the server's lookback (5 min in Prometheus, far longer in VictoriaMetrics), so a
pod sampled 13.1 h had counted 23.6 h. Three kinds of query, per node batch (``series_batch`` nodes):

* **per series and chunk** (one range query with ``step = chunk``, each point a chunk; ``--chunk`` defaults to the
  window: one chunk, so every per-series figure is exact), for the six signals F::

      count_over_time(F[C])  sum_over_time(F[C])  max_over_time(F[C])
      quantile_over_time(q, F[C])   for q in LEVELS (one request: each level labelled ``gpuscale_q``)

  dense levels for the three activity signals (a workload's pooled quantile is bounded from them: report/
  quantile_bounds.py), four for the others. Counts, sums and maxima merge exactly across chunks and series.
* **per pod owner and step** (kube_pod_owner joined on namespace/pod, summed by the TSDB: owners × steps points,
  not GPUs × steps): GPUs held, GPUs busy, activity summed (SM, else GR engine, else util/100) and pods alive,
  each over the samples in the step's window ``max_over_time(F[w])``, ``w`` = the larger of the step and the
  scrape interval, a millisecond after the step as raw mode's presence; these give replica counts, idle
  stretches, wake-ups and history spans. Per verdict block (an hour, or longer windows' blocks), each diagnosed
  field's ``sum_over_time`` and ``count_over_time`` summed per owner: the verdicts over time.
* **incidents**: ``max_over_time`` / ``changes`` of the Xid gauge and ``increase`` of the ECC DBE counter per chunk;
  the steps whose clock-event mask has an abnormal bit (``floor(x / bit) % 2 == 1``), a sparse range query whose
  answer holds only those steps.

Chunk edges: a point at ``T = edge - 1 ms`` over ``[C]`` holds the samples in ``[edge - C, edge - 1 ms]`` on
Prometheus 3, VictoriaMetrics and Thanos (ranges open on the left, millisecond timestamps): the chunks partition the
samples. Prometheus 2 closes ranges on the left too: a sample stamped exactly 1 ms before an edge counts in both.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from array import array
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.attribution import Target, attribute
from gpuscale.metrics.history import (
    FIELD_ALIASES,
    FIELDS,
    OwnerSteps,
    PodRef,
    SeriesSummary,
    SummaryHistory,
    SummaryIncident,
    clean,
    in_cluster,
)
from gpuscale.sources.history_fetch import (
    FetchOptions,
    Progress,
    identity,
    matrix_points,
    matrix_series,
    measure_scrape_interval,
    regex_alternatives,
)
from gpuscale.sources.promapi import PrometheusClient, TooManySamples

SUMMARY_FIELDS = ("gpu_util_percent", "sm_active", "tensor_active", "dram_active", "gr_engine_active", "fb_used_mib")
ACTIVITY_FIELDS = ("sm_active", "gr_engine_active", "gpu_util_percent")  # the activity's sources, in its order
DIAGNOSED_FIELDS = SUMMARY_FIELDS


def _band(low: float, high: float, spacing: float) -> list[float]:
    return [round(low + k * spacing, 4) for k in range(round((high - low) / spacing) + 1)]


# NB: levels every 5 % and dense around p50, p95 and p99: a workload's pooled quantile bound loses, per part, the
# samples between two levels (report/quantile_bounds.py), and a part of a mixed pool (GPUs at different levels) can
# sit anywhere in its own distribution at the pooled p50. Each level is one more pass over the samples in the TSDB.
DENSE_LEVELS: tuple[float, ...] = tuple(
    sorted({*_band(0.05, 0.9, 0.05), *_band(0.46, 0.54, 0.01), *_band(0.93, 0.97, 0.005), *_band(0.98, 0.998, 0.002)})
)
COARSE_LEVELS: tuple[float, ...] = (0.5, 0.9, 0.95, 0.99)
_POD_NORMALISED = (
    'label_replace(label_replace({x}, "pod", "$1", "exported_pod", "(.+)"), '
    '"namespace", "$1", "exported_namespace", "(.+)")'
)
_OWNER = ("cluster", "namespace", "owner_kind", "owner_name")  # NB: without a cluster label, the rest group


def _ms(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def _sel(name: str, batch: list[str] | None) -> str:
    return f'{name}{{Hostname=~"{regex_alternatives(batch)}"}}' if batch else name


# NB: VictoriaMetrics refuses a query longer than 16 KiB (-search.maxQueryLen): levels go out in packs under it
_MAX_QUERY_CHARS = 12_000
# NB: each level is a pass over the samples: VictoriaMetrics ends a query after 30 s (-search.maxQueryDuration), and
# 45 levels of 400 GPUs × 30 days did not finish in that on a loaded machine; a refused query is asked again for
# half the node batch, but only after its timeout.
_LEVELS_PER_QUERY = 8


def levels_of(fld: str) -> tuple[float, ...]:
    """The levels asked first: dense for SM_ACTIVE (the activity wherever it is reported), four for the rest;
    GR_ENGINE_ACTIVE and GPU_UTIL get the dense ones too in a batch where they stand in for it (``fallback``)."""
    return DENSE_LEVELS if fld == "sm_active" else COARSE_LEVELS


def quantile_query(batch: list[str] | None, fld: str, levels: tuple[float, ...], *, chunk: float) -> str:
    """``quantile_over_time`` at each of ``levels`` in one query, each answer labelled ``gpuscale_q``."""
    sel, c = _sel(FIELDS[fld], batch), _ms(chunk)
    return " or ".join(
        f'label_replace(quantile_over_time({q:g}, {sel}[{c}]), "gpuscale_q", "{q:g}", "", "")' for q in levels
    )


def level_packs(
    batch: list[str] | None, fld: str, levels: tuple[float, ...], *, chunk: float
) -> list[tuple[float, ...]]:
    """``levels`` in groups whose query stays under ``_MAX_QUERY_CHARS`` for this batch."""
    one = len(quantile_query(batch, fld, levels[:1], chunk=chunk)) + 4
    size = max(1, min(_LEVELS_PER_QUERY, _MAX_QUERY_CHARS // one))
    return [levels[i : i + size] for i in range(0, len(levels), size)]


def series_queries(batch: list[str] | None, *, chunk: float, step: float) -> list[tuple[str, str, str]]:
    """(kind, what, PromQL) per series and chunk for one node batch: counts, sums, maxima, quantiles, incidents."""
    c = _ms(chunk)
    out: list[tuple[str, str, str]] = []
    for fld in SUMMARY_FIELDS:
        sel = _sel(FIELDS[fld], batch)
        out += [
            ("stat", f"{fld}:count", f"count_over_time({sel}[{c}])"),
            ("stat", f"{fld}:total", f"sum_over_time({sel}[{c}])"),
            ("stat", f"{fld}:maximum", f"max_over_time({sel}[{c}])"),
        ]
        out += [
            ("quantiles", f"{fld}@{','.join(f'{q:g}' for q in pack)}", quantile_query(batch, fld, pack, chunk=chunk))
            for pack in level_packs(batch, fld, levels_of(fld), chunk=chunk)
        ]
    xid = _sel(FIELDS["last_xid"], batch)
    out += [
        ("xid", "max", f"max_over_time({xid}[{c}])"),
        # NB: one step more, so a change from the previous chunk's last sample counts in this one
        ("xid", "changes", f"changes({xid}[{_ms(chunk + step)}])"),
        ("ecc", "increase", f"increase({_sel(FIELDS['ecc_dbe_volatile'], batch)}[{c}])"),
    ]
    return out


def _joined(x: str, *, owner_window: float, exporter: str, pods: list[str] | None = None) -> str:
    """``x`` per (GPU) series, labelled with its pod's owner from kube_pod_owner (the exporter's own pod is none);
    ``pods``: the pods of the node batch (the owners of every pod otherwise: at 100,000 GPUs each of 250 batches'
    queries joined 25,000 pods' owners at every step, and the TSDB's time grew with the square of the fleet)."""
    pattern = exporter.replace("\\", "\\\\").replace('"', '\\"')
    only = f',pod=~"{regex_alternatives(pods)}"' if pods else ""
    owners = (
        f"max by (cluster, namespace, pod, owner_kind, owner_name) "
        f'(last_over_time(kube_pod_owner{{pod!~"{pattern}"{only}}}[{_ms(owner_window)}]))'
    )
    return f"{_POD_NORMALISED.format(x=x)} * on (cluster, namespace, pod) group_left (owner_kind, owner_name) {owners}"


def step_queries(
    batch: list[str] | None,
    *,
    window: float,
    idle_busy_percent: float,
    idle_sm_active: float,
    exporter: str,
    pods: list[str] | None = None,
) -> list[tuple[str, str]]:
    """(what, PromQL) per pod owner at each grid step: GPUs held, busy, activity summed, pods alive."""
    w = _ms(window)
    util, sm, gr = (
        f"max_over_time({_sel(FIELDS[f], batch)}[{w}])" for f in ("gpu_util_percent", "sm_active", "gr_engine_active")
    )
    sampled = f"({sm} or {gr} or {util})"
    busy = f"(({util} > {idle_busy_percent:g}) or ({sm} > {idle_sm_active:g}) or ({gr} > {idle_busy_percent / 100:g}))"
    activity = f"(clamp({sm}, 0, 1) or clamp({gr}, 0, 1) or clamp({util} / 100, 0, 1))"

    def j(x: str) -> str:
        return _joined(x, owner_window=max(window, 300.0), exporter=exporter, pods=pods)

    by = ", ".join(_OWNER)
    return [
        ("held", f"count by ({by}) ({j(sampled)})"),
        ("busy", f"count by ({by}) ({j(busy)})"),
        ("demand", f"sum by ({by}) ({j(activity)})"),
        ("alive", f"count by ({by}) (count by (cluster, namespace, pod, owner_kind, owner_name) ({j(sampled)}))"),
    ]


def block_queries(
    batch: list[str] | None, *, block: float, exporter: str, pods: list[str] | None = None
) -> list[tuple[str, str]]:
    """(field:sum|count, PromQL) per pod owner and verdict block, over the raw samples of each diagnosed field."""
    b, by = _ms(block), ", ".join(_OWNER)
    out = []
    for fld in DIAGNOSED_FIELDS:
        sel = _sel(FIELDS[fld], batch)
        for stat, fn in (("sum", "sum_over_time"), ("count", "count_over_time")):
            out.append(
                (
                    f"{fld}:{stat}",
                    f"sum by ({by}) ({_joined(f'{fn}({sel}[{b}])', owner_window=block, exporter=exporter, pods=pods)})",
                )
            )
    return out


def throttle_queries(batch: list[str] | None, *, window: float, bits: tuple[int, ...]) -> list[tuple[str, str]]:
    """The steps a GPU's clock-event mask had an abnormal bit: PromQL has no bitwise AND, but bit b of x is
    floor(x / b) % 2; only the matching steps are answered."""
    out = []
    for name in (FIELDS["clock_event_reasons"], *FIELD_ALIASES["clock_event_reasons"]):
        x = f"max_over_time({_sel(name, batch)}[{_ms(window)}])"
        if bits:
            out.append((name, " or ".join(f"(floor({x} / {bit}) % 2 == 1)" for bit in bits)))
    return out


async def _range(
    client: PrometheusClient,
    promql: str,
    *,
    first: float,
    points: int,
    step: float,
    max_points: int,
    add: Callable[[list[dict[str, Any]]], None],
) -> None:
    """``promql`` at ``first + k·step`` for k < points, in pieces of at most ``max_points``, halved on a refusal."""
    k = 0
    while k < points:
        n = min(max_points, points - k)
        while True:
            try:
                add(await client.query_range(promql, start=first + k * step, end=first + (k + n - 1) * step, step=step))
                break
            except TooManySamples:
                if n == 1:
                    raise  # NB: the caller halves the node batch
                n = max(1, n // 2)
        k += n


class _SummaryJobs:
    """The queries of one summary fetch, each run in pieces of at most ``max_points``, and a node batch the server
    refuses asked again in halves (every figure stays exact)."""

    def __init__(
        self,
        client: PrometheusClient,
        decoder: _SummaryDecoder,
        options: FetchOptions,
        *,
        timing: dict[str, tuple[float, int, float]],
        chunk: float,
        step: float,
        rate_window: float,
        block: float,
        idle: tuple[float, float],
        throttle_bits: tuple[int, ...],
    ) -> None:
        self.client, self.decoder, self.options, self.timing = client, decoder, options, timing
        self.chunk, self.step, self.rate_window, self.block = chunk, step, rate_window, block
        self.idle, self.throttle_bits = idle, throttle_bits
        self.semaphore = asyncio.Semaphore(options.concurrency)
        self.bar: Progress | None = None

    def queries(self, batch: list[str] | None) -> dict[tuple[str, str], str]:
        """Every query of one node batch by (kind, what): built when it is sent (the owner joins name the pods the
        batch's series answers named: ``OWNER_KINDS`` go after the rest), and again for half a refused batch."""
        exporter, (busy_percent, sm_active) = self.options.exporter_pod_pattern, self.idle
        pods = self.decoder.pods_on(batch)
        out = {(k, w): q for k, w, q in series_queries(batch, chunk=self.chunk, step=self.step)}
        for what, q in step_queries(
            batch,
            window=self.rate_window,
            idle_busy_percent=busy_percent,
            idle_sm_active=sm_active,
            exporter=exporter,
            pods=pods,
        ):
            out[("steps", what)] = q
        out |= {("block", what): q for what, q in block_queries(batch, block=self.block, exporter=exporter, pods=pods)}
        throttled = throttle_queries(batch, window=self.rate_window, bits=self.throttle_bits)
        out |= {("throttle", name): q for name, q in throttled}
        return out

    def promql(self, kind: str, what: str, batch: list[str] | None) -> str:
        if kind == "quantiles":
            fld, _, levels = what.partition("@")
            return quantile_query(batch, fld, tuple(float(q) for q in levels.split(",")), chunk=self.chunk)
        return self.queries(batch)[(kind, what)]

    async def one(self, kind: str, what: str, batch: list[str] | None) -> None:
        timing = self.timing
        first, points, every = timing.get(kind, timing["steps"] if kind == "throttle" else timing["stat"])
        try:
            async with self.semaphore:
                await _range(self.client, self.promql(kind, what, batch), first=first, points=points, step=every,
                             max_points=self.options.max_points,
                             add=lambda result: self.decoder.add(kind, what.partition("@")[0], result, first=first,
                                                                 every=every))  # fmt: skip
        except TooManySamples as e:
            if not batch or len(batch) == 1:
                raise SourceUnavailable(
                    self.client.display_url,
                    f"refuses a summary query even for one node and one point: {e} (raise its limits)",
                    kind="too_large",
                ) from None
            half = len(batch) // 2
            await self.one(kind, what, batch[:half])
            await self.one(kind, what, batch[half:])
            return
        if self.bar is not None:
            self.bar.advance()

    async def run(self, jobs: list[tuple[str, str, list[str] | None]]) -> None:
        await asyncio.gather(*(self.one(*job) for job in jobs))


async def fetch_summaries(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    chunk: float | None,
    block: float,
    options: FetchOptions,
    idle_busy_percent: float,
    idle_sm_active: float,
    throttle_bits: tuple[int, ...] = (),
    safety_percentile: float | None = None,
    progress: bool | None = None,
) -> SummaryHistory:
    """The summaries of [start, end) (module docstring); ``chunk`` None: one chunk, the window."""
    start = float(np.floor(start / step) * step)
    steps = int(np.ceil((end - start) / step))
    window = steps * step
    chunk = window if chunk is None else min(window, max(step, float(np.floor(chunk / step) * step)))
    chunks = int(np.ceil(window / chunk))
    block = max(step, float(np.floor(block / step) * step))
    h = SummaryHistory(
        start=start,
        step_seconds=step,
        chunk_seconds=chunk,
        chunks=chunks,
        block_seconds=block,
        source=client.display_url,
    )
    nodes = await client.label_values(
        "Hostname", match='{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_.*|DCGM_FI_DEV_FB_USED"}', start=start, end=end
    )
    interval = options.scrape_interval or await measure_scrape_interval(client, start=start, end=start + window)
    h.interval_seconds = interval or step
    batches: list[list[str] | None] = (
        [nodes[i : i + options.series_batch] for i in range(0, len(nodes), options.series_batch)] if nodes else [None]
    )
    decoder = _SummaryDecoder(h, re.compile(options.exporter_pod_pattern))
    timing = {
        "stat": (start + chunk - 0.001, chunks, chunk),
        "steps": (start + 0.001, steps, step),
        "block": (start + block - 0.001, int(np.ceil(window / block)), block),
    }
    work = _SummaryJobs(client, decoder, options, timing=timing, chunk=chunk, step=step,
                        rate_window=max(step, h.interval_seconds), block=block,
                        idle=(idle_busy_percent, idle_sm_active), throttle_bits=throttle_bits)  # fmt: skip
    jobs = [(kind, what, batch) for batch in batches for kind, what in work.queries(batch)]
    work.bar = bar = Progress(len(jobs), enabled=sys.stderr.isatty() if progress is None else progress)
    try:
        await work.run([job for job in jobs if job[0] not in OWNER_KINDS])
        await work.run([job for job in jobs if job[0] in OWNER_KINDS])
        # the activity's fallbacks get the dense levels where a GPU of the batch has no SM_ACTIVE
        more = [
            ("quantiles", f"{fld}@{','.join(f'{q:g}' for q in pack)}", batch)
            for batch in batches
            for fld in decoder.fallbacks(batch)
            for pack in level_packs(batch, fld, DENSE_LEVELS, chunk=chunk)
        ]
        bar.add(len(more))
        await work.run(more)
        if safety_percentile is not None and chunks == 1:
            await _exact_ranks(client, decoder, safety_percentile, chunk=chunk, first=start + chunk - 0.001)
        await identity(client, h, at=start + window, window=window)  # type: ignore[arg-type]
    finally:
        bar.close()
    decoder.finish()
    if interval is None:
        h.gaps.append("scrape interval not measurable (no GPU with two samples in an hour): a sample counts one step")
    h.gaps += [f"partial answer: {warning}" for warning in client.warnings]
    h.queries = client.queries
    return h


OWNER_KINDS = ("steps", "block")  # joined with kube_pod_owner: sent once the batch's pods are known
_RANK_QUERIES = 50  # at most: series of the same sample count share one; the rest keep the levels' bound
_UUIDS_PER_QUERY = 200


async def _exact_ranks(
    client: PrometheusClient, decoder: _SummaryDecoder, q: float, *, chunk: float, first: float
) -> None:
    """The activity's sample at or above the safety quantile, exactly, for each series in one chunk: raw mode's
    safety share (``method="higher"``), which no fixed level gives (the levels' bound interpolates past it)."""
    groups = sorted(decoder.rank_levels(q).items(), key=lambda kv: -len(kv[1]))
    jobs = [
        (fld, level, uuids[i : i + _UUIDS_PER_QUERY])
        for (fld, level), uuids in groups
        for i in range(0, len(uuids), _UUIDS_PER_QUERY)
    ][:_RANK_QUERIES]
    for fld, level, uuids in jobs:
        sel = f'{FIELDS[fld]}{{UUID=~"{regex_alternatives(uuids)}"}}'
        promql = f'label_replace(quantile_over_time({level!r}, {sel}[{_ms(chunk)}]), "gpuscale_q", "{level!r}", "", "")'
        result = await client.query_range(promql, start=first, end=first, step=chunk)
        decoder.add("quantiles", fld, result, first=first, every=chunk)


class _SummaryDecoder:
    def __init__(self, h: SummaryHistory, exporter: re.Pattern[str]) -> None:
        self.h = h
        self._exporter = exporter
        self._series: dict[tuple[Any, ...], SeriesSummary] = {}
        self._xid: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._meta: dict[tuple[str, str], PodRef | None] = {}
        self._throttle: dict[tuple[str, str], tuple[PodRef | None, list[float]]] = {}
        # NB: quantile answers as flat records (series number, level, chunk, value), 24 bytes each: a dict of
        # one-chunk arrays per level and series took 9 KB a GPU, most of the report's memory at 100,000 GPUs
        self._number: dict[int, int] = {}  # id(summary) → its place in _series
        self._q = (array("q"), array("d"), array("q"), array("d"))
        self._pods_by_host: dict[str, set[str]] = defaultdict(set)  # Hostname label → pod names on it

    def rank_levels(self, q: float) -> dict[tuple[str, float], list[str]]:
        """(field, level) → the GPU UUIDs whose activity series has, in its one chunk, its sample at or above the
        quantile ``q`` exactly at that level: rank ``m = ⌈q(n - 1)⌉`` of ``n`` samples, asked at
        ``(m + 10⁻⁶) / (n - 1)`` so the TSDB's interpolation lands on that sample (a hair above it, never below)."""
        out: dict[tuple[str, float], set[str]] = defaultdict(set)
        chosen: dict[tuple[str, PodRef | None], str] = {}
        for (gpu, pod, fld), s in self._series.items():
            if fld not in ACTIVITY_FIELDS or s.count.size != 1 or not np.nansum(s.count) > 1:
                continue
            known = chosen.get((gpu, pod))
            if known is None or ACTIVITY_FIELDS.index(fld) < ACTIVITY_FIELDS.index(known):
                chosen[(gpu, pod)] = fld
        for (gpu, pod), fld in chosen.items():
            n = int(self._series[(gpu, pod, fld)].count[0])
            m = math.ceil(q * (n - 1) - 1e-9)
            if m < n - 1:
                out[(fld, (m + 1e-6) / (n - 1))].add(gpu.split("/")[0])
        return {k: sorted(v) for k, v in out.items()}

    def pods_on(self, batch: list[str] | None) -> list[str] | None:
        """The pod names the series answers of ``batch`` (a node list) named; None: no batch, or none named yet."""
        if not batch:
            return None
        pods = sorted({p for node in batch for p in self._pods_by_host.get(node, ())})
        return pods or None

    def fallbacks(self, batch: list[str] | None) -> list[str]:
        """The activity's fallback fields that stand in for SM_ACTIVE on some GPU of ``batch`` (a node list)."""
        nodes = set(batch) if batch else None
        have: dict[str, set[tuple[str, PodRef | None]]] = {f: set() for f in ACTIVITY_FIELDS}
        for (gpu, pod, fld), s in self._series.items():
            if fld in have and (nodes is None or s.node in nodes) and np.nansum(s.count) > 0:
                have[fld].add((gpu, pod))
        gr_alone = have["gr_engine_active"] - have["sm_active"]
        util_alone = have["gpu_util_percent"] - have["sm_active"] - have["gr_engine_active"]
        return [f for f, alone in (("gr_engine_active", gr_alone), ("gpu_util_percent", util_alone)) if alone]

    def _pod(self, labels: dict[str, str]) -> PodRef | None:
        for pod_key, ns_key in (("exported_pod", "exported_namespace"), ("pod", "namespace")):
            if labels.get(pod_key) and labels.get(ns_key):
                if self._exporter.fullmatch(labels[pod_key]):
                    return None
                return PodRef(in_cluster(labels[ns_key], labels), labels[pod_key])
        return None

    def _gpu(self, labels: dict[str, str]) -> tuple[str, str]:
        device = attribute("DCGM_FI_DEV_GPU_UTIL", labels, Target(url=""))
        uuid = device.key[2] or "?"
        gpu = f"{uuid}/{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else uuid
        return gpu, in_cluster(device.node or labels.get("instance", "unknown"), labels)

    def _summary(self, labels: dict[str, str], fld: str) -> SeriesSummary:
        gpu, node = self._gpu(labels)
        pod = self._pod(labels)
        key = (gpu, pod, fld)
        s = self._series.get(key)
        if s is None:
            if pod is not None and labels.get("Hostname"):
                self._pods_by_host[labels["Hostname"]].add(pod.name)
            chunks = self.h.chunks
            s = self._series[key] = SeriesSummary(
                gpu,
                node,
                labels.get("modelName") or None,
                pod,
                fld,
                count=np.full(chunks, np.nan),
                total=np.full(chunks, np.nan),
                maximum=np.full(chunks, np.nan),
            )
            self._number[id(s)] = len(self._series) - 1
        return s

    def add(self, kind: str, what: str, result: list[dict[str, Any]], *, first: float, every: float) -> None:
        h = self.h
        for entry in result:
            labels, values = matrix_series(entry)
            if labels is None or not values:
                continue
            ts, vs, _ = matrix_points(values)
            vs = clean(vs).astype(np.float64)
            idx = np.rint((ts - first) / every).astype(np.int64)
            ok = (idx >= 0) & ~np.isnan(vs)
            idx, vs, ts = idx[ok], vs[ok], ts[ok]
            if kind == "steps" or kind == "block":
                self._owner(kind, what, labels, idx, vs)
            elif kind == "stat":
                fld, stat = what.split(":")
                getattr(self._summary(labels, fld), stat)[idx[idx < h.chunks]] = vs[idx < h.chunks]
            elif kind == "quantiles":
                level = labels.pop("gpuscale_q", None)
                s = self._summary(labels, what)
                try:
                    q = float(level or "nan")
                except ValueError:
                    continue
                inside = idx < h.chunks
                n = int(np.count_nonzero(inside))
                number, levels, chunk, value = self._q
                number.extend([self._number[id(s)]] * n)
                levels.extend([q] * n)
                chunk.extend(idx[inside].tolist())
                value.extend(vs[inside].tolist())
            elif kind == "xid":
                gpu, node = self._gpu(labels)
                d = self._xid.setdefault(
                    (gpu, node), {"max": np.full(h.chunks, np.nan), "changes": np.full(h.chunks, np.nan)}
                )
                d[what][idx[idx < h.chunks]] = vs[idx < h.chunks]
                self._meta[(gpu, node)] = self._pod(labels)
            elif kind == "ecc":
                gpu, node = self._gpu(labels)
                for i, v in zip(idx, vs, strict=True):
                    if v >= 0.5 and i < h.chunks:
                        h.incidents.append(
                            SummaryIncident("ecc-dbe", node, gpu, self._pod(labels), int(i), float(round(v)), 1)
                        )
            elif kind == "throttle":
                gpu, node = self._gpu(labels)
                _, seen = self._throttle.setdefault((gpu, node), (self._pod(labels), []))
                seen.extend(float(t) - 0.001 for t in ts)

    def _owner(self, kind: str, what: str, labels: dict[str, str], idx: np.ndarray, vs: np.ndarray) -> None:
        h = self.h
        key = (
            in_cluster(labels.get("namespace", ""), labels),
            labels.get("owner_kind", ""),
            labels.get("owner_name", ""),
        )
        if not key[0] or not key[2]:
            return
        o = h.owner_steps.get(key)
        if o is None:
            steps = h.steps
            o = h.owner_steps[key] = OwnerSteps(np.zeros(steps), np.zeros(steps), np.zeros(steps), np.zeros(steps))
        if kind == "steps":
            arr = getattr(o, what)
            keep = idx < len(arr)
            np.add.at(arr, idx[keep], vs[keep])  # NB: summed over node batches
            return
        fld, stat = what.split(":")
        blocks = int(np.ceil(h.steps * h.step_seconds / h.block_seconds))
        target = o.block_sums if stat == "sum" else o.block_counts
        arr = target.setdefault(fld, np.zeros(blocks))
        keep = idx < blocks
        np.add.at(arr, idx[keep], vs[keep])

    def finish(self) -> None:
        h = self.h
        h.series = list(self._series.values())
        for s in h.series:
            s.levels, s.quantiles = (), np.empty((0, h.chunks))
        number, levels, chunk, value = (np.array(a) for a in self._q)
        self._q = (array("q"), array("d"), array("q"), array("d"))
        order = np.lexsort((np.arange(number.size), levels, number))  # by series, level, then arrival
        number, levels, chunk, value = number[order], levels[order], chunk[order], value[order]
        edges = np.flatnonzero(np.diff(number)) + 1
        for a, b in zip(np.r_[0, edges], np.r_[edges, number.size], strict=True):
            if a == b:
                continue
            s = h.series[int(number[a])]
            known = np.unique(levels[a:b])
            s.levels = tuple(float(q) for q in known)
            s.quantiles = np.full((known.size, h.chunks), np.nan)
            s.quantiles[np.searchsorted(known, levels[a:b]), chunk[a:b]] = value[a:b]  # NB: the last answer wins
        for (gpu, node), d in self._xid.items():
            pod = self._meta[(gpu, node)]
            for i in np.flatnonzero((d["max"] > 0) & (d["changes"] > 0)):
                h.incidents.append(
                    SummaryIncident("xid", node, gpu, pod, int(i), float(d["max"][i]), int(d["changes"][i]))
                )
        for (gpu, node), (pod, seen) in self._throttle.items():
            times = sorted(set(seen))
            h.incidents.append(
                SummaryIncident(
                    "throttle",
                    node,
                    gpu,
                    pod,
                    0,
                    float(len(times)),
                    len(times),
                    first_seen=times[0],
                    last_seen=times[-1],
                )
            )
        if not h.series:
            h.gaps.append("no DCGM series in the window: is dcgm-exporter scraped by this server?")
        missing = sorted({FIELDS[f] for f in SUMMARY_FIELDS} - {FIELDS[s.field] for s in h.series})
        if h.series and missing:
            h.gaps.append(f"not reported by any GPU: {', '.join(missing)}")
        if h.series and not h.owner_steps:
            h.gaps.append("no kube_pod_owner joined the DCGM series: no replica counts, idle stretches or verdicts")
