"""What the adapter knows about the cluster — pods, workloads, nodes and namespaces — and the indices that
answer its lookups from memory.

The adapter answers an HPA request from memory; a request never calls the Kubernetes API. The typed seam
is ``ClusterObjects`` (a Protocol); two honest implementations sit behind it:

* ``StaticClusterObjects`` (here) — fixed lists, for unit tests and one-shot tools;
* ``KubeCache`` (sources/kube.py) — kept current by list+watch (sources/reflector.py).

Indices make every lookup O(1) or O(pods in the namespace): pods by (namespace, name), by namespace and by
(podIP, containerPort) — the last attributes a scraped exporter URL to the pod serving it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from gpuscale.errors import SelectorError
from gpuscale.selectors import DOUBLE_EQUALS, EQUALS, IN, LabelSelector

__all__ = [
    "ClusterObjects",
    "IndexedClusterObjects",
    "PodInfo",
    "StaticClusterObjects",
    "WorkloadInfo",
]

log = logging.getLogger(__name__)

# Phases in the order pod_at prefers them when two pods claim one ip:port (an IP reused after a pod ended).
_PHASE_PREFERENCE = {"Running": 0, "Pending": 1, "Unknown": 2, "Succeeded": 3, "Failed": 4}


# --- the values -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PodInfo:
    """The facts about a pod that attribution and selection need.

    ``owner`` is the (kind, name) of the controller ownerReference — a ReplicaSet for a Deployment's pods.
    ``container_ports`` are the containerPorts of its containers (and restartable init containers).
    """

    namespace: str
    name: str
    labels: Mapping[str, str]
    node_name: str | None
    pod_ip: str | None
    container_ports: tuple[int, ...]
    phase: str
    owner: tuple[str, str] | None
    annotations: Mapping[str, str] = field(default_factory=dict)
    named_ports: Mapping[str, int] = field(default_factory=dict)  # containerPort by port name
    # Unix seconds: status.startTime, and the Ready condition's lastTransitionTime while it is True. Their
    # difference is the pod's measured start-up (image pull, model load), the forecast's default horizon.
    started_at: float | None = None
    ready_at: float | None = None

    @classmethod
    def from_object(cls, obj: Mapping[str, Any]) -> PodInfo:
        """Build from a Pod as the API serves it (a JSON dict)."""
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        status = obj.get("status") or {}
        ports: set[int] = set()
        named: dict[str, int] = {}
        containers = list(spec.get("containers") or [])
        # NB: sidecars (init containers with restartPolicy Always) keep running and may serve metrics.
        containers += [c for c in spec.get("initContainers") or [] if c.get("restartPolicy") == "Always"]
        for container in containers:
            for port in container.get("ports") or []:
                number = port.get("containerPort")
                if isinstance(number, int):
                    ports.add(number)
                    if port.get("name"):
                        named.setdefault(port["name"], number)
        owner = next(
            (
                (ref.get("kind", ""), ref.get("name", ""))
                for ref in meta.get("ownerReferences") or []
                if ref.get("controller")
            ),
            None,
        )
        return cls(
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            labels=dict(meta.get("labels") or {}),
            node_name=spec.get("nodeName") or None,
            pod_ip=status.get("podIP") or None,
            container_ports=tuple(sorted(ports)),
            phase=status.get("phase") or "Unknown",
            owner=owner,
            annotations=dict(meta.get("annotations") or {}),
            named_ports=named,
            started_at=_timestamp(status.get("startTime")),
            ready_at=next(
                (
                    _timestamp(c.get("lastTransitionTime"))
                    for c in status.get("conditions") or []
                    if c.get("type") == "Ready" and c.get("status") == "True"
                ),
                None,
            ),
        )


def _timestamp(text: object) -> float | None:
    """An RFC 3339 time as the API writes it, in Unix seconds; None when absent or unreadable."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """A Deployment or StatefulSet: its pod selector (``spec.selector``) and its own labels."""

    kind: str
    namespace: str
    name: str
    selector: LabelSelector
    labels: Mapping[str, str]
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_object(cls, kind: str, obj: Mapping[str, Any]) -> WorkloadInfo:
        meta = obj.get("metadata") or {}
        try:
            selector = LabelSelector.from_dict((obj.get("spec") or {}).get("selector"))
        except SelectorError as e:
            # NB: the apiserver validates workload selectors, so this is a broken object; select nothing.
            log.warning("%s %s/%s has an invalid selector: %s", kind, meta.get("namespace"), meta.get("name"), e)
            selector = LabelSelector.nothing()
        return cls(
            kind,
            meta.get("namespace", ""),
            meta.get("name", ""),
            selector,
            dict(meta.get("labels") or {}),
            dict(meta.get("annotations") or {}),
        )


# --- the seam ---------------------------------------------------------------------------------------


@runtime_checkable
class ClusterObjects(Protocol):
    """Cluster state for consumers: cheap, synchronous lookups, never an API call."""

    @property
    def synced(self) -> bool:
        """True once every kind has been listed; before that, absence proves nothing."""
        ...

    def namespaces(self) -> frozenset[str]: ...

    def pods(self, namespace: str | None = None) -> list[PodInfo]:
        """Pods of one namespace (all namespaces when None), sorted by namespace and name."""
        ...

    def pod(self, namespace: str, name: str) -> PodInfo | None: ...

    def select_pods(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        """Pods in ``namespace`` whose labels match, sorted by name."""
        ...

    def workload(self, kind: str, namespace: str, name: str) -> WorkloadInfo | None: ...

    def workloads(self, kind: str, namespace: str) -> list[WorkloadInfo]:
        """Workloads of one kind ("Deployment" | "StatefulSet") in a namespace, sorted by name."""
        ...

    def pods_of(self, workload: WorkloadInfo) -> list[PodInfo]:
        """Pods in the workload's namespace matching its selector (what the HPA averages over)."""
        ...

    def nodes(self) -> frozenset[str]: ...

    def node_labels(self, name: str) -> Mapping[str, str] | None: ...

    def select_nodes(self, selector: LabelSelector) -> list[str]:
        """Names of the nodes whose labels match, sorted."""
        ...

    def pod_at(self, ip: str, port: int) -> PodInfo | None:
        """The pod serving ip:port (its podIP and one of its containerPorts), preferring a Running one."""
        ...

    @property
    def generation(self) -> int:
        """Changes whenever any object changes: answers derived from the objects can be cached per value."""
        ...


