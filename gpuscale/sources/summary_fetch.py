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
  not GPUs × steps; per pod where kube_pod_owner names no owner — a bare pod, a cluster without kube-state-metrics —
  which the report folds into the Kubernetes API's owner or reports bare, as raw mode does): GPUs held, GPUs busy,
  activity summed (SM, else GR engine, else util/100) and pods alive,
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
import re
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.history import (
    FIELD_ALIASES,
    FIELDS,
    SummaryHistory,
)
from gpuscale.sources.history_fetch import (
    FetchOptions,
    Progress,
    identity,
    measure_scrape_interval,
    regex_alternatives,
)
from gpuscale.sources.promapi import PrometheusClient, TooManySamples
from gpuscale.sources.summary_decoder import ACTIVITY_FIELDS, SUMMARY_FIELDS, SummaryDecoder

__all__ = ["ACTIVITY_FIELDS", "SUMMARY_FIELDS", "fetch_summaries"]

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


def _quoted(pattern: str) -> str:
    return pattern.replace("\\", "\\\\").replace('"', '\\"')


def _owners(*, owner_window: float, exporter: str, pods: list[str] | None) -> str:
    """Each pod's owner from kube_pod_owner (the exporter's own pod and KSM's ``<none>`` of a bare pod are none);
    ``pods``: the pods of the node batch (the owners of every pod otherwise: at 100,000 GPUs each of 250 batches'
    queries joined 25,000 pods' owners at every step, and the TSDB's time grew with the square of the fleet)."""
    only = f',pod=~"{regex_alternatives(pods)}"' if pods else ""
    return (
        f"max by (cluster, namespace, pod, owner_kind, owner_name) "
        f'(last_over_time(kube_pod_owner{{pod!~"{_quoted(exporter)}",owner_kind!="<none>"{only}}}[{_ms(owner_window)}]))'
    )


def _per_owner_and_pod(agg: str, x: str, *, owners: str, exporter: str, inner: str = "") -> str:
    """``agg`` of ``x`` per owner where kube_pod_owner names one, and per pod (label ``gpuscale_pod``) where it does
    not — a bare pod, a cluster without kube-state-metrics, a pod kube-state-metrics missed a while: ``x`` joined
    with one owner table, ``owners`` (_owners) ``or`` a row for each pod of ``x`` it lacks at that point (the
    exporter's own pod blanked: no pod), so no series falls out of the join and the batch's pods are named once
    (VictoriaMetrics refuses a query over 16 KiB). ``inner``: an aggregation per pod first (``count``: pods alive).
    """
    x = _POD_NORMALISED.format(x=x)
    pods = f'label_replace(group by (cluster, namespace, pod) ({x}), "gpuscale_pod", "$1", "pod", "(.+)")'
    pods = f'label_replace({pods}, "gpuscale_pod", "", "pod", "{_quoted(exporter)}")'
    joined = (
        f"{x} * on (cluster, namespace, pod) group_left (owner_kind, owner_name, gpuscale_pod) "
        f"({owners} or on (cluster, namespace, pod) {pods})"
    )
    by = ", ".join((*_OWNER, "gpuscale_pod"))
    if inner:
        joined = f"{inner} by ({by}, pod) ({joined})"
    return f"{agg} by ({by}) ({joined})"


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

    owners = _owners(owner_window=max(window, 300.0), exporter=exporter, pods=pods)

    def per(agg: str, x: str, inner: str = "") -> str:
        return _per_owner_and_pod(agg, x, owners=owners, exporter=exporter, inner=inner)

    return [
        ("held", per("count", sampled)),
        ("busy", per("count", busy)),
        ("demand", per("sum", activity)),
        ("alive", per("count", sampled, inner="count")),
    ]


def block_queries(
    batch: list[str] | None, *, block: float, exporter: str, pods: list[str] | None = None
) -> list[tuple[str, str]]:
    """(field:sum|count, PromQL) per pod owner (or unowned pod) and verdict block, over the raw samples of each
    diagnosed field."""
    b = _ms(block)
    owners = _owners(owner_window=block, exporter=exporter, pods=pods)
    out = []
    for fld in DIAGNOSED_FIELDS:
        sel = _sel(FIELDS[fld], batch)
        for stat, fn in (("sum", "sum_over_time"), ("count", "count_over_time")):
            promql = _per_owner_and_pod("sum", f"{fn}({sel}[{b}])", owners=owners, exporter=exporter)
            out.append((f"{fld}:{stat}", promql))
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
        decoder: SummaryDecoder,
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
    decoder = SummaryDecoder(h, re.compile(options.exporter_pod_pattern))
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
    client: PrometheusClient, decoder: SummaryDecoder, q: float, *, chunk: float, first: float
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
