"""GPU utilization history on a fixed time grid: what ``gpuscale report`` reads, whoever fetched it.

Pure data (numpy arrays, no I/O). ``sources/history_fetch.py`` fills it from a Prometheus-compatible range API,
``sources/history_file.py`` from an exported file; ``report/`` reads it. Shape::

    History(start, step_seconds, steps)             the grid: sample i describes [start + i·step, + step)
      gpus[k]   GpuHistory(key, node, product, mig_profile)
                  values[field] float32[steps]      NaN = no sample (gap, DCGM blank, NaN, ±Inf)
                  pod           int32[steps]        index into ``pods``; -1 = no pod held the GPU then
      pods[j]   PodRef(namespace, name)
      owners    (namespace, pod) → Owner(kind, name)   Deployment / StatefulSet / Job / DaemonSet / Pod
      requests  (namespace, pod) → GPUs requested   from kube-state-metrics when present
      node_pools node → pool                         the first pool label present, else the node name
      gaps      human sentences: what is missing and why (shown in every report format)

A GPU whose pod changes over the window keeps one ``GpuHistory``: the pod index changes along the grid,
so a Deployment's history is the union of its pods' GPU-steps, whatever pods came and went.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

# Field → DCGM series name. The report needs these and nothing else (FB_FREE is not fetched: peak FB used and the
# product's memory size are what the fits need). Raw mode holds GPUs × steps × 4 bytes per field a GPU reports:
# 173 MB per field at 1,000 GPUs × 30 days × 1 minute; past that, use summary mode.
FIELDS: dict[str, str] = {
    "gpu_util_percent": "DCGM_FI_DEV_GPU_UTIL",
    "sm_active": "DCGM_FI_PROF_SM_ACTIVE",
    "tensor_active": "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "dram_active": "DCGM_FI_PROF_DRAM_ACTIVE",
    "gr_engine_active": "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "fb_used_mib": "DCGM_FI_DEV_FB_USED",
    "last_xid": "DCGM_FI_DEV_XID_ERRORS",
    "ecc_dbe_volatile": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "clock_event_reasons": "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
}
# Newer dcgm-exporters name field 112 CLOCKS_EVENT_REASONS; either spelling fills ``clock_event_reasons``.
FIELD_ALIASES: dict[str, tuple[str, ...]] = {"clock_event_reasons": ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",)}

# The node labels that name a pool, most specific first (kube-state-metrics spells them label_<sanitised>).
POOL_LABELS: tuple[str, ...] = (
    "karpenter.sh/nodepool",
    "cloud.google.com/gke-nodepool",
    "eks.amazonaws.com/nodegroup",
    "kubernetes.azure.com/agentpool",
    "node.kubernetes.io/instance-type",
)


def ksm_label(label: str) -> str:
    """``karpenter.sh/nodepool`` → ``label_karpenter_sh_nodepool`` (kube-state-metrics' kube_node_labels)."""
    return "label_" + "".join(c if c.isalnum() else "_" for c in label)


def pool_of(node_labels: dict[str, str]) -> str | None:
    """The pool a node belongs to from its labels (Kubernetes or kube-state-metrics spelling), or None."""
    for label in POOL_LABELS:
        value = node_labels.get(label) or node_labels.get(ksm_label(label))
        if value:
            return value
    return None


# The label a multi-cluster store (Thanos' external labels, a central Prometheus) puts on every series of a cluster.
CLUSTER_LABEL = "cluster"


def in_cluster(name: str, labels: Mapping[str, str]) -> str:
    """A namespace or node name as the report keys it: ``cluster/name`` when the series carries a cluster label, so
    two clusters' ``serve`` namespaces (or ``node-1``s) are kept apart; the name itself otherwise."""
    cluster = labels.get(CLUSTER_LABEL)
    return f"{cluster}/{name}" if cluster and name else name


@dataclass(frozen=True, slots=True, order=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True, slots=True)
class Owner:
    """The workload a pod belongs to: ``kind`` is Deployment, StatefulSet, Job, DaemonSet, ReplicaSet or Pod
    (a bare pod owns itself); ``source`` says how it was found (kube-state-metrics, kubernetes, none)."""

    kind: str
    name: str
    source: str = "kube-state-metrics"


@dataclass(slots=True)
class GpuHistory:
    """One GPU (or MIG instance) over the window."""

    key: str  # UUID (plus GPU_I_ID on MIG), else Hostname/gpu index
    node: str
    product: str | None
    mig_profile: str | None
    pod: np.ndarray  # int32[steps]
    values: dict[str, np.ndarray] = field(default_factory=dict)  # field → float32[steps]

    def field(self, name: str) -> np.ndarray | None:
        return self.values.get(name)


@dataclass(slots=True)
class History:
    start: float  # epoch seconds of sample 0
    step_seconds: float
    steps: int
    gpus: list[GpuHistory] = field(default_factory=list)
    pods: list[PodRef] = field(default_factory=list)
    owners: dict[PodRef, Owner] = field(default_factory=dict)
    requests: dict[PodRef, float] = field(default_factory=dict)
    startups: dict[PodRef, float] = field(default_factory=dict)
    """Seconds from pod start to Ready (kube-state-metrics), where known: the measured cold start."""
    node_pools: dict[str, str] = field(default_factory=dict)
    gaps: list[str] = field(default_factory=list)
    source: str = ""
    mode: str = "raw"  # raw samples on the grid
    _pod_ids: dict[PodRef, int] = field(default_factory=dict, repr=False)

    @property
    def end(self) -> float:
        return self.start + self.steps * self.step_seconds

    def times(self) -> np.ndarray:
        return self.start + self.step_seconds * np.arange(self.steps, dtype=np.float64)

    def pod_index(self, ref: PodRef) -> int:
        """The index of ``ref`` in ``pods``, appended when new."""
        if len(self._pod_ids) != len(self.pods):  # NB: pods filled directly (a file): index them once
            self._pod_ids = {p: i for i, p in enumerate(self.pods)}
        i = self._pod_ids.get(ref)
        if i is None:
            self.pods.append(ref)
            i = self._pod_ids[ref] = len(self.pods) - 1
        return i

    def new_gpu(self, key: str, *, node: str, product: str | None = None, mig_profile: str | None = None) -> GpuHistory:
        gpu = GpuHistory(key, node, product, mig_profile, np.full(self.steps, -1, dtype=np.int32))
        self.gpus.append(gpu)
        return gpu

    def empty_field(self) -> np.ndarray:
        return np.full(self.steps, np.nan, dtype=np.float32)


def clean(values: np.ndarray) -> np.ndarray:
    """NaN for non-finite values and DCGM blank sentinels (≥ 1.4e14 in magnitude), as float32."""
    out = np.asarray(values, dtype=np.float64)
    bad = ~np.isfinite(out) | (np.abs(out) >= 1.4e14)
    out = np.where(bad, np.nan, out)
    return out.astype(np.float32)


# --- summaries: what the TSDB computed from raw samples, when raw samples do not fit here ---------------------------


@dataclass(slots=True)
class SeriesSummary:
    """One DCGM series (one GPU, or MIG instance, while one pod — or none — held it), one field, per chunk, all from
    its raw samples (range selectors, never subqueries: no lookback fills a gap).

    ``count``, ``total`` (the sum) and ``maximum`` are float64[chunks], NaN where the series has no sample in the
    chunk; ``quantiles`` is float64[len(levels), chunks], ``quantile_over_time(level, F[chunk])``."""

    gpu: str
    node: str
    product: str | None
    pod: PodRef | None
    field: str
    count: np.ndarray
    total: np.ndarray
    maximum: np.ndarray
    levels: tuple[float, ...] = ()
    quantiles: np.ndarray | None = None


@dataclass(slots=True)
class OwnerSteps:
    """One pod owner (kube_pod_owner's kind and name: a ReplicaSet, StatefulSet, Job …) as the TSDB summed its pods'
    series at each grid step (the samples in the step's window, no lookback): GPUs held, GPUs busy, activity summed
    (GPU-equivalents in use), pods alive; and per verdict block each diagnosed field's sum and sample count."""

    held: np.ndarray
    busy: np.ndarray
    demand: np.ndarray
    alive: np.ndarray
    block_sums: dict[str, np.ndarray] = field(default_factory=dict)
    block_counts: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(slots=True)
class SummaryIncident:
    kind: str  # xid | ecc-dbe | throttle
    node: str
    gpu: str
    pod: PodRef | None
    chunk: int
    value: float  # the Xid (max in the chunk), the ECC DBE increase, or the steps throttled
    count: int  # Xid changes in the chunk, or steps throttled
    first_seen: float | None = None  # throttle: the first and last step with an abnormal bit
    last_seen: float | None = None


@dataclass(slots=True)
class SummaryHistory:
    start: float
    step_seconds: float
    chunk_seconds: float
    chunks: int
    interval_seconds: float = 0.0  # what one sample counts for (the scrape interval); 0: the step
    block_seconds: float = 3600.0
    series: list[SeriesSummary] = field(default_factory=list)
    owner_steps: dict[tuple[str, str, str], OwnerSteps] = field(default_factory=dict)  # (ns, kind, name)
    # NB: the steps a pod had no kube_pod_owner series (a bare pod, a cluster without kube-state-metrics): per pod,
    # so the report folds them into the owner it learns later (the Kubernetes API's) or reports the pod bare
    pod_steps: dict[PodRef, OwnerSteps] = field(default_factory=dict)
    parents: dict[tuple[str, str, str], tuple[str, str]] = field(default_factory=dict)  # (kind, ns, name) → owner
    owners: dict[PodRef, Owner] = field(default_factory=dict)
    requests: dict[PodRef, float] = field(default_factory=dict)
    startups: dict[PodRef, float] = field(default_factory=dict)
    node_pools: dict[str, str] = field(default_factory=dict)
    incidents: list[SummaryIncident] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    source: str = ""
    queries: int = 0

    @property
    def end(self) -> float:
        return self.start + self.chunks * self.chunk_seconds

    @property
    def steps(self) -> int:
        return round(self.chunks * self.chunk_seconds / self.step_seconds)

    @property
    def sample_seconds(self) -> float:
        return self.interval_seconds or self.step_seconds

    @property
    def pods(self) -> list[PodRef]:
        """The pods that held a GPU with a sample in the window (those whose owners the Kubernetes API is asked)."""
        return sorted({s.pod for s in self.series if s.pod is not None})
