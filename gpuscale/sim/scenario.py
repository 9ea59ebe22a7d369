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
  its pods, Deployments + ReplicaSets, StatefulSets, Pods) as plain dicts in API JSON shape
  (``kube_manifests``).
- ``pods_by_gpu()`` is what dcgm-exporter learns from the kubelet PodResources API: which container holds
  which GPU / MIG instance on each node. The DCGM renderer labels series with it, so the DCGM pod labels
  and the Pod objects agree by construction.

Names follow Kubernetes (``object_names``). The parts live beside it: hardware in ``gpu_nodes``, workloads and
their pods in ``workloads``, the demo's cluster in ``demo_cluster``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuscale.sim import kube_manifests
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode
from gpuscale.sim.load import LoadModel
from gpuscale.sim.object_names import name_suffix, object_uid, template_hash
from gpuscale.sim.workloads import ContainerRef, Placement, PodKey, SimWorkload

__all__ = ["Scenario"]


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
        return template_hash(self.seed, workload.namespace, workload.name, workload.kind)

    def owner_name(self, workload: SimWorkload) -> str:
        """The pods' controller: the ReplicaSet ``<deploy>-<hash>`` or the StatefulSet itself."""
        if workload.kind == "Deployment":
            return f"{workload.name}-{self.pod_template_hash(workload)}"
        return workload.name

    def pod_name(self, workload: SimWorkload, ordinal: int) -> str:
        if workload.kind == "StatefulSet":
            return f"{workload.name}-{ordinal}"
        suffix = name_suffix(self.seed, workload.namespace, workload.name, ordinal)
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
            uid=object_uid(self.seed, "Pod", w.namespace, pod),
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
        """The cluster as Kubernetes API objects (see ``kube_manifests.kube_objects``)."""
        return kube_manifests.kube_objects(
            self, triton_ports=triton_ports, exporter_ports=exporter_ports, placements=placements
        )
