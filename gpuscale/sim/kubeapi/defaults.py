"""What kube-apiserver fills in: the API defaults clients observe, the generated Job selector, the not-ready
taint of a new Node, and what is kept of a status sent with a create."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

from gpuscale.sim.kubeapi.payloads import (
    timestamp,
)
from gpuscale.sim.kubeapi.validation import WORKLOAD_KINDS
from gpuscale.sim.resources import (
    ResourceType,
)


def apply_defaults(rt: ResourceType, obj: dict[str, Any], allocate_cluster_ip: Callable[[], str]) -> None:
    """The few API defaults clients observe (replicas, pod phase, namespace phase/label, service IPs)."""
    no_spec = rt.custom or rt.kind in ("ConfigMap", "Event", "Namespace", "PodTemplate")
    spec = obj.get("spec") if no_spec else obj.setdefault("spec", {})
    if rt.kind in WORKLOAD_KINDS:
        assert spec is not None
        if rt.kind != "DaemonSet":
            spec.setdefault("replicas", 1)
        if rt.kind != "ReplicaSet":
            spec.setdefault("revisionHistoryLimit", 10)
        if rt.kind == "DaemonSet":
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}})
        elif rt.kind == "Deployment":
            spec.setdefault("progressDeadlineSeconds", 600)
            spec.setdefault(
                "strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}}
            )
        elif rt.kind == "StatefulSet":
            spec.setdefault("podManagementPolicy", "OrderedReady")
            spec.setdefault("updateStrategy", {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    elif rt.kind == "Pod":
        assert spec is not None
        spec.setdefault("restartPolicy", "Always")
        spec.setdefault("schedulerName", "default-scheduler")
        spec.setdefault("terminationGracePeriodSeconds", 30)
        spec.setdefault("dnsPolicy", "ClusterFirst")
        for container in spec.get("containers") or []:
            for port in container.get("ports") or [] if isinstance(container, dict) else []:
                if isinstance(port, dict):
                    port.setdefault("protocol", "TCP")
    elif rt.kind == "Namespace":
        obj["metadata"].setdefault("labels", {})["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    elif rt.kind == "Job" and not rt.custom:
        assert spec is not None
        _default_job(spec, obj["metadata"])
    elif rt.kind == "CustomResourceDefinition" and not rt.custom and isinstance(spec, dict):
        names = spec.setdefault("names", {})
        if isinstance(names, dict) and names.get("kind"):
            names.setdefault("singular", str(names["kind"]).lower())
            names.setdefault("listKind", f"{names['kind']}List")
    elif rt.kind == "Service":
        assert spec is not None
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        for port in spec.get("ports") or []:
            if isinstance(port, dict):
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))
        if spec["type"] != "ExternalName" and "clusterIP" not in spec:
            spec["clusterIP"] = allocate_cluster_ip()
            spec["clusterIPs"] = [spec["clusterIP"]]


def _default_job(spec: dict[str, Any], meta: Mapping[str, Any]) -> None:
    """The Job defaults and, unless ``manualSelector``, the generated selector and template labels."""
    spec.setdefault("parallelism", 1)
    if spec.get("completionMode") != "Indexed" or "completions" in spec:
        spec.setdefault("completions", 1)
    spec.setdefault("backoffLimit", 6)
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    if not spec.get("manualSelector") and "selector" not in spec:
        uid = meta["uid"]
        spec["selector"] = {"matchLabels": {"batch.kubernetes.io/controller-uid": uid}}
        labels = spec.setdefault("template", {}).setdefault("metadata", {}).setdefault("labels", {})
        for prefix in ("batch.kubernetes.io/", ""):
            labels.setdefault(f"{prefix}controller-uid", uid)
            labels.setdefault(f"{prefix}job-name", meta["name"])


NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def node_not_ready_taint(node: dict[str, Any], *, creating: bool) -> None:
    """The taint kube-apiserver's TaintNodesByCondition admission puts on every new Node (``creating``), and the
    node lifecycle controller takes off once the Node reports Ready (at once here, on any write)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions if isinstance(c, dict))
    spec = node.setdefault("spec", {})
    taints = [t for t in spec.get("taints") or [] if isinstance(t, dict)]
    has = any(t.get("key") == NOT_READY_TAINT["key"] and t.get("effect") == "NoSchedule" for t in taints)
    if ready and has:
        spec["taints"] = [
            t for t in taints if t.get("key") != NOT_READY_TAINT["key"] or t.get("effect") != "NoSchedule"
        ]
        if not spec["taints"]:
            del spec["taints"]
    elif creating and not ready and not has:
        spec["taints"] = [*taints, dict(NOT_READY_TAINT)]
    if spec.get("taints") == []:
        del spec["taints"]  # NB: omitempty — kube-apiserver serves no taints as no field at all


def status_on_create(rt: ResourceType, obj: dict[str, Any]) -> None:
    """What kube-apiserver keeps of a status sent with a create (PrepareForCreate)."""
    if rt.kind == "Node" and not rt.custom:
        node_not_ready_taint(obj, creating=True)
    if rt.custom:
        if rt.has_status:
            obj.pop("status", None)  # NB: with the status subresource, a create's status is dropped
    elif rt.kind == "Pod":
        obj["status"] = {"phase": "Pending"}
    elif rt.kind in WORKLOAD_KINDS or rt.kind == "Job":
        obj["status"] = {}
    elif rt.kind == "CustomResourceDefinition":
        # NB: the CRD controllers accept the names and establish the resource at once here (no delay).
        names = (obj.get("spec") or {}).get("names") or {}
        now = timestamp()
        obj["status"] = {
            "acceptedNames": copy.deepcopy(names),
            "storedVersions": [v["name"] for v in (obj.get("spec") or {}).get("versions") or [] if v.get("storage")],
            "conditions": [
                {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": now}
                for t, r, m in (
                    ("NamesAccepted", "NoConflicts", "no conflicts found"),
                    ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
                )
            ],
        }
    elif rt.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    elif rt.kind == "Service":
        obj["status"] = {"loadBalancer": {}}
