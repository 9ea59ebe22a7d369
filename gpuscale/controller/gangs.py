"""Gangs: all-or-nothing groups of pods, read from Volcano, coscheduling and Kueue objects. Pure.

A gang is *pending* when its scheduler holds it back for want of capacity:

* Volcano ``PodGroup`` (``scheduling.volcano.sh/v1beta1``): phase ``Pending`` or ``Inqueue`` with the
  condition ``Unschedulable=True``. With Volcano's default ``enqueue`` action the pods of such a group are never
  created, so the cluster-autoscaler never sees them (volcano-sh/volcano #3910).
* coscheduling ``PodGroup`` (``scheduling.x-k8s.io/v1alpha1``): not ``Running``/``Finished``/``Failed`` and fewer
  pods bound to nodes than ``minMember``.
* Kueue ``Workload`` (``kueue.x-k8s.io/v1beta2``): neither ``Admitted`` nor ``Finished``, with its quota reserved
  (``QuotaReserved=True``: admission checks pending) or refused for a failed topology placement. One still waiting
  for quota is not pending here: new nodes would not admit it. Its Job stays suspended, so it has no pods; once
  admitted, its pods are those owned by the Workload's owner (the Job).

What a gang needs (its *pod sets*: how many pods of which shape) comes, in this order, from its unbound pods
(grouped by shape), from the owning Job's pod template (``batch/v1`` Job: ``minMember`` pods; Volcano
``batch.volcano.sh/v1alpha1`` Job: one pod set per task), or from ``minResources`` divided evenly over
``minMember`` pods (GPUs rounded up per pod); a Workload lists its pod sets itself.

A Kueue Workload is *covered* when one of its admission checks — in its status, or on its ClusterQueue — is
run by Kueue's own ProvisioningRequest controller (``kueue.x-k8s.io/provisioning-request``): Kueue then asks
for the capacity itself and gpuscale must not ask twice.

A gang *needs one NVLink domain* when a pod template carries Kueue's
``kueue.x-k8s.io/podset-required-topology: nvidia.com/gpu.clique``, a Workload pod set requires that topology,
or the gang object is annotated ``gpuscale.io/nvlink-domain: required``.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from gpuscale.controller.pools import GPU_CLIQUE_LABEL, GPU_PRODUCT_LABEL
from gpuscale.controller.writes import ClusterView, ObjectKey
from gpuscale.model import format_quantity, parse_quantity

__all__ = [
    "ADMISSION_CHECK",
    "CLUSTER_QUEUE",
    "COSCHEDULING_POD_GROUP",
    "GANG_KINDS",
    "JOB",
    "KUEUE_PROVISIONING_CONTROLLER",
    "KUEUE_WORKLOAD",
    "LOCAL_QUEUE",
    "NVLINK_ANNOTATION",
    "POD",
    "VOLCANO_JOB",
    "VOLCANO_POD_GROUP",
    "Gang",
    "PodSet",
    "gangs_of",
    "gpus_of_pod_spec",
]

Kind = tuple[str, str]
VOLCANO_POD_GROUP: Kind = ("scheduling.volcano.sh/v1beta1", "PodGroup")
COSCHEDULING_POD_GROUP: Kind = ("scheduling.x-k8s.io/v1alpha1", "PodGroup")
KUEUE_WORKLOAD: Kind = ("kueue.x-k8s.io/v1beta2", "Workload")
ADMISSION_CHECK: Kind = ("kueue.x-k8s.io/v1beta2", "AdmissionCheck")
CLUSTER_QUEUE: Kind = ("kueue.x-k8s.io/v1beta2", "ClusterQueue")
LOCAL_QUEUE: Kind = ("kueue.x-k8s.io/v1beta2", "LocalQueue")
JOB: Kind = ("batch/v1", "Job")
VOLCANO_JOB: Kind = ("batch.volcano.sh/v1alpha1", "Job")
POD: Kind = ("v1", "Pod")
GANG_KINDS: tuple[Kind, ...] = (
    VOLCANO_POD_GROUP,
    COSCHEDULING_POD_GROUP,
    KUEUE_WORKLOAD,
    ADMISSION_CHECK,
    CLUSTER_QUEUE,
    LOCAL_QUEUE,
    JOB,
    VOLCANO_JOB,
    POD,
)
"""What ``gangs_of`` reads from the view (the caches must list+watch these; absent CRDs simply give nothing)."""

KUEUE_PROVISIONING_CONTROLLER = "kueue.x-k8s.io/provisioning-request"
NVLINK_ANNOTATION = "gpuscale.io/nvlink-domain"
_KUEUE_TOPOLOGY_ANNOTATION = "kueue.x-k8s.io/podset-required-topology"
_VOLCANO_GROUP_ANNOTATIONS = ("scheduling.k8s.io/group-name", "scheduling.volcano.sh/group-name")
_COSCHEDULING_LABEL = "scheduling.x-k8s.io/pod-group"
_PLACEHOLDER_IMAGE = "registry.k8s.io/pause:3.10"
_TERMINAL_POD_PHASES = ("Succeeded", "Failed")
_CAPACITY_REASONS = ("TopologyPlacementFailed",)  # QuotaReserved=False for want of nodes, not of quota

Framework = Literal["volcano", "coscheduling", "kueue"]
State = Literal["pending", "done", "other"]


@dataclass(frozen=True, slots=True)
class PodSet:
    """``count`` pods shaped like ``template`` (a PodTemplateSpec: ``metadata`` + ``spec``)."""

    name: str
    count: int
    template: Mapping[str, Any]
    gpus_per_pod: int
    gpu_product: str | None
    """The GPU product the pods require (nodeSelector or required node affinity on nvidia.com/gpu.product)."""


@dataclass(frozen=True, slots=True)
class Gang:
    framework: Framework
    key: ObjectKey
    uid: str
    state: State
    pod_sets: tuple[PodSet, ...]
    demand_from: Literal["pods", "job", "min-resources", "workload", "none"]
    pods: tuple[Mapping[str, Any], ...]
    """The gang's pods that exist now (any phase but Succeeded/Failed)."""
    covered_by: str | None
    """The Kueue AdmissionCheck that provisions this gang itself, if any."""
    needs_one_nvlink_domain: bool

    @property
    def gpus(self) -> int:
        return sum(p.count * p.gpus_per_pod for p in self.pod_sets)

    @property
    def pod_count(self) -> int:
        return sum(p.count for p in self.pod_sets)

    def __str__(self) -> str:
        return f"{self.framework} {self.key}"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    return obj.get("metadata") or {}


