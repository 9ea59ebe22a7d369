"""The fleet the dashboard tests load into a real Prometheus: what each exporter exposes, over two hours.

Built only from what the exporters really expose: the shipped scrapes of tests/fixtures (dcgm-exporter's H100 node,
Triton, vLLM, NIM; see tests/fixtures/README.md), gpuscale's own registries (the adapter's and the controller's
prometheus-client collectors, exercised), and the kube-state-metrics series the rules join with (written here,
with kube-state-metrics' metric and label names). Healthy and faulty side by side: the H100 fixture's faulty
GPU 5 (Xid 94/63, double-bit ECC, thermal slowdown), an idle GPU with no pod, and a second node cloned from the first
where a notebook holds a GPU it never uses and the fine-tuning job's second worker runs.

Gauges keep their scraped value, shaped over time by ``shape`` (a straggler, then a hang, in the fine-tuning job;
a wave of inference load); counters (and histogram buckets) rise at the rate between a fixture and its
``-t0`` scrape 60 s earlier (the whole two hours), or, without one, from half their value to their value (``_grown``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import generate_latest

from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.metrics.exposition import parse_families
from gpuscale.metrics.series import TargetHealth

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
NODE_1 = "ip-10-0-131-77.ec2.internal"
NODE_2 = "ip-10-0-140-12.ec2.internal"
STEP = 60

Sample = tuple[str, dict[str, str], float, bool]  # name, labels, value, monotonic
Series = tuple[str, dict[str, str], list[tuple[float, float]]]


def scrape(text: str) -> list[Sample]:
    out = []
    # NB: gpuscale's own parser keeps sample names as exposed (prometheus_client's appends _total to counters).
    for family in parse_families(text):
        monotonic = family.type in {"counter", "histogram"}
        for s in family.samples:
            if not math.isnan(s.value):
                out.append((s.name, dict(s.labels), s.value, monotonic and not s.name.endswith("_created")))
    return out


def _key(name: str, labels: dict[str, str]) -> tuple:
    return (name, tuple(sorted(labels.items())))


def over_time(now: list[Sample], before: list[Sample] | None, *, start: float, end: float) -> list[Series]:
    earlier = {_key(n, lab): v for n, lab, v, _ in before or []}
    times = [start + i * STEP for i in range(int((end - start) // STEP) + 1)]
    out = []
    for name, labels, value, monotonic in now:
        if name.endswith("_timestamp_seconds"):  # a time: as old at every moment as it is at the end
            points = [(t, t - (end - value)) for t in times]
        elif not monotonic:
            points = [(t, value * shape(name, labels, t, end=end)) for t in times]
        elif (k := _key(name, labels)) in earlier:
            # the scraped rate all along; totals raised where two hours at that rate exceed the scraped total
            rate = max(0.0, value - earlier[k]) / 60
            base = value + max(0.0, rate * (end - start) - value)
            points = [(t, base - rate * (end - t)) for t in times]
        else:
            points = [(t, _grown(name, value, (t - start) / (end - start))) for t in times]
        out.append((name, labels, points))
    return out


ACTIVITY = ("DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_DRAM_ACTIVE")
TRAFFIC = ("DCGM_FI_PROF_NVLINK_TX_BYTES", "DCGM_FI_PROF_NVLINK_RX_BYTES", "DCGM_FI_PROF_PCIE_TX_BYTES",
           "DCGM_FI_PROF_PCIE_RX_BYTES")  # fmt: skip
HANG_MINUTES = 40  # the fine-tuning job hangs this long before the end: SMs and NVLink near zero, pods still there


def shape(name: str, labels: dict[str, str], t: float, *, end: float) -> float:
    """A gauge's value over time as a multiple of its scraped value: the stories the pictures tell.

    The fine-tuning JobSet (two workers, eight GPUs) runs with one straggling rank (worker-1's GPU 3 at half its
    peers' SM activity), then hangs for the last HANG_MINUTES (GPU_UTIL stays high, as it does while NCCL spins);
    inference GPUs' activity follows an hourly wave of ±20 % (their GPU_UTIL stays flat).
    """
    pod = labels.get("pod", "")
    if pod.startswith("llm-finetune-worker-"):
        if t > end - HANG_MINUTES * 60:
            return 0.02 if name in ACTIVITY else 0.0 if name in TRAFFIC else 1.0
        if pod.endswith("-1") and labels.get("gpu") == "3" and name in ACTIVITY:
            return 0.5
        return 1.0
    if labels.get("namespace") in {"inference", "nim"} and name in ACTIVITY:
        return 1.0 + 0.2 * math.sin(2 * math.pi * t / 3600)
    return 1.0


def _grown(name: str, value: float, fraction: float) -> float:
    """A counter seen once, ``fraction`` of the way through the window: DCGM's counts (ECC errors, remapped rows,
    Xid windows) jump from half to their value halfway (an event an hour before the end); others grow linearly."""
    if name.startswith("DCGM_") and value.is_integer():
        return value if fraction >= 0.5 else float(math.floor(value / 2))
    return value * (0.5 + 0.5 * fraction)


def with_labels(samples: Iterable[Sample], **labels: str) -> list[Sample]:
    return [(n, {**lab, **labels}, v, m) for n, lab, v, m in samples]


SECOND_NODE_PODS = {  # node 1's pod → node 2's
    "triton-inference-7d9f8b6c5-x2k4q": "triton-inference-7d9f8b6c5-m8d2w",
    "llama3-8b-instruct-5c6b9d8f47-qz7mh": "llama3-8b-instruct-5c6b9d8f47-r4t9n",
    "llm-finetune-worker-0": "llm-finetune-worker-1",
    "embeddings-batch-28471-8xk2p": "embeddings-batch-28471-c3v7x",
}


def dcgm() -> list[Sample]:
    node_1 = scrape((FIXTURES / "dcgm" / "dcgm-exporter-h100-8gpu.prom").read_text())
    node_2 = []
    for name, labels, value, monotonic in node_1:
        labels = {**labels, "Hostname": NODE_2, "UUID": labels["UUID"].replace("GPU-", "GPU-b")}
        if "pod" in labels:
            labels["pod"] = SECOND_NODE_PODS[labels["pod"]]
        elif labels["gpu"] == "6":  # a notebook holds node 2's idle GPU
            labels.update(container="notebook", namespace="notebooks", pod="jupyter-alice-0", pod_uid="")
        if labels["gpu"] == "5":  # node 2's GPU 5 is healthy: a copy of GPU 4
            continue
        node_2.append((name, labels, value, monotonic))
    healthy_5 = [
        (n, {**lab, "gpu": "5", "UUID": "GPU-b5", "device": "nvidia5"}, v, m)
        for n, lab, v, m in node_2
        if lab["gpu"] == "4"
    ]
    return node_1 + node_2 + healthy_5


def servers() -> list[tuple[list[Sample], list[Sample] | None]]:
    """(now, 60 s before) per inference-server pod, with the pod labels a PodMonitor gives its series."""
    pods = [
        ("triton/triton", "inference", "triton-inference-7d9f8b6c5-x2k4q"),
        ("llm/vllm-v0.11", "llm", "vllm-llama-0"),
        ("llm/nim-llm", "nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh"),
    ]
    out = []
    for path, namespace, pod in pods:
        now = scrape((FIXTURES / f"{path}.prom").read_text())
        before = scrape((FIXTURES / f"{path}-t0.prom").read_text())
        out.append((with_labels(now, namespace=namespace, pod=pod), with_labels(before, namespace=namespace, pod=pod)))
    return out


class _Source:
    def __init__(self, name: str, targets: list[TargetHealth]) -> None:
        self.name, self._targets = name, targets

    def health(self) -> list[TargetHealth]:
        return self._targets


def gpuscale_itself(now: float) -> list[Sample]:
    """The adapter's and the controller's own /metrics, from their real registries."""
    targets = [
        TargetHealth(
            target="http://prometheus-operated.monitoring.svc:9090",
            healthy=True,
            last_success=now - 4,
            last_duration_seconds=0.08,
            series=412,
            failures_total=2,
        ),
        TargetHealth(
            target=f"http://{NODE_2}:9400/metrics",
            healthy=False,
            last_success=now - 300,
            failures_total=17,
            last_error="connection refused",
            last_error_kind="connect",
            last_error_at=now - 5,
        ),
    ]
    adapter = AdapterMetrics(lambda: [_Source("prometheus", targets)], clock=lambda: now)
    for code, n in (("200", 900), ("404", 12), ("503", 3)):
        adapter.requests.labels("custom.metrics.k8s.io", "pods", code).inc(n)
    for seconds in (0.0007, 0.002, 0.004, 0.02):
        adapter.request_seconds.labels("custom.metrics.k8s.io").observe(seconds)
    adapter.refresh_seconds.observe(0.12)
    adapter.refresh_timestamp.set(now - 3)
    adapter.devices.set(16)
    adapter.series.set(1400)
    controller = ControllerMetrics(lambda: [("exporter", t) for t in targets])
    controller.actions.labels("health", "patch", "applied").inc(3)
    controller.actions.labels("health", "event", "applied").inc(3)
    controller.held_back.inc(1)
    controller.held_back_nodes.set(0)
    controller.remediated_nodes.set(1)
    controller.pool_nodes.labels("h100-ondemand").set(1)
    controller.pool_nodes.labels("h100-spot").set(1)
    controller.pools.set(2)
    controller.idle_gpus.labels(NODE_2).set(1)
    controller.idle_gpu_seconds.inc(5400)
    controller.reconcile_seconds.observe(0.4)
    controller.reconcile_failures.labels("plan").inc(0)
    controller.leader.set(1)
    controller.telemetry_nodes.labels("true").set(1)
    controller.telemetry_nodes.labels("false").set(1)
    controller.dry_run.set(0)
    return with_labels(
        scrape(generate_latest(adapter.registry).decode()), namespace="gpuscale", pod="gpuscale-adapter-6c9d7-k2x4p"
    ) + with_labels(
        scrape(generate_latest(controller.registry).decode()),
        namespace="gpuscale",
        pod="gpuscale-controller-5f8b-q7m2z",
    )


def kube_state_metrics(pods: Iterable[tuple[str, str]]) -> list[Sample]:
    """kube-state-metrics' series for the pods on the GPUs (names and labels as kube-state-metrics v2 writes them;
    pod labels as exported with --metric-labels-allowlist=pods=[jobset.sigs.k8s.io/jobset-name,…])."""
    out: list[Sample] = []
    for namespace, pod in sorted(set(pods)):
        if pod.startswith("llm-finetune-worker-"):
            owner = ("Job", "llm-finetune-workers-0")
            out.append(
                (
                    "kube_pod_labels",
                    {"namespace": namespace, "pod": pod, "label_jobset_sigs_k8s_io_jobset_name": "llm-finetune"},
                    1.0,
                    False,
                )
            )
        elif pod.startswith("embeddings-batch-"):
            owner = ("Job", "embeddings-batch-28471")
        elif pod.startswith("jupyter-"):
            owner = ("StatefulSet", "jupyter-alice")
        else:
            owner = ("ReplicaSet", pod.rsplit("-", 1)[0])
        out.append(
            (
                "kube_pod_owner",
                {
                    "namespace": namespace,
                    "pod": pod,
                    "owner_kind": owner[0],
                    "owner_name": owner[1],
                    "owner_is_controller": "true",
                },
                1.0,
                False,
            )
        )
    for node, pool in ((NODE_1, "h100-ondemand"), (NODE_2, "h100-spot")):
        out.append(
            (
                "kube_node_labels",
                {
                    "node": node,
                    "label_karpenter_sh_nodepool": pool,
                    "label_node_kubernetes_io_instance_type": "p5.48xlarge",
                },
                1.0,
                False,
            )
        )
    for namespace, hpa, desired, current in (("inference", "triton-inference", 3, 2), ("llm", "vllm-llama", 2, 2)):
        labels = {"namespace": namespace, "horizontalpodautoscaler": hpa}
        out.append(("kube_horizontalpodautoscaler_status_desired_replicas", labels, float(desired), False))
        out.append(("kube_horizontalpodautoscaler_status_current_replicas", labels, float(current), False))
        for status, v in (("true", 1.0), ("false", 0.0)):
            out.append(
                (
                    "kube_horizontalpodautoscaler_status_condition",
                    {**labels, "condition": "ScalingActive", "status": status},
                    v,
                    False,
                )
            )
    return out


def fleet(*, end: float, hours: float = 2.0) -> list[Series]:
    start = end - hours * 3600
    gpus = dcgm()
    pods = [(lab["namespace"], lab["pod"]) for _, lab, _, _ in gpus if lab.get("pod")]
    series = over_time(gpus, None, start=start, end=end)
    for now, before in servers():
        series += over_time(now, before, start=start, end=end)
    series += over_time(gpuscale_itself(end), None, start=start, end=end)
    series += over_time(kube_state_metrics(pods), None, start=start, end=end)
    return series
