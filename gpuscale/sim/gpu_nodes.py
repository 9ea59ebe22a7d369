"""The simulated cluster's hardware: GPU nodes, their GPUs and MIG instances, and the devices a pod can be given.

A ``SimNode`` carries the labels GPU Feature Discovery and the GPU Operator put on a real node; ``slots()`` lists
what the device plugin would advertise (whole GPUs as ``nvidia.com/gpu``, MIG instances as
``nvidia.com/mig-<profile>``, mixed strategy). GPU UUIDs are deterministic in (seed, node, index).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from gpuscale.sim.gpu_activity import H100_SXM, GpuModel
from gpuscale.sim.object_names import gpu_uuid

__all__ = ["MIG_ALL_BALANCED", "MIG_PROFILE_FB_MIB", "GpuSlot", "MigInstance", "SimGpu", "SimNode", "mig_counts"]

# NB: 1g/2g/3g sizes as in the MIG fixture (A100-80GB); 4g and 7g are plausible, invented.
MIG_PROFILE_FB_MIB: dict[str, int] = {
    "1g.10gb": 9728,
    "1g.20gb": 19968,
    "2g.20gb": 19968,
    "3g.40gb": 40192,
    "4g.40gb": 40192,
    "7g.80gb": 80384,
}


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
            for profile, count in mig_counts(gpus).items():
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


def mig_counts(gpus: Iterable[SimGpu]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for gpu in gpus:
        for inst in gpu.mig:
            counts[inst.profile] = counts.get(inst.profile, 0) + 1
    return dict(sorted(counts.items()))
