"""The simulated cluster's workloads and their pods: what a Deployment or StatefulSet asks for, and where each
replica landed (``Placement``, made by ``Scenario.placements``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from gpuscale.sim.gpu_activity import PROFILES, Profile
from gpuscale.sim.gpu_nodes import MIG_PROFILE_FB_MIB, GpuSlot
from gpuscale.sim.load import ConstantLoad, LoadModel
from gpuscale.sim.serving_queue import TritonModel

__all__ = ["ContainerRef", "Placement", "PodKey", "SimWorkload", "WorkloadKind"]

PodKey = tuple[str, str]
"""``(namespace, pod name)``."""

WorkloadKind = Literal["Deployment", "StatefulSet"]

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


class ContainerRef(NamedTuple):
    """The container dcgm-exporter attributes a GPU to (its ``namespace``/``pod``/``container`` labels)."""

    namespace: str
    pod: str
    container: str
