"""Pure parts of the controller, table-driven: telemetry windows (increases, sustained conditions, idle time,
vanished GPUs), the hints planner (scale-down-disabled / do-not-disrupt, idle GPUs, safe-to-evict), node JSON
patches, PDB arithmetic and policy validation."""

from __future__ import annotations

from typing import ClassVar

import pytest

from gpuscale.controller.health import node_json_patch
from gpuscale.controller.hints import (
    DO_NOT_DISRUPT,
    IDLE_PODS,
    SAFE_TO_EVICT,
    SCALE_DOWN_DISABLED,
    HintActions,
    HintsPlanner,
    idle_gpus,
    load_hints_policy,
)
from gpuscale.controller.remediation_policy import load_remediation_policy
from gpuscale.controller.telemetry import (
    ClusterTelemetry,
    GpuTelemetry,
    NodeGpuTelemetry,
    TelemetryHistory,
)
from gpuscale.controller.writes import Emit, Patch, StaticClusterView
from gpuscale.disruption import disruptions_allowed
from gpuscale.errors import ConfigError
from gpuscale.metrics.attribution import Device
from gpuscale.metrics.devices import DeviceReading
from gpuscale.metrics.diagnosis import GpuSignals
from gpuscale.model import pod as pod_ref


def reading(node: str, gpu: int, t: float, *, pod: tuple[str, str] | None = None, **values: float) -> DeviceReading:
    owner = pod_ref(*pod) if pod else None
    device = Device(("gpu", node, str(gpu), "", ""), ("gpu", node, str(gpu)), owner, node, ())
    return DeviceReading(device, {"gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"}, "url", t, dict(values))


class TestTelemetryHistory:
    def test_counter_increase_over_the_window_and_reset(self):
        history = TelemetryHistory(window_seconds=100)
        steps = [(0, 5, 0.0), (30, 5, 0.0), (60, 7, 2.0), (120, 9, 4.0), (170, 9, 2.0), (200, 1, 3.0), (400, 1, 0.0)]
        for t, value, expected in steps:
            tel = history.observe([reading("n", 0, t, DCGM_FI_DEV_PCIE_REPLAY_COUNTER=value)], now=t)
            assert tel.node("n").gpus["0"].pcie_replay_increase == expected, t

    def test_sustained_slowdown_and_idle_time_restart_on_a_break(self):
        history = TelemetryHistory(idle_below=0.05)
        masks = [(0, 0x40, 0.01), (100, 0x08, 0.02), (200, 0x4, 0.5), (300, 0x80, 0.0), (350, 0x80, 0.0)]
        seen = []
        for t, mask, active in masks:
            tel = history.observe(
                [reading("n", 0, t, DCGM_FI_DEV_CLOCKS_EVENT_REASONS=mask, DCGM_FI_PROF_SM_ACTIVE=active)], now=t
            )
            gpu = tel.node("n").gpus["0"]
            seen.append((gpu.slowdown_seconds, gpu.idle_seconds))
        assert seen == [(0, 0), (100, 100), (0, 0), (0, 0), (50, 50)]

    def test_a_gpu_missing_from_an_answering_exporter_vanished_but_a_silent_exporter_is_unknown(self):
        history = TelemetryHistory()
        history.observe([reading("n", 0, 0), reading("n", 1, 0)], now=0)
        tel = history.observe([reading("n", 0, 10)], now=10)
        assert dict(tel.node("n").vanished) == {"1": 10} and tel.node("n").reporting
        tel = history.observe([], now=20)
        assert not tel.node("n").reporting and tel.node("n").gpus == {}
        tel = history.observe([reading("n", 0, 30), reading("n", 1, 30)], now=30)
        assert tel.node("n").vanished == {}

    def test_stale_readings_are_ignored(self):
        tel = TelemetryHistory().observe([reading("n", 0, 0)], now=500, max_age_seconds=60)
        assert tel.nodes == {}


def gpu(node: str, index: int, *, pod: tuple[str, str] | None, idle: float) -> GpuTelemetry:
    return GpuTelemetry(node, str(index), None, GpuSignals(), 0.0, pod=pod, idle_seconds=idle)


def node_obj(name: str, **annotations: str) -> dict:
    labels = {"karpenter.sh/nodepool": "gpu"} if name.startswith("k") else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
    }


def pod_obj(namespace: str, name: str, *, labels: dict | None = None, **annotations: str) -> dict:
    meta = {"name": name, "namespace": namespace, "labels": labels or {}, "annotations": annotations}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


def telemetry(*gpus: GpuTelemetry) -> ClusterTelemetry:
    nodes: dict[str, dict[str, GpuTelemetry]] = {}
    for g in gpus:
        nodes.setdefault(g.node, {})[g.gpu] = g
    return ClusterTelemetry(0.0, 600.0, {n: NodeGpuTelemetry(n, True, gs) for n, gs in nodes.items()})


