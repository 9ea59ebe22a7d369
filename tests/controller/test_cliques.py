"""NVLink-domain warnings: NVLink-bound gangs split or too big for any domain, tensor-parallel groups split.

Scope: the domain of a bound pod is its node's ``nvidia.com/gpu.clique``; nodes without it are unknown, not
guessed; each warning is an Event planned once (re-running on the state with the Event plans nothing).
"""

from __future__ import annotations

import pytest

from gpuscale.controller.cliques import NODE, plan_clique_warnings
from gpuscale.controller.gangs import GANG_KINDS, gangs_of
from gpuscale.controller.pools import load_pools_policy, pools_of
from gpuscale.sim.kubeapi import SimKubeApi

from .kube import apply_in_process, sim_view
from .objects import gpu_node
from .test_provisioning import gpu_pod, volcano_group

KINDS = (*GANG_KINDS, NODE)


@pytest.fixture
def sim(batch_sim) -> SimKubeApi:
    api = batch_sim
    for name, clique in (("gb-1", "rack-a"), ("gb-2", "rack-a"), ("gb-3", "rack-b"), ("gb-4", None)):
        api.create(gpu_node(name, pool="gb200", product="NVIDIA-GB200", gpus=4, clique=clique))
    return api


def plan(sim: SimKubeApi) -> list:
    view = sim_view(sim, KINDS)
    pools = pools_of(view.objects(*NODE), policy=load_pools_policy())
    writes = plan_clique_warnings(view, gangs=gangs_of(view), pools=pools)
    apply_in_process(sim, writes)
    return writes


def bind(sim: SimKubeApi, pod: dict, node: str, *, phase: str = "Running") -> None:
    sim.create({**pod, "spec": {**pod["spec"], "nodeName": node}, "status": {"phase": phase}})


def running_nvlink_gang(sim: SimKubeApi, *, nodes: tuple[str, str]) -> None:
    """A running Volcano gang of two 4-GPU pods that needs one NVLink domain, bound to ``nodes``."""
    group = volcano_group("tp", gpus=8, members=2, phase="Running")
    group["metadata"]["annotations"] = {"gpuscale.io/nvlink-domain": "required"}
    sim.create(group)
    member = {"scheduling.k8s.io/group-name": "tp"}
    for i, node in enumerate(nodes):
        bind(sim, gpu_pod(f"tp-{i}", gpus=4, group={}, annotations=member), node)


def test_a_running_nvlink_gang_split_across_cliques_is_warned_once(sim) -> None:
    running_nvlink_gang(sim, nodes=("gb-1", "gb-3"))
    (warning,) = plan(sim)
    assert warning.reason == "GangSpansNVLinkDomains" and warning.regarding.kind == "PodGroup"
    assert "nvidia.com/gpu.clique=rack-a: tp-0; nvidia.com/gpu.clique=rack-b: tp-1" in warning.message
    assert plan(sim) == []  # said once


def test_an_unlabelled_node_is_unknown_not_a_split(sim) -> None:
    running_nvlink_gang(sim, nodes=("gb-1", "gb-4"))
    assert plan(sim) == []


def test_a_pending_gang_bigger_than_any_clique_is_warned(sim) -> None:
    # Kueue's topology annotation asks for one NVLink domain; rack-a holds 8 GPUs, the gang wants 12
    workload = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "big", "namespace": "ml"},
        "status": {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]},
        "spec": {
            "podSets": [
                {
                    "name": "workers",
                    "count": 3,
                    "template": {
                        "metadata": {
                            "annotations": {"kueue.x-k8s.io/podset-required-topology": "nvidia.com/gpu.clique"}
                        },
                        "spec": {
                            "containers": [
                                {"name": "w", "image": "t", "resources": {"limits": {"nvidia.com/gpu": "4"}}}
                            ]
                        },
                    },
                }
            ]
        },
    }
    sim.create(workload)
    small = {**workload, "metadata": {"name": "small", "namespace": "ml"}}
    small["spec"] = {"podSets": [{**workload["spec"]["podSets"][0], "count": 2}]}
    sim.create(small)
    (warning,) = plan(sim)
    assert warning.reason == "GangExceedsNVLinkDomain" and warning.regarding.name == "big"
    assert "needs 12 GPUs" in warning.message and "has 8 (gb200/rack-a)" in warning.message
    assert plan(sim) == []


def test_a_tensor_parallel_group_across_cliques_is_warned_on_its_leader(sim) -> None:
    def lws_pod(name: str, index: str, group: str) -> dict:
        return gpu_pod(
            name,
            gpus=4,
            group={"leaderworkerset.sigs.k8s.io/group-key": group, "leaderworkerset.sigs.k8s.io/worker-index": index},
        )

    bind(sim, lws_pod("vllm-0", "0", "g0"), "gb-3")
    bind(sim, lws_pod("vllm-0-1", "1", "g0"), "gb-1")
    bind(sim, lws_pod("vllm-1", "0", "g1"), "gb-1")  # this group stays in one rack
    bind(sim, lws_pod("vllm-1-1", "1", "g1"), "gb-2")
    (warning,) = plan(sim)
    assert warning.reason == "TensorParallelSpansNVLinkDomains"
    assert (warning.regarding.kind, warning.regarding.name) == ("Pod", "vllm-0")
    assert "rack-a: vllm-0-1; nvidia.com/gpu.clique=rack-b: vllm-0" in warning.message
    assert plan(sim) == []


def test_an_admitted_kueue_gang_split_across_cliques_is_warned(sim) -> None:
    job = sim.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "llm", "namespace": "ml"},
            "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "w", "image": "t"}]}}},
        }
    )
    owner = {"apiVersion": "batch/v1", "kind": "Job", "name": "llm", "uid": job["metadata"]["uid"], "controller": True}
    template = {"spec": {"containers": [{"name": "w", "image": "t", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}}
    sim.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "job-llm", "namespace": "ml", "ownerReferences": [owner]},
            "spec": {
                "podSets": [
                    {
                        "name": "main",
                        "count": 2,
                        "template": template,
                        "topologyRequest": {"required": "nvidia.com/gpu.clique"},
                    }
                ]
            },
            "status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted"}]},
        }
    )
    for i, node in enumerate(("gb-2", "gb-3")):
        pod = gpu_pod(f"llm-{i}", gpus=4, group={"batch.kubernetes.io/job-name": "llm"})
        pod["metadata"]["ownerReferences"] = [owner]
        bind(sim, pod, node)
    (warning,) = plan(sim)
    assert (warning.reason, warning.regarding.kind) == ("GangSpansNVLinkDomains", "Workload")
    assert "rack-a: llm-0; nvidia.com/gpu.clique=rack-b: llm-1" in warning.message
