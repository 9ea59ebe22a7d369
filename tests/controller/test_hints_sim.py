"""Autoscaler hints end to end: simulated workloads on simulated GPUs, telemetry over (manual) time, the hints
planner beside health, writes through the actuator to the simulated API.

An active 2-GPU training gang and warm inference protect their nodes (scale-down-disabled), which lose it once
the gang is gone and the inference has had no traffic for the activity window; a notebook holding a GPU at 0 % is listed as requested-but-idle after an hour (node
annotation, Event, /metrics gauge) and, with safe-to-evict on, annotated for the autoscaler."""

from __future__ import annotations

from gpuscale.controller.hints import (
    IDLE_PODS,
    SAFE_TO_EVICT,
    SCALE_DOWN_DISABLED,
    HintActions,
    HintsPlanner,
    idle_gpus,
    load_hints_policy,
)
from gpuscale.sim.load import ConstantLoad
from gpuscale.sim.workloads import SimWorkload
from tests.controller.harness import start_harness

GANG = {"app": "train", "scheduling.x-k8s.io/pod-group": "train"}


def node_of(h, namespace: str, pod_prefix: str) -> str:
    (pod,) = [p for p in h.api.list("v1", "Pod", namespace=namespace) if p["metadata"]["name"].startswith(pod_prefix)]
    return pod["spec"]["nodeName"]


async def test_gangs_are_protected_and_idle_gpus_reported(tmp_path):
    workloads = (
        SimWorkload(
            "ml", "train", kind="StatefulSet", gpus_per_pod=2, profile="training", labels=GANG, load=ConstantLoad(90.0)
        ),
        SimWorkload("lab", "notebook", profile="idle", load=ConstantLoad(0.0)),
        SimWorkload("serve", "bert", labels={"app": "bert", "gpuscale.io/scrape": "triton"}, load=ConstantLoad(50.0)),
    )
    hints = HintsPlanner(load_hints_policy(), HintActions(safe_to_evict=True))
    h = await start_harness(tmp_path, nodes=3, workloads=workloads, extra_planners=(hints,))
    try:
        train_node, notebook_node = node_of(h, "ml", "train"), node_of(h, "lab", "notebook")
        serve_node = node_of(h, "serve", "bert")
        await h.reconcile()
        assert h.node(train_node)["metadata"]["annotations"][SCALE_DOWN_DISABLED] == "true"
        assert h.node(serve_node)["metadata"]["annotations"][SCALE_DOWN_DISABLED] == "true", "warm inference"
        assert SCALE_DOWN_DISABLED not in (h.node(notebook_node)["metadata"].get("annotations") or {})
        assert (await h.reconcile()).writes == []

        await h.reconcile(advance=3700)  # the notebook's GPU has been idle for over an hour
        notes = h.node(notebook_node)["metadata"]["annotations"]
        assert notes[IDLE_PODS].startswith("lab/notebook-") and notes[IDLE_PODS].endswith("=1")
        assert [e["reason"] for e in h.events(notebook_node)] == ["GpuRequestedButIdle"]
        (notebook,) = h.api.list("v1", "Pod", namespace="lab")
        assert notebook["metadata"]["annotations"][SAFE_TO_EVICT] == "true"
        telemetry = h.controller.telemetry.history.snapshot
        assert idle_gpus(telemetry, idle_for=3600) == {notebook_node: 1}

        await h.exporters.set_replicas("ml/train", 0)  # the gang finished: its GPUs idle, unheld
        h.exporters.set_load("serve/bert", ConstantLoad(0.0))  # no more traffic
        await h.reconcile()
        if serve_node != train_node:
            assert h.node(serve_node)["metadata"]["annotations"][SCALE_DOWN_DISABLED] == "true", "still warm"
        await h.reconcile(advance=700)  # past protect.active_within (10 min)
        assert SCALE_DOWN_DISABLED not in (h.node(serve_node)["metadata"].get("annotations") or {})
        assert SCALE_DOWN_DISABLED not in (h.node(train_node)["metadata"].get("annotations") or {})
    finally:
        await h.close()
