"""What the adapter knows about the cluster: pods, workloads, nodes and namespaces, cached by list+watch.

The adapter answers an HPA request from memory; a request never calls the Kubernetes API. The typed seam
is ``ClusterObjects`` (a Protocol); two honest implementations sit behind it:

* ``StaticClusterObjects`` — fixed lists, for unit tests and one-shot tools;
* ``KubeCache`` — kubernetes-asyncio, one loop per resource in the style of kopf's ``infinite_watch`` and
  client-go's reflector::

      list (paged) ──► replace the index ──► watch from the list's resourceVersion ──► apply each event
        ▲                                        │ stream ended (timeoutSeconds): watch again from the
        │                                        │   last resourceVersion seen (events and BOOKMARKs)
        └── 410 Gone (ERROR event or HTTP 410) ◄─┘ other errors: back off (doubling, capped), resume

  A relist replaces everything of that kind, so an object deleted while no watch was open disappears:
  a DELETED is never lost, it is at worst learned late.

Indices make every lookup O(1) or O(pods in the namespace): pods by (namespace, name), by namespace and by
(podIP, containerPort) — the last attributes a scraped exporter URL to the pod serving it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import aiohttp
from kubernetes_asyncio import client, config

from gpuscale.backoff import Backoff
from gpuscale.config import read_yaml
from gpuscale.errors import SelectorError, SourceUnavailable
from gpuscale.files import named_by
from gpuscale.selectors import DOUBLE_EQUALS, EQUALS, IN, LabelSelector
from gpuscale.sources.base import TargetHealth
from gpuscale.sources.credentials import read_pem, read_token

__all__ = [
    "ClusterObjects",
    "KubeCache",
    "PodInfo",
    "StaticClusterObjects",
    "WorkloadInfo",
    "load_api_client",
]

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
DEPLOYMENT = "Deployment"
STATEFULSET = "StatefulSet"
_LIST_PAGE_SIZE = 500
_LIST_TIMEOUT_SECONDS = 60.0
_INITIAL_BACKOFF_SECONDS = 0.5
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


class _IndexedClusterObjects:
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
        # NB: called from the pipeline's build thread while the watch may change the index on the event loop:
        # copy the holders in one C call and skip a pod deleted meanwhile, rather than iterate a live set.
        holders = tuple(self._index.endpoints.get((ip, port), ()))
        pods = [p for p in map(self._index.pods.get, holders) if p is not None]
        if not pods:
            return None
        return min(pods, key=lambda p: (_PHASE_PREFERENCE.get(p.phase, 5), p.namespace, p.name))


class StaticClusterObjects(_IndexedClusterObjects):
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


# --- the Kubernetes-backed cache --------------------------------------------------------------------


class WatchExpired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone): relist."""


@dataclass(frozen=True, slots=True)
class WatchedKind:
    """One cached resource: how to list/watch it and how its objects enter the index."""

    name: str
    list_call: Callable[..., Awaitable[Any]]
    replace: Callable[[list[dict[str, Any]]], None]
    put: Callable[[dict[str, Any]], None]
    remove: Callable[[dict[str, Any]], None]


def namespaced_name(obj: Mapping[str, Any]) -> tuple[str, str]:
    """An object's (namespace, name); ``""`` for a cluster-scoped object's namespace."""
    meta = obj.get("metadata") or {}
    return meta.get("namespace", ""), meta.get("name", "")


