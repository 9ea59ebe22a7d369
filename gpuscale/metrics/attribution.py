"""Attribution: which GPU (device), pod, node and namespace a series value belongs to.

The rules, and the bugs they avoid (prometheus-adapter #456/#630, dcgm-exporter #42):

* DCGM series name their workload in labels the exporter adds from the kubelet: ``pod``/``namespace``/
  ``container``; ``pod_name``/``pod_namespace`` with ``-o``; ``exported_pod``/``exported_namespace`` after
  Prometheus relabelling with ``honorLabels: false`` — in which case ``pod``/``namespace`` are the
  *exporter's* target labels and must not be read as the workload.
* A DCGM series whose pod label names the exporter itself (idle GPU seen through Prometheus) belongs to
  its node only, as do GPUs with no pod labels (dcgm-exporter ≥ 4.0 drops them for idle GPUs).
* Every other series (Triton) belongs to the pod that serves it: the scrape target. Triton's own
  ``namespace`` label is *model* namespacing, so it is never read as a Kubernetes namespace unless the
  series also carries a ``pod`` label (a Prometheus target label).
* A router's per-backend series (the vLLM production-stack router's ``vllm:num_requests_waiting{server=
  "http://10.42.1.17:8000"}``) belong to the backend pod that URL resolves to, when it resolves to one;
  otherwise to the router. A server behind a sidecar (KServe's queue-proxy, a metrics-merging sidecar) needs
  nothing special: the scrape URL's port is one of the pod's containerPorts, so the target is the pod.
* A device is one physical GPU, or one MIG instance (``GPU_I_ID``); ``physical`` keys the parent GPU so
  parent-level values repeated on every MIG instance (power) can be counted once.
* DRA (dcgm-exporter with ``KUBERNETES_ENABLE_DRA``, the GPU Operator's default): a GPU allocated through a
  ResourceClaim carries ``dra_claim_namespace``/``dra_claim_name`` (and driver, pool, device) beside
  ``pod``/``namespace``; its values count towards the pod *and* the claim. A MIG instance allocated through a
  claim is identified by ``dra_mig_device_uuid`` as well as ``GPU_I_ID``; its parent stays the physical GPU.
  A claim shared by several pods repeats the GPU's series per pod: they are kept apart, as virtual GPUs are.
* Node: the scrape target's node when the Kubernetes API knows it (the legacy exporter's ``Hostname`` is
  its pod name), else the ``Hostname``/``hostname`` label.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from gpuscale.metrics.steps import Steps, finish
from gpuscale.model import RESOURCE_CLAIM, ObjectRef, namespace, node, pod


@dataclass(frozen=True, slots=True)
class Target:
    """What the Kubernetes API knows about a scrape target (an exporter or Triton endpoint)."""

    url: str
    pod: ObjectRef | None = None
    node: str | None = None


class Device(NamedTuple):
    """Where a series' values count: one GPU or MIG instance (``key[0] == "gpu"``), or one Triton series.

    A NamedTuple, not a dataclass: one is built per distinct label set on a cold refresh (20,000 at
    10,000 GPUs), and a frozen dataclass costs five times as much to build.
    """

    key: tuple[str, ...]
    physical: tuple[str, ...]
    pod: ObjectRef | None
    node: str | None
    labels: tuple[tuple[str, str], ...]  # the series' metric labels, for external-metric selectors
    objects: tuple[ObjectRef, ...] = ()  # what its values count towards: its pod, namespace, node (and claim)
    claim: ObjectRef | None = None  # the DRA ResourceClaim the GPU is allocated through

    @property
    def namespace(self) -> str | None:
        return self.pod.namespace if self.pod else None


@functools.lru_cache(maxsize=65536)
def _objects(owner: ObjectRef | None, node_name: str | None, claim: ObjectRef | None = None) -> tuple[ObjectRef, ...]:
    """What a device's values count towards; cached, since a pod's or node's devices all share it."""
    objects: list[ObjectRef] = []
    if owner is not None:
        objects += [owner, namespace(owner.namespace or "")]
    if node_name:
        objects.append(node(node_name))
    if claim is not None:
        objects.append(claim)
    return tuple(objects)


def _device(
    key: tuple[str, ...],
    physical: tuple[str, ...],
    owner: ObjectRef | None,
    node_name: str | None,
    labels: tuple[tuple[str, str], ...],
    claim: ObjectRef | None = None,
) -> Device:
    return Device(key, physical, owner, node_name, labels, _objects(owner, node_name, claim), claim)


