"""The report as data: one pydantic model, the JSON schema of ``gpuscale report -o json`` (versioned).

``SCHEMA`` names the version; a change that removes or renames a field bumps it, an added field does not.
``gpuscale report --print-schema`` prints the JSON Schema generated from these models (docs/report.md).

Units are in the field names: ``*_hours`` GPU-hours, ``*_cost`` in ``currency`` (None when the product has no
price: GPU-hours are still shown, a cost is never made up), ``*_percent`` 0–100, ``*_mib`` MiB, ``*_seconds``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

SCHEMA = "gpuscale.io/report/v2"

Severity = Literal["ok", "info", "warning", "critical"]


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SignalStats(_Out):
    """One signal over a workload's samples: the exact quantiles and maximum, and beside them the recency-weighted
    trend (VPA's decaying histogram: recent hours count more) with the estimate built on it (the same unit)."""

    unit: Literal["percent", "mib", "gpus"]
    p50: float | None = Field(description="exact over the samples (raw); the TSDB's over raw samples (summary)")
    p95: float | None = Field(description="as p50; pooled over series or chunks in summary mode: a bound from above")
    p99: float | None = Field(description="as p95")
    max: float
    samples: int
    trend_p50: float = Field(description="recency-weighted (half-life), to a histogram bucket: a trend, not a fact")
    trend_p90: float
    trend_p95: float
    target: float = Field(description="the trend's target percentile + margin (VPA's estimate)")
    lower_bound: float
    upper_bound: float


class Recommendation(_Out):
    kind: Literal[
        "fewer-gpus",
        "smaller-gpu",
        "mig-profile",
        "time-slicing",
        "replicas",
        "scale-to-zero",
        "diagnosis",
        "keep",
        "not-enough-data",
    ]
    severity: Severity
    short: str = Field(description="a few words for a table cell: 'fewer-gpus 4→1', 'mig 1g.10gb'")
    summary: str
    evidence: dict[str, float | int | str | None] = Field(
        default_factory=dict, description="the numbers the recommendation rests on"
    )
    monthly_saving: float | None = Field(None, description="cost of what it frees over 30 days at this usage")
    role: Literal["recommended", "alternative", "note"] = Field(
        "note",
        description="the one action recommended for the workload, an alternative to it, or a note (a diagnosis)",
    )


class VerdictShare(_Out):
    code: str
    share: float = Field(description="share of the workload's hours (0-1) whose mean signals gave this verdict")
    hours: int
    example: str = Field(description="the diagnosis' explanation for one such hour")


class CostFigures(_Out):
    gpus: int = Field(description="distinct GPUs seen")
    allocated_hours: float = Field(description="GPU-hours a pod held the GPU (samples present)")
    active_hours: float = Field(description="allocated GPU-hours weighted by activity (SM, else GR engine, else util)")
    idle_hours: float = Field(description="allocated minus active")
    unallocated_hours: float = Field(0.0, description="GPU-hours no pod held the GPU")
    allocated_cost: float | None = None
    idle_cost: float | None = None
    unallocated_cost: float | None = None
    unpriced_hours: float = Field(0.0, description="allocated GPU-hours on products without a price")


class Workload(_Out):
    namespace: str
    kind: str
    name: str
    owner_source: str = Field(description="kube-state-metrics, kubernetes, or none (a pod whose owner is unknown)")
    pods: int
    product: str | None
    pools: list[str]
    gpus_requested_per_pod: float | None
    requests_source: Literal["kube-state-metrics", "observed"]
    history_seconds: float
    samples: int = Field(description="grid steps in which the workload held at least one GPU")
    coverage: float = Field(
        1.0,
        description="of the steps from its first to its last sample, the share with a real sample (0-1): gaps "
        "count as neither allocated nor idle",
    )
    confidence: float
    status: Literal["ok", "not-enough-data"]
    busy: bool
    activity_signal: str = Field(description="which DCGM field the activity comes from")
    signals: dict[str, SignalStats]
    activity_histogram: list[float] = Field(
        description="share of GPU-time (recency-weighted, as the percentiles) per 10 % activity band, 0-10 … 90-100"
    )
    cost: CostFigures
    longest_idle_seconds: float
    verdicts: list[VerdictShare]
    recommendations: list[Recommendation] = Field(
        description="the recommended action first, then its alternatives (largest saving first), then notes"
    )
    rule: str = Field("", description="why the first recommendation is the one recommended")


class Group(_Out):
    name: str
    cost: CostFigures


class IdleNode(_Out):
    node: str
    pool: str
    gpus: int
    allocated_share: float
    active_share: float
    idle_hours: float
    idle_cost: float | None


class Incident(_Out):
    kind: Literal["xid", "ecc-dbe", "throttle"]
    node: str
    gpu: str
    pod: str | None
    first_seen: float
    last_seen: float
    count: int
    value: str
    meaning: str


class TimelinePoint(_Out):
    t: float
    allocated_gpus: float
    active_gpus: float


class Window(_Out):
    start: float
    end: float
    step_seconds: float


class OutOfRange(_Out):
    """Values of one DCGM field outside what it can physically hold: not counted anywhere (docs/report.md)."""

    field: str = Field(description="the history field: gpu_util_percent, sm_active, fb_used_mib, …")
    count: int = Field(description="values taken out of every figure")
    low: float = Field(description="the field's physical range, lowest")
    high: float = Field(description="the field's physical range, highest")
    unit: str
    lowest_seen: float = Field(description="the lowest of the values taken out")
    highest_seen: float = Field(description="the highest of the values taken out")


class Report(_Out):
    schema_: str = Field(SCHEMA, alias="schema")
    generated_at: float
    source: str
    mode: Literal["raw", "summary"]
    exact: list[str] = Field(description="figures that are exact in this mode")
    approximate: list[str] = Field(description="figures that are approximate in this mode, and how")
    window: Window
    currency: str
    gaps: list[str]
    out_of_range: list[OutOfRange] = Field(
        default_factory=list, description="values outside their field's physical range, kept out of every figure"
    )
    workloads: list[Workload]
    pools: list[Group]
    namespaces: list[Group]
    total: CostFigures
    idle_nodes: list[IdleNode]
    incidents: list[Incident]
    timeline: list[TimelinePoint]

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
