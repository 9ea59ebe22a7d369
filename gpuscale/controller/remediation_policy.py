"""``policies/remediation.yaml``: what the health planner does about each kind of GPU problem.

Validated like every policy file (``config.validate``): an error names the file, the field path and the reason.
Which Xid is fatal stays in ``health.yaml`` (the Xid table); this file maps findings to actions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.config import Seconds, read_yaml, validate
from gpuscale.policy_files import REMEDIATION_FILE, policy_file

__all__ = ["RemediationPolicy", "SignalRule", "load_remediation_policy"]

Action = Literal["remediate", "warn", "ignore"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SignalRule(_Section):
    action: Action
    sustained: Seconds = Field(300.0, ge=0, description="for conditions that must last (hw_slowdown)")
    above: float = Field(0.0, ge=0, description="for counter increases (pcie_replay)")


class Signals(_Section):
    xid_fatal: SignalRule
    xid_application: SignalRule
    ecc_dbe: SignalRule
    row_remap_failure: SignalRule
    gpu_vanished: SignalRule
    hw_slowdown: SignalRule
    pcie_replay: SignalRule


class TaintRule(_Section):
    key: str = Field(min_length=1)
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = "NoSchedule"


class BreakerRule(_Section):
    max_pool_share: float = Field(0.2, gt=0, le=1)
    max_cluster_share: float = Field(0.2, gt=0, le=1)
    min_nodes: int = Field(1, ge=0)
    window: Seconds = Field(3600.0, gt=0)


class OptOut(_Section):
    label: str = "gpuscale.io/remediation"
    value: str = "disabled"
    defer_to_nvsentinel: bool = False
    nvsentinel_label: str = "k8saas.nvidia.com/ManagedByNVSentinel"


class RecoveryRule(_Section):
    healthy_for: Seconds = Field(120.0, ge=0, description="a node's GPUs must stay clean this long before undo")


class RemediationPolicy(_Section):
    version: Literal[1]
    signals: Signals
    window: Seconds = Field(600.0, gt=0)
    condition_type: str = Field("GpuHealthy", min_length=1)
    owns_accelerated_hardware_ready: bool = False
    taint: TaintRule
    breaker: BreakerRule = BreakerRule()
    recovery: RecoveryRule = RecoveryRule()
    opt_out: OptOut = OptOut()
    pool_labels: tuple[str, ...] = Field(min_length=1)


def load_remediation_policy(path_dir: str | Path | None = None) -> RemediationPolicy:
    """``remediation.yaml`` from ``path_dir`` when it holds one, else the shipped file; ConfigError if invalid."""
    path = policy_file(REMEDIATION_FILE, path_dir)
    return validate(RemediationPolicy, read_yaml(path), path)
