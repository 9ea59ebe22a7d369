"""What is wrong with a reporting node's GPUs: its telemetry and the remediation policy → ``Problem``s, each
either remediated (taint, cordon, drain: ``health.HealthPlanner``) or only warned about. Pure.

The Xid and memory-error findings come from the diagnosis (``health_findings``); the remediation policy decides,
per kind of problem, what is done about it (``remediate``, ``warn`` or ``ignore``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpuscale.controller.pools import GPU_COUNT_LABEL
from gpuscale.controller.remediation_policy import RemediationPolicy
from gpuscale.controller.telemetry import NodeGpuTelemetry
from gpuscale.metrics.diagnosis import DiagnosisPolicy, FindingCode, Severity, health_findings

__all__ = ["Problem", "node_problems"]

# The order problems are named in a condition's reason (the first) and message.
_REASON_ORDER = ("XidFatal", "EccDbe", "RowRemapFailure", "GpuVanished", "HwSlowdown", "PcieReplay", "XidApplication")


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with one GPU. ``text`` is stable while the problem lasts (no counts that move), so a
    recorded message changes only when the set of problems does."""

    reason: str
    gpu: str
    text: str
    action: Literal["remediate", "warn"]


def node_problems(
    node: NodeGpuTelemetry,
    *,
    labels: Mapping[str, str],
    policy: RemediationPolicy,
    diagnosis: DiagnosisPolicy,
) -> list[Problem]:
    """Every problem the telemetry of one reporting node shows, in reason order, then by GPU."""
    signals = policy.signals
    health = diagnosis.health
    out: list[Problem] = []

    def add(reason: str, gpu: str, text: str, action: str) -> None:
        if action != "ignore":
            out.append(Problem(reason, gpu, text, action))  # type: ignore[arg-type]

    for gpu in node.gpus.values():
        s = gpu.signals
        for finding in health_findings(s, diagnosis):
            if finding.xid is None:
                continue
            info = health.xid_info(finding.xid)
            text = f"GPU {gpu.gpu}: Xid {finding.xid} ({info.meaning}), action {info.action}"
            if finding.code == FindingCode.UNHEALTHY:
                add("XidFatal", gpu.gpu, text, signals.xid_fatal.action)
            elif finding.severity != Severity.INFO:
                add("XidApplication", gpu.gpu, text, signals.xid_application.action)
        ecc_now = s.ecc_dbe_volatile is not None and s.ecc_dbe_volatile > health.ecc_dbe_volatile.above
        if ecc_now or (gpu.ecc_dbe_increase or 0) > 0:
            add("EccDbe", gpu.gpu, f"GPU {gpu.gpu}: volatile double-bit ECC errors", signals.ecc_dbe.action)
        if s.row_remap_failure is not None and s.row_remap_failure > health.row_remap_failure.above:
            add("RowRemapFailure", gpu.gpu, f"GPU {gpu.gpu}: row-remap failure", signals.row_remap_failure.action)
        if signals.hw_slowdown.action != "ignore" and gpu.slowdown_seconds >= max(signals.hw_slowdown.sustained, 1e-9):
            text = f"GPU {gpu.gpu}: hardware slowdown for over {signals.hw_slowdown.sustained:g}s"
            add("HwSlowdown", gpu.gpu, text, signals.hw_slowdown.action)
        if gpu.pcie_replay_increase is not None and gpu.pcie_replay_increase > signals.pcie_replay.above:
            add("PcieReplay", gpu.gpu, f"GPU {gpu.gpu}: PCIe replay counter growing", signals.pcie_replay.action)
    for gpu in node.vanished:
        add("GpuVanished", gpu, f"GPU {gpu}: no longer reported by its exporter", signals.gpu_vanished.action)
    expected = labels.get(GPU_COUNT_LABEL, "")
    physical = {g.split("/", 1)[0] for g in node.gpus} | {g.split("/", 1)[0] for g in node.vanished}
    if expected.isdigit() and len(physical) < int(expected):
        text = f"exporter reports {len(physical)} of the node's {expected} GPUs"
        add("GpuVanished", "-", text, signals.gpu_vanished.action)
    order = {r: i for i, r in enumerate(_REASON_ORDER)}
    return sorted(out, key=lambda p: (order.get(p.reason, len(order)), p.gpu, p.text))