def _conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (obj.get("status") or {}).get("conditions") or [] if isinstance(c, dict)}


def _is_true(obj: Mapping[str, Any], condition: str) -> bool:
    return _conditions(obj).get(condition, {}).get("status") == "True"


def _quantity(raw: Any) -> float:
    try:
        return parse_quantity(str(raw))
    except ValueError:
        return 0.0


def _count(raw: Any, default: int) -> int:
    """A count field (``minMember``, ``count``, ``replicas``); the default when it is not a whole number.

    NB: the CRDs' schemas make these int32, so a bad value is rare; it must still not stop the reconcile.
    """
    if isinstance(raw, bool):
        return default
    try:
        return max(int(raw), 0) if raw is not None else default
    except (TypeError, ValueError):
        return default


def gpus_of_pod_spec(spec: Mapping[str, Any], *, gpu_resource: str = "nvidia.com/gpu") -> int:
    """GPUs a pod asks for: the sum over its containers (limits, else requests), or its largest init container."""

    def of(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        raw = (resources.get("limits") or {}).get(gpu_resource, (resources.get("requests") or {}).get(gpu_resource))
        return int(_quantity(raw)) if raw is not None else 0

    main = sum(of(c) for c in spec.get("containers") or [] if isinstance(c, dict))
    init = max((of(c) for c in spec.get("initContainers") or [] if isinstance(c, dict)), default=0)
    return max(main, init)


def _required_product(spec: Mapping[str, Any]) -> str | None:
    selected = (spec.get("nodeSelector") or {}).get(GPU_PRODUCT_LABEL)
    if selected:
        return str(selected)
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
        or {}
    ).get("nodeSelectorTerms") or []
    # NB: one term with `In [one product]` is a requirement we can honour; alternatives (several terms or
    # values) leave the product open rather than pick one.
    if len(required) == 1:
        for expression in required[0].get("matchExpressions") or []:
            values = expression.get("values") or []
            if expression.get("key") == GPU_PRODUCT_LABEL and expression.get("operator") == "In" and len(values) == 1:
                return str(values[0])
    return None