class _Index:
    """The in-memory indices behind both implementations; every method is O(1) or O(objects touched)."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], PodInfo] = {}
        self.pods_by_namespace: dict[str, dict[str, PodInfo]] = {}
        # (namespace, label key, value) → pod names: a selector's equality terms find their pods without a scan
        self.pods_by_label: dict[tuple[str, str, str], set[str]] = {}
        self.endpoints: dict[tuple[str, int], set[tuple[str, str]]] = {}
        self.workloads: dict[tuple[str, str, str], WorkloadInfo] = {}
        self.workloads_by_namespace: dict[tuple[str, str], dict[str, WorkloadInfo]] = {}
        self.node_labels: dict[str, Mapping[str, str]] = {}
        self.namespace_names: frozenset[str] = frozenset()
        self.node_names: frozenset[str] = frozenset()
        self.generation = 0  # bumped on every change, so readers can cache derived answers

    # pods
    def put_pod(self, pod: PodInfo) -> None:
        # NB: most watch events change nothing kept here (conditions, restarts, resourceVersion): leaving the
        # generation alone keeps every answer derived from it cached (adapter/answers.py).
        if self.pods.get((pod.namespace, pod.name)) == pod:
            return
        self.generation += 1
        self.remove_pod(pod.namespace, pod.name)
        key = (pod.namespace, pod.name)
        self.pods[key] = pod
        self.pods_by_namespace.setdefault(pod.namespace, {})[pod.name] = pod
        for label in pod.labels.items():
            self.pods_by_label.setdefault((pod.namespace, *label), set()).add(pod.name)
        if pod.pod_ip:
            for port in pod.container_ports:
                self.endpoints.setdefault((pod.pod_ip, port), set()).add(key)

    def remove_pod(self, namespace: str, name: str) -> None:
        self.generation += 1
        old = self.pods.pop((namespace, name), None)
        if old is None:
            return
        in_namespace = self.pods_by_namespace.get(namespace)
        if in_namespace is not None:
            in_namespace.pop(name, None)
            if not in_namespace:
                del self.pods_by_namespace[namespace]
        for label in old.labels.items():
            names = self.pods_by_label.get((namespace, *label))
            if names is not None:
                names.discard(name)
                if not names:
                    del self.pods_by_label[(namespace, *label)]
        if old.pod_ip:
            for port in old.container_ports:
                holders = self.endpoints.get((old.pod_ip, port))
                if holders is not None:
                    holders.discard((namespace, name))
                    if not holders:
                        del self.endpoints[(old.pod_ip, port)]

    def set_pods(self, pods: Iterable[PodInfo]) -> None:
        self.generation += 1
        self.pods, self.pods_by_namespace, self.endpoints, self.pods_by_label = {}, {}, {}, {}
        for pod in pods:
            self.put_pod(pod)

    # workloads
    def put_workload(self, workload: WorkloadInfo) -> None:
        if self.workloads.get((workload.kind, workload.namespace, workload.name)) == workload:
            return  # NB: a status update (replicas, conditions): see put_pod
        self.generation += 1
        self.workloads[(workload.kind, workload.namespace, workload.name)] = workload
        self.workloads_by_namespace.setdefault((workload.kind, workload.namespace), {})[workload.name] = workload

    def remove_workload(self, kind: str, namespace: str, name: str) -> None:
        self.generation += 1
        if self.workloads.pop((kind, namespace, name), None) is None:
            return
        group = self.workloads_by_namespace.get((kind, namespace))
        if group is not None:
            group.pop(name, None)
            if not group:
                del self.workloads_by_namespace[(kind, namespace)]

    def set_workloads(self, kind: str, workloads: Iterable[WorkloadInfo]) -> None:
        self.generation += 1
        for key in [k for k in self.workloads if k[0] == kind]:
            self.remove_workload(*key)
        for workload in workloads:
            self.put_workload(workload)

    # nodes and namespaces (frozen sets rebuilt on change, so readers get them without copying)
    def put_node(self, name: str, labels: Mapping[str, str]) -> None:
        if name in self.node_names and self.node_labels.get(name) == labels:
            return  # NB: a status update (conditions, heartbeats): see put_pod
        self.generation += 1
        self.node_labels[name] = labels
        if name not in self.node_names:
            self.node_names = self.node_names | {name}

    def remove_node(self, name: str) -> None:
        self.generation += 1
        if self.node_labels.pop(name, None) is not None:
            self.node_names = self.node_names - {name}

    def set_nodes(self, nodes: Mapping[str, Mapping[str, str]]) -> None:
        self.generation += 1
        self.node_labels = dict(nodes)
        self.node_names = frozenset(nodes)

    def put_namespace(self, name: str) -> None:
        if name not in self.namespace_names:
            self.generation += 1
            self.namespace_names = self.namespace_names | {name}

    def remove_namespace(self, name: str) -> None:
        self.generation += 1
        self.namespace_names = self.namespace_names - {name}

    def set_namespaces(self, names: Iterable[str]) -> None:
        self.generation += 1
        self.namespace_names = frozenset(names)


class IndexedClusterObjects:
    """The ClusterObjects queries, answered from an ``_Index``."""

    def __init__(self) -> None:
        self._index = _Index()

    @property
    def generation(self) -> int:
        return self._index.generation

    def namespaces(self) -> frozenset[str]:
        return self._index.namespace_names

    def pods(self, namespace: str | None = None) -> list[PodInfo]:
        # NB: .get, not [], on names listed a moment earlier: the refresh thread (forecasts, prepared answers)
        # reads while the watch changes the index on the event loop, and a pod deleted in between is skipped.
        pods = self._index.pods if namespace is None else self._index.pods_by_namespace.get(namespace, {})
        return [p for k in sorted(pods) if (p := pods.get(k)) is not None]

    def pod(self, namespace: str, name: str) -> PodInfo | None:
        return self._index.pods.get((namespace, name))

    def select_pods(self, namespace: str, selector: LabelSelector) -> list[PodInfo]:
        """The namespace's pods the selector matches, by name. Equality and ``in`` terms (every HPA's
        ``matchLabels``) narrow the candidates through the label index first: O(pods selected), not O(namespace)
        — the adapter selects again for every HPA query whenever any pod changes."""
        index = self._index
        in_namespace = index.pods_by_namespace.get(namespace, {})
        candidates: set[str] | None = None
        for r in selector.requirements:
            if r.operator in (EQUALS, DOUBLE_EQUALS, IN):
                # NB: set() of one C-level copy: the refresh thread may read while the loop changes the index
                names = set().union(*(index.pods_by_label.get((namespace, r.key, v), ()) for v in r.values))
                candidates = names if candidates is None else candidates & names
        names = sorted(in_namespace) if candidates is None else sorted(candidates)
        return [p for n in names if (p := in_namespace.get(n)) is not None and selector.matches(p.labels)]

    def workload(self, kind: str, namespace: str, name: str) -> WorkloadInfo | None:
        return self._index.workloads.get((kind, namespace, name))

    def workloads(self, kind: str, namespace: str) -> list[WorkloadInfo]:
        group = self._index.workloads_by_namespace.get((kind, namespace), {})
        return [w for n in sorted(group) if (w := group.get(n)) is not None]  # NB: .get: see pods

    def pods_of(self, workload: WorkloadInfo) -> list[PodInfo]:
        return self.select_pods(workload.namespace, workload.selector)

    def nodes(self) -> frozenset[str]:
        return self._index.node_names

    def node_labels(self, name: str) -> Mapping[str, str] | None:
        return self._index.node_labels.get(name)

    def select_nodes(self, selector: LabelSelector) -> list[str]:
        labels = self._index.node_labels
        return sorted(n for n, node_labels in labels.items() if selector.matches(node_labels))

    def pod_at(self, ip: str, port: int) -> PodInfo | None:
        # NB: called by the build between the watch's changes (and by a source's own thread): copy the holders in one
        # C call and skip a pod deleted meanwhile, rather than iterate a live set.
        holders = tuple(self._index.endpoints.get((ip, port), ()))
        pods = [p for p in map(self._index.pods.get, holders) if p is not None]
        if not pods:
            return None
        return min(pods, key=lambda p: (_PHASE_PREFERENCE.get(p.phase, 5), p.namespace, p.name))


class StaticClusterObjects(IndexedClusterObjects):
    """A fixed cluster, for unit tests and tools without an API server. Always synced.

    ``nodes`` is a list of names or a mapping of name → labels; ``namespaces`` defaults to the namespaces
    of the given pods and workloads.
    """

    def __init__(
        self,
        *,
        pods: Iterable[PodInfo] = (),
        workloads: Iterable[WorkloadInfo] = (),
        nodes: Iterable[str] | Mapping[str, Mapping[str, str]] = (),
        namespaces: Iterable[str] | None = None,
    ) -> None:
        super().__init__()
        pods, workloads = list(pods), list(workloads)
        self._index.set_pods(pods)
        for workload in workloads:
            self._index.put_workload(workload)
        if isinstance(nodes, Mapping):
            self._index.set_nodes({name: dict(labels) for name, labels in nodes.items()})
        else:
            self._index.set_nodes({name: {} for name in nodes})
        if namespaces is None:
            namespaces = {p.namespace for p in pods} | {w.namespace for w in workloads}
        self._index.set_namespaces(namespaces)

    @property
    def synced(self) -> bool:
        return True
