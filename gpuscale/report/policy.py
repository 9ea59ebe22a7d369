"""The report's policies: ``rightsizing.yaml`` (thresholds, VPA constants) and ``gpus.yaml`` (products, MIG).

Both validated at load (ConfigError names the file, the field and the reason); each comes from ``--policies
DIR`` when it holds the file, else the shipped copy. ``ReportPolicy`` bundles them with the diagnosis policy
and the price table, so the report core takes one argument for "every number that is a choice".
"""

from __future__ import annotations

import re
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.config import Regex, Seconds, read_yaml, validate
from gpuscale.metrics.diagnosis import DiagnosisPolicy, load_policy
from gpuscale.policy_files import GPUS_FILE, RIGHTSIZING_FILE, policy_file
from gpuscale.pricing import PriceTable, load_prices

Ratio = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ScaleToZero(_Section):
    kinds: tuple[str, ...] = ("Deployment", "StatefulSet")
    min_idle_stretch: Seconds = Field(gt=0)
    scale_down_after: Seconds = Field(600.0, gt=0)
    """How long the autoscaler waits idle before it scales to zero (KEDA's cooldownPeriod, an HPA's window)."""
    cold_start: Seconds = Field(45.0, gt=0)
    """What one wake-up costs the first request: pod start → ready with the model loaded (p95)."""
    latency_budget_per_day: Seconds = Field(300.0, ge=0)
    """Cold-start waiting the service may add per day; more wake-ups than that keep one replica warm."""


class Replicas(_Section):
    """Replica counts for pooled workloads: how many pods carry the workload's summed GPU demand."""

    kinds: tuple[str, ...] = ("Deployment", "StatefulSet", "LeaderWorkerSet")
    target_utilisation: float = Field(0.6, gt=0, le=1)
    min_pods: int = Field(3, ge=2)


class IdleNodeRule(_Section):
    min_allocated_share: Ratio
    max_active_share: Ratio


class Rightsizing(_Section):
    version: Literal[1]
    half_life: Seconds = Field(gt=0)
    target_percentile: Ratio
    lower_bound_percentile: Ratio
    upper_bound_percentile: Ratio
    margin_fraction: float = Field(ge=0, le=10)
    min_history: Seconds
    min_samples: int = Field(ge=1)
    busy_share: Ratio
    safety_percentile: Ratio = 0.99
    """The activity quantile (exact, unweighted) every downsizing must leave room for, with ``margin_fraction``."""
    time_slicing_min_pods: int = Field(ge=2)
    scale_to_zero: ScaleToZero
    replicas: Replicas = Field(default_factory=Replicas)
    idle_node: IdleNodeRule
    throttle_incident_min: Seconds
    fewer_gpus_critical_share: Ratio


class MigProfile(_Section):
    profile: str = Field(min_length=1)
    slices: int = Field(ge=1)
    of: int = Field(7, ge=1)
    memory_mib: float = Field(gt=0)

    @property
    def compute_share(self) -> float:
        return self.slices / self.of


class Product(_Section):
    name: str = Field(min_length=1)
    match: Regex
    memory_mib: float = Field(gt=0)
    tflops: float = Field(gt=0)
    mig: tuple[MigProfile, ...] = ()


class GpuTable(_Section):
    version: Literal[1]
    products: tuple[Product, ...]

    @cached_property
    def _compiled(self) -> tuple[tuple[re.Pattern[str], Product], ...]:
        return tuple((re.compile(p.match, re.IGNORECASE), p) for p in self.products)

    def product(self, label: str | None) -> Product | None:
        """The table's entry for a ``modelName`` / ``nvidia.com/gpu.product`` label, or None when unknown."""
        if not label:
            return None
        for pattern, product in self._compiled:
            if pattern.fullmatch(label):
                return product
        return None


class ReportPolicy(BaseModel):
    model_config = ConfigDict(frozen=True)

    rightsizing: Rightsizing
    gpus: GpuTable
    diagnosis: DiagnosisPolicy
    prices: PriceTable


def load_report_policy(path_dir: str | Path | None = None) -> ReportPolicy:
    rightsizing_path, gpus_path = policy_file(RIGHTSIZING_FILE, path_dir), policy_file(GPUS_FILE, path_dir)
    return ReportPolicy(
        rightsizing=validate(Rightsizing, read_yaml(rightsizing_path), rightsizing_path),
        gpus=validate(GpuTable, read_yaml(gpus_path), gpus_path),
        diagnosis=load_policy(path_dir),
        prices=load_prices(path_dir),
    )