def _pod_set(name: str, count: int, template: Mapping[str, Any], gpu_resource: str) -> PodSet:
    spec = template.get("spec") or {}
    return PodSet(
        name=name,
        count=count,
        template=template,
        gpus_per_pod=gpus_of_pod_spec(spec, gpu_resource=gpu_resource),
        gpu_product=_required_product(spec),
    )


_POD_ONLY_SPEC_FIELDS = ("nodeName",)
_POD_TEMPLATE_DROPPED_ANNOTATIONS = (
    "autoscaling.x-k8s.io/consume-provisioning-request",
    "autoscaling.x-k8s.io/provisioning-class-name",
)


def _template_of_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = _meta(pod)
    spec = {k: copy.deepcopy(v) for k, v in (pod.get("spec") or {}).items() if k not in _POD_ONLY_SPEC_FIELDS}
    annotations = {
        k: v for k, v in (meta.get("annotations") or {}).items() if k not in _POD_TEMPLATE_DROPPED_ANNOTATIONS
    }
    template_meta: dict[str, Any] = {}
    if meta.get("labels"):
        template_meta["labels"] = dict(meta["labels"])
    if annotations:
        template_meta["annotations"] = annotations
    return {"metadata": template_meta, "spec": spec}


def _pod_sets_of_pods(pods: Iterable[Mapping[str, Any]], min_member: int, gpu_resource: str) -> list[PodSet]:
    """Unbound pods grouped by shape (their spec); the largest set grows to ``min_member`` pods in all."""
    shapes: dict[str, tuple[dict[str, Any], int]] = {}
    for pod in pods:
        template = _template_of_pod(pod)
        shape = json.dumps(template["spec"], sort_keys=True)
        first, n = shapes.get(shape, (template, 0))
        shapes[shape] = (first, n + 1)
    sets = [_pod_set(f"pods-{i}", n, t, gpu_resource) for i, (t, n) in enumerate(shapes.values())]
    missing = min_member - sum(s.count for s in sets)
    if sets and missing > 0:
        largest = max(range(len(sets)), key=lambda i: sets[i].count)
        s = sets[largest]
        sets[largest] = PodSet(s.name, s.count + missing, s.template, s.gpus_per_pod, s.gpu_product)
    return sets


def _pod_sets_of_min_resources(min_resources: Mapping[str, Any], min_member: int, gpu_resource: str) -> list[PodSet]:
    """``minMember`` placeholder pods that together ask for ``minResources`` (per-pod amounts rounded up)."""
    members = max(min_member, 1)
    requests: dict[str, str] = {}
    for resource, raw in min_resources.items():
        total = _quantity(raw)
        if total <= 0:
            continue
        if resource == gpu_resource or "/" in resource:
            requests[resource] = str(math.ceil(total / members))  # NB: extended resources come in whole units
        else:
            requests[resource] = format_quantity(total / members)
    extended = {k: v for k, v in requests.items() if "/" in k}
    container: dict[str, Any] = {
        "name": "gang-member",
        "image": _PLACEHOLDER_IMAGE,
        "resources": {"requests": requests},
    }
    if extended:
        container["resources"]["limits"] = extended  # NB: extended resources need limits equal to requests
    template = {"metadata": {}, "spec": {"containers": [container], "restartPolicy": "Never"}}
    return [_pod_set("members", members, template, gpu_resource)]


def _owner(view: ClusterView, obj: Mapping[str, Any], kinds: Iterable[Kind]) -> Mapping[str, Any] | None:
    namespace = _meta(obj).get("namespace")
    for ref in _meta(obj).get("ownerReferences") or []:
        for api_version, kind in kinds:
            if ref.get("apiVersion") == api_version and ref.get("kind") == kind:
                owner = view.get(api_version, kind, ref.get("name", ""), namespace)
                if owner is not None and (not ref.get("uid") or _meta(owner).get("uid") == ref.get("uid")):
                    return owner
    return None