POD_LABELS = (
    ("exported_pod", "exported_namespace"),
    ("pod", "namespace"),
    ("pod_name", "pod_namespace"),
)
"""(pod label, namespace label) pairs in the order they win: the first pair whose pod label is set names the
workload. A series with none of the pod labels belongs to its scrape target (or only to its node)."""
_GPU_ID_LABELS = ("UUID", "uuid", "gpu_uuid")
_HOST_LABELS = ("Hostname", "hostname")
# dcgm-exporter's DRA attributes (KUBERNETES_ENABLE_DRA): which claim, driver, pool and device a GPU is allocated as.
DRA_LABELS = (
    "dra_claim_name",
    "dra_claim_namespace",
    "dra_driver_name",
    "dra_pool_name",
    "dra_device_name",
    "dra_mig_profile",
    "dra_mig_device_uuid",
)
# Labels that say *where* a series lives rather than what it measures: not offered to external selectors.
_PLACEMENT_LABELS = frozenset(
    {
        "pod",
        "namespace",
        "container",
        "pod_uid",
        "pod_name",
        "pod_namespace",
        "container_name",
        "exported_pod",
        "exported_namespace",
        "exported_container",
        "Hostname",
        "hostname",
        "instance",
        "job",
        "endpoint",
        "service",
        "server",
        *DRA_LABELS,
    }
)
# Labels naming the backend URL a router's series describe.
_BACKEND_LABELS = ("server",)


def _is_dcgm(name: str, labels: Mapping[str, str]) -> bool:
    return name.startswith(("DCGM_", "dcgm_")) or "UUID" in labels


def _labelled_pod(labels: Mapping[str, str]) -> ObjectRef | None:
    for pod_key, ns_key in POD_LABELS:
        name = labels.get(pod_key)
        if name:
            ns = labels.get(ns_key)
            return pod(ns, name) if ns else None
    return None


# Every label ``attribute`` reads to place a DCGM series; the rest only become ``Device.labels``.
_DCGM_PLACEMENT_LABELS = (
    *_HOST_LABELS,
    *(key for pair in POD_LABELS for key in pair),
    *_GPU_ID_LABELS,
    "gpu",
    "GPU_I_ID",
    "vgpu",
    "dra_claim_namespace",
    "dra_claim_name",
    "dra_mig_device_uuid",
)


def dcgm_placement(labels: Mapping[str, str]) -> tuple[str | None, ...]:
    """The label values that place a DCGM series: from one target, equal tuples → the same device key,
    pod and node (``Device.labels`` may differ). dcgm-exporter writes each GPU's identity on every field
    with extra labels on a few (``err_code``, ``xid``), so callers that group series by device compare
    these few values instead of attributing every label set.
    """
    return tuple(map(labels.get, _DCGM_PLACEMENT_LABELS))


def backend_url(labels: Mapping[str, str]) -> str | None:
    """The backend URL a router's series names (``server="http://host:port"``), if any."""
    for key in _BACKEND_LABELS:
        value = labels.get(key)
        if value and value.startswith(("http://", "https://")):
            return value
    return None


def attribute(name: str, labels: Mapping[str, str], target: Target, *, backend: Target | None = None) -> Device:
    """Place one series. Pure; the caller memoises per (target, labels) if it needs speed.

    ``backend``: what the series' backend URL (``backend_url``) resolves to, for a router's series.
    """
    get = labels.get
    if backend is not None and backend.pod is not None and not _is_dcgm(name, labels):
        external, parts = _series_labels(tuple(labels.items()))
        key = ("series", target.url, *parts)
        return _device(key, key, backend.pod, backend.node, external)
    node_name = target.node or get("Hostname") or get("hostname") or None
    if _is_dcgm(name, labels):
        # NB: sorting the pairs orders by key (keys are unique), the order selectors and the wire expect.
        items = sorted(labels.items())
        external = tuple([item for item in items if item[0] not in _PLACEMENT_LABELS])
        owner = _labelled_pod(labels)
        if owner is not None and owner == target.pod:
            owner = None  # the exporter's own target labels, not a workload
        gpu = get("UUID") or get("uuid") or get("gpu_uuid") or get("gpu", "")
        physical = ("gpu", node_name or "", gpu)
        claim_name, claim_ns = get("dra_claim_name"), get("dra_claim_namespace")
        claim = ObjectRef(RESOURCE_CLAIM, claim_name, claim_ns) if claim_name and claim_ns else None
        # NB: with --kubernetes-virtual-gpus, or a DRA claim shared by pods, one GPU's series repeat per pod;
        # keep them apart.
        instance = get("GPU_I_ID", "") or get("dra_mig_device_uuid", "")
        key = (*physical, instance, str(owner) if get("vgpu") or claim else "")
        return _device(key, physical, owner, node_name, external, claim)
    owner = _labelled_pod(labels) if "pod" in labels or "exported_pod" in labels else None
    owner = owner or target.pod
    external, parts = _series_labels(tuple(labels.items()))
    key = ("series", target.url, *parts)
    return _device(key, key, owner, node_name, external)


