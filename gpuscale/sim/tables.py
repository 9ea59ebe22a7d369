"""What ``kubectl get`` prints for each kind the simulated API serves: the rows of its server-side
``meta.k8s.io/v1`` Tables, with kubectl's usual columns (``-o wide`` ones at priority 1) and its AGE wording."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpuscale.errors import SelectorError
from gpuscale.model import format_quantity, parse_quantity
from gpuscale.selectors import LabelSelector

__all__ = ["DEFAULT_TABLE", "TABLES", "Column", "selector_text"]


def _now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None


def _human_duration(seconds: float) -> str:
    """apimachinery ``duration.HumanDuration`` (what kubectl shows as AGE)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m" if s % 60 == 0 else f"{minutes}m{s % 60}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        return f"{hours}h" if minutes % 60 == 0 else f"{hours}h{minutes % 60}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        return f"{hours // 24}d" if hours % 24 == 0 else f"{hours // 24}d{hours % 24}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _age(obj: Mapping[str, Any]) -> str:
    created = _parse_time(obj.get("metadata", {}).get("creationTimestamp"))
    if created is None:
        return "<unknown>"
    return _human_duration((_now() - created).total_seconds())


Column = tuple[str, int]  # (name, priority); 1 = shown only with -o wide


def _pod_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    statuses = status.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    restarts = sum(int(s.get("restartCount", 0)) for s in statuses)
    phase = status.get("reason") or status.get("phase") or "Unknown"
    if o["metadata"].get("deletionTimestamp"):
        phase = "Terminating"
    gates = spec.get("readinessGates")
    return [
        o["metadata"]["name"],
        f"{ready}/{len(spec.get('containers') or [])}",
        phase,
        str(restarts),
        _age(o),
        status.get("podIP") or "<none>",
        spec.get("nodeName") or "<none>",
        status.get("nominatedNodeName") or "<none>",
        f"0/{len(gates)}" if gates else "<none>",
    ]


def _node_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    state = "Unknown" if ready is None else ("Ready" if ready.get("status") == "True" else "NotReady")
    if spec.get("unschedulable"):
        state += ",SchedulingDisabled"
    labels = o["metadata"].get("labels") or {}
    roles = sorted(k.split("/", 1)[1] for k in labels if k.startswith("node-role.kubernetes.io/") and "/" in k)
    info = status.get("nodeInfo") or {}
    addresses = {a.get("type"): a.get("address") for a in status.get("addresses") or []}
    return [
        o["metadata"]["name"],
        state,
        ",".join(r for r in roles if r) or "<none>",
        _age(o),
        info.get("kubeletVersion", ""),
        addresses.get("InternalIP", "<none>"),
        addresses.get("ExternalIP", "<none>"),
        info.get("osImage", "<unknown>"),
        info.get("kernelVersion", "<unknown>"),
        info.get("containerRuntimeVersion", "<unknown>"),
    ]


def _hpa_targets(spec: Mapping[str, Any], status: Mapping[str, Any]) -> str:
    """kubectl's TARGETS column (formatHPAMetrics): "current/target" per metric, at most two, then "+ N more..."."""
    specs, currents = spec.get("metrics") or [], status.get("currentMetrics") or []
    if not specs:
        return "<none>"
    shown = []
    for i, metric in enumerate(specs):
        kind = {"Pods": "pods", "Object": "object", "External": "external", "Resource": "resource"}.get(
            metric.get("type", ""), ""
        )
        target = (metric.get(kind) or {}).get("target") or {}
        current = ((currents[i].get(kind) or {}) if i < len(currents) else {}).get("current") or {}
        key = "averageValue" if "averageValue" in target else "value"
        if kind == "resource" and "averageUtilization" in target:
            key = "averageUtilization"
        now = _canonical(current[key]) if key in current else "<unknown>"
        goal = _canonical(target[key]) if key in target else "<none>"
        text = f"{now}%/{goal}%" if key == "averageUtilization" else f"{now}/{goal}"
        if kind == "resource":
            text = f"{(metric.get('resource') or {}).get('name', '')}: {text}"
        elif key == "averageValue" and kind in ("object", "external"):
            text += " (avg)"
        shown.append(text)
    more = len(shown) - 2
    return ", ".join(shown[:2]) + (f" + {more} more..." if more > 0 else "")


def _canonical(quantity: Any) -> str:
    """A quantity as kube-apiserver stores it ("1000m" → "1"); kubectl prints the stored form."""
    try:
        return format_quantity(parse_quantity(str(quantity)))
    except ValueError:
        return str(quantity)


def _hpa_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    ref = spec.get("scaleTargetRef") or {}
    return [
        o["metadata"]["name"],
        f"{ref.get('kind', '')}/{ref.get('name', '')}",
        _hpa_targets(spec, status),
        str(spec.get("minReplicas", 1)),
        str(spec.get("maxReplicas", "")),
        str(status.get("currentReplicas", 0)),
        _age(o),
    ]


def selector_text(raw: Any) -> str:
    try:
        return str(LabelSelector.from_dict(raw))
    except SelectorError:
        return ""


def _containers_images(o: Mapping[str, Any]) -> tuple[str, str]:
    containers = ((o.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []
    return ",".join(c.get("name", "") for c in containers), ",".join(c.get("image", "") for c in containers)


def _deployment_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    names, images = _containers_images(o)
    return [
        o["metadata"]["name"],
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        status.get("updatedReplicas", 0),
        status.get("availableReplicas", 0),
        _age(o),
        names,
        images,
        selector_text(spec.get("selector")),
    ]


def _statefulset_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    names, images = _containers_images(o)
    return [
        o["metadata"]["name"],
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        _age(o),
        names,
        images,
    ]


def _replicaset_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    names, images = _containers_images(o)
    return [
        o["metadata"]["name"],
        spec.get("replicas", 0),
        status.get("replicas", 0),
        status.get("readyReplicas", 0),
        _age(o),
        names,
        images,
        selector_text(spec.get("selector")),
    ]


def _daemonset_row(o: Mapping[str, Any]) -> list[Any]:
    spec, status = o.get("spec") or {}, o.get("status") or {}
    names, images = _containers_images(o)
    node_selector = ((spec.get("template") or {}).get("spec") or {}).get("nodeSelector") or {}
    return [
        o["metadata"]["name"],
        status.get("desiredNumberScheduled", 0),
        status.get("currentNumberScheduled", 0),
        status.get("numberReady", 0),
        status.get("updatedNumberScheduled", 0),
        status.get("numberAvailable", 0),
        ",".join(f"{k}={v}" for k, v in sorted(node_selector.items())) or "<none>",
        _age(o),
        names,
        images,
        selector_text(spec.get("selector")),
    ]


def _service_row(o: Mapping[str, Any]) -> list[Any]:
    spec = o.get("spec") or {}
    ports = ",".join(
        f"{p.get('port')}{':' + str(p['nodePort']) if p.get('nodePort') else ''}/{p.get('protocol', 'TCP')}"
        for p in spec.get("ports") or []
    )
    selector = ",".join(f"{k}={v}" for k, v in sorted((spec.get("selector") or {}).items()))
    external = ",".join(spec.get("externalIPs") or []) or "<none>"
    return [
        o["metadata"]["name"],
        spec.get("type", "ClusterIP"),
        spec.get("clusterIP", "<none>"),
        external,
        ports or "<none>",
        _age(o),
        selector or "<none>",
    ]


def _event_row(o: Mapping[str, Any]) -> list[Any]:
    involved = o.get("involvedObject") or {}
    last = _parse_time(o.get("lastTimestamp") or o.get("eventTime")) or _parse_time(
        o["metadata"].get("creationTimestamp")
    )
    seen = _human_duration((_now() - last).total_seconds()) if last else "<unknown>"
    return [
        seen,
        o.get("type", ""),
        o.get("reason", ""),
        f"{(involved.get('kind') or '').lower()}/{involved.get('name', '')}",
        o.get("message", ""),
    ]


TABLES: dict[str, tuple[list[Column], Callable[[Mapping[str, Any]], list[Any]]]] = {
    "Pod": (
        [
            ("Name", 0),
            ("Ready", 0),
            ("Status", 0),
            ("Restarts", 0),
            ("Age", 0),
            ("IP", 1),
            ("Node", 1),
            ("Nominated Node", 1),
            ("Readiness Gates", 1),
        ],
        _pod_row,
    ),
    "Node": (
        [
            ("Name", 0),
            ("Status", 0),
            ("Roles", 0),
            ("Age", 0),
            ("Version", 0),
            ("Internal-IP", 1),
            ("External-IP", 1),
            ("OS-Image", 1),
            ("Kernel-Version", 1),
            ("Container-Runtime", 1),
        ],
        _node_row,
    ),
    "Namespace": (
        [("Name", 0), ("Status", 0), ("Age", 0)],
        lambda o: [o["metadata"]["name"], (o.get("status") or {}).get("phase", ""), _age(o)],
    ),
    "Deployment": (
        [
            ("Name", 0),
            ("Ready", 0),
            ("Up-to-date", 0),
            ("Available", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1),
        ],
        _deployment_row,
    ),
    "StatefulSet": ([("Name", 0), ("Ready", 0), ("Age", 0), ("Containers", 1), ("Images", 1)], _statefulset_row),
    "HorizontalPodAutoscaler": (
        [
            ("Name", 0),
            ("Reference", 0),
            ("Targets", 0),
            ("MinPods", 0),
            ("MaxPods", 0),
            ("Replicas", 0),
            ("Age", 0),
        ],
        _hpa_row,
    ),
    "ReplicaSet": (
        [
            ("Name", 0),
            ("Desired", 0),
            ("Current", 0),
            ("Ready", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1),
        ],
        _replicaset_row,
    ),
    "DaemonSet": (
        [
            ("Name", 0),
            ("Desired", 0),
            ("Current", 0),
            ("Ready", 0),
            ("Up-to-date", 0),
            ("Available", 0),
            ("Node Selector", 0),
            ("Age", 0),
            ("Containers", 1),
            ("Images", 1),
            ("Selector", 1),
        ],
        _daemonset_row,
    ),
    "Service": (
        [("Name", 0), ("Type", 0), ("Cluster-IP", 0), ("External-IP", 0), ("Port(s)", 0), ("Age", 0), ("Selector", 1)],
        _service_row,
    ),
    "ConfigMap": (
        [("Name", 0), ("Data", 0), ("Age", 0)],
        lambda o: [o["metadata"]["name"], len(o.get("data") or {}) + len(o.get("binaryData") or {}), _age(o)],
    ),
    "Event": ([("Last Seen", 0), ("Type", 0), ("Reason", 0), ("Object", 0), ("Message", 0)], _event_row),
    "Lease": (
        [("Name", 0), ("Holder", 0), ("Age", 0)],
        lambda o: [o["metadata"]["name"], (o.get("spec") or {}).get("holderIdentity", ""), _age(o)],
    ),
}
DEFAULT_TABLE: tuple[list[Column], Callable[[Mapping[str, Any]], list[Any]]] = (
    [("Name", 0), ("Age", 0)],
    lambda o: [o["metadata"]["name"], _age(o)],
)
