"""The pure description of a simulated GPU cluster: nodes and GPUs, workloads, and where their pods run.

Nothing here does I/O or keeps time. A ``Scenario`` is an immutable value; changing replicas or load gives
a new one (``with_replicas``, ``with_load``). Everything derived from it is deterministic in
``Scenario.seed``: GPU UUIDs, pod-template hashes and pod-name suffixes, object UIDs, and placements.

- ``placements()`` assigns each pod replica to a node and GPUs (or MIG instances), like the scheduler
  would with the NVIDIA device plugin: a pod needs ``gpus_per_pod`` whole GPUs (``nvidia.com/gpu``) or MIG
  instances of one profile (``nvidia.com/mig-<profile>``, mixed strategy) on ONE node that matches its
  ``node_selector``; among fitting nodes the one with the most free devices wins (the default
  LeastAllocated spreading), ties in node order; devices are taken lowest index first. A pod that fits
  nowhere is Pending (``node is None``). Passing the current placements as ``keep`` keeps running pods
  where they are when replicas change, so scaling one workload never moves another's pods.
- ``kube_objects()`` renders the Kubernetes objects (Namespaces, Nodes, the dcgm-exporter DaemonSet and
  its pods, Deployments + ReplicaSets, StatefulSets, Pods) as plain dicts in API JSON shape.
- ``pods_by_gpu()`` is what dcgm-exporter learns from the kubelet PodResources API: which container holds
  which GPU / MIG instance on each node. The DCGM renderer labels series with it, so the DCGM pod labels
  and the Pod objects agree by construction.

Names follow Kubernetes: Deployment pods are ``<deploy>-<pod-template-hash>-<5 chars>`` (hash and suffix
drawn from the apimachinery "safe" alphabet), StatefulSet pods ``<sts>-<ordinal>``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from gpuscale.sim.gpu_activity import A100_SXM4_80GB, H100_SXM, PROFILES, GpuModel, Profile
from gpuscale.sim.load import ConstantLoad, DiurnalLoad, LoadModel
from gpuscale.sim.serving_queue import TritonModel

__all__ = [
    "DCGM_EXPORTER_NAMESPACE",
    "MIG_PROFILE_FB_MIB",
    "ContainerRef",
    "GpuSlot",
    "MigInstance",
    "Placement",
    "PodKey",
    "Profile",
    "Scenario",
    "SimGpu",
    "SimNode",
    "SimWorkload",
    "TritonModel",
    "demo_scenario",
    "gpu_uuid",
]

PodKey = tuple[str, str]
"""``(namespace, pod name)``."""

WorkloadKind = Literal["Deployment", "StatefulSet"]

DCGM_EXPORTER_NAMESPACE = "gpu-operator"
DCGM_EXPORTER_NAME = "nvidia-dcgm-exporter"
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04"
DEFAULT_EXPORTER_PORT = 9400
DEFAULT_TRITON_METRICS_PORT = 8002
POD_IP = "127.0.0.1"
CREATION_TIMESTAMP = "2026-01-05T08:00:00Z"

# NB: 1g/2g/3g sizes as in the MIG fixture (A100-80GB); 4g and 7g are plausible, invented.
MIG_PROFILE_FB_MIB: dict[str, int] = {
    "1g.10gb": 9728,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80384,
}

# apimachinery util/rand: the alphabet of pod-name suffixes and of SafeEncodeString (pod-template-hash).
_SAFE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"


# --- deterministic names -----------------------------------------------------------------------------


def _digest(*parts: object, size: int = 16) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=size).digest()


def _uid(*parts: object) -> str:
    """A deterministic, valid version-4 UUID string for ``parts``."""
    return str(uuid.UUID(bytes=_digest("uid", *parts), version=4))


def gpu_uuid(seed: int, node: str, index: int) -> str:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``, deterministic in (seed, node, index)."""
    h = _digest("gpu", seed, node, index).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _template_hash(*parts: object) -> str:
    """Like ``rand.SafeEncodeString(fmt.Sprint(uint32 hash))``: 9–10 chars of ``[4-9bcdf]``."""
    number = int.from_bytes(_digest("hash", *parts, size=4), "big")
    return "".join(_SAFE_ALPHABET[ord(ch) % len(_SAFE_ALPHABET)] for ch in str(number))


def _suffix(*parts: object, length: int = 5) -> str:
    """Like ``rand.String(5)``: a pod-name suffix from the safe alphabet."""
    data = _digest("suffix", *parts, size=length)
    return "".join(_SAFE_ALPHABET[b % len(_SAFE_ALPHABET)] for b in data)


