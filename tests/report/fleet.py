"""A small fleet's DCGM and kube-state-metrics history with known answers, written the two ways real backends
load history: OpenMetrics text for ``promtool tsdb create-blocks-from openmetrics`` (Prometheus) and JSON lines
for VictoriaMetrics' ``/api/v1/import``.

Over ``hours`` at 1-minute samples ending at ``end``:

* node-a (pool ``gpu-ondemand``, H100): pod ml/trainer-7d9f-abcde of Deployment ``trainer`` (through ReplicaSet
  trainer-7d9f) holds 4 GPUs and requests 4; GPU 0 runs at util 98 %, SM 0.7; GPUs 1–3 sit at 0.
* node-b (pool ``gpu-spot``, H100): pod web/infer-0 of StatefulSet ``infer`` holds GPU 0 at util 60 %, SM 0.08,
  FB 7 GiB; GPU 1 is held by no pod (the exporter's own target labels) and reports Xid 79 after the first hour.

* node-c (pool ``gpu-serve``, H100): pod serve/chat-5c8f-qwert of Deployment ``chat`` holds GPU 0 with bursty SM
  activity — a 30 % baseline with rare peaks, exact p95 65 % and p99 93 % (``chat_activity``) — util 100 %,
  FB 20,000 MiB: the production case that must not be told to shrink.

Hand counts (per hour of window): trainer 4 GPU-h allocated, 0.7 active; infer 1 allocated, 0.08 active;
1 GPU-h unallocated; chat 1 allocated, mean(chat_activity) active.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

H100 = "NVIDIA H100 80GB HBM3"
Series = tuple[str, dict[str, str], list[tuple[float, float]]]


def chat_activity(samples: int) -> list[float]:
    """Deterministic bursty activity: 2 % of samples at 0.93, 4 % at 0.65, the rest 0.3, in bursts of 8 samples."""
    import numpy as np

    values = np.full(samples, 0.3)
    top, next_ = int(samples * 0.02), int(samples * 0.04)
    values[:top], values[top : top + next_] = 0.93, 0.65
    blocks = values.reshape(-1, 8)
    return [float(v) for v in blocks[np.random.default_rng(11).permutation(len(blocks))].reshape(-1)]


def fleet(*, end: float, hours: int, step: float = 60.0) -> list[Series]:
    start = end - hours * 3600
    times = [start + i * step for i in range(int(hours * 3600 / step))]
    out: list[Series] = []

    def gpu(node: str, index: int, pod: str, namespace: str, fields: dict[str, float | list[float]]) -> None:
        labels = {
            "Hostname": node,
            "UUID": f"GPU-{node}-{index}",
            "gpu": str(index),
            "modelName": H100,
            "pod": pod,
            "namespace": namespace,
        }
        for name, value in fields.items():
            values = value if isinstance(value, list) else [value] * len(times)
            out.append((name, labels, list(zip(times, values, strict=True))))

    for i in range(4):
        busy = i == 0
        gpu(
            "node-a",
            i,
            "trainer-7d9f-abcde",
            "ml",
            {
                "DCGM_FI_DEV_GPU_UTIL": 98.0 if busy else 0.0,
                "DCGM_FI_PROF_SM_ACTIVE": 0.7 if busy else 0.0,
                "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.5 if busy else 0.0,
                "DCGM_FI_DEV_FB_USED": 30000.0 if busy else 0.0,
                "DCGM_FI_DEV_XID_ERRORS": 0.0,
            },
        )
    gpu(
        "node-b",
        0,
        "infer-0",
        "web",
        {
            "DCGM_FI_DEV_GPU_UTIL": 60.0,
            "DCGM_FI_PROF_SM_ACTIVE": 0.08,
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.05,
            "DCGM_FI_DEV_FB_USED": 7168.0,
            "DCGM_FI_DEV_XID_ERRORS": 0.0,
        },
    )
    xid = [0.0 if t < start + 3600 else 79.0 for t in times]
    gpu(
        "node-b",
        1,
        "nvidia-dcgm-exporter-x7k2p",
        "gpu-operator",
        {
            "DCGM_FI_DEV_GPU_UTIL": 0.0,
            "DCGM_FI_PROF_SM_ACTIVE": 0.0,
            "DCGM_FI_DEV_FB_USED": 0.0,
            "DCGM_FI_DEV_XID_ERRORS": xid,
        },
    )
    gpu(
        "node-c",
        0,
        "chat-5c8f-qwert",
        "serve",
        {
            "DCGM_FI_DEV_GPU_UTIL": 100.0,
            "DCGM_FI_PROF_SM_ACTIVE": chat_activity(len(times)),
            "DCGM_FI_DEV_FB_USED": 20000.0,
            "DCGM_FI_DEV_XID_ERRORS": 0.0,
        },
    )
    ksm = [(t, 1.0) for t in times]
    out.append(
        (
            "kube_pod_owner",
            {"namespace": "ml", "pod": "trainer-7d9f-abcde", "owner_kind": "ReplicaSet", "owner_name": "trainer-7d9f"},
            ksm,
        )
    )
    out.append(
        (
            "kube_replicaset_owner",
            {"namespace": "ml", "replicaset": "trainer-7d9f", "owner_kind": "Deployment", "owner_name": "trainer"},
            ksm,
        )
    )
    out.append(
        (
            "kube_pod_owner",
            {"namespace": "web", "pod": "infer-0", "owner_kind": "StatefulSet", "owner_name": "infer"},
            ksm,
        )
    )
    out.append(
        (
            "kube_pod_owner",
            {"namespace": "serve", "pod": "chat-5c8f-qwert", "owner_kind": "ReplicaSet", "owner_name": "chat-5c8f"},
            ksm,
        )
    )
    out.append(
        (
            "kube_replicaset_owner",
            {"namespace": "serve", "replicaset": "chat-5c8f", "owner_kind": "Deployment", "owner_name": "chat"},
            ksm,
        )
    )
    for ns, pod, n in (("ml", "trainer-7d9f-abcde", 4.0), ("web", "infer-0", 1.0), ("serve", "chat-5c8f-qwert", 1.0)):
        out.append(
            (
                "kube_pod_container_resource_requests",
                {"namespace": ns, "pod": pod, "container": "main", "resource": "nvidia_com_gpu", "unit": "integer"},
                [(t, n) for t, _ in ksm],
            )
        )
    for node, pool in (("node-a", "gpu-ondemand"), ("node-b", "gpu-spot"), ("node-c", "gpu-serve")):
        out.append(("kube_node_labels", {"node": node, "label_karpenter_sh_nodepool": pool}, ksm))
    return out


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))


def openmetrics(series: list[Series]) -> Iterator[str]:
    """OpenMetrics text, one family after another (promtool wants each family's samples together)."""
    names = list(dict.fromkeys(name for name, _, _ in series))
    for name in names:
        yield f"# TYPE {name} gauge\n"
        for n, labels, samples in series:
            if n == name:
                head = f"{name}{{{_labels(labels)}}} "  # NB: once per series, not per sample (~1 M lines a fleet)
                yield "".join(f"{head}{v} {t:.3f}\n" for t, v in samples)
    yield "# EOF\n"


def vm_import(series: list[Series]) -> Iterator[str]:
    """VictoriaMetrics' /api/v1/import JSON lines (timestamps in milliseconds)."""
    for name, labels, samples in series:
        yield (
            json.dumps(
                {
                    "metric": {"__name__": name, **labels},
                    "values": [v for _, v in samples],
                    "timestamps": [int(t * 1000) for t, _ in samples],
                }
            )
            + "\n"
        )