def _pod_sets_of_job(job: Mapping[str, Any], min_member: int, gpu_resource: str) -> list[PodSet]:
    spec = job.get("spec") or {}
    if job.get("apiVersion") == VOLCANO_JOB[0]:
        return [
            _pod_set(
                task.get("name") or f"task-{i}",
                _count(task.get("replicas"), 1),
                task.get("template") or {},
                gpu_resource,
            )
            for i, task in enumerate(spec.get("tasks") or [])
            if _count(task.get("replicas"), 1) > 0
        ]
    count = min_member or _count(spec.get("parallelism"), 1)
    return [_pod_set("workers", count, spec.get("template") or {}, gpu_resource)]


def _live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL_POD_PHASES and not _meta(pod).get(
        "deletionTimestamp"
    )


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _nvlink_required(obj: Mapping[str, Any], templates: Iterable[Mapping[str, Any]]) -> bool:
    if (_meta(obj).get("annotations") or {}).get(NVLINK_ANNOTATION) == "required":
        return True
    return any(
        ((t.get("metadata") or {}).get("annotations") or {}).get(_KUEUE_TOPOLOGY_ANNOTATION) == GPU_CLIQUE_LABEL
        for t in templates
    )


def _pod_group_gang(
    view: ClusterView, pg: Mapping[str, Any], framework: Framework, pods: list[Mapping[str, Any]], gpu_resource: str
) -> Gang:
    spec, status = pg.get("spec") or {}, pg.get("status") or {}
    phase = status.get("phase") or ""
    min_member = _count(spec.get("minMember"), 1) or 1
    live = [p for p in pods if _live(p)]
    bound = sum(1 for p in live if _bound(p))
    if framework == "volcano":
        done = phase in ("Running", "Completed")
        pending = phase in ("Pending", "Inqueue") and _is_true(pg, "Unschedulable")
    else:
        done = phase in ("Running", "Finished", "Failed")
        pending = not done and bound < min_member
    unbound = [p for p in live if not _bound(p)]
    demand_from: Literal["pods", "job", "min-resources", "none"] = "none"
    pod_sets: list[PodSet] = []
    if unbound:
        pod_sets, demand_from = _pod_sets_of_pods(unbound, min_member - bound, gpu_resource), "pods"
    elif (job := _owner(view, pg, (JOB, VOLCANO_JOB))) is not None:
        pod_sets, demand_from = _pod_sets_of_job(job, min_member, gpu_resource), "job"
    elif spec.get("minResources"):
        pod_sets = _pod_sets_of_min_resources(spec["minResources"], min_member, gpu_resource)
        demand_from = "min-resources"
    return Gang(
        framework=framework,
        key=ObjectKey.of(pg),
        uid=_meta(pg).get("uid", ""),
        state="done" if done else "pending" if pending else "other",
        pod_sets=tuple(pod_sets),
        demand_from=demand_from,
        pods=tuple(live),
        covered_by=None,
        needs_one_nvlink_domain=_nvlink_required(pg, [p.template for p in pod_sets]),
    )


def _kueue_provisioning_checks(view: ClusterView) -> set[str]:
    return {
        _meta(check).get("name", "")
        for check in view.objects(*ADMISSION_CHECK)
        if (check.get("spec") or {}).get("controllerName") == KUEUE_PROVISIONING_CONTROLLER
    }


