"""The columns of each view's table (``-o wide`` adds some): what each cell shows and how a long one is cut."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuscale.metrics.devices import GpuStatus
from gpuscale.metrics.diagnosis import DiagnosisPolicy, Verdict
from gpuscale.metrics.rollups import NodeStatus, PodStatus
from gpuscale.top.cells import (
    NONE,
    SEVERITY_STYLES,
    celsius,
    findings,
    mem_share,
    mib,
    number,
    pct,
    ratio_pct,
    seconds,
    throttle,
    verdict_counts,
    watts,
    xids,
)
from gpuscale.top.document import Scope, View, WorkloadStatus
from gpuscale.top.table import Column

__all__ = ["RenderOptions", "columns"]


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to render: ``width`` None = unlimited; ``headers`` False drops the header row, legend and notes."""

    policy: DiagnosisPolicy
    scope: Scope = field(default_factory=Scope)
    width: int | None = 120
    headers: bool = True
    wide: bool = False


def _verdict_style(v: Verdict) -> str | None:
    return SEVERITY_STYLES[v.severity]


def _activity_columns(o: RenderOptions) -> list[Column[Any]]:
    """SM, occupancy (wide), tensor, DRAM and memory: the deep signals every view shows the same way."""
    cols: list[Column[Any]] = [Column("SM", lambda x: ratio_pct(x.signals.sm_active), right=True)]
    if o.wide:
        cols.append(Column("OCC", lambda x: ratio_pct(x.signals.sm_occupancy), right=True))
    return [
        *cols,
        Column("TENSOR", lambda x: ratio_pct(x.signals.tensor_active), right=True),
        Column("DRAM", lambda x: ratio_pct(x.signals.dram_active), right=True),
        Column("MEM", lambda x: mib(x.signals.fb_used_mib), right=True),
    ]


def _device_columns(o: RenderOptions) -> list[Column[Any]]:
    """Memory share (wide), power and temperature: what the gpus and nodes views show after the activities."""
    cols: list[Column[Any]] = [Column("MEM%", lambda x: mem_share(x.signals), right=True)] if o.wide else []
    return [
        *cols,
        Column("POWER", lambda x: watts(x.signals.power_watts), right=True),
        Column("TEMP", lambda x: celsius(x.signals.gpu_temp_c), right=True),
    ]


def _gpu_columns(o: RenderOptions) -> list[Column[GpuStatus]]:
    def pod(g: GpuStatus) -> str:
        if g.pod is None:
            return NONE
        return g.pod if o.scope.namespace and not o.scope.all_namespaces else f"{g.namespace}/{g.pod}"

    cols: list[Column[GpuStatus]] = [
        Column("NODE", lambda g: g.node or NONE, cut="host", min_width=14, shrink_first=True, keep=True),
        Column("GPU", lambda g: g.device_id, keep=True),
    ]
    if o.wide:
        cols += [
            Column("MODEL", lambda g: g.model or NONE, cut="end"),
            Column("PROFILE", lambda g: g.mig_profile or NONE),
        ]
    cols += [
        Column("POD", pod, cut="middle", min_width=18, keep=True),
        Column("UTIL", lambda g: pct(g.signals.gpu_util_percent), right=True),
    ]
    if o.wide:
        cols.append(Column("GR", lambda g: ratio_pct(g.signals.gr_engine_active), right=True))
    cols += _activity_columns(o)
    cols += _device_columns(o)
    if o.wide:
        cols += [
            Column("CLOCK", lambda g: number(g.signals.sm_clock_mhz), right=True),
            Column("THROTTLE", lambda g: throttle(g.clock_events, o.policy)),
            Column("XID", lambda g: xids(g.signals)),
        ]
    cols.append(Column("VERDICT", lambda g: g.verdict.code.value, keep=True, style=lambda g: _verdict_style(g.verdict)))
    if o.wide:
        cols += [
            Column("SEVERITY", lambda g: g.verdict.severity.value),
            Column("FINDINGS", lambda g: findings(g.verdict)),
            Column("UUID", lambda g: g.uuid or NONE),
        ]
    return cols


def _inference(p: PodStatus, name: str, digits: int) -> str:
    return number(getattr(p.inference, name) if p.inference else None, digits)


def _serves_llm(pods: Sequence[PodStatus]) -> bool:
    """Whether any pod reports an LLM server's own signals (then the serving columns are shown)."""
    return any(p.inference is not None and p.inference.serves_llm for p in pods)