class TestHints:
    policy = load_hints_policy()
    gang: ClassVar[dict[str, str]] = {"scheduling.x-k8s.io/pod-group": "g1"}

    def plan(self, objects, tel, actions: HintActions | None = None):
        return HintsPlanner(self.policy, actions or HintActions()).plan(StaticClusterView(objects), tel, now=0.0)

    def test_an_active_multi_gpu_gang_protects_its_nodes_and_idle_removes_only_ours(self):
        objects = [
            node_obj("a"),
            node_obj("k1"),
            pod_obj("ml", "w0", labels=self.gang),
            pod_obj("ml", "w1", labels=self.gang),
        ]
        tel = telemetry(gpu("a", 0, pod=("ml", "w0"), idle=0), gpu("k1", 0, pod=("ml", "w1"), idle=0))
        writes = self.plan(objects, tel)
        patched = {w.key.name: w.patch["metadata"]["annotations"] for w in writes if isinstance(w, Patch)}
        assert patched["a"][SCALE_DOWN_DISABLED] == "true"
        assert patched["k1"][DO_NOT_DISRUPT] == "true", "a Karpenter node gets Karpenter's annotation"
        # Applied, the same plan writes nothing; once idle, our annotations come off.
        objects[0] = node_obj("a", **{SCALE_DOWN_DISABLED: "true", "gpuscale.io/scale-down-disabled-by": "x"})
        objects[1] = node_obj("k1", **{DO_NOT_DISRUPT: "true", "gpuscale.io/do-not-disrupt-by": "x"})
        assert self.plan(objects, tel) == []
        idle = telemetry(gpu("a", 0, pod=("ml", "w0"), idle=700), gpu("k1", 0, pod=("ml", "w1"), idle=700))
        removed = {w.key.name: w.patch["metadata"]["annotations"] for w in self.plan(objects, idle)}
        assert removed["a"] == {SCALE_DOWN_DISABLED: None, "gpuscale.io/scale-down-disabled-by": None}

    def test_a_node_under_health_remediation_is_not_protected(self):
        objects = [
            node_obj("a", **{"gpuscale.io/tainted-by": "gpuscale-controller"}),
            pod_obj("ml", "w0", labels=self.gang),
        ]
        tel = telemetry(gpu("a", 0, pod=("ml", "w0"), idle=0), gpu("a", 1, pod=("ml", "w0"), idle=0))
        assert self.plan(objects, tel) == []
        objects[0]["metadata"]["annotations"].update(
            {SCALE_DOWN_DISABLED: "true", "gpuscale.io/scale-down-disabled-by": "x"}
        )
        (removed,) = self.plan(objects, tel)
        assert removed.patch["metadata"]["annotations"][SCALE_DOWN_DISABLED] is None

    def test_a_node_health_is_about_to_remediate_is_not_protected_in_the_same_reconcile(self):
        from gpuscale.controller.health import HealthPlanner
        from gpuscale.metrics.diagnosis import load_policy

        health = HealthPlanner(load_remediation_policy(), load_policy())
        objects = [
            node_obj("a"),
            node_obj("b"),
            pod_obj("ml", "w0", labels=self.gang),
            pod_obj("ml", "w1", labels=self.gang),
        ]
        bad = GpuTelemetry("a", "0", None, GpuSignals(last_xid=79, xid_counts={79: 1}), 0.0, pod=("ml", "w0"))
        tel = telemetry(bad, gpu("a", 1, pod=("ml", "w0"), idle=0), gpu("b", 0, pod=("ml", "w1"), idle=0))
        assert health.remediates(objects[0], tel.node("a")) and not health.remediates(objects[1], tel.node("b"))
        planner = HintsPlanner(self.policy, HintActions(idle=False), being_replaced=health.remediates)
        writes = planner.plan(StaticClusterView(objects), tel, now=0.0)
        assert [w.key.name for w in writes] == ["b"]

    def test_a_persons_scale_down_disabled_is_left_alone(self):
        objects = [node_obj("a", **{SCALE_DOWN_DISABLED: "true"}), pod_obj("ml", "solo")]
        tel = telemetry(gpu("a", 0, pod=("ml", "solo"), idle=9999))
        assert self.plan(objects, tel, HintActions(idle=False)) == []

    @pytest.mark.parametrize(
        ("labels", "annotations", "gpus", "protected"),
        [
            ({}, {}, 1, False),  # a one-GPU pod is no gang
            ({}, {}, 2, True),  # one pod holding two GPUs
            ({"gpuscale.io/scrape": "triton"}, {}, 1, True),  # warm inference
            ({}, {"gpuscale.io/scrape": "true"}, 1, True),  # warm inference discovery scrapes by annotation (vLLM…)
            ({}, {"gpuscale.io/scrape": "false"}, 1, False),
        ],
    )
    def test_what_counts_as_worth_protecting(self, labels, annotations, gpus, protected):
        objects = [node_obj("a"), pod_obj("ml", "p", labels=labels, **annotations)]
        tel = telemetry(*(gpu("a", i, pod=("ml", "p"), idle=0) for i in range(gpus)))
        writes = self.plan(objects, tel, HintActions(idle=False))
        assert bool(writes) is protected

    def test_requested_but_idle_gpus_are_reported_and_optionally_made_safe_to_evict(self):
        objects = [node_obj("a"), pod_obj("ml", "idle"), pod_obj("kube-system", "sys"), pod_obj("ml", "busy")]
        tel = telemetry(
            gpu("a", 0, pod=("ml", "idle"), idle=4000),
            gpu("a", 1, pod=("kube-system", "sys"), idle=4000),
            gpu("a", 2, pod=("ml", "busy"), idle=0),
            gpu("a", 3, pod=None, idle=9000),
        )
        assert idle_gpus(tel, idle_for=3600) == {"a": 2}
        writes = self.plan(objects, tel, HintActions(scale_down_disabled=False, safe_to_evict=True))
        events = [w for w in writes if isinstance(w, Emit)]
        assert [e.reason for e in events] == ["GpuRequestedButIdle"]
        assert "ml/idle (1 GPU)" in events[0].message
        notes = {
            (w.key.namespace, w.key.name): w.patch["metadata"]["annotations"] for w in writes if isinstance(w, Patch)
        }
        assert notes[(None, "a")][IDLE_PODS] == "kube-system/sys=1,ml/idle=1"
        assert notes[("ml", "idle")][SAFE_TO_EVICT] == "true"
        assert ("kube-system", "sys") not in notes, "never in kube-system"


