"""The ``-o json`` / ``-o yaml`` document of ``gpuscale top`` (docs/top.md documents every field): what every
collector answers with and every formatter reads."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.metrics.devices import GpuStatus, Timestamp
from gpuscale.metrics.rollups import NodeStatus, PodStatus

__all__ = ["VIEWS", "GpuTopList", "Item", "Scope", "SourceStatus", "View", "WorkloadStatus"]

View = Literal["gpus", "pods", "nodes", "workloads"]
VIEWS: tuple[View, ...] = ("gpus", "pods", "nodes", "workloads")


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceStatus(_Doc):
    """One target top read from (an exporter URL, a Prometheus server, the adapter API)."""

    target: str
    healthy: bool
    error: str | None = None
    last_success: Timestamp | None = None
    series: int = 0


class Scope(_Doc):
    """What was asked for: ``namespace`` None = every namespace (or a cluster-scoped view)."""

    namespace: str | None = None
    all_namespaces: bool = False
    selector: str | None = None


class WorkloadStatus(_Doc):
    """A Deployment or StatefulSet: its request rate now and forecast one start-up ahead, as the adapter serves
    them (docs/forecast.md). None = not served (yet): a forecast needs 10 minutes of history."""

    namespace: str
    kind: str  # Deployment | StatefulSet
    name: str
    requests_per_second: float | None = None  # now: the last 15 s step (workload_requests_per_second)
    forecast_requests_per_second: float | None = None  # mean, at the horizon
    forecast_p90_requests_per_second: float | None = None
    horizon_seconds: float | None = None  # the start-up the forecast looks ahead by
    forecast_replicas: float | None = None  # p90 ÷ capacity per replica (needs the capacity annotation)
    forecast_model: str | None = None  # the model making the forecast: the configured one, or naive (issue 38)


class GpuTopList(_Doc):
    """The ``-o json`` / ``-o yaml`` document (docs/top.md documents every field). ``version`` changes only
    when a field changes meaning or disappears; new fields may be added within a version."""

    kind: Literal["GpuTopList"] = "GpuTopList"
    version: Literal[1] = 1
    view: View
    generated_at: Timestamp
    scope: Scope = Field(default_factory=Scope)
    sources: list[SourceStatus] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    items: list[GpuStatus] | list[PodStatus] | list[NodeStatus] | list[WorkloadStatus] = Field(default_factory=list)


Item = GpuStatus | PodStatus | NodeStatus | WorkloadStatus
