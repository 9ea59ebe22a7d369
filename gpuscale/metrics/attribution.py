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
* A device is one physical GPU, or one MIG instance (``GPU_I_ID``); ``physical`` keys the parent GPU so
  parent-level values repeated on every MIG instance (power) can be counted once.
* Node: the scrape target's node when the Kubernetes API knows it (the legacy exporter's ``Hostname`` is
  its pod name), else the ``Hostname``/``hostname`` label.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuscale.model import ObjectRef, pod


@dataclass(frozen=True, slots=True)
class Target:
    """What the Kubernetes API knows about a scrape target (an exporter or Triton endpoint)."""

    url: str
    pod: ObjectRef | None = None
    node: str | None = None


@dataclass(frozen=True, slots=True)
class Device:
    key: tuple[str, ...]
    physical: tuple[str, ...]
    pod: ObjectRef | None
    node: str | None
    labels: tuple[tuple[str, str], ...]  # the series' metric labels, for external-metric selectors

    @property
    def namespace(self) -> str | None:
        return self.pod.namespace if self.pod else None


# Label pairs (pod, namespace), in the order they win.
_POD_LABELS = (
    ("exported_pod", "exported_namespace"),
    ("pod", "namespace"),
    ("pod_name", "pod_namespace"),
)
_GPU_ID_LABELS = ("UUID", "uuid", "gpu_uuid")
_HOST_LABELS = ("Hostname", "hostname")
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
    }
)


def _is_dcgm(name: str, labels: Mapping[str, str]) -> bool:
    return name.startswith(("DCGM_", "dcgm_")) or "UUID" in labels


def _labelled_pod(labels: Mapping[str, str]) -> ObjectRef | None:
    for pod_key, ns_key in _POD_LABELS:
        name = labels.get(pod_key)
        if name:
            ns = labels.get(ns_key)
            return pod(ns, name) if ns else None
    return None


def attribute(name: str, labels: Mapping[str, str], target: Target) -> Device:
    """Place one series. Pure; the caller memoises per (target, labels) if it needs speed."""
    host = next((labels[k] for k in _HOST_LABELS if labels.get(k)), None)
    node = target.node or host
    external = tuple(sorted((k, v) for k, v in labels.items() if k not in _PLACEMENT_LABELS))
    if _is_dcgm(name, labels):
        owner = _labelled_pod(labels)
        if owner is not None and owner == target.pod:
            owner = None  # the exporter's own target labels, not a workload
        gpu = next((labels[k] for k in _GPU_ID_LABELS if labels.get(k)), labels.get("gpu", ""))
        physical = ("gpu", node or "", gpu)
        instance = labels.get("GPU_I_ID", "")
        # NB: with --kubernetes-virtual-gpus one GPU's series repeat per pod; keep them apart.
        key = (*physical, instance, str(owner) if labels.get("vgpu") else "")
        return Device(key, physical, owner, node, external)
    owner = _labelled_pod(labels) if "pod" in labels or "exported_pod" in labels else None
    owner = owner or target.pod
    key = ("series", target.url, *(f"{k}={v}" for k, v in sorted(labels.items())))
    return Device(key, key, owner, node, external)


class Attributor:
    """Memoising front of ``attribute``: series label sets repeat on every refresh."""

    def __init__(self, resolve_target: Callable[[str], Target]) -> None:
        self._resolve_target = resolve_target
        self._targets: dict[str, Target] = {}
        self._cache: dict[tuple[Target, bool, frozenset[tuple[str, str]]], Device] = {}

    def begin_refresh(self) -> None:
        """Forget target resolutions (pods move between refreshes); keep nothing unbounded."""
        self._targets.clear()
        if len(self._cache) > 200_000:
            self._cache.clear()

    def target(self, url: str) -> Target:
        t = self._targets.get(url)
        if t is None:
            t = self._targets[url] = self._resolve_target(url)
        return t

    def __call__(self, name: str, labels: Mapping[str, str], target_url: str) -> Device:
        target = self.target(target_url)
        # NB: the key holds the resolved Target, so a pod that moved gets a fresh attribution.
        key = (target, _is_dcgm(name, labels), frozenset(labels.items()))
        device = self._cache.get(key)
        if device is None:
            device = self._cache[key] = attribute(name, labels, target)
        return device