def test_node_json_patch_guards_the_taint_list_and_keeps_other_annotations():
    node = {"metadata": {"annotations": {"x": "1"}}, "spec": {"taints": [{"key": "t", "effect": "NoSchedule"}]}}
    ops = node_json_patch(node, annotations={"a/b": "v", "x": None}, taints=[], unschedulable=True)
    assert ops == [
        {"op": "add", "path": "/metadata/annotations/a~1b", "value": "v"},
        {"op": "remove", "path": "/metadata/annotations/x"},
        {"op": "test", "path": "/spec/taints", "value": [{"key": "t", "effect": "NoSchedule"}]},
        {"op": "remove", "path": "/spec/taints"},
        {"op": "add", "path": "/spec/unschedulable", "value": True},
    ]


@pytest.mark.parametrize(
    ("spec", "ready", "allowed"),
    [
        ({"minAvailable": 2}, 3, 1),
        ({"minAvailable": "50%"}, 3, 1),  # ceil(1.5) = 2
        ({"maxUnavailable": 1}, 3, 1),
        ({"maxUnavailable": 1}, 2, 0),  # one already unready
        ({"maxUnavailable": "34%"}, 3, 2),  # ceil(1.02) = 2 → desired 1
        ({"minAvailable": 0}, 0, 0),
    ],
)
def test_disruptions_allowed(spec, ready, allowed):
    pdb = {"metadata": {"namespace": "d"}, "spec": {**spec, "selector": {"matchLabels": {"app": "x"}}}}
    pods = [
        {
            "metadata": {"namespace": "d", "labels": {"app": "x"}},
            "status": {"conditions": [{"type": "Ready", "status": "True" if i < ready else "False"}]},
        }
        for i in range(3)
    ]
    assert disruptions_allowed(pdb, pods) == allowed


def test_a_bad_remediation_policy_names_file_and_field(tmp_path):
    (tmp_path / "remediation.yaml").write_text(
        "version: 1\nsignals: {}\ntaint: {key: k}\npool_labels: [a]\nbreaker: {max_pool_share: 2}\n"
    )
    with pytest.raises(ConfigError) as e:
        load_remediation_policy(tmp_path)
    assert "remediation.yaml" in str(e.value) and "max_pool_share" in str(e.value)


def test_gangs_are_recognised_for_every_batch_framework():
    from gpuscale.controller.drain import gang_of

    def pod(labels=None, annotations=None):
        return {"metadata": {"namespace": "ml", "labels": labels or {}, "annotations": annotations or {}}}

    assert gang_of(pod({"jobset.sigs.k8s.io/jobset-name": "js"})) == ("ml", "js")
    assert gang_of(pod(annotations={"scheduling.k8s.io/group-name": "pg"})) == ("ml", "pg")
    assert gang_of(pod({"training.kubeflow.org/job-name": "pt"})) == ("ml", "pt")
    lws = {"leaderworkerset.sigs.k8s.io/name": "llm", "leaderworkerset.sigs.k8s.io/group-index": "2"}
    assert gang_of(pod(lws)) == ("ml", "llm/group-2"), "each LeaderWorkerSet group is its own gang"
    indexed = {"batch.kubernetes.io/job-name": "ddp", "batch.kubernetes.io/job-completion-index": "3"}
    assert gang_of(pod(indexed)) == ("ml", "job/ddp")
    assert gang_of(pod({"batch.kubernetes.io/job-name": "plain"})) is None, "a non-indexed Job's pods are independent"