def _serving_columns() -> list[Column[PodStatus]]:
    return [
        Column("BATCH", lambda p: _inference(p, "batch_size", 0), right=True),
        Column("KV", lambda p: pct(p.inference.kv_cache_usage if p.inference else None), right=True),
        Column("TTFT95", lambda p: seconds(p.inference.ttft_p95_seconds if p.inference else None), right=True),
    ]


def _pod_columns(o: RenderOptions, *, serving: bool = False) -> list[Column[PodStatus]]:
    cols: list[Column[PodStatus]] = []
    if o.scope.namespace is None or o.scope.all_namespaces:
        cols.append(Column("NAMESPACE", lambda p: p.namespace, keep=True))
    cols += [
        Column("POD", lambda p: p.name, cut="middle", min_width=18, keep=True),
        Column("GPUS", lambda p: number(p.gpus), right=True),
    ]
    if o.wide:
        cols.append(Column("NODE", lambda p: p.node or NONE, cut="host", min_width=14, shrink_first=True))
    cols.append(Column("UTIL", lambda p: pct(p.signals.gpu_util_percent), right=True))
    cols += _activity_columns(o)
    cols.append(Column("POWER", lambda p: watts(p.signals.power_watts), right=True))
    if o.wide:
        cols += [
            Column("TEMP", lambda p: celsius(p.signals.gpu_temp_c), right=True),
            Column("THROTTLE", lambda p: throttle(p.clock_events, o.policy)),
            Column("XID", lambda p: xids(p.signals)),
            Column("RPS", lambda p: _inference(p, "requests_per_second", 1), right=True),
        ]
    cols.append(Column("QUEUE", lambda p: _inference(p, "queue_depth", 0), right=True))
    if serving:
        cols += _serving_columns()
    cols += [
        Column("Q:C", lambda p: _inference(p, "queue_compute_ratio", 2), right=True),
        Column("VERDICT", lambda p: p.verdict.code.value, keep=True, style=lambda p: _verdict_style(p.verdict)),
    ]
    if serving:
        cols.append(
            Column(
                "SERVING",
                lambda p: p.serving.code.value if p.serving else NONE,
                keep=True,
                style=lambda p: SEVERITY_STYLES[p.serving.severity] if p.serving else None,
            )
        )
    if o.wide:
        cols += [
            Column("SEVERITY", lambda p: p.verdict.severity.value),
            Column("FINDINGS", lambda p: findings(p.verdict)),
        ]
    return cols


def _node_columns(o: RenderOptions) -> list[Column[NodeStatus]]:
    cols: list[Column[NodeStatus]] = [
        Column("NODE", lambda n: n.name, cut="host", min_width=14, keep=True),
        Column("GPUS", lambda n: number(n.gpus), right=True),
    ]
    if o.wide:
        cols.append(Column("DEVICES", lambda n: number(n.devices), right=True))
    cols += [
        Column("PODS", lambda n: number(n.pods), right=True),
        Column("UTIL", lambda n: pct(n.signals.gpu_util_percent), right=True),
    ]
    cols += _activity_columns(o)
    cols += _device_columns(o)
    if o.wide:
        cols.append(Column("THROTTLE", lambda n: throttle(n.clock_events, o.policy)))
    cols.append(
        Column(
            "VERDICTS",
            verdict_counts,
            keep=True,
            style=lambda n: SEVERITY_STYLES[n.worst.severity] if n.worst else None,
        )
    )
    if o.wide:
        cols.append(Column("WORST", lambda n: f"{n.worst.gpu}:{n.worst.code.value}" if n.worst else NONE))
    return cols


def _workload_columns() -> list[Column[WorkloadStatus]]:
    return [
        Column("NAMESPACE", lambda w: w.namespace, keep=True),
        Column("WORKLOAD", lambda w: f"{w.kind.lower()}/{w.name}", cut="middle", min_width=16, keep=True),
        Column("REQ/S NOW", lambda w: number(w.requests_per_second, 2), right=True),
        Column("FORECAST", lambda w: number(w.forecast_requests_per_second, 2), right=True),
        Column("P90", lambda w: number(w.forecast_p90_requests_per_second, 2), right=True),
        Column("AHEAD", lambda w: NONE if w.horizon_seconds is None else f"{w.horizon_seconds:.0f}s", right=True),
        Column("REPLICAS", lambda w: number(w.forecast_replicas, 1), right=True),
        Column("MODEL", lambda w: w.forecast_model or NONE),
    ]


def columns(view: View, options: RenderOptions, items: Sequence[Any] = ()) -> list[Column[Any]]:
    if view == "gpus":
        return _gpu_columns(options)
    if view == "pods":
        return _pod_columns(options, serving=_serves_llm(items))
    if view == "workloads":
        return _workload_columns()
    return _node_columns(options)