class Reflector:
    """List+watch loops over a set of kinds (client-go's reflector, kopf's ``infinite_watch``): the machinery
    every cache here shares. A subclass sets ``self._kinds`` (how to list each kind and where its objects go);
    ``name`` labels its health entries.

    ``watch_timeout_seconds`` is the server-side ``timeoutSeconds`` of each watch request;
    ``backoff_max_seconds`` caps the doubling delay after errors.
    """

    name = SOURCE

    def __init__(self, *, watch_timeout_seconds: int = 300, backoff_max_seconds: float = 30) -> None:
        self._watch_timeout = int(watch_timeout_seconds)
        self._backoff_max = float(backoff_max_seconds)
        self._kinds: tuple[WatchedKind, ...] = ()
        self._listed: set[str] = set()
        self._synced_event = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.last_errors: dict[str, str] = {}
        """kind → the last error its loop met (cleared by the next successful list); for readiness messages."""
        self._answered_at: dict[str, float] = {}  # kind → when the API last answered its list or watch
        self._failures: dict[str, int] = {}
        self._last_problem: dict[str, tuple[str, float]] = {}  # kind → (reason, when), kept after recovery
        self.relists = 0
        """How many times a watch expired (410 Gone) and its kind was listed again."""
        self.relist_after_error = False
        """Whether a watch error (not a clean end) leads to a new list rather than a watch resumed from the last
        resourceVersion: a cache others act on (the controller's) is confirmed again by a list after any outage."""
        self._confirmed: set[str] = set()  # kinds listed since their last watch error
        self._unconfirmed_since: dict[str, float] = {}  # kind → when its last error made it unconfirmed
        self._confirm_changed = asyncio.Event()  # set by every list: what ``reconfirm`` waits on
        self._said: dict[str, tuple[str, float]] = {}  # kind → (problem last logged, when)

    def health(self) -> list[TargetHealth]:
        """One entry per kind, as sources report targets: /metrics and /readyz show an API outage with them."""
        out = []
        for kind in self._kinds:
            error = self.last_errors.get(kind.name)
            problem, problem_at = self._last_problem.get(kind.name, (None, None))
            out.append(
                TargetHealth(
                    kind.name,
                    error is None and kind.name in self._listed,
                    last_success=self._answered_at.get(kind.name),
                    error=error if error is not None else (None if kind.name in self._listed else "not listed yet"),
                    failures_total=self._failures.get(kind.name, 0),
                    error_kind="api_error" if error is not None else None,
                    last_error=problem,
                    last_error_kind="api_error" if problem is not None else None,
                    last_error_at=problem_at,
                )
            )
        return out

    def _answered(self, kind: str) -> None:
        self._answered_at[kind] = time.time()
        self.last_errors.pop(kind, None)

    @property
    def synced(self) -> bool:
        return self._synced_event.is_set()

    # -- lifecycle

    async def start(self) -> None:
        """Start the list+watch loops (idempotent). Returns at once; see ``wait_synced``."""
        if self._tasks:
            return
        self._tasks = [asyncio.create_task(self._run(kind), name=f"kube-watch-{kind.name}") for kind in self._kinds]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def wait_synced(self, timeout: float) -> None:
        """Wait until every kind has been listed once; SourceUnavailable after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(self._synced_event.wait(), timeout)
        except TimeoutError:
            missing = ", ".join(k.name for k in self._kinds if k.name not in self._listed)
            errors = "; ".join(f"{k}: {e}" for k, e in sorted(self.last_errors.items()))
            reason = f"cache not synced after {timeout:g}s ({missing} not listed yet)"
            raise SourceUnavailable(SOURCE, f"{reason}: {errors}" if errors else reason) from None

    async def refresh_once(self) -> None:
        """List every kind once and replace the indices; SourceUnavailable if the API cannot be read."""
        results = await asyncio.gather(*(self._list(kind) for kind in self._kinds), return_exceptions=True)
        for kind, result in zip(self._kinds, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, SourceUnavailable):
                    raise result
                if isinstance(result, asyncio.CancelledError):
                    raise result
                raise api_unavailable(kind.name, result) from result

    # -- the loop

    async def _run(self, kind: WatchedKind) -> None:
        backoff = self._backoff()
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    resource_version = await self._list(kind)
                    backoff.reset()
                loop = asyncio.get_running_loop()
                started = loop.time()
                resource_version, events = await self._watch(kind, resource_version)
                self._answered(kind.name)
                if events == 0 and loop.time() - started < 1.0:
                    # NB: a server that ends watches at once would otherwise have us spinning.
                    await asyncio.sleep(backoff.next_delay())
                else:
                    backoff.reset()
            except WatchExpired as e:
                if resource_version is None:  # the list itself expired (a stale continue token): not too fast
                    await asyncio.sleep(backoff.next_delay())
                log.info("kubernetes %s watch expired (%s); relisting", kind.name, e)
                self.relists += 1
                resource_version = None
            except asyncio.CancelledError:
                raise
            except (
                SourceUnavailable,
                client.ApiException,
                aiohttp.ClientError,
                OSError,
                TimeoutError,
                ValueError,
            ) as e:
                if self.relist_after_error:
                    resource_version = None
                    if kind.name in self._confirmed:
                        self._confirmed.discard(kind.name)
                        self._unconfirmed_since[kind.name] = time.time()
                error = api_unavailable(kind.name, e)
                self.last_errors[kind.name] = error.reason
                self._failures[kind.name] = self._failures.get(kind.name, 0) + 1
                self._last_problem[kind.name] = (error.reason, time.time())
                # NB: a 429 or 503 says when to come back; never sooner than it asks.
                delay = max(backoff.next_delay(), _retry_after(e))
                # NB: said once per distinct problem (and every 5 minutes while it lasts), not every retry
                said, said_at = self._said.get(kind.name, ("", 0.0))
                if said != error.reason or time.monotonic() - said_at > 300:
                    log.warning("%s; retrying with backoff (now %.1fs)", error, delay)
                    self._said[kind.name] = (error.reason, time.monotonic())
                await asyncio.sleep(delay)

    def _backoff(self) -> Backoff:
        """A loop's delays after errors: from 0.5 s, doubling up to ``backoff_max_seconds``, ±20 % jitter."""
        return Backoff(initial_seconds=_INITIAL_BACKOFF_SECONDS, max_seconds=self._backoff_max, jitter=0.2)

    async def _list(self, kind: WatchedKind) -> str:
        """List every object of a kind (paged), replace its index, return the list's resourceVersion."""
        items: list[dict[str, Any]] = []
        resource_version = ""
        token: str | None = None
        while True:
            response = await kind.list_call(
                limit=_LIST_PAGE_SIZE,
                _continue=token,
                _preload_content=False,
                _request_timeout=_LIST_TIMEOUT_SECONDS,
            )
            try:
                body = await read_json(response)
            finally:
                response.release()
            items.extend(body.get("items") or [])
            meta = body.get("metadata") or {}
            resource_version = resource_version or meta.get("resourceVersion", "")
            token = meta.get("continue") or None
            if token is None:
                break
        kind.replace(items)
        self._listed.add(kind.name)
        self._confirmed.add(kind.name)
        self._unconfirmed_since.pop(kind.name, None)
        self._said.pop(kind.name, None)
        self._confirm_changed.set()
        self._answered(kind.name)
        if len(self._listed) == len(self._kinds):
            self._synced_event.set()
        log.debug("listed %d %s at resourceVersion %s", len(items), kind.name, resource_version)
        return resource_version

    async def _watch(self, kind: WatchedKind, resource_version: str) -> tuple[str, int]:
        """Apply one watch stream's events; return the resourceVersion to resume from and the event count."""
        events = 0
        async for event_type, obj in watch_events(
            kind.list_call, resource_version=resource_version, timeout_seconds=self._watch_timeout
        ):
            events += 1
            self._answered_at[kind.name] = time.time()
            resource_version = (obj.get("metadata") or {}).get("resourceVersion") or resource_version
            if event_type in ("ADDED", "MODIFIED"):
                kind.put(obj)
            elif event_type == "DELETED":
                kind.remove(obj)
            # BOOKMARK: only the resourceVersion moves.
        return resource_version, events