@functools.lru_cache(maxsize=4096)
def _series_labels(items: tuple[tuple[str, str], ...]) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """A series' labels for external selectors (sorted, placement labels left out) and its key's ``k=v`` parts.

    NB: cached by the labels as written: the replicas of one inference server repeat the same few label sets
    (2,881 Triton pods: four), each otherwise sorted and formatted once per pod. A DCGM label set names
    its GPU (UUID), so it is never repeated and not cached. Bounded: label sets unique to a pod only churn it.
    """
    ordered = sorted(items)  # NB: orders by key (keys are unique), the order selectors and the wire expect
    external = tuple([item for item in ordered if item[0] not in _PLACEMENT_LABELS])
    return external, tuple([f"{k}={v}" for k, v in ordered])


IDENTITY_SHARDS = 256


class Attributor:
    """Memoising front of ``attribute``: series label sets repeat on every refresh.

    Devices are memoised per target URL; each URL's target is resolved once per refresh, and when it
    resolves differently (its pod moved or appeared) that URL's memo starts afresh. The same inputs
    give the same Device object, which aggregation relies on to group series by device.
    """

    def __init__(self, resolve_target: Callable[[str], Target], *, max_series_per_target: int = 200_000) -> None:
        self._resolve_target = resolve_target
        self._resolved: set[str] = set()
        # Fast path: sources that hand out one dict per distinct label set (Prometheus) are recognised by
        # the dict's identity; the entry keeps the dict alive so its id stays unique. Reset every refresh.
        # NB: in shards: one dict of every label set (~50,000 at 10,000 GPUs) held the interpreter lock for ms in
        # one C call each time it was cleared or grew a size, holding the adapter's event loop (metrics/chunked.py)
        self._by_identity: list[dict[int, tuple[Mapping[str, str], str, bool, Device]]] = [
            {} for _ in range(IDENTITY_SHARDS)
        ]
        self._buckets: dict[str, tuple[Target, dict[tuple[bool, tuple[str, ...], tuple[str, ...]], Device]]] = {}
        self._max = max_series_per_target

    def begin_refresh(self) -> None:
        """Targets are resolved again (pods move between refreshes); memos of targets gone are dropped."""
        finish(self.begin_refresh_steps())

    def begin_refresh_steps(self) -> Steps[None]:
        """``begin_refresh`` in steps (metrics/steps.py): a target's memo or a shard dropped per step."""
        gone = [u for u in self._buckets if u not in self._resolved]
        for url in gone:
            del self._buckets[url]
            yield
        self._resolved.clear()
        for shard in self._by_identity:
            shard.clear()
            yield

    def target(self, url: str) -> Target:
        return self._bucket(url)[0]

    def _bucket(self, url: str) -> tuple[Target, dict[tuple[bool, tuple[str, ...], tuple[str, ...]], Device]]:
        bucket = self._buckets.get(url)
        if bucket is not None and url in self._resolved:
            return bucket
        target = self._resolve_target(url)
        self._resolved.add(url)
        if bucket is None or bucket[0] != target or len(bucket[1]) > self._max:
            bucket = self._buckets[url] = (target, {})
        return bucket

    def __call__(self, name: str, labels: Mapping[str, str], target_url: str) -> Device:
        dcgm = _is_dcgm(name, labels)
        key = id(labels)
        shard = self._by_identity[(key >> 4) % IDENTITY_SHARDS]  # NB: objects are 16-byte aligned
        known = shard.get(key)
        if known is not None and known[0] is labels and known[1] == target_url and known[2] == dcgm:
            return known[3]
        device = self._lookup(name, labels, target_url, dcgm)
        shard[key] = (labels, target_url, dcgm, device)
        return device

    def _lookup(self, name: str, labels: Mapping[str, str], target_url: str, dcgm: bool) -> Device:
        bucket = self._buckets.get(target_url)
        if bucket is None or target_url not in self._resolved:
            bucket = self._bucket(target_url)
        backend = None if dcgm else backend_url(labels)
        if backend is not None:
            # NB: not memoised with the router's target: the backend's pod may move while the router stays.
            return attribute(name, labels, bucket[0], backend=self._bucket(backend)[0])
        # NB: the keys and the values as two flat tuples, not a frozenset of pairs: exporters write labels in
        # a stable order, and this runs once per series per refresh. A reordered label set only costs one
        # extra attribution.
        key = (dcgm, tuple(labels), tuple(labels.values()))
        device = bucket[1].get(key)
        if device is None:
            device = bucket[1][key] = attribute(name, labels, bucket[0])
        return device