# --- hardware ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigInstance:
    """A MIG GPU instance: its profile (``GPU_I_PROFILE``) and ``GPU_I_ID``."""

    profile: str
    instance_id: int

    def __post_init__(self) -> None:
        if self.profile not in MIG_PROFILE_FB_MIB:
            raise ValueError(f"unknown MIG profile {self.profile!r}; valid: {', '.join(MIG_PROFILE_FB_MIB)}")

    @property
    def slices(self) -> int:
        """Compute slices out of 7."""
        return int(self.profile.split("g.", 1)[0])

    @property
    def fb_total_mib(self) -> int:
        return MIG_PROFILE_FB_MIB[self.profile]

    @property
    def resource(self) -> str:
        """The extended resource a pod requests for it (mixed strategy)."""
        return f"nvidia.com/mig-{self.profile}"


# A100 "all-balanced" geometry with the GI IDs of the MIG fixture.
MIG_ALL_BALANCED: tuple[MigInstance, ...] = (
    MigInstance("3g.40gb", 2),
    MigInstance("2g.20gb", 3),
    MigInstance("1g.10gb", 9),
    MigInstance("1g.10gb", 10),
)


@dataclass(frozen=True, slots=True)
class SimGpu:
    """One physical GPU. ``mig`` lists its GPU instances when MIG is enabled (empty otherwise)."""

    index: int
    uuid: str
    pci_bus_id: str
    hardware: GpuModel = H100_SXM
    mig: tuple[MigInstance, ...] = ()

    @property
    def device(self) -> str:
        return f"nvidia{self.index}"

    @property
    def model_name(self) -> str:
        return self.hardware.name

    @property
    def fb_total_mib(self) -> int:
        return self.hardware.fb_total_mib

    @property
    def power_limit_w(self) -> float:
        return self.hardware.power_limit_w

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)


class GpuSlot(NamedTuple):
    """What a pod is given: a whole GPU (``instance is None``) or one MIG instance (its GPU_I_ID)."""

    gpu: int
    instance: int | None = None


class ContainerRef(NamedTuple):
    """The container dcgm-exporter attributes a GPU to (its ``namespace``/``pod``/``container`` labels)."""

    namespace: str
    pod: str
    container: str


@dataclass(frozen=True, slots=True)
class SimNode:
    """A GPU node. ``labels`` are the node's full label set (see ``SimNode.build`` for the usual ones)."""

    name: str
    gpus: tuple[SimGpu, ...]
    labels: Mapping[str, str] = field(default_factory=dict)
    driver_version: str = "580.95.05"
    cpu_cores: int = 192
    memory_gib: int = 2048

    @classmethod
    def build(
        cls,
        name: str,
        *,
        hardware: GpuModel = H100_SXM,
        gpu_count: int = 8,
        seed: int = 0,
        mig: Mapping[int, Sequence[MigInstance]] | None = None,
        labels: Mapping[str, str] | None = None,
        instance_type: str | None = None,
        zone: str | None = None,
        driver_version: str = "580.95.05",
        cpu_cores: int = 192,
        memory_gib: int = 2048,
    ) -> SimNode:
        """A node with ``gpu_count`` GPUs of ``hardware`` and GPU Feature Discovery / GPU Operator labels.

        ``mig`` maps GPU index → its MIG instances (mixed strategy). ``labels`` are added last and win.
        """
        mig = dict(mig or {})
        gpus = tuple(
            SimGpu(
                index=i,
                uuid=gpu_uuid(seed, name, i),
                pci_bus_id=hardware.pci_bus_ids[i % len(hardware.pci_bus_ids)]
                if i < len(hardware.pci_bus_ids)
                else f"00000000:{0xD0 + i:02X}:00.0",
                hardware=hardware,
                mig=tuple(mig.get(i, ())),
            )
            for i in range(gpu_count)
        )
        all_labels: dict[str, str] = {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": hardware.product_label,
            "nvidia.com/gpu.count": str(gpu_count),
            "nvidia.com/gpu.memory": str(hardware.fb_total_mib),
            "nvidia.com/gpu.deploy.dcgm-exporter": "true",
            "nvidia.com/mig.capable": "true",
            "nvidia.com/mig.config": "all-disabled",
            "nvidia.com/mig.strategy": "mixed",
        }
        if instance_type:
            all_labels["node.kubernetes.io/instance-type"] = instance_type
        if zone:
            all_labels["topology.kubernetes.io/zone"] = zone
        if mig:
            all_labels["nvidia.com/mig.config"] = "custom"
            all_labels["nvidia.com/mig.config.state"] = "success"
            for profile, count in _mig_counts(gpus).items():
                all_labels[f"nvidia.com/mig-{profile}.count"] = str(count)
        all_labels.update(labels or {})
        return cls(
            name=name,
            gpus=gpus,
            labels=all_labels,
            driver_version=driver_version,
            cpu_cores=cpu_cores,
            memory_gib=memory_gib,
        )

    def gpu(self, index: int) -> SimGpu:
        for gpu in self.gpus:
            if gpu.index == index:
                return gpu
        raise KeyError(f"node {self.name} has no GPU {index}; GPUs: {[g.index for g in self.gpus]}")

    def slots(self) -> list[GpuSlot]:
        """Every allocatable device: whole non-MIG GPUs and MIG instances, in index order."""
        out: list[GpuSlot] = []
        for gpu in self.gpus:
            if gpu.mig:
                out.extend(GpuSlot(gpu.index, inst.instance_id) for inst in gpu.mig)
            else:
                out.append(GpuSlot(gpu.index))
        return out

    def slot_resource(self, slot: GpuSlot) -> str:
        """``nvidia.com/gpu`` or ``nvidia.com/mig-<profile>`` for ``slot``."""
        if slot.instance is None:
            return "nvidia.com/gpu"
        for inst in self.gpu(slot.gpu).mig:
            if inst.instance_id == slot.instance:
                return inst.resource
        raise KeyError(f"node {self.name} GPU {slot.gpu} has no MIG instance {slot.instance}")


