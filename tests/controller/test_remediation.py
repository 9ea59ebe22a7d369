"""GPU health remediation end to end inside one process: simulated dcgm-exporters with injected faults, the
simulated Kubernetes API over HTTP, the real caches, telemetry, health planner and actuator; one reconcile at a
time on a manual clock.

Behaviours pinned: the ladder Event → condition → taint → cordon in that order and its undo on recovery; a
second reconcile writes nothing; a person's cordon and uncordon are never reverted; the circuit breaker holds the
third bad node of a pool of ten at 20 % and remembers across restarts; dry-run writes nothing; 409 and 500 answers
are retried; opted-out nodes are left alone; a vanished GPU and sustained slowdowns are found.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from gpuscale.controller.health import CORDONED_BY, HELD_BACK, RECORD, TAINTED_BY, HealthActions
from gpuscale.controller.remediation_policy import load_remediation_policy
from tests.controller.harness import NAMESPACE, start_harness

TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gpu-unhealthy"


def condition(node: dict, kind: str = "GpuHealthy") -> dict | None:
    return next((c for c in node.get("status", {}).get("conditions", []) if c["type"] == kind), None)


def taint_keys(node: dict) -> list[str]:
    return [t["key"] for t in node.get("spec", {}).get("taints", [])]


@pytest.fixture
async def cluster(tmp_path):
    h = await start_harness(tmp_path, nodes=3)
    yield h
    await h.close()


async def test_fatal_xid_gets_event_condition_taint_cordon_in_order_and_is_restored(cluster):
    h = cluster
    await h.reconcile()
    assert h.writes_seen() == [], "a healthy cluster is written nothing"
    h.exporters.sim.override_gpu("gpu-01", 1, last_xid=79, xid_window=((79, 1),))
    mark = len(h.api.requests)
    result = await h.reconcile()
    writes = [(r.method, r.path_qs.split("?")[0]) for r in list(h.api.requests)[mark:] if r.method != "GET"]
    assert writes == [
        ("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps"),  # the breaker's record first: a step is on record
        ("POST", "/api/v1/namespaces/default/events"),
        ("PATCH", "/api/v1/nodes/gpu-01/status"),
        ("PATCH", "/api/v1/nodes/gpu-01"),  # taint, cordon and their record: one guarded JSON patch
    ]
    assert all(o.result == "applied" for o in result.outcomes)
    node = h.node("gpu-01")
    assert condition(node)["status"] == "False" and condition(node)["reason"] == "XidFatal"
    assert "Xid 79" in condition(node)["message"]
    assert TAINT in taint_keys(node)
    assert node["spec"]["unschedulable"] is True
    record = json.loads(node["metadata"]["annotations"][RECORD])
    assert record["reason"] == "XidFatal" and record["by"] == "gpuscale-controller" and record["since"]
    assert node["metadata"]["annotations"][CORDONED_BY] == "gpuscale-controller"
    assert [e["reason"] for e in h.events("gpu-01")] == ["GpuUnhealthy"]
    for other in ("gpu-00", "gpu-02"):
        assert condition(h.node(other)) is None and not h.node(other)["spec"].get("unschedulable")

    again = await h.reconcile()
    assert again.writes == [], "an unchanged cluster plans nothing"

    h.exporters.sim.clear_overrides()
    await h.reconcile()
    assert h.node("gpu-01")["spec"]["unschedulable"] is True, "clean for 15 s is not recovered yet"
    await h.reconcile(advance=120.0)  # recovery.healthy_for: 2 min
    node = h.node("gpu-01")
    assert condition(node)["status"] == "True" and condition(node)["reason"] == "GpuRecovered"
    assert TAINT not in taint_keys(node)
    assert not node["spec"].get("unschedulable")
    assert not any(k.startswith("gpuscale.io/") for k in node["metadata"].get("annotations", {}))
    assert [e["reason"] for e in h.events("gpu-01")] == ["GpuUnhealthy", "GpuRecovered"]
    assert (await h.reconcile()).writes == []


async def test_a_flapping_gpu_keeps_its_node_out(cluster):
    h = cluster
    h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
    await h.reconcile()
    h.exporters.sim.clear_overrides()
    await h.reconcile()  # clean: the wait starts
    record = json.loads(h.node("gpu-01")["metadata"]["annotations"][RECORD])
    assert record["clean_since"] and len(h.events("gpu-01")) == 1
    h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
    await h.reconcile(advance=60.0)  # back within the wait
    assert "clean_since" not in json.loads(h.node("gpu-01")["metadata"]["annotations"][RECORD])
    assert len(h.events("gpu-01")) == 1, "the same problem: no new Event"
    h.exporters.sim.clear_overrides()
    await h.reconcile(advance=60.0)
    await h.reconcile(advance=90.0)
    assert h.node("gpu-01")["spec"]["unschedulable"] is True, "the wait restarted"
    await h.reconcile(advance=60.0)
    assert not h.node("gpu-01")["spec"].get("unschedulable")


async def test_a_node_cordoned_by_a_person_is_never_uncordoned(cluster):
    h = cluster
    h.api.patch("v1", "Node", "gpu-00", {"spec": {"unschedulable": True}})  # a person: kubectl cordon
    h.exporters.sim.override_gpu("gpu-00", 0, last_xid=48, xid_window=((48, 2),))
    await h.reconcile()
    node = h.node("gpu-00")
    assert TAINT in taint_keys(node)
    assert CORDONED_BY not in node["metadata"]["annotations"], "we did not cordon it, so we do not claim it"
    h.exporters.sim.clear_overrides()
    await h.reconcile_until_recovered()
    node = h.node("gpu-00")
    assert TAINT not in taint_keys(node)
    assert node["spec"]["unschedulable"] is True, "the person's cordon stays"


async def test_a_persons_uncordon_is_not_reverted(cluster):
    h = cluster
    h.exporters.sim.override_gpu("gpu-02", 1, row_remap_failure=1)
    await h.reconcile()
    assert h.node("gpu-02")["spec"]["unschedulable"] is True
    h.api.patch("v1", "Node", "gpu-02", {"spec": {"unschedulable": None}})  # a person: kubectl uncordon
    await h.reconcile()
    node = h.node("gpu-02")
    assert not node["spec"].get("unschedulable")
    assert node["metadata"]["annotations"]["gpuscale.io/overridden"] == "cordon"
    await h.reconcile()
    assert not h.node("gpu-02")["spec"].get("unschedulable"), "still not re-cordoned"


async def test_breaker_holds_the_third_bad_node_of_a_pool_of_ten_and_remembers(tmp_path):
    h = await start_harness(tmp_path, nodes=10)
    try:
        for name in ("gpu-03", "gpu-05", "gpu-07"):
            h.exporters.sim.override_gpu(name, 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        acted = [n for n in ("gpu-03", "gpu-05", "gpu-07") if TAINT in taint_keys(h.node(n))]
        assert acted == ["gpu-03", "gpu-05"]
        held = h.node("gpu-07")
        assert not held["spec"].get("unschedulable") and TAINT not in taint_keys(held)
        assert "2 of 10 GPU nodes acted on (limit 2, 20%)" in held["metadata"]["annotations"][HELD_BACK]
        assert condition(held)["status"] == "False", "the condition still tells the truth"
        assert "RemediationHeldBack" in [e["reason"] for e in h.events("gpu-07")]
        state = json.loads(
            h.api.get("v1", "ConfigMap", "gpuscale-controller-state", namespace=NAMESPACE)["data"]["breaker"]
        )
        assert sorted(state["acted"]) == ["gpu-03", "gpu-05"]
        assert (await h.reconcile()).writes == []

        # The two recover; within the breaker's window they still count, even for a new controller instance.
        h.exporters.sim.clear_overrides()
        h.exporters.sim.override_gpu("gpu-07", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile_until_recovered()
        assert TAINT not in taint_keys(h.node("gpu-03"))
        restarted = await start_harness(tmp_path, api=h.api, nodes=10)
        restarted.exporters.sim.override_gpu("gpu-07", 0, last_xid=79, xid_window=((79, 1),))
        try:
            await restarted.reconcile()
            assert TAINT not in taint_keys(h.node("gpu-07")), "the breaker's memory survived the restart"
            await restarted.reconcile(advance=3600.0)
            assert TAINT in taint_keys(h.node("gpu-07")), "after the window it may act"
            assert HELD_BACK not in h.node("gpu-07")["metadata"]["annotations"]
        finally:
            await restarted.close()
    finally:
        await h.close()


async def test_dry_run_writes_nothing(tmp_path):
    h = await start_harness(tmp_path, nodes=2, dry_run=True)
    try:
        h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
        before = h.api.resource_version
        result = await h.reconcile()
        assert result.outcomes and {o.result for o in result.outcomes} == {"dry-run"}
        assert h.api.resource_version == before, "nothing was stored"
        writes = [r for r in h.api.requests if r.method != "GET"]
        assert writes and all("dryRun=All" in r.path_qs for r in writes)
        assert condition(h.node("gpu-01")) is None and h.events("gpu-01") == []
        mark = len(h.api.requests)
        await h.reconcile()
        assert [r for r in list(h.api.requests)[mark:] if r.method != "GET"] == [], "validated once, not every time"
    finally:
        await h.close()


async def test_conflict_and_server_errors_are_retried(cluster):
    h = cluster
    h.api.fail_next(500, verb="patch", resource="nodes")
    h.api.fail_next(409, verb="patch", resource="nodes")
    h.api.fail_next(429, verb="patch", resource="nodes", retry_after_seconds=0)
    h.api.fail_next(503, verb="create", resource="events")
    h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
    result = await h.reconcile()
    assert [(f.verb, f.code) for f in h.api.faults_served] == [
        ("create", 503),
        ("patch", 500),
        ("patch", 409),
        ("patch", 429),
    ]
    assert all(o.result == "applied" for o in result.outcomes)
    node = h.node("gpu-00")
    assert condition(node)["status"] == "False" and node["spec"]["unschedulable"] is True
    assert h.actuator.retries == 4


async def test_a_write_that_keeps_failing_is_reported_and_planned_again(cluster):
    h = cluster
    h.api.fail_next(500, verb="patch", resource="nodes", times=20)
    h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
    result = await h.reconcile()
    failed = [o for o in result.outcomes if o.result == "failed"]
    assert failed and "HTTP 500 InternalError" in failed[0].detail
    h.api.clear_faults()
    await h.reconcile()
    assert h.node("gpu-00")["spec"]["unschedulable"] is True, "the next reconcile plans it again"


async def test_opted_out_nodes_are_left_alone(cluster):
    h = cluster
    h.api.patch("v1", "Node", "gpu-01", {"metadata": {"labels": {"gpuscale.io/remediation": "disabled"}}})
    h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
    result = await h.reconcile()
    assert result.writes == []


async def test_a_node_opted_out_after_an_action_gets_only_our_marks_removed(cluster):
    h = cluster
    await h.reconcile()
    h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
    await h.reconcile()
    node = h.node("gpu-01")
    assert TAINT in taint_keys(node) and node["spec"]["unschedulable"] is True and condition(node) is not None
    # another agent's marks, then the opt-out label
    taints = node["spec"]["taints"]
    person = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    h.api.patch("v1", "Node", "gpu-01", [{"op": "test", "path": "/spec/taints", "value": taints},
                                         {"op": "add", "path": "/spec/taints/-", "value": person}], patch_type="json")  # fmt: skip
    h.api.patch("v1", "Node", "gpu-01", {"metadata": {"annotations": {"example.com/owner": "team-a"}}})
    other = {
        "type": "ExampleHealthy",
        "status": "False",
        "reason": "AgentSaysSo",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    h.api.patch(
        "v1", "Node", "gpu-01", {"status": {"conditions": [other]}}, patch_type="strategic", subresource="status"
    )
    h.api.patch("v1", "Node", "gpu-01", {"metadata": {"labels": {"gpuscale.io/remediation": "disabled"}}})
    result = await h.reconcile()
    assert {o.result for o in result.outcomes} == {"applied"}, result.outcomes
    node = h.node("gpu-01")
    assert taint_keys(node) == [person["key"]]
    assert not node["spec"].get("unschedulable")
    assert condition(node) is None and condition(node, "ExampleHealthy")["status"] == "False"
    notes = node["metadata"]["annotations"]
    assert notes.get("example.com/owner") == "team-a" and not any(k.startswith("gpuscale.io/") for k in notes)
    assert node["metadata"]["labels"]["gpuscale.io/remediation"] == "disabled"
    assert "RemediationOptedOut" in [e["reason"] for e in h.events("gpu-01")]
    assert (await h.reconcile()).writes == [], "said and done once"


async def test_nvsentinel_managed_nodes_are_left_alone_when_configured(tmp_path):
    base = load_remediation_policy()
    policy = base.model_copy(update={"opt_out": base.opt_out.model_copy(update={"defer_to_nvsentinel": True})})
    h = await start_harness(tmp_path, nodes=2, policy=policy)
    try:
        h.api.patch(
            "v1", "Node", "gpu-01", {"metadata": {"labels": {"k8saas.nvidia.com/ManagedByNVSentinel": "false"}}}
        )
        for name in ("gpu-00", "gpu-01"):
            h.exporters.sim.override_gpu(name, 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        assert condition(h.node("gpu-00")) is None, "NVSentinel's node"
        assert condition(h.node("gpu-01"))["status"] == "False", "opted out of NVSentinel: ours"
    finally:
        await h.close()


async def test_a_vanished_gpu_is_remediated_and_its_return_restores_the_node(cluster):
    h = cluster
    await h.reconcile()
    h.exporters.sim.vanish_gpu("gpu-02", 1)
    await h.reconcile()
    node = h.node("gpu-02")
    assert condition(node)["reason"] == "GpuVanished" and TAINTED_BY in node["metadata"]["annotations"]
    h.exporters.sim.restore_gpu("gpu-02", 1)
    await h.reconcile_until_recovered()
    assert condition(h.node("gpu-02"))["status"] == "True"


async def test_an_exporter_that_does_not_answer_decides_nothing(cluster):
    h = cluster
    h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
    await h.reconcile()
    h.exporters.sim.clear_overrides()
    h.exporters.server.set_faults("dcgm/gpu-00", status=503)
    await h.reconcile()
    assert TAINT in taint_keys(h.node("gpu-00")), "unknown is not recovered"


async def test_sustained_slowdown_and_pcie_replays_warn_without_cordoning(cluster):
    h = cluster
    h.exporters.sim.override_gpu("gpu-01", 0, clock_event_mask=0x40, pcie_replay_count=5)
    await h.reconcile()
    h.exporters.sim.override_gpu("gpu-01", 0, pcie_replay_count=9)
    await h.reconcile(advance=200.0)
    assert h.events("gpu-01") and h.events("gpu-01")[-1]["reason"] == "GpuWarning"
    assert "PCIe" in h.events("gpu-01")[-1]["message"]
    await h.reconcile(advance=200.0)
    node = h.node("gpu-01")
    assert node["metadata"]["annotations"]["gpuscale.io/gpu-warnings"] == "HwSlowdown:0,PcieReplay:0"
    assert not node["spec"].get("unschedulable") and condition(node) is None


async def test_switched_off_steps_are_not_taken(tmp_path):
    h = await start_harness(tmp_path, nodes=2, actions=HealthActions(taint=False, cordon=False))
    try:
        h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        node = h.node("gpu-00")
        assert condition(node)["status"] == "False"
        assert TAINT not in taint_keys(node) and not node["spec"].get("unschedulable")
    finally:
        await h.close()


async def test_accelerated_hardware_ready_only_where_the_policy_says_we_own_it(tmp_path):
    base = load_remediation_policy()
    h = await start_harness(tmp_path, nodes=2, policy=base.model_copy(update={"owns_accelerated_hardware_ready": True}))
    try:
        # Another agent's condition on gpu-00 is never touched; its GpuHealthy is ours.
        h.api.patch(
            "v1",
            "Node",
            "gpu-00",
            {"status": {"conditions": [{"type": "GpuMemWatch", "status": "False", "reason": "NVSentinel"}]}},
            patch_type="strategic",
            subresource="status",
        )
        h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        node = h.node("gpu-00")
        assert condition(node, "AcceleratedHardwareReady")["status"] == "False"
        assert condition(node, "GpuMemWatch") == {"type": "GpuMemWatch", "status": "False", "reason": "NVSentinel"}
        h.exporters.sim.clear_overrides()
        await h.reconcile_until_recovered()
        node = h.node("gpu-00")
        assert condition(node, "AcceleratedHardwareReady")["status"] == "True"
        assert condition(node, "GpuMemWatch")["reason"] == "NVSentinel"
    finally:
        await h.close()
    h = await start_harness(tmp_path, nodes=2)
    try:
        h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        assert condition(h.node("gpu-00"), "AcceleratedHardwareReady") is None, "not ours by default"
    finally:
        await h.close()


async def test_an_api_outage_holds_every_write_until_the_caches_have_listed_again(cluster):
    h = cluster
    await h.reconcile()
    h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
    await h.api.go_away()
    try:
        for _ in range(100):  # the watches see the outage (bounded: 10 s)
            if not h.cache.confirmed:
                break
            await asyncio.sleep(0.1)
        assert not h.cache.confirmed
        h.clock.advance(15)
        result = await h.controller.reconcile_once()  # the caches hold their last view: never acted on
        assert result.planned == {} and result.outcomes == []
        assert result.error and result.error.startswith("view not confirmed"), result.error
        assert h.controller.metrics.view_confirmed._value.get() == 0
    finally:
        await h.api.come_back()
    result = await h.reconcile()  # listed again: confirmed, and it acts once
    assert h.node("gpu-01")["spec"]["unschedulable"] is True
    assert h.controller.metrics.view_confirmed._value.get() == 1
    again = await h.reconcile()
    assert again.writes == [], "nothing planned twice once the view shows the writes"


async def test_a_write_from_a_stale_view_is_refused_re_read_and_planned_again(cluster):
    """The stale-copy bug: the cache shows no taints and no annotations while another agent has just added both.
    The guarded add fails (422), the node is re-read, the plan is made again, and everything survives."""
    h = cluster
    await h.reconcile()
    await h.cache.stop()  # NB: the watches stop delivering: the view is stale (but saw no error)
    person = {"key": "example.com/maintenance", "value": "alice", "effect": "NoSchedule"}
    h.api.patch("v1", "Node", "gpu-01", [{"op": "add", "path": "/spec/taints", "value": [person]}], patch_type="json")
    h.api.patch("v1", "Node", "gpu-01", {"metadata": {"annotations": {"example.com/owner": "team-a"}}})
    assert not (h.cache.get("v1", "Node", "gpu-01").get("spec") or {}).get("taints"), "the view is stale"
    h.exporters.sim.override_gpu("gpu-01", 1, last_xid=79, xid_window=((79, 1),))
    h.clock.advance(15)
    result = await h.controller.reconcile_once()
    conflicts = [o for o in result.outcomes if o.result == "conflict"]
    assert conflicts and all(o.write.key.name == "gpu-01" for o in conflicts), result.outcomes
    assert h.controller.metrics.replans._value.get() >= 1
    node = h.node("gpu-01")
    assert set(taint_keys(node)) == {person["key"], TAINT}
    assert node["metadata"]["annotations"]["example.com/owner"] == "team-a"
    assert node["spec"]["unschedulable"] is True
    # nothing was sent twice: one taint patch and one cordon patch applied
    applied = [
        o.write.why.split(":")[0]
        for o in result.outcomes
        if o.result == "applied" and o.write.__class__.__name__ == "Patch"
    ]
    assert applied.count("taint, cordon") == 1, applied