class KubeCache(_IndexedClusterObjects, Reflector):
    """ClusterObjects kept current by list+watch over kubernetes-asyncio.

    ``start()`` launches one loop per kind (pods, namespaces, nodes, deployments, statefulsets) and returns at
    once; ``wait_synced()`` waits for every kind's first list. ``refresh_once()`` does one list pass, for
    callers that run no loops (tests, one-shot commands). The ApiClient stays the caller's to close.
    ``watch_timeout_seconds`` is the server-side ``timeoutSeconds`` of each watch request;
    ``backoff_max_seconds`` caps the doubling delay after errors.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        watch_timeout_seconds: int = 300,
        backoff_max_seconds: float = 30,
    ) -> None:
        _IndexedClusterObjects.__init__(self)
        Reflector.__init__(self, watch_timeout_seconds=watch_timeout_seconds, backoff_max_seconds=backoff_max_seconds)
        core = client.CoreV1Api(api_client)
        apps = client.AppsV1Api(api_client)
        index = self._index
        self._kinds = (
            WatchedKind(
                "pods",
                core.list_pod_for_all_namespaces,
                lambda objs: index.set_pods(PodInfo.from_object(o) for o in objs),
                lambda obj: index.put_pod(PodInfo.from_object(obj)),
                lambda obj: index.remove_pod(*namespaced_name(obj)),
            ),
            WatchedKind(
                "namespaces",
                core.list_namespace,
                lambda objs: index.set_namespaces(namespaced_name(o)[1] for o in objs),
                lambda obj: index.put_namespace(namespaced_name(obj)[1]),
                lambda obj: index.remove_namespace(namespaced_name(obj)[1]),
            ),
            WatchedKind(
                "nodes",
                core.list_node,
                lambda objs: index.set_nodes({namespaced_name(o)[1]: _labels(o) for o in objs}),
                lambda obj: index.put_node(namespaced_name(obj)[1], _labels(obj)),
                lambda obj: index.remove_node(namespaced_name(obj)[1]),
            ),
            self._workload_kind("deployments", DEPLOYMENT, apps.list_deployment_for_all_namespaces),
            self._workload_kind("statefulsets", STATEFULSET, apps.list_stateful_set_for_all_namespaces),
        )

    def _workload_kind(self, name: str, kind: str, list_call: Callable[..., Awaitable[Any]]) -> WatchedKind:
        index = self._index
        return WatchedKind(
            name,
            list_call,
            lambda objs: index.set_workloads(kind, (WorkloadInfo.from_object(kind, o) for o in objs)),
            lambda obj: index.put_workload(WorkloadInfo.from_object(kind, obj)),
            lambda obj: index.remove_workload(kind, *namespaced_name(obj)),
        )


def _retry_after(error: BaseException) -> float:
    """Seconds a 429/503 answer's Retry-After asks for (0 when none)."""
    if isinstance(error, client.ApiException) and error.status in (429, 503):
        try:
            return min(float((error.headers or {}).get("Retry-After", 0)), 60.0)
        except (TypeError, ValueError):
            return 0.0
    return 0.0


