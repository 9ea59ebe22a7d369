"""Gang-aware capacity: pending gangs get exactly one ProvisioningRequest, followed through its conditions.

Scope: detection of pending Volcano / coscheduling / Kueue gangs and their demand (pods, owning Job,
minResources, Workload pod sets); Kueue's own ProvisioningRequest admission check; no duplicate across
re-runs and restarts (state only in the objects); Failed / BookingExpired / CapacityRevoked → retry with backoff;
cleanup when the gang runs or goes. Planners run on views read from the simulated API and their writes are
applied to it (tests/controller/kube.py).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from gpuscale.controller.gangs import GANG_KINDS, gangs_of
from gpuscale.controller.pools import PoolsPolicy, load_pools_policy
from gpuscale.controller.provisioning import (
    CONSUME_ANNOTATION,
    PROVISIONING_KINDS,
    PROVISIONING_REQUEST,
    plan_provisioning,
)
from gpuscale.controller.writes import Create, Delete, Emit, Patch
from gpuscale.model import parse_quantity
from gpuscale.sim.kubeapi import SimKubeApi

from .kube import apply_in_process, sim_view

KINDS = (*GANG_KINDS, *PROVISIONING_KINDS)
T0 = datetime(2026, 12, 3, 7, 0, tzinfo=UTC).timestamp()


@pytest.fixture
def sim(batch_sim) -> SimKubeApi:
    return batch_sim


@pytest.fixture
def policy() -> PoolsPolicy:
    return load_pools_policy()


def volcano_group(name: str = "train", *, gpus: int = 16, members: int = 2, phase: str = "Pending") -> dict[str, Any]:
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"minMember": members, "minResources": {"nvidia.com/gpu": str(gpus), "cpu": "16", "memory": "64Gi"}},
        "status": {
            "phase": phase,
            "conditions": [{"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources"}],
        },
    }


def gpu_pod(name: str, *, gpus: int = 8, group: dict[str, str], annotations: dict[str, str] | None = None) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "labels": group, "annotations": annotations or {}},
        "spec": {
            "containers": [{"name": "w", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        },
    }


def workload(name: str = "llm", *, checks: tuple[str, ...] = (), queue: str = "", admitted: bool = False) -> dict:
    template = {
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "w", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        }
    }
    status: dict[str, Any] = {
        "admissionChecks": [{"name": c, "state": "Pending"} for c in checks],
        "conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}],
    }
    if admitted:
        status["conditions"].append({"type": "Admitted", "status": "True", "reason": "Admitted"})
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"queueName": queue, "podSets": [{"name": "workers", "count": 4, "template": template}]},
        "status": status,
    }


def provisioning_check(name: str = "provision") -> dict:
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "AdmissionCheck",
        "metadata": {"name": name},
        "spec": {"controllerName": "kueue.x-k8s.io/provisioning-request", "parameters": {"name": "gpu-config"}},
    }


def requests(sim: SimKubeApi) -> list[dict]:
    return sim.list(*PROVISIONING_REQUEST, namespace="ml")


def reconcile(sim: SimKubeApi, policy: PoolsPolicy, now: float = T0) -> list:
    writes = plan_provisioning(sim_view(sim, KINDS), now=now, policy=policy)
    apply_in_process(sim, writes)
    return writes


def test_a_16_gpu_volcano_gang_without_pods_gets_exactly_one_request(sim, policy) -> None:
    sim.create(volcano_group())
    writes = reconcile(sim, policy)
    assert [type(w).__name__ for w in writes] == ["Create", "Create"]  # the pod template, then the request
    (request,) = requests(sim)
    assert request["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
    (pod_set,) = request["spec"]["podSets"]
    template = sim.get("v1", "PodTemplate", pod_set["podTemplateRef"]["name"], namespace="ml")
    (container,) = template["template"]["spec"]["containers"]
    gpus_per_pod = int(container["resources"]["limits"]["nvidia.com/gpu"])
    assert (pod_set["count"], gpus_per_pod, pod_set["count"] * gpus_per_pod) == (2, 8, 16)
    assert parse_quantity(container["resources"]["requests"]["memory"]) == 32 * 2**30  # minResources split evenly
    assert request["spec"]["parameters"] == {"ValidUntilSeconds": "600"}
    # Re-run on the new state, and as a restarted controller would (a fresh view, no memory): nothing to do.
    assert plan_provisioning(sim_view(sim, KINDS), now=T0 + 5, policy=policy) == []
    assert reconcile(sim, load_pools_policy(), now=T0 + 3600) == []
    assert len(requests(sim)) == 1
    # A replayed plan (a controller that crashed after writing) creates no duplicate either.
    sim.delete("v1", "PodTemplate", pod_set["podTemplateRef"]["name"], namespace="ml")
    replay = plan_provisioning(sim_view(sim, KINDS), now=T0, policy=policy)
    assert [type(w).__name__ for w in replay] == ["Create"] and replay[0].obj["kind"] == "PodTemplate"
    apply_in_process(sim, replay)
    assert len(requests(sim)) == 1


def test_a_kueue_workload_covered_by_kueues_provisioning_check_gets_none(sim, policy) -> None:
    sim.create(provisioning_check())
    sim.create(workload("by-status", checks=("provision",)))
    # the check named on the ClusterQueue counts too (before Kueue copies it into the Workload's status)
    sim.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": "gpus"},
            "spec": {"admissionChecksStrategy": {"admissionChecks": [{"name": "provision"}]}},
        }
    )
    sim.create(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": "team", "namespace": "ml"},
            "spec": {"clusterQueue": "gpus"},
        }
    )
    sim.create(workload("by-queue", queue="team"))
    gangs = {g.key.name: g for g in gangs_of(sim_view(sim, KINDS))}
    assert gangs["by-status"].covered_by == gangs["by-queue"].covered_by == "provision"
    assert reconcile(sim, policy) == [] and requests(sim) == []


def test_a_kueue_workload_not_admitted_without_that_check_gets_one(sim, policy) -> None:
    sim.create({**provisioning_check("other"), "spec": {"controllerName": "example.com/budget"}})
    sim.create(workload(checks=("other",)))
    reconcile(sim, policy)
    (request,) = requests(sim)
    assert request["spec"]["podSets"][0]["count"] == 4
    assert request["metadata"]["ownerReferences"][0]["kind"] == "Workload"
    # admitted: Kueue has what it needs, the request and its template go
    sim.patch(
        "kueue.x-k8s.io/v1beta2",
        "Workload",
        "llm",
        {"status": {"conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted"}]}},
        namespace="ml",
        subresource="status",
    )
    writes = reconcile(sim, policy)
    assert {type(w) for w in writes} == {Delete} and "admitted or running" in writes[0].why
    assert requests(sim) == [] and sim.list("v1", "PodTemplate", namespace="ml") == []


def test_a_kueue_workload_waiting_for_quota_gets_none(sim, policy) -> None:
    waiting = workload("queued")
    waiting["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "couldn't assign flavors"}
    ]
    sim.create(waiting)
    placement = workload("no-domain")
    placement["status"]["conditions"] = [
        {"type": "QuotaReserved", "status": "False", "reason": "TopologyPlacementFailed"}
    ]
    sim.create(placement)
    reconcile(sim, policy)
    assert [r["metadata"]["annotations"]["gpuscale.io/gang"] for r in requests(sim)] == ["Workload/ml/no-domain"]


def test_coscheduling_pods_are_pointed_at_the_request(sim, policy) -> None:
    sim.create(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "tp", "namespace": "ml"},
            "spec": {"minMember": 3},
            "status": {"phase": "Pending"},
        }
    )
    for i in range(3):
        sim.create(gpu_pod(f"tp-{i}", group={"scheduling.x-k8s.io/pod-group": "tp"}))
    writes = reconcile(sim, policy)
    (request,) = requests(sim)
    assert request["spec"]["podSets"][0]["count"] == 3
    template = sim.get("v1", "PodTemplate", request["spec"]["podSets"][0]["podTemplateRef"]["name"], namespace="ml")
    assert template["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert sum(isinstance(w, Patch) for w in writes) == 3
    for i in range(3):
        pod = sim.get("v1", "Pod", f"tp-{i}", namespace="ml")
        assert pod["metadata"]["annotations"][CONSUME_ANNOTATION] == request["metadata"]["name"]
    assert reconcile(sim, policy) == []


def test_demand_from_the_owning_job_when_pods_do_not_exist(sim, policy) -> None:
    job = sim.create(
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "pretrain", "namespace": "ml"},
            "spec": {
                "parallelism": 4,
                "suspend": True,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "w", "image": "t", "resources": {"limits": {"nvidia.com/gpu": "4"}}}],
                    }
                },
            },
        }
    )
    group = volcano_group("pretrain", gpus=1, members=4)
    group["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "pretrain", "uid": job["metadata"]["uid"]}
    ]
    sim.create(group)
    (gang,) = gangs_of(sim_view(sim, KINDS))
    assert (gang.demand_from, gang.pod_count, gang.gpus) == ("job", 4, 16)


def test_demand_from_a_volcano_jobs_tasks(sim, policy) -> None:
    def task(name: str, replicas: int, gpus: int) -> dict:
        limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
        container = {"name": name, "image": "t", "resources": {"limits": limits}}
        return {"name": name, "replicas": replicas, "template": {"spec": {"containers": [container]}}}

    vcjob = sim.create(
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "mpi", "namespace": "ml"},
            "spec": {"minAvailable": 5, "tasks": [task("launcher", 1, 0), task("worker", 4, 8)]},
        }
    )
    group = volcano_group("mpi-group", gpus=32, members=5)
    group["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "name": "mpi", "uid": vcjob["metadata"]["uid"]}
    ]
    sim.create(group)
    (gang,) = gangs_of(sim_view(sim, KINDS))
    assert gang.demand_from == "job"
    assert [(p.name, p.count, p.gpus_per_pod) for p in gang.pod_sets] == [("launcher", 1, 0), ("worker", 4, 8)]
    reconcile(sim, policy)
    (request,) = requests(sim)
    assert [p["count"] for p in request["spec"]["podSets"]] == [1, 4]  # one request, a pod set per task


def fail(sim: SimKubeApi, request: dict, condition: str, at: float) -> None:
    when = datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    sim.patch(
        *PROVISIONING_REQUEST,
        request["metadata"]["name"],
        {
            "status": {
                "conditions": [
                    {"type": "Accepted", "status": "True", "reason": "Accepted", "lastTransitionTime": when},
                    {
                        "type": condition,
                        "status": "True",
                        "reason": "Why",
                        "message": "no capacity",
                        "lastTransitionTime": when,
                    },
                ]
            }
        },
        namespace="ml",
        subresource="status",
    )


@pytest.mark.parametrize("condition", ["Failed", "BookingExpired", "CapacityRevoked"])
def test_a_failed_request_is_retried_after_a_doubling_backoff(sim, policy, condition) -> None:
    sim.create(volcano_group())
    reconcile(sim, policy)
    (first,) = requests(sim)
    fail(sim, first, condition, T0 + 10)
    assert reconcile(sim, policy, now=T0 + 10 + 59) == []  # backoff 60 s not over
    writes = reconcile(sim, policy, now=T0 + 10 + 60)
    assert [type(w) for w in writes] == [Create, Delete, Emit]
    assert writes[2].type == "Warning" and writes[2].reason == "ProvisioningRetry" and condition in writes[2].message
    (second,) = requests(sim)
    assert second["metadata"]["name"].endswith("-try2") and second["metadata"]["labels"]["gpuscale.io/attempt"] == "2"
    assert second["spec"] == first["spec"]
    events = sim.list("v1", "Event", namespace="ml")
    assert [e["reason"] for e in events] == ["ProvisioningRetry"]
    assert events[0]["involvedObject"]["kind"] == "PodGroup"
    # a restarted controller knows it is on attempt 2: the next backoff is 120 s
    fail(sim, second, condition, T0 + 200)
    assert reconcile(sim, load_pools_policy(), now=T0 + 200 + 119) == []
    reconcile(sim, policy, now=T0 + 200 + 120)
    assert [r["metadata"]["name"][-4:] for r in requests(sim)] == ["try3"]


def test_a_retry_interrupted_between_create_and_delete_is_finished(sim, policy) -> None:
    sim.create(volcano_group())
    reconcile(sim, policy)
    (first,) = requests(sim)
    fail(sim, first, "Failed", T0)
    writes = plan_provisioning(sim_view(sim, KINDS), now=T0 + 60, policy=policy)
    apply_in_process(sim, writes[:1])  # the controller died after creating the next request
    writes = reconcile(sim, policy, now=T0 + 61)
    assert [type(w) for w in writes] == [Delete] and "superseded" in writes[0].why
    assert [r["metadata"]["name"][-4:] for r in requests(sim)] == ["try2"]


def test_max_attempts_gives_up_once(sim, tmp_path) -> None:
    (tmp_path / "pools.yaml").write_text("gangs: {max_attempts: 1}\n")
    policy = load_pools_policy(tmp_path)
    sim.create(volcano_group())
    reconcile(sim, policy)
    fail(sim, requests(sim)[0], "Failed", T0)
    writes = reconcile(sim, policy, now=T0 + 3600)
    assert [type(w) for w in writes] == [Emit] and writes[0].reason == "ProvisioningGaveUp"
    assert reconcile(sim, policy, now=T0 + 7200) == []
    assert len(requests(sim)) == 1


def test_cleanup_when_the_gang_runs_or_is_deleted(sim, policy) -> None:
    sim.create(volcano_group("a"))
    sim.create(volcano_group("b"))
    reconcile(sim, policy)
    assert len(requests(sim)) == 2
    sim.patch(
        "scheduling.volcano.sh/v1beta1",
        "PodGroup",
        "a",
        {"status": {"phase": "Running", "conditions": []}},
        namespace="ml",
        subresource="status",
    )
    sim.delete("scheduling.volcano.sh/v1beta1", "PodGroup", "b", namespace="ml")
    writes = reconcile(sim, policy)
    assert len(writes) == 4 and all(isinstance(w, Delete) for w in writes)
    assert any("no longer exists" in w.why for w in writes) and any("admitted or running" in w.why for w in writes)
    assert requests(sim) == [] and sim.list("v1", "PodTemplate", namespace="ml") == []
    assert reconcile(sim, policy) == []


def test_gangs_without_gpus_or_not_blocked_are_left_alone(sim, policy) -> None:
    sim.create(volcano_group("cpu-only", gpus=0))
    inqueue = volcano_group("fine")
    inqueue["status"] = {"phase": "Inqueue", "conditions": []}
    sim.create(inqueue)
    assert reconcile(sim, policy) == []
    disabled = PoolsPolicy.model_validate({"gangs": {"enabled": False}})
    sim.create(volcano_group("blocked"))
    assert plan_provisioning(sim_view(sim, KINDS), now=T0, policy=disabled) == []


def test_a_gang_already_consuming_someone_elses_request_is_left_alone(sim, policy) -> None:
    sim.create(
        {
            "apiVersion": "scheduling.x-k8s.io/v1alpha1",
            "kind": "PodGroup",
            "metadata": {"name": "mine", "namespace": "ml"},
            "spec": {"minMember": 2},
        }
    )
    own = {CONSUME_ANNOTATION: "team-booking"}
    for i in range(2):
        sim.create(gpu_pod(f"mine-{i}", group={"scheduling.x-k8s.io/pod-group": "mine"}, annotations=own))
    assert reconcile(sim, policy) == [] and requests(sim) == []


def test_malformed_counts_do_not_stop_the_reconcile(sim, policy) -> None:
    group = volcano_group("odd")
    group["spec"]["minMember"] = "many"  # the CRD schema would refuse it; the planner must not crash on it
    sim.create(group)
    reconcile(sim, policy)
    (request,) = requests(sim)
    assert request["spec"]["podSets"][0]["count"] == 1  # minMember read as 1: all 16 GPUs in one pod


def test_provisioned_and_refused_requests_are_said_once(sim, policy) -> None:
    sim.create(volcano_group())
    reconcile(sim, policy)
    (request,) = requests(sim)
    booked = {"type": "Provisioned", "status": "True", "reason": "Provisioned", "message": "2 nodes up"}
    sim.patch(
        *PROVISIONING_REQUEST,
        request["metadata"]["name"],
        {"status": {"conditions": [booked]}},
        namespace="ml",
        subresource="status",
    )
    (event,) = reconcile(sim, policy)
    assert (event.type, event.reason) == ("Normal", "CapacityProvisioned") and "2 nodes up" in event.message
    assert reconcile(sim, policy) == []