def _cluster_queue_checks(view: ClusterView, workload: Mapping[str, Any]) -> set[str]:
    namespace = _meta(workload).get("namespace")
    local = view.get(*LOCAL_QUEUE, (workload.get("spec") or {}).get("queueName", ""), namespace)
    if local is None:
        return set()
    queue = view.get(*CLUSTER_QUEUE, (local.get("spec") or {}).get("clusterQueue", ""))
    if queue is None:
        return set()
    spec = queue.get("spec") or {}
    names = {str(n) for n in spec.get("admissionChecks") or []}
    strategy = (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
    return names | {str(rule.get("name")) for rule in strategy if isinstance(rule, dict)}


def _workload_gang(
    view: ClusterView,
    workload: Mapping[str, Any],
    provisioning: set[str],
    pods_by_owner: Mapping[str, list[Mapping[str, Any]]],
    gpu_resource: str,
) -> Gang:
    spec = workload.get("spec") or {}
    # NB: a Workload's pods are those of the job it stands for (its owner), once Kueue lets the job start.
    owners = [ref.get("uid", "") for ref in _meta(workload).get("ownerReferences") or [] if ref.get("uid")]
    pods = [p for uid in owners for p in pods_by_owner.get(uid, []) if _live(p)]
    done = _is_true(workload, "Admitted") or _is_true(workload, "Finished")
    quota = _conditions(workload).get("QuotaReserved", {})
    # NB: a Workload still waiting for quota would not be admitted on new nodes; asking for them would only
    # leave them idle. Quota reserved (admission checks pending) or a failed topology placement: capacity helps.
    needs_capacity = quota.get("status") == "True" or quota.get("reason") in _CAPACITY_REASONS
    pending = not done and needs_capacity and not _meta(workload).get("deletionTimestamp")
    checks = {c.get("name", "") for c in (workload.get("status") or {}).get("admissionChecks") or []}
    covering = sorted((checks | _cluster_queue_checks(view, workload)) & provisioning)
    pod_sets = [
        _pod_set(ps.get("name") or f"podset-{i}", _count(ps.get("count"), 1), ps.get("template") or {}, gpu_resource)
        for i, ps in enumerate(spec.get("podSets") or [])
        if _count(ps.get("count"), 1) > 0
    ]
    topology_required = any(
        ((ps.get("topologyRequest") or {}).get("required")) == GPU_CLIQUE_LABEL for ps in spec.get("podSets") or []
    )
    return Gang(
        framework="kueue",
        key=ObjectKey.of(workload),
        uid=_meta(workload).get("uid", ""),
        state="done" if done else "pending" if pending else "other",
        pod_sets=tuple(pod_sets),
        demand_from="workload" if pod_sets else "none",
        pods=tuple(pods),
        covered_by=covering[0] if covering else None,
        needs_one_nvlink_domain=topology_required or _nvlink_required(workload, [p.template for p in pod_sets]),
    )


def gangs_of(view: ClusterView, *, gpu_resource: str = "nvidia.com/gpu") -> list[Gang]:
    """Every gang the view holds (pending, done or neither), in a stable order."""
    pods_by_volcano: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    pods_by_coscheduling: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    pods_by_owner: dict[str, list[Mapping[str, Any]]] = {}
    for pod in view.objects(*POD):
        meta = _meta(pod)
        for ref in meta.get("ownerReferences") or []:
            if ref.get("uid"):
                pods_by_owner.setdefault(ref["uid"], []).append(pod)
        namespace = meta.get("namespace", "")
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        group = next((annotations[a] for a in _VOLCANO_GROUP_ANNOTATIONS if annotations.get(a)), None)
        if group:
            pods_by_volcano.setdefault((namespace, group), []).append(pod)
        if labels.get(_COSCHEDULING_LABEL):
            pods_by_coscheduling.setdefault((namespace, labels[_COSCHEDULING_LABEL]), []).append(pod)
    gangs = []
    groups: tuple[tuple[Kind, Framework, dict[tuple[str, str], list[Mapping[str, Any]]]], ...] = (
        (VOLCANO_POD_GROUP, "volcano", pods_by_volcano),
        (COSCHEDULING_POD_GROUP, "coscheduling", pods_by_coscheduling),
    )
    for kind, framework, pods in groups:
        for pg in view.objects(*kind):
            key = (_meta(pg).get("namespace", ""), _meta(pg).get("name", ""))
            gangs.append(_pod_group_gang(view, pg, framework, pods.get(key, []), gpu_resource))
    provisioning = _kueue_provisioning_checks(view)
    gangs.extend(
        _workload_gang(view, wl, provisioning, pods_by_owner, gpu_resource) for wl in view.objects(*KUEUE_WORKLOAD)
    )
    return gangs
