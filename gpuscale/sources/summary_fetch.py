"""``--mode summary``: the TSDB computes per-series summaries, gpuscale combines them (fleets whose raw samples
do not fit one machine: 10,000 GPUs × 30 days × 1-minute samples is 432 M samples per field).

For every node batch (as in ``sources/history_fetch``) and every chunk of ``chunk`` seconds (one range query with
``step = chunk`` covers the whole window), over a subquery at the report's step ``S`` so a summary describes
exactly the grid samples raw mode would fetch::

    count_over_time(F[C:S])  avg_over_time(F[C:S])  max_over_time(F[C:S])
    quantile_over_time(q, F[C:S])  for q = 0.25, 0.5, 0.75, 0.9, 0.95

for F in GPU_UTIL, SM_ACTIVE, PIPE_TENSOR_ACTIVE, DRAM_ACTIVE, GR_ENGINE_ACTIVE, FB_USED; per pod (grouped by
its four pod labels, so the GPUs of one pod are counted together)::

    max_over_time((count by (P) (UTIL or SM_ACTIVE))[C:S])                      GPUs held at once
    max_over_time((count by (P) (UTIL > i or SM_ACTIVE > s or GR > s))[C:S])    GPUs busy at once
    max_over_time((sum by (P) (FB_USED))[C:S])                                   the pod's memory peak

and for incidents ``max_over_time`` / ``changes`` of the Xid gauge, ``increase`` of the ECC DBE counter, and
``count_over_time`` of the steps whose clock-event mask has an abnormal bit (``floor(x / bit) % 2 == 1``).
55 range queries per node batch (53 without clock-event bits to look for) plus the 4 identity queries of raw
mode, whatever the window: the answer is series × chunks points, not series × steps. Which figures this makes
exact and which approximate is in ``report/summary.py`` and docs/report.md.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import numpy as np

from gpuscale.metrics.attribution import Target, attribute
from gpuscale.metrics.history import (
    FIELD_ALIASES,
    FIELDS,
    PodPeaks,
    PodRef,
    SeriesSummary,
    SummaryHistory,
    SummaryIncident,
    clean,
)
from gpuscale.model import format_duration
from gpuscale.sources.history_fetch import FetchOptions, Progress, identity, regex_alternatives
from gpuscale.sources.promapi import PrometheusClient

SUMMARY_FIELDS = ("gpu_util_percent", "sm_active", "tensor_active", "dram_active", "gr_engine_active", "fb_used_mib")
_STAT_QUERIES = {
    "count": "count_over_time({sel}[{c}:{s}])",
    "avg": "avg_over_time({sel}[{c}:{s}])",
    "max": "max_over_time({sel}[{c}:{s}])",
    "p25": "quantile_over_time(0.25, {sel}[{c}:{s}])",
    "p50": "quantile_over_time(0.5, {sel}[{c}:{s}])",
    "p75": "quantile_over_time(0.75, {sel}[{c}:{s}])",
    "p90": "quantile_over_time(0.9, {sel}[{c}:{s}])",
    "p95": "quantile_over_time(0.95, {sel}[{c}:{s}])",
}
_POD_LABELS = "namespace, pod, exported_namespace, exported_pod"


def _sel(name: str, batch: list[str] | None) -> str:
    return f'{name}{{Hostname=~"{regex_alternatives(batch)}"}}' if batch else name


def summary_queries(
    batch: list[str] | None,
    *,
    chunk: float,
    step: float,
    idle_busy_percent: float,
    idle_sm_active: float,
    throttle_bits: tuple[int, ...] = (),
) -> list[tuple[str, str, str]]:
    """(kind, field or stat, PromQL) for one node batch."""
    # NB: the subquery's range is half a step short of the chunk: Prometheus 2 closes range selectors on both
    # ends ([T-C, T], one sample too many per chunk), Prometheus 3 and VictoriaMetrics on the right only
    # ((T-C, T]); half a step short, every backend evaluates exactly the chunk's C/S grid steps.
    c, s = format_duration(chunk - step / 2), format_duration(step)
    # NB: changes() over one step more, so a change from the previous chunk's last sample counts here.
    c_changes = format_duration(chunk + step / 2)
    out = []
    for fld in SUMMARY_FIELDS:
        sel = _sel(FIELDS[fld], batch)
        out += [("stat", f"{fld}:{stat}", q.format(sel=sel, c=c, s=s)) for stat, q in _STAT_QUERIES.items()]
    util, sm, gr = (_sel(FIELDS[f], batch) for f in ("gpu_util_percent", "sm_active", "gr_engine_active"))
    fb = _sel(FIELDS["fb_used_mib"], batch)
    busy = f"({util} > {idle_busy_percent:g}) or ({sm} > {idle_sm_active:g}) or ({gr} > {idle_busy_percent / 100:g})"
    out += [
        ("pod", "held_max", f"max_over_time((count by ({_POD_LABELS}) ({util} or {sm}))[{c}:{s}])"),
        ("pod", "busy_max", f"max_over_time((count by ({_POD_LABELS}) ({busy}))[{c}:{s}])"),
        ("pod", "fb_max_mib", f"max_over_time((sum by ({_POD_LABELS}) ({fb}))[{c}:{s}])"),
        ("xid", "max", f"max_over_time({_sel(FIELDS['last_xid'], batch)}[{c}:{s}])"),
        ("xid", "changes", f"changes({_sel(FIELDS['last_xid'], batch)}[{c_changes}:{s}])"),
        ("ecc", "increase", f"increase({_sel(FIELDS['ecc_dbe_volatile'], batch)}[{c}])"),
    ]
    # Steps with an abnormal clock-event bit set: PromQL has no bitwise AND, but bit b of x is floor(x / b) % 2.
    for name in (FIELDS["clock_event_reasons"], *FIELD_ALIASES["clock_event_reasons"]):
        sel = _sel(name, batch)
        any_bit = " or ".join(f"(floor({sel} / {bit}) % 2 == 1)" for bit in throttle_bits)
        if any_bit:
            out.append(("throttle", name, f"count_over_time(({any_bit})[{c}:{s}])"))
    return out


async def fetch_summaries(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    chunk: float,
    options: FetchOptions,
    idle_busy_percent: float,
    idle_sm_active: float,
    throttle_bits: tuple[int, ...] = (),
    progress: bool | None = None,
) -> SummaryHistory:
    import sys

    start = float(np.floor(start / step) * step)
    chunk = max(step, float(np.floor(chunk / step) * step))
    chunks = int(np.ceil((end - start) / chunk))
    h = SummaryHistory(start=start, step_seconds=step, chunk_seconds=chunk, chunks=chunks, source=client.display_url)
    nodes = await client.label_values(
        "Hostname", match='{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_.*|DCGM_FI_DEV_FB_USED"}', start=start, end=end
    )
    batches: list[list[str] | None] = (
        [nodes[i : i + options.series_batch] for i in range(0, len(nodes), options.series_batch)] if nodes else [None]
    )
    work = [
        q
        for batch in batches
        for q in summary_queries(
            batch,
            chunk=chunk,
            step=step,
            idle_busy_percent=idle_busy_percent,
            idle_sm_active=idle_sm_active,
            throttle_bits=throttle_bits,
        )
    ]
    bar = Progress(len(work), enabled=sys.stderr.isatty() if progress is None else progress)
    decoder = _SummaryDecoder(h, re.compile(options.exporter_pod_pattern))
    semaphore = asyncio.Semaphore(options.concurrency)
    # Each point at T summarises (T - chunk, T]; the first ends one step before start + chunk, so chunk k holds
    # the grid steps start + k·chunk … start + (k+1)·chunk - step, as raw mode's grid does.
    first = start + chunk - step

    async def one(kind: str, what: str, promql: str) -> None:
        async with semaphore:
            result = await client.query_range(promql, start=first, end=first + (chunks - 1) * chunk, step=chunk)
        decoder.add(kind, what, result, first=first)
        bar.advance()

    try:
        await asyncio.gather(*(one(*q) for q in work))
        await identity(client, h, at=start + chunks * chunk, window=chunks * chunk)  # type: ignore[arg-type]
    finally:
        bar.close()
    decoder.finish()
    h.gaps += [f"partial answer: {w}" for w in client.warnings]
    h.queries = client.queries
    return h


class _SummaryDecoder:
    def __init__(self, h: SummaryHistory, exporter: re.Pattern[str]) -> None:
        self.h = h
        self._exporter = exporter
        self._series: dict[tuple[Any, ...], SeriesSummary] = {}
        self._xid: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._meta: dict[tuple[str, str], tuple[str, PodRef | None]] = {}

    def _points(self, values: list[Any], *, first: float) -> tuple[np.ndarray, np.ndarray]:
        ts = np.fromiter((float(p[0]) for p in values), dtype=np.float64, count=len(values))
        vs = clean(np.array([p[1] for p in values], dtype=np.float64)).astype(np.float64)
        idx = np.rint((ts - first) / self.h.chunk_seconds).astype(np.int64)
        ok = (idx >= 0) & (idx < self.h.chunks)
        return idx[ok], vs[ok]

    def _pod(self, labels: dict[str, str]) -> PodRef | None:
        for pod_key, ns_key in (("exported_pod", "exported_namespace"), ("pod", "namespace")):
            if labels.get(pod_key) and labels.get(ns_key):
                if self._exporter.fullmatch(labels[pod_key]):
                    return None
                return PodRef(labels[ns_key], labels[pod_key])
        return None

    def add(self, kind: str, what: str, result: list[dict[str, Any]], *, first: float) -> None:
        h = self.h
        nan = np.full(h.chunks, np.nan)
        for series in result:
            labels = series.get("metric") or {}
            idx, vs = self._points(series.get("values") or [], first=first)
            if kind == "pod":
                pod = self._pod(labels)
                if pod is None:
                    continue
                peaks = h.pods.get(pod) or h.pods.setdefault(
                    pod, PodPeaks(np.zeros(h.chunks), np.zeros(h.chunks), np.zeros(h.chunks))
                )
                arr = getattr(peaks, what)
                arr[idx] = np.nan_to_num(vs)
                continue
            device = attribute("DCGM_FI_DEV_GPU_UTIL", labels, Target(url=""))
            uuid = device.key[2] or "?"
            gpu = f"{uuid}/{labels['GPU_I_ID']}" if labels.get("GPU_I_ID") else uuid
            node = device.node or labels.get("instance", "unknown")
            pod = self._pod(labels)
            if kind == "stat":
                fld, stat = what.split(":")
                key = (gpu, pod, fld)
                s = self._series.get(key)
                if s is None:
                    s = self._series[key] = SeriesSummary(
                        gpu, node, labels.get("modelName") or None, pod, fld, {k: nan.copy() for k in _STAT_QUERIES}
                    )
                s.stats[stat][idx] = vs
            elif kind == "xid":
                d = self._xid.setdefault((gpu, node), {"max": nan.copy(), "changes": nan.copy()})
                d[what][idx] = vs
                self._meta[(gpu, node)] = (node, pod)
            elif kind == "throttle":
                for i, v in zip(idx, vs, strict=True):
                    if v >= 1:
                        h.incidents.append(SummaryIncident("throttle", node, gpu, pod, int(i), float(v), int(v)))
            elif kind == "ecc":
                for i, v in zip(idx, vs, strict=True):
                    if v >= 0.5:
                        h.incidents.append(SummaryIncident("ecc-dbe", node, gpu, pod, int(i), float(round(v)), 1))

    def finish(self) -> None:
        h = self.h
        h.series = list(self._series.values())
        for (gpu, node), d in self._xid.items():
            _, pod = self._meta[(gpu, node)]
            for i in np.flatnonzero((d["max"] > 0) & (d["changes"] > 0)):
                h.incidents.append(
                    SummaryIncident("xid", node, gpu, pod, int(i), float(d["max"][i]), int(d["changes"][i]))
                )
        if not h.series:
            h.gaps.append("no DCGM series in the window: is dcgm-exporter scraped by this server?")
        missing = sorted({FIELDS[f] for f in SUMMARY_FIELDS} - {FIELDS[s.field] for s in h.series})
        if h.series and missing:
            h.gaps.append(f"not reported by any GPU: {', '.join(missing)}")
