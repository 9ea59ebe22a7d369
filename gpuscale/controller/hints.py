"""Autoscaler hints from GPU telemetry (policies/hints.yaml). A planner (pure).

- Protect: ``cluster-autoscaler.kubernetes.io/scale-down-disabled=true`` — or ``karpenter.sh/do-not-disrupt=true``
  on Karpenter nodes (labelled ``karpenter.sh/nodepool``) — on nodes running an active multi-GPU gang or warm
  inference with recent traffic; removed when they go idle.
- Idle: GPUs a pod requests but leaves idle for the idle window are recorded on the node (an annotation listing
  the pods, and an Event when the list changes), counted on /metrics (``idle_gpus``), and where allowed the pod
  is annotated ``cluster-autoscaler.kubernetes.io/safe-to-evict=true``, so the autoscaler's request-based
  scale-down can take the node.

Every annotation this planner sets goes with a marker (``gpuscale.io/<what>-by``); it only ever removes an
annotation carrying its marker, so a person's ``scale-down-disabled`` or ``safe-to-evict`` is never touched.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuscale.config import Seconds, read_yaml, validate
from gpuscale.controller.drain import gang_of
from gpuscale.controller.telemetry import ClusterTelemetry, NodeGpuTelemetry
from gpuscale.controller.writes import ClusterView, Emit, ObjectKey, Patch, Write
from gpuscale.errors import SelectorError
from gpuscale.policy_files import HINTS_FILE, policy_file
from gpuscale.selectors import LabelSelector
from gpuscale.settings import HintActions  # NB: the settings group, handed whole by cli/controller.py

__all__ = ["HintActions", "HintsPlanner", "HintsPolicy", "idle_gpus", "load_hints_policy"]

SCALE_DOWN_DISABLED = "cluster-autoscaler.kubernetes.io/scale-down-disabled"
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
KARPENTER_POOL = "karpenter.sh/nodepool"
IDLE_PODS = "gpuscale.io/idle-gpu-pods"
# NB: the pods discovery scrapes as inference servers (sources/exporter_discovery.py): the selector's, or annotated so —
# how vLLM, SGLang, TGI and NIM pods are usually marked, since the default selector names Triton.
SCRAPE_ANNOTATION = "gpuscale.io/scrape"
UNDER_REMEDIATION = "gpuscale.io/tainted-by"  # the health planner's mark: the autoscaler should replace the node
_MARKER = {
    SCALE_DOWN_DISABLED: "gpuscale.io/scale-down-disabled-by",
    DO_NOT_DISRUPT: "gpuscale.io/do-not-disrupt-by",
    SAFE_TO_EVICT: "gpuscale.io/safe-to-evict-by",
}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class IdleRule(_Section):
    below: float = Field(0.05, ge=0, le=1)
    for_seconds: Seconds = Field(3600.0, gt=0, alias="for")
    never_evict_namespaces: tuple[str, ...] = ("kube-system",)


class ProtectRule(_Section):
    gang_min_gpus: int = Field(2, ge=1)
    active_within: Seconds = Field(600.0, gt=0)
    inference_selector: str = "gpuscale.io/scrape=triton"
    gang_keys: tuple[str, ...] = Field(min_length=1)


class HintsPolicy(_Section):
    version: Literal[1]
    idle: IdleRule
    protect: ProtectRule


def load_hints_policy(path_dir: str | Path | None = None) -> HintsPolicy:
    path = policy_file(HINTS_FILE, path_dir)
    policy = validate(HintsPolicy, read_yaml(path), path)
    try:
        LabelSelector.parse(policy.protect.inference_selector)
    except SelectorError as e:
        from gpuscale.errors import ConfigError

        raise ConfigError(f"protect.inference_selector: {e}", path=str(path)) from e
    return policy


def idle_gpus(telemetry: ClusterTelemetry, *, idle_for: float) -> dict[str, int]:
    """node → GPUs held by a pod and idle for at least ``idle_for`` seconds (nodes with none left out)."""
    out: dict[str, int] = {}
    for name, node in telemetry.nodes.items():
        count = sum(1 for g in node.gpus.values() if g.pod is not None and g.idle_seconds >= idle_for)
        if count:
            out[name] = count
    return out


def _serves_inference(pod: Mapping[str, Any], selector: LabelSelector) -> bool:
    meta = _meta(pod)
    annotated = str((meta.get("annotations") or {}).get(SCRAPE_ANNOTATION, "")).lower() == "true"
    return annotated or selector.matches(meta.get("labels") or {})


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


@dataclass(frozen=True)
class HintsPlanner:
    policy: HintsPolicy
    actions: HintActions = field(default_factory=HintActions)
    identity: str = "gpuscale-controller"
    name: str = "hints"
    being_replaced: Callable[[Mapping[str, Any], NodeGpuTelemetry], bool] | None = None
    """Whether health remediation takes this node out now (so it is never protected, even in the reconcile that
    remediates it); e.g. ``HealthPlanner.remediates``."""

    def plan(self, view: ClusterView, telemetry: ClusterTelemetry, *, now: float) -> list[Write]:
        protect, idle = self.policy.protect, self.policy.idle
        selector = LabelSelector.parse(protect.inference_selector)
        # Per pod: its GPUs (on any node) and how long the least idle of them has been idle.
        pod_gpus: dict[tuple[str, str], int] = {}
        pod_idle: dict[tuple[str, str], float] = {}
        pods_on: dict[str, set[tuple[str, str]]] = {}
        for name, node in telemetry.nodes.items():
            if not node.reporting:
                continue
            for gpu in node.gpus.values():
                if gpu.pod is None:
                    continue
                pod_gpus[gpu.pod] = pod_gpus.get(gpu.pod, 0) + 1
                pod_idle[gpu.pod] = min(pod_idle.get(gpu.pod, gpu.idle_seconds), gpu.idle_seconds)
                pods_on.setdefault(name, set()).add(gpu.pod)
        gang_gpus: dict[tuple[str, str], int] = {}
        pod_objects = {pod: view.get("v1", "Pod", pod[1], pod[0]) for pod in pod_gpus}
        for pod, obj in pod_objects.items():
            gang = gang_of(obj, protect.gang_keys) if obj is not None else None
            if gang is not None:
                gang_gpus[gang] = gang_gpus.get(gang, 0) + pod_gpus[pod]
        writes: list[Write] = []
        for node in view.objects("v1", "Node"):
            name = _meta(node).get("name", "")
            tel = telemetry.node(name)
            if tel is None or not tel.reporting:
                continue  # NB: no telemetry, no opinion: keep what is there
            reasons = []
            idle_here = []
            for pod in sorted(pods_on.get(name, ())):
                obj = pod_objects.get(pod)
                if obj is None:
                    continue
                active = pod_idle[pod] < protect.active_within
                gang = gang_of(obj, protect.gang_keys)
                gpus = gang_gpus.get(gang, 0) if gang is not None else pod_gpus[pod]
                if active and gpus >= protect.gang_min_gpus:
                    what = f"gang {gang[1]}" if gang is not None else "pod"
                    reasons.append(f"{what} {pod[0]}/{pod[1]} active on {gpus} GPUs")
                elif active and _serves_inference(obj, selector):
                    reasons.append(f"inference {pod[0]}/{pod[1]} served recently")
                if pod_idle[pod] >= idle.for_seconds:
                    idle_here.append(pod)
            if (_meta(node).get("annotations") or {}).get(UNDER_REMEDIATION) or (
                self.being_replaced is not None and self.being_replaced(node, tel)
            ):
                reasons = []  # NB: a node being replaced for bad GPUs must not be kept from scale-down
            if self.actions.scale_down_disabled:
                karpenter = bool((_meta(node).get("labels") or {}).get(KARPENTER_POOL))
                if karpenter and self.actions.karpenter:
                    writes.extend(self._protect(node, DO_NOT_DISRUPT, reasons))
                else:
                    writes.extend(self._protect(node, SCALE_DOWN_DISABLED, reasons))
            if self.actions.idle:
                writes.extend(self._idle_record(node, idle_here, pod_gpus, idle.for_seconds))
        if self.actions.safe_to_evict:
            writes.extend(self._safe_to_evict(pod_objects, pod_idle))
        return writes

    def _protect(self, node: Mapping[str, Any], annotation: str, reasons: list[str]) -> list[Write]:
        notes = _meta(node).get("annotations") or {}
        marker = _MARKER[annotation]
        key = ObjectKey("v1", "Node", _meta(node).get("name", ""))
        if reasons:
            if notes.get(annotation) == "true":
                return []  # already protected (by us, or by someone whose annotation we leave alone)
            why = f"{annotation}: {'; '.join(reasons)}"
            return [Patch(key, {"metadata": {"annotations": {annotation: "true", marker: self.identity}}}, why)]
        if notes.get(marker):
            why = f"{annotation} removed: no active gang or warm inference"
            return [Patch(key, {"metadata": {"annotations": {annotation: None, marker: None}}}, why)]
        return []

    def _idle_record(
        self, node: Mapping[str, Any], pods: list[tuple[str, str]], gpus: Mapping[tuple[str, str], int], idle_for: float
    ) -> list[Write]:
        summary = ",".join(f"{ns}/{name}={gpus[(ns, name)]}" for ns, name in pods)
        notes = _meta(node).get("annotations") or {}
        if summary == notes.get(IDLE_PODS, ""):
            return []
        key = ObjectKey("v1", "Node", _meta(node).get("name", ""))
        writes: list[Write] = []
        if pods:
            hours = idle_for / 3600.0
            listing = ", ".join(f"{ns}/{name} ({gpus[(ns, name)]} GPU)" for ns, name in pods)
            writes.append(Emit(key, "Normal", "GpuRequestedButIdle", f"idle for over {hours:g}h: {listing}"))
        why = f"idle GPU pods: {summary or 'none'}"
        writes.append(Patch(key, {"metadata": {"annotations": {IDLE_PODS: summary or None}}}, why))
        return writes

    def _safe_to_evict(
        self, pods: Mapping[tuple[str, str], Mapping[str, Any] | None], idle: Mapping[tuple[str, str], float]
    ) -> list[Write]:
        writes: list[Write] = []
        marker = _MARKER[SAFE_TO_EVICT]
        for pod, obj in sorted(pods.items()):
            if obj is None or pod[0] in self.policy.idle.never_evict_namespaces:
                continue
            notes = _meta(obj).get("annotations") or {}
            key = ObjectKey("v1", "Pod", pod[1], pod[0])
            if idle[pod] >= self.policy.idle.for_seconds:
                if SAFE_TO_EVICT not in notes:
                    patch = {"metadata": {"annotations": {SAFE_TO_EVICT: "true", marker: self.identity}}}
                    writes.append(Patch(key, patch, f"{SAFE_TO_EVICT}: its GPUs idle"))
            elif notes.get(marker):
                patch = {"metadata": {"annotations": {SAFE_TO_EVICT: None, marker: None}}}
                writes.append(Patch(key, patch, f"{SAFE_TO_EVICT} removed: its GPUs are active again"))
        return writes