def _mig_counts(gpus: Iterable[SimGpu]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in gpus:
        for inst in gpu.mig:
            counts[inst.profile] = counts.get(inst.profile, 0) + 1
    return dict(sorted(counts.items()))


# --- workloads ---------------------------------------------------------------------------------------

_DEFAULT_IMAGES: dict[str, str] = {
    "inference": "nvcr.io/nvidia/tritonserver:25.01-py3",
    "llm-decode": "nvcr.io/nim/meta/llama3-8b-instruct:1.0.3",
    "training": "nvcr.io/nvidia/pytorch:25.01-py3",
    "batch-light": "ghcr.io/example/batch-worker:1.4.2",
    "idle": "jupyter/pytorch-notebook:2025-01-06",
}


@dataclass(frozen=True, slots=True)
class SimWorkload:
    """A Deployment or StatefulSet whose pods each use ``gpus_per_pod`` GPUs (or MIG instances).

    ``load`` is the offered request rate for the whole workload (split equally over running replicas);
    ``capacity_rps`` what one replica serves at saturation. ``profile`` says how the GPU responds (see
    ``gpuscale.sim.load``). With ``triton_models`` each pod also runs a Triton metrics endpoint.
    ``mig_profile`` makes pods request ``nvidia.com/mig-<profile>`` instead of whole GPUs.
    """

    namespace: str
    name: str
    kind: WorkloadKind = "Deployment"
    replicas: int = 1
    gpus_per_pod: int = 1
    profile: Profile = "inference"
    container: str = "main"
    labels: Mapping[str, str] | None = None  # pod labels; default {"app": name}
    triton_models: tuple[TritonModel, ...] = ()
    capacity_rps: float = 100.0
    load: LoadModel | None = None
    mig_profile: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    image: str | None = None
    queue_timeout_s: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in ("Deployment", "StatefulSet"):
            raise ValueError(f"{self.key}: kind must be Deployment or StatefulSet, got {self.kind!r}")
        if self.profile not in PROFILES:
            raise ValueError(f"{self.key}: unknown profile {self.profile!r}; valid: {', '.join(PROFILES)}")
        if self.replicas < 0 or self.gpus_per_pod < 1:
            raise ValueError(f"{self.key}: replicas must be >= 0 and gpus_per_pod >= 1")
        if self.mig_profile is not None and self.mig_profile not in MIG_PROFILE_FB_MIB:
            raise ValueError(
                f"{self.key}: unknown MIG profile {self.mig_profile!r}; valid: {', '.join(MIG_PROFILE_FB_MIB)}"
            )

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def pod_labels(self) -> dict[str, str]:
        return dict(self.labels) if self.labels is not None else {"app": self.name}

    @property
    def gpu_resource(self) -> str:
        return f"nvidia.com/mig-{self.mig_profile}" if self.mig_profile else "nvidia.com/gpu"

    @property
    def container_image(self) -> str:
        return self.image or _DEFAULT_IMAGES[self.profile]

    @property
    def offered_load(self) -> LoadModel:
        return self.load if self.load is not None else ConstantLoad(0.0)


@dataclass(frozen=True, slots=True)
class Placement:
    """One pod replica and the devices it was given. ``node is None`` means Pending (did not fit)."""

    namespace: str
    workload: str
    kind: WorkloadKind
    pod: str
    ordinal: int
    container: str
    node: str | None
    slots: tuple[GpuSlot, ...]
    uid: str

    @property
    def key(self) -> PodKey:
        return (self.namespace, self.pod)

    @property
    def workload_key(self) -> str:
        return f"{self.namespace}/{self.workload}"

    @property
    def scheduled(self) -> bool:
        return self.node is not None

    @property
    def gpu_indices(self) -> tuple[int, ...]:
        return tuple(sorted({slot.gpu for slot in self.slots}))


# --- the scenario ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    """A simulated cluster: nodes, workloads and the seed every derived name and number depends on."""

    nodes: tuple[SimNode, ...]
    workloads: tuple[SimWorkload, ...]
    seed: int = 0

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate node names in {names}")
        keys = [w.key for w in self.workloads]
        if len(set(keys)) != len(keys):
            raise ValueError(f"duplicate workloads in {keys}")

    # lookups ---------------------------------------------------------------------------------------

    def node(self, name: str) -> SimNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"unknown node {name!r}; nodes: {', '.join(n.name for n in self.nodes)}")

    def workload(self, ref: str | SimWorkload) -> SimWorkload:
        """The workload named ``namespace/name`` (or a bare ``name`` when unique)."""
        wanted = ref.key if isinstance(ref, SimWorkload) else ref
        matches = [w for w in self.workloads if wanted in (w.key, w.name)]
        if len(matches) == 1:
            return matches[0]
        valid = ", ".join(w.key for w in self.workloads)
        if not matches:
            raise KeyError(f"unknown workload {wanted!r}; workloads: {valid}")
        raise KeyError(f"ambiguous workload {wanted!r}; use namespace/name: {valid}")

    def with_workload(self, workload: SimWorkload) -> Scenario:
        """This scenario with the workload of the same key replaced by ``workload``."""
        existing = self.workload(workload.key)
        return dataclasses.replace(self, workloads=tuple(workload if w is existing else w for w in self.workloads))

    def with_replicas(self, ref: str | SimWorkload, replicas: int) -> Scenario:
        return self.with_workload(dataclasses.replace(self.workload(ref), replicas=replicas))

    def with_load(self, ref: str | SimWorkload, load: LoadModel) -> Scenario:
        return self.with_workload(dataclasses.replace(self.workload(ref), load=load))

    # names -----------------------------------------------------------------------------------------

    def pod_template_hash(self, workload: SimWorkload) -> str:
        return _template_hash(self.seed, workload.namespace, workload.name, workload.kind)

    def owner_name(self, workload: SimWorkload) -> str:
        """The pods' controller: the ReplicaSet ``<deploy>-<hash>`` or the StatefulSet itself."""
        if workload.kind == "Deployment":
            return f"{workload.name}-{self.pod_template_hash(workload)}"
        return workload.name

    def pod_name(self, workload: SimWorkload, ordinal: int) -> str:
        if workload.kind == "StatefulSet":
            return f"{workload.name}-{ordinal}"
        suffix = _suffix(self.seed, workload.namespace, workload.name, ordinal)
        return f"{self.owner_name(workload)}-{suffix}"

    # placement -------------------------------------------------------------------------------------

    def placements(self, *, keep: Sequence[Placement] = (), retired: Iterable[PodKey] = ()) -> list[Placement]:
        """Assign every pod replica to a node and devices (see the module docstring for the rules).

        ``keep``: current placements; running pods that still exist stay on their devices. StatefulSets
        keep ordinals ``0..replicas-1``; Deployments keep their oldest pods (scale-down removes the newest,
        as a ReplicaSet does). ``retired``: pod keys that existed before and must not be reused by new
        Deployment pods (Kubernetes never reuses a random pod name).
        """
        retired_keys = set(retired)
        free: dict[str, list[GpuSlot]] = {node.name: node.slots() for node in self.nodes}
        slot_resource = {(node.name, slot): node.slot_resource(slot) for node in self.nodes for slot in free[node.name]}
        placed: dict[str, list[Placement]] = {w.key: [] for w in self.workloads}
        to_place: dict[str, list[int]] = {}

        # Pass 1: reserve what running pods already hold, so no new pod can take it.
        for w in self.workloads:
            kept = sorted((p for p in keep if p.workload_key == w.key and p.kind == w.kind), key=lambda p: p.ordinal)
            # NB: a StatefulSet keeps ordinals below its replica count; a ReplicaSet its oldest pods.
            kept = [p for p in kept if p.ordinal < w.replicas] if w.kind == "StatefulSet" else kept[: w.replicas]
            pending: list[int] = []
            for p in kept:
                node_free = free.get(p.node) if p.node is not None else None
                if (
                    p.node is not None
                    and node_free is not None
                    and len(p.slots) == w.gpus_per_pod
                    and all(s in node_free for s in p.slots)
                    and all(slot_resource[(p.node, s)] == w.gpu_resource for s in p.slots)
                ):
                    for s in p.slots:
                        node_free.remove(s)
                    placed[w.key].append(p)
                else:
                    pending.append(p.ordinal)
            used = {p.ordinal for p in kept}
            if w.kind == "StatefulSet":
                pending.extend(i for i in range(w.replicas) if i not in used)
            else:
                ordinal = 0
                while len(used) < w.replicas:
                    if ordinal not in used and (w.namespace, self.pod_name(w, ordinal)) not in retired_keys:
                        used.add(ordinal)
                        pending.append(ordinal)
                    ordinal += 1
            to_place[w.key] = sorted(pending)

        # Pass 2: schedule new and pending pods, workload by workload.
        for w in self.workloads:
            for ordinal in to_place[w.key]:
                placed[w.key].append(self._schedule(w, ordinal, free, slot_resource))

        return [p for w in self.workloads for p in sorted(placed[w.key], key=lambda p: p.ordinal)]

    def _schedule(
        self,
        w: SimWorkload,
        ordinal: int,
        free: dict[str, list[GpuSlot]],
        slot_resource: Mapping[tuple[str, GpuSlot], str],
    ) -> Placement:
        best: tuple[str, list[GpuSlot]] | None = None
        for node in self.nodes:
            if any(node.labels.get(k) != v for k, v in w.node_selector.items()):
                continue
            fitting = [s for s in free[node.name] if slot_resource[(node.name, s)] == w.gpu_resource]
            if len(fitting) >= w.gpus_per_pod and (best is None or len(fitting) > len(best[1])):
                best = (node.name, fitting)
        slots: tuple[GpuSlot, ...] = ()
        node_name: str | None = None
        if best is not None:
            node_name = best[0]
            slots = tuple(best[1][: w.gpus_per_pod])
            for s in slots:
                free[node_name].remove(s)
        pod = self.pod_name(w, ordinal)
        return Placement(
            namespace=w.namespace,
            workload=w.name,
            kind=w.kind,
            pod=pod,
            ordinal=ordinal,
            container=w.container,
            node=node_name,
            slots=slots,
            uid=_uid(self.seed, "Pod", w.namespace, pod),
        )

    def pods_by_gpu(self, placements: Sequence[Placement] | None = None) -> dict[str, dict[GpuSlot, ContainerRef]]:
        """Per node: device → the container holding it (what dcgm-exporter labels series with)."""
        if placements is None:
            placements = self.placements()
        out: dict[str, dict[GpuSlot, ContainerRef]] = {node.name: {} for node in self.nodes}
        for p in placements:
            if p.node is None:
                continue
            for slot in p.slots:
                out[p.node][slot] = ContainerRef(p.namespace, p.pod, p.container)
        return out

    # Kubernetes objects ----------------------------------------------------------------------------

    def kube_objects(
        self,
        *,
        triton_ports: Mapping[PodKey, int] | None = None,
        exporter_ports: Mapping[str, int] | None = None,
        placements: Sequence[Placement] | None = None,
    ) -> list[dict[str, Any]]:
        """The cluster as Kubernetes API objects (plain dicts, API JSON shape, no resourceVersion).

        ``triton_ports``: the metrics port of each Triton pod (default 8002); ``exporter_ports``: the
        dcgm-exporter port per node (default 9400). Every pod's IP is 127.0.0.1 so a scraper that
        discovers targets from the Pods finds the simulated exporters on loopback.
        """
        if placements is None:
            placements = self.placements()
        triton_ports = triton_ports or {}
        exporter_ports = exporter_ports or {}
        objects: list[dict[str, Any]] = []
        namespaces = sorted({DCGM_EXPORTER_NAMESPACE, *(w.namespace for w in self.workloads)})
        objects.extend(self._namespace(ns) for ns in namespaces)
        objects.extend(self._node(node) for node in self.nodes)
        objects.append(self._dcgm_daemonset())
        objects.extend(
            self._dcgm_pod(node, exporter_ports.get(node.name, DEFAULT_EXPORTER_PORT)) for node in self.nodes
        )
        by_workload: dict[str, list[Placement]] = {w.key: [] for w in self.workloads}
        for p in placements:
            by_workload.setdefault(p.workload_key, []).append(p)
        for w in self.workloads:
            pods = by_workload[w.key]
            if w.kind == "Deployment":
                objects.append(self._deployment(w, pods))
                objects.append(self._replicaset(w, pods))
            else:
                objects.append(self._statefulset(w, pods))
        for w in self.workloads:
            for p in by_workload[w.key]:
                objects.append(self._pod(w, p, triton_ports.get(p.key, DEFAULT_TRITON_METRICS_PORT)))
        return objects

    def _meta(self, kind: str, name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name}
        if namespace is not None:
            meta["namespace"] = namespace
        meta["uid"] = _uid(self.seed, kind, namespace, name)
        meta["creationTimestamp"] = CREATION_TIMESTAMP
        meta.update(extra)
        return meta

    def _owner_ref(self, kind: str, name: str, namespace: str | None) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": kind,
            "name": name,
            "uid": _uid(self.seed, kind, namespace, name),
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def _namespace(self, name: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": self._meta("Namespace", name, labels={"kubernetes.io/metadata.name": name}),
            "spec": {"finalizers": ["kubernetes"]},
            "status": {"phase": "Active"},
        }

    def _node(self, node: SimNode) -> dict[str, Any]:
        whole = sum(1 for g in node.gpus if not g.mig)
        capacity = {
            "cpu": str(node.cpu_cores),
            "ephemeral-storage": "3905109820Ki",
            "hugepages-1Gi": "0",
            "hugepages-2Mi": "0",
            "memory": f"{node.memory_gib * 1024 * 1024}Ki",
            "nvidia.com/gpu": str(whole),
            "pods": "110",
        }
        for profile, count in _mig_counts(node.gpus).items():
            capacity[f"nvidia.com/mig-{profile}"] = str(count)
        allocatable = dict(capacity)
        allocatable["cpu"] = f"{node.cpu_cores * 1000 - 550}m"
        allocatable["memory"] = f"{node.memory_gib * 1024 * 1024 - 1_968_000}Ki"
        allocatable["ephemeral-storage"] = "3598798019722"
        conditions = [
            _condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            _condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            _condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ]
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": self._meta("Node", node.name, labels=dict(node.labels)),
            "spec": {"providerID": f"sim:///{node.name}"},
            "status": {
                "capacity": capacity,
                "allocatable": allocatable,
                "conditions": conditions,
                "addresses": [
                    {"type": "InternalIP", "address": POD_IP},
                    {"type": "Hostname", "address": node.name},
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "containerRuntimeVersion": "containerd://1.7.23",
                    "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                    "kubeProxyVersion": "v1.31.4",
                    "kubeletVersion": "v1.31.4",
                    "operatingSystem": "linux",
                    "osImage": "Amazon Linux 2023.6.20250107",
                },
            },
        }

    def _dcgm_daemonset(self) -> dict[str, Any]:
        labels = {"app": DCGM_EXPORTER_NAME}
        n = len(self.nodes)
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": self._meta(
                "DaemonSet", DCGM_EXPORTER_NAME, DCGM_EXPORTER_NAMESPACE, labels=dict(labels), generation=1
            ),
            "spec": {
                "selector": {"matchLabels": dict(labels)},
                "template": {
                    "metadata": {"labels": dict(labels)},
                    "spec": {
                        "hostNetwork": True,
                        "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
                        "containers": [{"name": DCGM_EXPORTER_NAME, "image": DCGM_EXPORTER_IMAGE}],
                    },
                },
            },
            "status": {
                "currentNumberScheduled": n,
                "desiredNumberScheduled": n,
                "numberAvailable": n,
                "numberMisscheduled": 0,
                "numberReady": n,
                "observedGeneration": 1,
                "updatedNumberScheduled": n,
            },
        }

    def _dcgm_pod(self, node: SimNode, port: int) -> dict[str, Any]:
        name = f"{DCGM_EXPORTER_NAME}-{_suffix(self.seed, DCGM_EXPORTER_NAME, node.name)}"
        revision = _template_hash(self.seed, "DaemonSet", DCGM_EXPORTER_NAME)
        labels = {"app": DCGM_EXPORTER_NAME, "controller-revision-hash": revision, "pod-template-generation": "1"}
        container = {
            "name": DCGM_EXPORTER_NAME,
            "image": DCGM_EXPORTER_IMAGE,
            "args": [f"--address=:{port}", "--kubernetes=true"],
            "env": [
                {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
                {"name": "DCGM_EXPORTER_LISTEN", "value": f":{port}"},
            ],
            "ports": [{"name": "metrics", "containerPort": port, "hostPort": port, "protocol": "TCP"}],
        }
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": self._meta(
                "Pod",
                name,
                DCGM_EXPORTER_NAMESPACE,
                labels=labels,
                ownerReferences=[self._owner_ref("DaemonSet", DCGM_EXPORTER_NAME, DCGM_EXPORTER_NAMESPACE)],
            ),
            "spec": {
                "nodeName": node.name,
                "hostNetwork": True,
                "containers": [container],
                "restartPolicy": "Always",
                "schedulerName": "default-scheduler",
                "serviceAccountName": DCGM_EXPORTER_NAME,
            },
            "status": _running_status(DCGM_EXPORTER_NAME, DCGM_EXPORTER_IMAGE),
        }

    def _template_spec(self, w: SimWorkload, *, triton_port: int = DEFAULT_TRITON_METRICS_PORT) -> dict[str, Any]:
        count = str(w.gpus_per_pod)
        container: dict[str, Any] = {
            "name": w.container,
            "image": w.container_image,
            "resources": {
                "limits": {w.gpu_resource: count, "cpu": "8", "memory": "64Gi"},
                "requests": {w.gpu_resource: count, "cpu": "4", "memory": "32Gi"},
            },
        }
        if w.triton_models:
            container["args"] = [
                "tritonserver",
                "--model-repository=/models",
                f"--metrics-port={triton_port}",
            ]
            container["ports"] = [
                {"name": "http", "containerPort": 8000, "protocol": "TCP"},
                {"name": "grpc", "containerPort": 8001, "protocol": "TCP"},
                {"name": "metrics", "containerPort": triton_port, "protocol": "TCP"},
            ]
        spec: dict[str, Any] = {
            "containers": [container],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
        }
        if w.node_selector:
            spec["nodeSelector"] = dict(w.node_selector)
        return spec

    def _workload_status(self, pods: Sequence[Placement]) -> tuple[int, int]:
        return len(pods), sum(1 for p in pods if p.scheduled)

    def _deployment(self, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
        total, ready = self._workload_status(pods)
        labels = w.pod_labels
        status: dict[str, Any] = {
            "observedGeneration": 1,
            "replicas": total,
            "updatedReplicas": total,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "conditions": [
                _condition(
                    "Available",
                    "True" if ready >= w.replicas else "False",
                    "MinimumReplicasAvailable" if ready >= w.replicas else "MinimumReplicasUnavailable",
                ),
                _condition("Progressing", "True", "NewReplicaSetAvailable"),
            ],
        }
        if total - ready:
            status["unavailableReplicas"] = total - ready
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": self._meta(
                "Deployment",
                w.name,
                w.namespace,
                labels=dict(labels),
                generation=1,
                annotations={"deployment.kubernetes.io/revision": "1"},
            ),
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": dict(labels)},
                "template": {"metadata": {"labels": dict(labels)}, "spec": self._template_spec(w)},
                "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
                "revisionHistoryLimit": 10,
                "progressDeadlineSeconds": 600,
            },
            "status": status,
        }

    def _replicaset(self, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
        total, ready = self._workload_status(pods)
        template_hash = self.pod_template_hash(w)
        labels = {**w.pod_labels, "pod-template-hash": template_hash}
        name = self.owner_name(w)
        return {
            "apiVersion": "apps/v1",
            "kind": "ReplicaSet",
            "metadata": self._meta(
                "ReplicaSet",
                name,
                w.namespace,
                labels=dict(labels),
                generation=1,
                annotations={"deployment.kubernetes.io/desired-replicas": str(w.replicas)},
                ownerReferences=[self._owner_ref("Deployment", w.name, w.namespace)],
            ),
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": dict(labels)},
                "template": {"metadata": {"labels": dict(labels)}, "spec": self._template_spec(w)},
            },
            "status": {
                "observedGeneration": 1,
                "replicas": total,
                "fullyLabeledReplicas": total,
                "readyReplicas": ready,
                "availableReplicas": ready,
            },
        }

    def _statefulset(self, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
        total, ready = self._workload_status(pods)
        labels = w.pod_labels
        revision = f"{w.name}-{self.pod_template_hash(w)}"
        return {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": self._meta("StatefulSet", w.name, w.namespace, labels=dict(labels), generation=1),
            "spec": {
                "replicas": w.replicas,
                "serviceName": w.name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": dict(labels)},
                "template": {"metadata": {"labels": dict(labels)}, "spec": self._template_spec(w)},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
            },
            "status": {
                "observedGeneration": 1,
                "replicas": total,
                "readyReplicas": ready,
                "availableReplicas": ready,
                "currentReplicas": total,
                "updatedReplicas": total,
                "currentRevision": revision,
                "updateRevision": revision,
                "collisionCount": 0,
            },
        }

    def _pod(self, w: SimWorkload, p: Placement, triton_port: int) -> dict[str, Any]:
        labels = w.pod_labels
        if w.kind == "Deployment":
            labels["pod-template-hash"] = self.pod_template_hash(w)
            owner = self._owner_ref("ReplicaSet", self.owner_name(w), w.namespace)
        else:
            labels["apps.kubernetes.io/pod-index"] = str(p.ordinal)
            labels["controller-revision-hash"] = f"{w.name}-{self.pod_template_hash(w)}"
            labels["statefulset.kubernetes.io/pod-name"] = p.pod
            owner = self._owner_ref("StatefulSet", w.name, w.namespace)
        meta = {
            "name": p.pod,
            "namespace": p.namespace,
            "uid": p.uid,
            "creationTimestamp": CREATION_TIMESTAMP,
            "labels": labels,
            "ownerReferences": [owner],
        }
        if w.kind == "Deployment":
            meta["generateName"] = f"{self.owner_name(w)}-"
        if w.triton_models:
            meta["annotations"] = {
                "gpuscale.io/scrape": "true",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(triton_port),
                "prometheus.io/path": "/metrics",
            }
        spec = self._template_spec(w, triton_port=triton_port)
        if w.kind == "StatefulSet":
            spec["hostname"] = p.pod
            spec["subdomain"] = w.name
        if p.node is not None:
            spec["nodeName"] = p.node
            status = _running_status(w.container, w.container_image)
        else:
            status = {
                "phase": "Pending",
                "qosClass": "Burstable",
                "conditions": [
                    _condition(
                        "PodScheduled",
                        "False",
                        "Unschedulable",
                        f"0/{len(self.nodes)} nodes are available: Insufficient {w.gpu_resource}.",
                    )
                ],
            }
        return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _condition(kind: str, status: str, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastTransitionTime": CREATION_TIMESTAMP,
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _running_status(container: str, image: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "qosClass": "Burstable",
        "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}],
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
        "startTime": CREATION_TIMESTAMP,
        "conditions": [
            _condition("PodReadyToStartContainers", "True"),
            _condition("Initialized", "True"),
            _condition("Ready", "True"),
            _condition("ContainersReady", "True"),
            _condition("PodScheduled", "True"),
        ],
        "containerStatuses": [
            {
                "name": container,
                "image": image,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": CREATION_TIMESTAMP}},
            }
        ],
    }


# --- the demo cluster --------------------------------------------------------------------------------

H100_SELECTOR = {"nvidia.com/gpu.product": H100_SXM.product_label}


def demo_scenario(*, seed: int = 7, period_s: float = 900.0) -> Scenario:
    """A realistic small cluster for the demo and end-to-end tests.

    - 3 × p5.48xlarge (8 × H100 80GB HBM3 each) and 1 × p4de.24xlarge (8 × A100-SXM4-80GB; GPUs 0 and 1
      MIG-enabled with the A100 "balanced" geometry 3g.40gb + 2g.20gb + 2 × 1g.10gb).
    - ``inference/triton-bert`` — Triton, 3 replicas × 1 H100, models ``bert_qa_onnx`` v2 and
      ``resnet50_trt`` v1; diurnal load with bursts that overload it at peak (so an HPA has work to do).
    - ``nim/llama3-8b`` — LLM server, 2 × 1 H100, ``llm-decode`` profile (the utilisation trap).
    - ``ml-training/llm-finetune-worker`` — StatefulSet, 1 pod × 4 H100, power-capped training.
    - ``ml-batch/embeddings-batch`` — a light batch Deployment, 1 × 1 H100.
    - ``inference/whisper-asr`` — 2 replicas on ``nvidia.com/mig-2g.20gb`` (no Triton endpoint).
    - ``ml-dev/notebook`` — an idle notebook holding a ``1g.10gb`` MIG instance.
    - Idle: 14 of the 24 H100s, 6 whole A100s and 5 MIG instances carry no pod.

    ``period_s`` is the length of the compressed "day" of the diurnal loads.
    """
    zones = ("us-east-1a", "us-east-1b", "us-east-1a")
    h100_nodes = tuple(
        SimNode.build(name, hardware=H100_SXM, seed=seed, instance_type="p5.48xlarge", zone=zone)
        for name, zone in zip(
            ("ip-10-0-131-77.ec2.internal", "ip-10-0-140-12.ec2.internal", "ip-10-0-152-203.ec2.internal"),
            zones,
            strict=True,
        )
    )
    a100_node = SimNode.build(
        "ip-10-1-22-14.ec2.internal",
        hardware=A100_SXM4_80GB,
        seed=seed,
        mig={0: MIG_ALL_BALANCED, 1: MIG_ALL_BALANCED},
        instance_type="p4de.24xlarge",
        zone="us-east-1b",
        driver_version="550.127.08",
        cpu_cores=96,
        memory_gib=1152,
    )
    triton_models = (
        TritonModel(
            "bert_qa_onnx", "2", share=0.3, compute_infer_us=10240.0, max_batch_size=1, load_duration_s=11.304518226
        ),
        TritonModel(
            "resnet50_trt", "1", share=0.7, compute_infer_us=1560.0, max_batch_size=16, load_duration_s=4.812055719
        ),
    )
    workloads = (
        SimWorkload(
            "inference",
            "triton-bert",
            replicas=3,
            profile="inference",
            container="triton-server",
            triton_models=triton_models,
            capacity_rps=150.0,
            load=DiurnalLoad(
                mean_rps=300.0,
                amplitude=0.45,
                period_s=period_s,
                peak_at_s=0.6 * period_s,
                burst_every_s=period_s / 3,
                burst_duration_s=period_s / 15,
                burst_factor=0.8,
                seed=seed,
            ),
            node_selector=H100_SELECTOR,
        ),
        SimWorkload(
            "nim",
            "llama3-8b",
            replicas=2,
            profile="llm-decode",
            container="nim-llm",
            capacity_rps=8.0,
            load=DiurnalLoad(mean_rps=10.0, amplitude=0.5, period_s=period_s, burst_every_s=0, seed=seed + 1),
            node_selector=H100_SELECTOR,
        ),
        SimWorkload(
            "ml-training",
            "llm-finetune-worker",
            kind="StatefulSet",
            replicas=1,
            gpus_per_pod=4,
            profile="training",
            container="pytorch",
            node_selector=H100_SELECTOR,
        ),
        SimWorkload(
            "ml-batch",
            "embeddings-batch",
            replicas=1,
            profile="batch-light",
            container="encoder",
            capacity_rps=100.0,
            load=ConstantLoad(27.0),
            node_selector=H100_SELECTOR,
        ),
        SimWorkload(
            "inference",
            "whisper-asr",
            replicas=2,
            profile="inference",
            container="asr",
            capacity_rps=20.0,
            load=DiurnalLoad(mean_rps=16.0, amplitude=0.3, period_s=period_s, burst_every_s=0, seed=seed + 2),
            mig_profile="2g.20gb",
            image="ghcr.io/example/whisper-asr:0.9.1",
        ),
        SimWorkload(
            "ml-dev",
            "notebook",
            replicas=1,
            profile="idle",
            container="notebook",
            mig_profile="1g.10gb",
        ),
    )
    return Scenario(nodes=(*h100_nodes, a100_node), workloads=workloads, seed=seed)