async def watch_events(
    list_call: Callable[..., Awaitable[Any]], *, resource_version: str, timeout_seconds: int, **list_kwargs: Any
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """One watch stream as (event type, object) pairs, until the server closes it after ``timeout_seconds``.

    Raises ``WatchExpired`` for a 410 (in an ERROR event or as the HTTP status): the caller relists.
    Other ERROR events and statuses raise ``client.ApiException``. Shared by every list+watch loop here.
    """
    response = await list_call(
        **list_kwargs,
        watch=True,
        resource_version=resource_version,
        timeout_seconds=timeout_seconds,
        allow_watch_bookmarks=True,
        _preload_content=False,
        _request_timeout=aiohttp.ClientTimeout(
            total=None, sock_connect=_LIST_TIMEOUT_SECONDS, sock_read=timeout_seconds + 30
        ),
    )
    try:
        if response.status != 200:
            await read_json(response)  # raises with the server's Status
        async for raw in response.content:
            line = raw.strip()
            if not line:
                continue
            event = json.loads(line)
            event_type = event.get("type")
            obj = event.get("object") or {}
            if event_type == "ERROR":
                if obj.get("code") == 410:
                    raise WatchExpired(obj.get("message", "410 Gone"))
                raise client.ApiException(status=obj.get("code"), reason=f"{obj.get('reason')}: {obj.get('message')}")
            yield event_type, obj
    finally:
        response.close()


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


async def read_json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    """The JSON body of a 2xx response; ``WatchExpired`` for 410, ``client.ApiException`` for other statuses."""
    raw = await response.read()
    if response.status == 410:
        raise WatchExpired(raw.decode(errors="replace")[:200])
    if not 200 <= response.status < 300:
        error = client.ApiException(status=response.status, reason=response.reason)
        error.body = raw
        raise error
    body = json.loads(raw)
    if not isinstance(body, dict):
        raise ValueError("the API server answered with JSON that is not an object")
    return body


def api_unavailable(kind: str, error: BaseException) -> SourceUnavailable:
    if isinstance(error, SourceUnavailable):
        return error
    if isinstance(error, client.ApiException):
        detail = f"HTTP {error.status} {error.reason}"
        body = getattr(error, "body", None)
        if body:
            with contextlib.suppress(ValueError, AttributeError):
                detail += f": {json.loads(body).get('message', '')}"
        if error.status in (401, 403):
            detail += " — this identity needs list and watch on it: apply deploy/'s RBAC for this component"
    else:
        detail = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return SourceUnavailable(SOURCE, f"cannot list/watch {kind}: {detail}")


async def load_api_client(kubeconfig: str | os.PathLike[str] | None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else from the in-cluster service account.

    Raises SourceUnavailable saying which was tried and why it failed, ConfigError naming the file when the
    kubeconfig (or a file it names) is not one to read (``read_kubeconfig``). The caller closes the client.
    """
    if kubeconfig is not None:
        path = os.fspath(kubeconfig)
        if not os.path.lexists(path):
            raise SourceUnavailable(SOURCE, f"kubeconfig {path} does not exist")
        data = _with_files_inlined(read_kubeconfig(path), path)
        try:
            return await config.new_client_from_config_dict(config_dict=data)
        except (config.ConfigException, AssertionError, AttributeError, ValueError, KeyError, TypeError) as e:
            # NB: the client asserts that the current context exists, and indexes whatever types it is given
            reason = " ".join(str(e).split()) or "the current context, its cluster or its user is missing"
            raise SourceUnavailable(SOURCE, f"cannot load kubeconfig {path}: {reason}") from e
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as e:
        raise SourceUnavailable(
            SOURCE,
            f"no kubeconfig given and not running in a cluster ({e}); pass a kubeconfig or run in a pod with a "
            "service account",
        ) from e
    return client.ApiClient(configuration)


def read_kubeconfig(path: str) -> dict[str, Any]:
    """The kubeconfig at ``path`` as plain data, read as every config file is (files.py, config.read_yaml: a
    regular file of at most 4 MiB, YAML aliases and nesting bounded, no key twice); ConfigError naming the file.

    NB: kubernetes-asyncio reads it itself, whole, with PyYAML's pure-Python yaml.safe_load (a 100 MB kubeconfig
    was still being parsed after 20 s), takes a "billion laughs" file (its aliases stay shared references until
    something walks them) and opens the files it names with open().read() (a FIFO tokenFile blocked the command
    for good, past SIGTERM)."""
    with named_by("--kubeconfig"):
        return dict(read_yaml(Path(path), what="kubeconfig"))


def check_kubeconfig(path: str) -> None:
    """What load_api_client reads of a kubeconfig (the file, and the files its current context names) is readable
    within limits; ConfigError naming the file otherwise. For a command that reaches the API late (report, after
    its fetch): a bad --kubeconfig is refused at once rather than after minutes of work."""
    _with_files_inlined(read_kubeconfig(path), path)


_FILE_KEYS = {
    "clusters": (("certificate-authority", "certificate-authority-data", "CA bundle"),),
    "users": (
        ("client-certificate", "client-certificate-data", "client certificate"),
        ("client-key", "client-key-data", "client key"),
    ),
}
"""Per kubeconfig list, the keys naming a PEM file, the key the client prefers holding it inline (base64), and
what the file is."""


def _with_files_inlined(data: dict[str, Any], path: str) -> dict[str, Any]:
    """``data`` with the files its current context's cluster and user name (CA, client certificate and key, token
    file) read within files.py's limits and put inline, so that the client opens none of them itself. A relative
    name is relative to the kubeconfig's directory, as for kubectl. Entries of other contexts are not read: a
    missing file there is no error, as for kubectl; what does not have the expected shape is left to the client
    to refuse."""
    context = current_context(data)
    if context is None:
        return data
    base = os.path.dirname(os.path.abspath(path))
    out = dict(data)
    for section, ref in (("clusters", "cluster"), ("users", "user")):
        entry = _named_entry(data.get(section), context.get(ref), ref)
        if not isinstance(entry, dict):
            continue
        inlined = dict(entry)
        where = f"of {ref} {context.get(ref)!r} in --kubeconfig {path}"
        for file_key, data_key, what in _FILE_KEYS[section]:
            name = entry.get(file_key)
            if isinstance(name, str) and name and not entry.get(data_key):
                pem = read_pem(os.path.join(base, name), flag=f"{file_key} {where}", what=what)
                inlined[data_key] = base64.standard_b64encode(pem).decode("ascii")
        token_file = entry.get("tokenFile")
        if section == "users" and isinstance(token_file, str) and token_file and not entry.get("token"):
            inlined["token"] = read_token(os.path.join(base, token_file), flag=f"tokenFile {where}")
        out[section] = [
            {**item, ref: inlined} if isinstance(item, dict) and item.get("name") == context.get(ref) else item
            for item in data[section]
        ]
    return out


def current_context(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``context`` of a kubeconfig's current context (cluster, user, namespace), else None."""
    context = _named_entry(data.get("contexts"), data.get("current-context"), "context")
    return context if isinstance(context, dict) else None


