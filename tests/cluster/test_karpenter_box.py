"""What gpuscale writes for the autoscaler, judged by the autoscaler: the real Karpenter, kube-scheduler and kwok nodes
of the cluster in a box (tests/cluster/box.py), with `gpuscale controller` as its ServiceAccount under
deploy/controller's RBAC (components drain and karpenter-weights) and a dcgm-exporter serving every node's GPUs.

Each scenario has NodePools of its own, tainted so that no pod of another lands there, and they run at once:
Karpenter's consolidation waits 10-15 s before each decision, so the protection scenario runs in a background
thread (started by the first test) while the replacement and NodePool-weight scenarios run in the foreground.

- GPU failure → replacement (pool ``replace``): Xid 79 on a Karpenter node → condition, status taint, cordon,
  PDB-respecting drain → the scheduler cannot place the evicted pods there → Karpenter provisions a replacement
  from the same NodePool → pods Running; the emptied node is then removed by Karpenter's emptiness consolidation.
- Protection (pool ``protect``): a node serving inference keeps ``karpenter.sh/do-not-disrupt`` and survives the
  consolidation that removes its idle neighbour; once its traffic stops the annotation goes and Karpenter
  consolidates it too.
- NodePool weights (pools ``train-a100`` and ``serve-h100``): Karpenter's own choice between equal pools is the
  later name (train-a100, also the cheaper GPU); gpuscale measures the A100s idle and the H100s busy, weighs
  serve-h100 highest, and Karpenter then provisions there.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from tests.cluster.box import Box, GpuExporter, gpu_pod_spec
from tests.cluster.controlplane import _Process, _spawn
from tests.ports import free_port

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
OUR_MARK = "gpuscale.io/do-not-disrupt-by"
STATUS_TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gpu-unhealthy"
WEIGHED = ("serve-h100", "train-a100")
ACTIVE_WITHIN_SECONDS = 3  # hints.yaml for this run: "recent" traffic means the last 3 s, so "goes idle" is quick
T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T | None],
    *,
    timeout: float,
    interval: float = 0.25,
    stop: threading.Event | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy (returned); fail naming ``what`` after ``timeout`` s, or at
    once when ``stop`` is set (the module is being torn down under a background scenario)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        if stop is None:
            time.sleep(interval)
        else:
            assert not stop.wait(interval), f"{what}: stopped"


def deployment(
    name: str,
    namespace: str,
    *,
    pools: list[str],
    gpus: int,
    replicas: int = 1,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, **(labels or {})}, "annotations": dict(annotations or {})},
                "spec": gpu_pod_spec(pools, gpus=gpus),
            },
        },
    }


def running(box: Box, namespace: str, app: str) -> list[dict[str, Any]]:
    """The pods of ``app`` that are Running and Ready and not being deleted."""
    out = []
    for pod in box.pods(namespace, f"app={app}"):
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in (pod.get("status") or {}).get("conditions", [])
        )
        if pod["status"].get("phase") == "Running" and ready and not pod["metadata"].get("deletionTimestamp"):
            out.append(pod)
    return out


def node_of(pod: dict[str, Any]) -> str:
    return pod["spec"]["nodeName"]


def get_node(box: Box, name: str) -> dict[str, Any] | None:
    answer = box.rest().get(f"/api/v1/nodes/{name}")
    return answer.body if answer.ok else None


def weight(box: Box, pool: str) -> int | None:
    return box.rest().get(f"/apis/karpenter.sh/v1/nodepools/{pool}").expect(200)["spec"].get("weight")


@dataclass
class Scene:
    box: Box
    exporter: GpuExporter
    controller: _Process
    metrics_url: str
    figures: dict[str, float] = field(default_factory=dict)

    def reconciles(self) -> int:
        with urllib.request.urlopen(self.metrics_url, timeout=5) as answer:
            text = answer.read().decode()
        found = re.search(r"^gpuscale_controller_reconcile_duration_seconds_count (\S+)", text, re.MULTILINE)
        return int(float(found.group(1))) if found else 0


@pytest.fixture(scope="module")
def scene(box: Box, tmp_path_factory):
    work = tmp_path_factory.mktemp("karpenter-box")
    plane = box.plane
    deploy = REPO / "deploy/controller"
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(deploy, work)],
        "components": [os.path.relpath(deploy / "components" / c, work) for c in ("drain", "karpenter-weights")],
    }
    (work / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    applied = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(work))
    assert applied.returncode == 0, applied.stderr
    # NB: its RBAC, admission and ServiceAccount are what is under test; the controller runs as a process here,
    # and the Deployment's pods would only sit Pending (no pool takes them), offered to Karpenter every batch.
    scaled = plane.kubectl("-n", "gpuscale", "scale", "deployment/gpuscale-controller", "--replicas=0")
    assert scaled.returncode == 0, scaled.stderr
    for namespace in ("replace", "protect", "weights"):
        box.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    box.nodepool("replace", ["h100-8x"], policy="WhenEmpty")
    box.nodepool("protect", ["h100-8x"])
    box.nodepool("train-a100", ["a100-8x"], consolidate_after="Never")
    box.nodepool("serve-h100", ["h100-8x"], consolidate_after="Never")

    policies = work / "policies"
    policies.mkdir()
    hints = yaml.safe_load((REPO / "policies/hints.yaml").read_text())
    hints["protect"]["active_within"] = f"{ACTIVE_WITHIN_SECONDS}s"
    (policies / "hints.yaml").write_text(yaml.safe_dump(hints))
    # The weighed pools declared, so that they are ranked before they have a node: what makes "nothing written
    # before anything is measured" a rule of the NodePool writer rather than a pool list that is merely empty.
    declared = [
        {"name": "train-a100", "gpu_product": "NVIDIA-A100-SXM4-80GB", "gpus_per_node": 8},
        {"name": "serve-h100", "gpu_product": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8},
    ]
    # A node's activity counts after 5 s watched (1 min by default), so a pool is not ranked on its first idle
    # seconds before its pod starts.
    pools_policy = {"version": 1, "pools": declared, "expander": {"karpenter_min_observed": "5s"}}
    (policies / "pools.yaml").write_text(yaml.safe_dump(pools_policy))

    exporter = GpuExporter(plane)
    port = free_port()
    command = [
        sys.executable, "-m", "gpuscale.cli.main", "controller",
        "--kubeconfig", str(plane.service_account_kubeconfig("gpuscale", "gpuscale-controller")),
        "--scrape-url", exporter.url, "--policies", str(policies),
        "--port", str(port), "--bind-address", "127.0.0.1", "--interval", "0.5s",
        "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.5s", "--identity", "box",
        "--health-drain", *[arg for pool in WEIGHED for arg in ("--karpenter-nodepool", pool)],
    ]  # fmt: skip
    controller = _spawn("gpuscale-controller", command, work)
    scene = Scene(box, exporter, controller, f"http://127.0.0.1:{port}/metrics")
    try:
        lease = "/apis/coordination.k8s.io/v1/namespaces/gpuscale/leases/gpuscale-controller"

        def leading() -> bool:
            assert controller.popen.poll() is None, controller.tail()
            answer = box.rest().get(lease)
            return answer.ok and answer.body["spec"].get("holderIdentity") == "box"

        wait_for("the controller leads", leading, timeout=60)
        yield scene
    finally:
        controller.stop()
        exporter.stop()
        log = controller.log.read_text(errors="replace")
        shutil.copyfile(controller.log, plane.workdir / "gpuscale-controller.log")
    assert "Forbidden" not in log and " 403" not in log, log[-3000:]


# --- protection and idle capacity (runs in the background) -----------------------------------------------------


@dataclass
class ProtectionResult:
    done: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    facts: dict[str, Any] = field(default_factory=dict)


def protection_scenario(scene: Scene, result: ProtectionResult) -> None:
    box, exporter, ns = scene.box, scene.exporter, "protect"
    facts = result.facts
    # Three nodes: a filler of 7 GPUs on each (no two fit one 8-GPU node), then one 1-GPU pod in each node's last
    # GPU: inference with traffic (serve), an idle pod (idle) and one its owner pinned (anchor: the pod-level
    # do-not-disrupt, which Karpenter honours), where the others' pods can go when a node is consolidated. The
    # fillers' GPUs stay idle, or they would count as busy 7-GPU pods, which gpuscale protects too.
    exporter.activity.update({"serve": 0.7, "idle": 0.0, "anchor": 0.3, "filler": 0.0})
    box.apply(deployment("filler", ns, pools=[ns], gpus=7, replicas=3))
    wait_for("3 fillers Running", lambda: len(running(box, ns, "filler")) == 3, timeout=90, stop=result.stop)
    box.apply(
        deployment("serve", ns, pools=[ns], gpus=1, labels={"gpuscale.io/scrape": "triton"}),
        deployment("idle", ns, pools=[ns], gpus=1),
        deployment("anchor", ns, pools=[ns], gpus=1, annotations={DO_NOT_DISRUPT: "true"}),
    )
    placed = {}
    for app in ("serve", "idle", "anchor"):
        placed[app] = node_of(
            wait_for(f"{app} Running", lambda a=app: running(box, ns, a), timeout=60, stop=result.stop)[0]
        )
    assert len(set(placed.values())) == 3, placed
    facts["nodes"] = placed
    protected, idle_node = placed["serve"], placed["idle"]

    def marked(name: str) -> bool:
        notes = (get_node(box, name) or {}).get("metadata", {}).get("annotations") or {}
        return notes.get(DO_NOT_DISRUPT) == "true" and bool(notes.get(OUR_MARK))

    wait_for("gpuscale protects the node serving inference", lambda: marked(protected), timeout=30, stop=result.stop)
    # NB: a GPU pod counts as active until it has been idle for active_within, so the idle fillers protected every
    # node for their first seconds; the nodes without traffic must lose that before Karpenter may act.
    others = (idle_node, placed["anchor"])
    wait_for(
        "gpuscale leaves the nodes without traffic",
        lambda: not any(marked(n) for n in others),
        timeout=30,
        stop=result.stop,
    )
    facts["protected_while_others_are_not"] = marked(protected)

    # The fillers go: all three nodes are 1/8 used, and Karpenter consolidates what it may.
    box.rest().delete(f"/apis/apps/v1/namespaces/{ns}/deployments/filler").expect(200)
    started = time.monotonic()
    wait_for(
        "Karpenter consolidates the idle node", lambda: get_node(box, idle_node) is None, timeout=240, stop=result.stop
    )
    facts["idle_consolidated_after_s"] = time.monotonic() - started
    facts["protected_after_idle_consolidated"] = get_node(box, protected) is not None and marked(protected)
    wait_for("the idle pod Running again", lambda: running(box, ns, "idle"), timeout=60, stop=result.stop)

    # Traffic stops: the annotation goes (the pod still there), then Karpenter takes the node.
    exporter.activity["serve"] = 0.0
    stopped = time.monotonic()
    wait_for("gpuscale removes its do-not-disrupt", lambda: not marked(protected), timeout=30, stop=result.stop)
    facts["unprotected_after_s"] = time.monotonic() - stopped
    facts["serve_still_on_protected_node"] = any(node_of(p) == protected for p in running(box, ns, "serve"))
    wait_for(
        "Karpenter consolidates the node once idle",
        lambda: get_node(box, protected) is None,
        timeout=240,
        stop=result.stop,
    )
    facts["protected_consolidated_after_s"] = time.monotonic() - stopped
    wait_for("serve Running again", lambda: running(box, ns, "serve"), timeout=60, stop=result.stop)
    facts["final_nodes"] = sorted(n["metadata"]["name"] for n in box.nodes(ns))
    facts["serve_now_on"] = node_of(running(box, ns, "serve")[0])


@pytest.fixture(scope="module")
def protection(scene):
    result = ProtectionResult()

    def run() -> None:
        try:
            protection_scenario(scene, result)
        except BaseException as e:  # NB: handed to the test that asserts on it
            result.error = e
        finally:
            result.done.set()

    threading.Thread(target=run, name="protection-scenario", daemon=True).start()
    yield result
    result.stop.set()
    result.done.wait(30)


# --- GPU failure → replacement ------------------------------------------------------------------------------------


def test_a_failed_gpu_node_is_cordoned_drained_and_replaced_by_karpenter(scene, protection):
    box, exporter, ns = scene.box, scene.exporter, "replace"
    exporter.activity["train"] = 0.6
    box.apply(
        deployment("train", ns, pools=["replace"], gpus=4, replicas=2),
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "train", "namespace": ns},
            "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "train"}}},
        },
    )
    pods = wait_for("2 train pods Running", lambda: (r := running(box, ns, "train")) and len(r) == 2 and r, timeout=90)
    failing = node_of(pods[0])
    before = {p["metadata"]["name"] for p in pods if node_of(p) == failing}
    assert failing.startswith("kwok-") and box.nodes("replace")[0]["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"

    exporter.xid[failing] = 79
    xid_at = time.monotonic()
    seen: dict[str, float] = {}
    fewest_ready = 2

    def replaced() -> bool:
        nonlocal fewest_ready
        node = get_node(box, failing) or {}
        conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
        taints = {t["key"] for t in node.get("spec", {}).get("taints") or []}
        for what, now in (
            ("condition", conditions.get("GpuHealthy") == "False"),
            ("taint", STATUS_TAINT in taints),
            ("cordon", bool(node.get("spec", {}).get("unschedulable"))),
        ):
            if now and what not in seen:
                seen[what] = time.monotonic() - xid_at
        ready = running(box, ns, "train")
        fewest_ready = min(fewest_ready, len(ready))
        return len(ready) == 2 and all(node_of(p) != failing for p in ready)

    wait_for("both pods Running away from the failed node", replaced, timeout=120, interval=0.1)
    xid_to_running = time.monotonic() - xid_at
    scene.figures["xid_to_running_s"] = xid_to_running
    assert set(seen) == {"condition", "taint", "cordon"}, seen
    assert fewest_ready >= 1, "the drain broke the PodDisruptionBudget (minAvailable 1)"
    now_on = {node_of(p) for p in running(box, ns, "train")}
    pools = {n["metadata"]["name"]: n["metadata"]["labels"].get("karpenter.sh/nodepool") for n in box.nodes(ns)}
    assert now_on and all(pools.get(n) == "replace" and n != failing for n in now_on), (now_on, pools)
    evicted = {p["metadata"]["name"] for p in box.pods(ns, "app=train")}
    assert not before & evicted, "the pods on the failed node were not replaced"
    refusals = [
        e["message"]
        for e in box.events(ns, fieldSelector="reason=FailedScheduling")
        if "were unschedulable" in e.get("message", "")
    ]
    assert refusals, "the scheduler never reported the cordoned node as unschedulable for the evicted pods"

    # What becomes of the failed node: drained, empty, and removed by Karpenter's emptiness consolidation.
    wait_for("Karpenter removes the emptied node", lambda: get_node(box, failing) is None, timeout=240)
    scene.figures["xid_to_node_removed_s"] = time.monotonic() - xid_at

    def claim_gone() -> bool:
        # NB: the Node goes first; its NodeClaim follows once Karpenter's finalizer has seen the Node gone
        claims = box.rest().get("/apis/karpenter.sh/v1/nodeclaims").expect(200)["items"]
        return not [c for c in claims if c.get("status", {}).get("nodeName") == failing]

    wait_for("Karpenter removes the emptied node's NodeClaim", claim_gone, timeout=60)
    karpenter_log = (box.plane.workdir / "karpenter.log").read_text(errors="replace")
    decisions = [line for line in karpenter_log.splitlines() if "disrupting node(s)" in line and failing in line]
    assert decisions and all('"Empty/' in line for line in decisions), decisions
    print(
        f"Xid 79 → condition {seen['condition']:.1f} s, taint {seen['taint']:.1f} s, cordon {seen['cordon']:.1f} s; "
        f"pods Running on the replacement {xid_to_running:.1f} s; failed node removed by Karpenter "
        f"{scene.figures['xid_to_node_removed_s']:.1f} s after the Xid"
    )


# --- NodePool weights -----------------------------------------------------------------------------------------------


def test_karpenter_provisions_from_the_nodepool_gpuscale_weighs_highest(scene, protection):
    box, exporter, ns = scene.box, scene.exporter, "weights"
    wait_for("the controller reconciles", lambda: scene.reconciles() >= 5, timeout=30)
    assert [weight(box, p) for p in WEIGHED] == [None, None], "a ranking was written before anything was measured"

    # Karpenter's own choice between two pools of equal weight: train-a100 (the later name).
    exporter.activity.update({"first": 0.05, "measure-h100": 0.9})
    assert launched_for(box, deployment("first", ns, pools=list(WEIGHED), gpus=8)) == {"train-a100"}
    assert launched_for(box, deployment("measure-h100", ns, pools=["serve-h100"], gpus=8)) == {"serve-h100"}

    # gpuscale measures A100s at 5 % and H100s at 90 %: 5.12/0.05 against 12.30/0.9 per useful GPU-hour.
    wait_for(
        "gpuscale weighs serve-h100 above train-a100",
        lambda: weight(box, "serve-h100") == 100 and weight(box, "train-a100") == 50,
        timeout=30,
    )
    assert weight(box, "replace") is None and weight(box, "protect") is None, "an unmanaged NodePool was written"
    assert launched_for(box, deployment("steered", ns, pools=list(WEIGHED), gpus=8)) == {"serve-h100"}

    # RBAC lets its ServiceAccount patch NodePools; components/karpenter-weights' admission lets it change the
    # weight and nothing else.
    account = box.plane.token_rest(box.plane.service_account_token("gpuscale", "gpuscale-controller"))
    path = "/apis/karpenter.sh/v1/nodepools/serve-h100"
    assert account.patch(path, {"spec": {"weight": 100}}).status == 200
    refused = account.patch(path, {"spec": {"limits": {"nvidia.com/gpu": "8"}}})
    assert refused.status == 403 and "nodepool-weight" in str(refused.body), refused
    refused = account.patch(path, {"metadata": {"labels": {"team": "x"}}})
    assert refused.status == 403 and "nodepool-weight" in str(refused.body), refused


def launched_for(box: Box, workload: dict[str, Any]) -> set[str]:
    """Apply ``workload`` (one pod) and wait for it to run; the NodePools of the NodeClaims Karpenter launched
    meanwhile and of the node the pod runs on (NB: Karpenter may launch a second NodeClaim for a pod it sees still
    pending before its first registers; each is Karpenter's choice, so all count)."""

    def claims() -> dict[str, str]:
        items = box.rest().get("/apis/karpenter.sh/v1/nodeclaims").expect(200)["items"]
        return {c["metadata"]["name"]: c["metadata"]["labels"].get("karpenter.sh/nodepool", "") for c in items}

    before = claims()
    box.apply(workload)
    meta = workload["metadata"]
    pod = wait_for(f"{meta['name']} Running", lambda: running(box, meta["namespace"], meta["name"]), timeout=90)[0]
    node = get_node(box, node_of(pod)) or {}
    # NB: the other scenarios' pools provision meanwhile too
    pools = {pool for name, pool in claims().items() if name not in before and pool in WEIGHED}
    return pools | {node.get("metadata", {}).get("labels", {}).get("karpenter.sh/nodepool", "")}


# --- protection and idle capacity: the background scenario's verdict ----------------------------------------------


def test_a_node_serving_inference_is_kept_while_its_idle_neighbour_is_consolidated_then_taken_once_idle(
    scene, protection
):
    assert protection.done.wait(600), "the protection scenario did not finish"
    if protection.error is not None:
        raise protection.error
    facts = protection.facts
    nodes = facts["nodes"]
    assert facts["protected_while_others_are_not"]
    assert facts["protected_after_idle_consolidated"], "the protected node did not survive the consolidation"
    assert facts["serve_still_on_protected_node"], "the annotation went only because the pod had gone"
    assert facts["final_nodes"] == [nodes["anchor"]] and facts["serve_now_on"] == nodes["anchor"], facts
    print(
        f"idle neighbour consolidated {facts['idle_consolidated_after_s']:.1f} s after the fillers went, the protected "
        f"node kept; protection removed {facts['unprotected_after_s']:.1f} s after its traffic "
        f"stopped, the node consolidated {facts['protected_consolidated_after_s']:.1f} s after"
    )
