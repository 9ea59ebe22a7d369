"""The answers of ``--mode summary``'s queries (sources/summary_fetch.py), placed on a SummaryHistory."""

from __future__ import annotations

import math
import re
from collections import defaultdict
from typing import Any

import numpy as np

from gpuscale.metrics.attribution import Target, attribute
from gpuscale.metrics.history import (
    FIELDS,
    OwnerSteps,
    PodRef,
    SeriesSummary,
    SummaryHistory,
    SummaryIncident,
    clean,
    in_cluster,
)
from gpuscale.sources.history_fetch import matrix_points, matrix_series

SUMMARY_FIELDS = ("gpu_util_percent", "sm_active", "tensor_active", "dram_active", "gr_engine_active", "fb_used_mib")
ACTIVITY_FIELDS = ("sm_active", "gr_engine_active", "gpu_util_percent")  # the activity's sources, in its order


class SummaryDecoder:
    """Places summary mode's answers (sources/summary_fetch.py) on a SummaryHistory: per series and chunk, per owner
    and step or block, incidents."""

    def __init__(self, h: SummaryHistory, exporter: re.Pattern[str]) -> None:
        self.h = h
        self._exporter = exporter
        self._series: dict[tuple[Any, ...], SeriesSummary] = {}
        self._xid: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._meta: dict[tuple[str, str], PodRef | None] = {}
        self._throttle: dict[tuple[str, str], tuple[PodRef | None, list[float]]] = {}
        # NB: each quantile answer goes straight into its series' array (levels × chunks), rows added for the levels
        # a query first answers; the series asked the same levels share one tuple of them and one map level → row. A
        # dict of one-chunk arrays per level and series took 9 KB a GPU, flat records sorted at the end ~4 KB at their
        # peak. The maps are keyed by the tuple's id (hashing 45 floats per answer cost 0.3 ms a GPU), kept here.
        self._levels: dict[tuple[float, ...], tuple[float, ...]] = {(): ()}  # each set of levels → its one tuple
        self._rows: dict[int, dict[float, int]] = {id(()): {}}  # id(levels) → level → row
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
        return s

    def _place(self, s: SeriesSummary, answers: list[tuple[float, np.ndarray, np.ndarray]]) -> None:
        """One query's answers (level, chunks, values) for ``s``, in arrival order (the last answer wins); the levels
        first answered add their rows at once (in level order, NaN elsewhere): one growth per query, not per level."""
        rows = self._rows[id(s.levels)]
        new = {q for q, _, _ in answers if q not in rows}
        if new:
            levels = tuple(sorted({*s.levels, *new}))
            grown = self._levels.setdefault(levels, levels)
            rows = self._rows.setdefault(id(grown), {level: i for i, level in enumerate(grown)})
            quantiles = np.full((len(grown), self.h.chunks), np.nan)
            if s.levels:
                quantiles[[rows[q] for q in s.levels]] = s.quantiles
            s.levels, s.quantiles = grown, quantiles
        for q, idx, vs in answers:
            s.quantiles[rows[q], idx] = vs  # type: ignore[index]

    def add(self, kind: str, what: str, result: list[dict[str, Any]], *, first: float, every: float) -> None:
        h = self.h
        answered: dict[int, tuple[SeriesSummary, list[tuple[float, np.ndarray, np.ndarray]]]] = {}  # id → answers
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
                idx, vs = idx[inside], vs[inside]
                if math.isnan(q) or not idx.size:
                    continue
                answered.setdefault(id(s), (s, []))[1].append((q, idx, vs))
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
        for s, answers in answered.values():
            self._place(s, answers)

    def _owner(self, kind: str, what: str, labels: dict[str, str], idx: np.ndarray, vs: np.ndarray) -> None:
        """A per-owner answer (owner_kind, owner_name) into h.owner_steps, a per-pod one (the steps its pod had no
        kube_pod_owner) into h.pod_steps; the rest (no pod: unallocated GPUs, the exporter's own) is no workload's."""
        h = self.h
        ns = in_cluster(labels.get("namespace", ""), labels)
        table: dict[Any, OwnerSteps]
        if labels.get("owner_name"):
            key: Any = (ns, labels.get("owner_kind", ""), labels["owner_name"])
            table = h.owner_steps
        elif labels.get("gpuscale_pod"):
            key = PodRef(ns, labels["gpuscale_pod"])
            table = h.pod_steps
        else:
            return
        if not ns:
            return
        o = table.get(key)
        if o is None:
            steps = h.steps
            o = table[key] = OwnerSteps(np.zeros(steps), np.zeros(steps), np.zeros(steps), np.zeros(steps))
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
            if s.quantiles is None:
                s.quantiles = np.empty((0, h.chunks))
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
        if any(s.pod for s in h.series) and not h.owner_steps and not h.pod_steps:
            h.gaps.append("no pod's GPU series answered per step: no replica counts, idle stretches or verdicts")