def _named_entry(items: Any, name: Any, key: str) -> Any:
    """``items[i][key]`` where ``items[i]["name"] == name`` (a kubeconfig's clusters, users, contexts), else None."""
    if not isinstance(items, list) or name is None:
        return None
    return next((item.get(key) for item in items if isinstance(item, dict) and item.get("name") == name), None)


class ApiServerSession:
    """An aiohttp session that talks to the API server as an ApiClient does — its CA, client certificate and
    bearer token — for the requests kubernetes-asyncio has no method for, such as a pod's ``proxy`` subresource
    (``gpuscale top --discover-exporters`` scrapes exporters through it). ``refresh_token`` before a round of
    requests picks up a token an exec plugin or a projected service-account token has renewed."""

    def __init__(self, api: client.ApiClient) -> None:
        import ssl

        configuration = api.configuration
        self.host = configuration.host.rstrip("/")
        self._configuration = configuration
        ssl_context: ssl.SSLContext | bool = False
        if self.host.startswith("https"):
            ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                ssl_context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
            if not configuration.verify_ssl:
                ssl_context.check_hostname = False
                ssl_context.verify_mode = ssl.CERT_NONE
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context))

    async def refresh_token(self) -> None:
        token = await self._configuration.get_api_key_with_prefix("BearerToken")
        if token:
            self.session.headers["Authorization"] = token

    async def close(self) -> None:
        await self.session.close()
