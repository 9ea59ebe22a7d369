"""The demo's cluster: a realistic small GPU cluster for ``gpuscale demo`` and the end-to-end tests."""

from __future__ import annotations

from gpuscale.sim.gpu_activity import A100_SXM4_80GB, H100_SXM
from gpuscale.sim.gpu_nodes import MIG_ALL_BALANCED, SimNode
from gpuscale.sim.load import ConstantLoad, DiurnalLoad
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.serving_queue import TritonModel
from gpuscale.sim.workloads import SimWorkload

__all__ = ["demo_scenario"]

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
    h100_nodes = _h100_nodes(seed)
    a100_node = _a100_node(seed)
    workloads = (*_h100_workloads(seed, period_s), *_mig_workloads(seed, period_s))
    return Scenario(nodes=(*h100_nodes, a100_node), workloads=workloads, seed=seed)


def _h100_nodes(seed: int) -> tuple[SimNode, ...]:
    """The three p5.48xlarge nodes, two zones."""
    zones = ("us-east-1a", "us-east-1b", "us-east-1a")
    return tuple(
        SimNode.build(name, hardware=H100_SXM, seed=seed, instance_type="p5.48xlarge", zone=zone)
        for name, zone in zip(
            ("ip-10-0-131-77.ec2.internal", "ip-10-0-140-12.ec2.internal", "ip-10-0-152-203.ec2.internal"),
            zones,
            strict=True,
        )
    )


def _a100_node(seed: int) -> SimNode:
    """The p4de.24xlarge node, GPUs 0 and 1 cut into MIG instances."""
    return SimNode.build(
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


def _triton_models() -> tuple[TritonModel, ...]:
    """The two models triton-bert serves."""
    return (
        TritonModel(
            "bert_qa_onnx", "2", share=0.3, compute_infer_us=10240.0, max_batch_size=1, load_duration_s=11.304518226
        ),
        TritonModel(
            "resnet50_trt", "1", share=0.7, compute_infer_us=1560.0, max_batch_size=16, load_duration_s=4.812055719
        ),
    )


def _h100_workloads(seed: int, period_s: float) -> tuple[SimWorkload, ...]:
    """Serving, training and batch workloads on whole H100s."""
    triton_models = _triton_models()
    return (
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
    )


def _mig_workloads(seed: int, period_s: float) -> tuple[SimWorkload, ...]:
    """The workloads on the A100's MIG instances."""
    return (
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
