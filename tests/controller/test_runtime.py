"""The controller's runtime against the simulated API: leader election (two replicas never both act), watch caches
that recover from 410 Gone and dropped watches, evictions that respect PodDisruptionBudgets and drain gangs whole.
Clocks are manual; waits are on conditions, bounded."""

from __future__ import annotations

import asyncio

import pytest
from kubernetes_asyncio.config import new_client_from_config

from gpuscale.controller.health import HealthActions
from gpuscale.controller.leader import LeaseElector
from gpuscale.sim.exporters import ManualClock
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.objects import ObjectCache, WatchSpec
from tests.controller.harness import NAMESPACE, start_harness


@pytest.fixture
async def api():
    sim = SimKubeApi()
    await sim.start()
    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    yield sim
    await sim.stop()


@pytest.fixture
async def rest(api, tmp_path):
    client = await new_client_from_config(config_file=api.write_kubeconfig(tmp_path / "kubeconfig"))
    yield KubeRest(client)
    await client.close()


def elector(rest: KubeRest, identity: str, clock: ManualClock) -> LeaseElector:
    return LeaseElector(
        rest,
        namespace=NAMESPACE,
        name="gpuscale-controller",
        identity=identity,
        lease_duration=15,
        renew_deadline=10,
        retry_period=2,
        monotonic=clock,
        wall=lambda: 1_790_000_000.0 + clock(),
    )


async def test_two_replicas_never_both_lead(api, rest):
    clock_a, clock_b = ManualClock(), ManualClock()
    a, b = elector(rest, "replica-a", clock_a), elector(rest, "replica-b", clock_b)
    assert await a.try_acquire_or_renew() is True
    assert await b.try_acquire_or_renew() is False
    for _ in range(5):
        clock_a.advance(2)
        clock_b.advance(2)
        assert await a.try_acquire_or_renew() and not await b.try_acquire_or_renew()
        assert a.is_leader and not b.is_leader
    lease = api.get("coordination.k8s.io/v1", "Lease", "gpuscale-controller", namespace=NAMESPACE)
    assert lease["spec"]["holderIdentity"] == "replica-a"

    # replica-a hangs: it stops renewing. It stops leading after renew-deadline, before b may take over.
    clock_a.advance(11)
    assert not a.is_leader
    clock_b.advance(14)
    assert await b.try_acquire_or_renew() is False, "the lease has not expired from b's point of view"
    clock_b.advance(2)
    assert await b.try_acquire_or_renew() is True and b.is_leader
    lease = api.get("coordination.k8s.io/v1", "Lease", "gpuscale-controller", namespace=NAMESPACE)
    assert lease["spec"]["holderIdentity"] == "replica-b" and lease["spec"]["leaseTransitions"] == 1
    assert await a.try_acquire_or_renew() is False and not a.is_leader


async def test_racing_replicas_one_wins_the_conflict(api, rest):
    clock = ManualClock()
    replicas = [elector(rest, f"replica-{i}", clock) for i in range(4)]
    results = await asyncio.gather(*(r.try_acquire_or_renew() for r in replicas))
    assert sum(results) == 1


async def test_release_hands_over_at_once(api, rest):
    clock_a, clock_b = ManualClock(), ManualClock()
    a, b = elector(rest, "replica-a", clock_a), elector(rest, "replica-b", clock_b)
    await a.try_acquire_or_renew()
    await b.try_acquire_or_renew()
    await a.release()
    assert not a.is_leader
    assert await b.try_acquire_or_renew() is True


async def test_a_lease_that_cannot_be_written_is_said_once_with_the_fix_then_backed_off(api, rest, caplog):
    lonely = LeaseElector(rest, namespace="missing", name="gpuscale-controller", identity="a")
    for _ in range(4):
        assert await lonely.try_acquire_or_renew() is False
    lines = [r.getMessage() for r in caplog.records if "lease=missing/gpuscale-controller" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "cannot create the Lease (HTTP 404" in lines[0] and "kubectl create namespace missing" in lines[0]
    assert "\n" not in lines[0] and "Traceback" not in caplog.text
    assert lonely.problem and lonely._backoff == 16.0  # 2, 4, 8, 16 s: doubling, not every retry period
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "missing"}})
    assert await lonely.try_acquire_or_renew() is True and lonely.problem == ""


async def test_only_the_leader_acts(tmp_path):
    clock = ManualClock()
    first = await start_harness(tmp_path, nodes=2)
    try:
        leader_a = elector(first.rest, "replica-a", clock)
        second = await start_harness(tmp_path, api=first.api, nodes=2)
        try:
            leader_b = elector(second.rest, "replica-b", clock)
            first.controller.leadership = leader_a
            second.controller.leadership = leader_b
            await leader_a.try_acquire_or_renew()
            await leader_b.try_acquire_or_renew()
            for h in (first, second):
                h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
            follower = await second.reconcile()
            assert follower.writes and not follower.outcomes, "the follower plans but does not write"
            assert first.events("gpu-01") == []
            leader = await first.reconcile()
            assert leader.writes and all(o.result == "applied" for o in leader.outcomes)
            assert [e["reason"] for e in first.events("gpu-01")] == ["GpuUnhealthy"]
        finally:
            await second.close()
    finally:
        await first.close()


async def _until(condition, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not condition():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_a_watch_that_returns_410_recovers(api, rest):
    cache = ObjectCache(rest, [WatchSpec("v1", "Node")], backoff_max_seconds=0.05)
    cache.relist_after_error = False  # NB: here the watch resumes from its resourceVersion, to meet the 410
    await cache.start()
    try:
        await cache.wait_synced(timeout=10)
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}})
        await _until(lambda: cache.get("v1", "Node", "gpu-a") is not None)
        # The watch falls behind the retained history, is cut, and comes back with a too-old resourceVersion.
        api.fail_next(410, verb="watch", resource="nodes")
        api.compact()
        api.drop_watches()
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-b"}})
        api.delete("v1", "Node", "gpu-a")
        await _until(lambda: cache.get("v1", "Node", "gpu-b") is not None and cache.get("v1", "Node", "gpu-a") is None)
        assert cache.relists >= 1
        assert [(f.verb, f.code) for f in api.faults_served] == [("watch", 410)]
        assert cache.objects("v1", "Node")[0]["kind"] == "Node", "list items get their kind back"
    finally:
        await cache.stop()


async def test_a_dropped_watch_unconfirms_the_view_until_it_has_listed_again(api, rest):
    cache = ObjectCache(rest, [WatchSpec("v1", "Node"), WatchSpec("v1", "Pod")], backoff_max_seconds=0.05)
    await cache.start()
    try:
        await cache.wait_synced(timeout=10)
        assert cache.confirmed and cache.unconfirmed() == ""
        lists = sum(1 for r in api.requests if r.method == "GET" and "watch" not in r.path_qs)
        api.fail_next(503, verb="list", resource="nodes")  # the relist itself fails once: still unconfirmed
        await _until(lambda: api.drop_watches("nodes") > 0)  # once the watch is open, cut it
        await _until(lambda: not cache.confirmed)
        assert "Node" in cache.unconfirmed()
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-new"}})
        await _until(lambda: cache.confirmed)
        assert cache.get("v1", "Node", "gpu-new") is not None
        relisted = sum(1 for r in api.requests if r.method == "GET" and "watch" not in r.path_qs) - lists
        assert relisted >= 2, "confirmed by a list after the error (one failed, one served)"
        # a new leader's reconfirm: every kind listed again
        assert await cache.reconfirm(timeout=10) and cache.confirmed
    finally:
        await cache.stop()


async def test_a_list_that_fails_is_retried_with_backoff(api, rest):
    api.fail_next(500, verb="list", resource="nodes", times=2)
    cache = ObjectCache(rest, [WatchSpec("v1", "Node")], backoff_max_seconds=0.05)
    await cache.start()
    try:
        await cache.wait_synced(timeout=10)
        assert [f.code for f in api.faults_served] == [500, 500]
        assert cache.health()[0].failures_total == 2 and cache.health()[0].healthy
    finally:
        await cache.stop()


def _pod(name: str, node: str, *, labels: dict[str, str] | None = None, daemonset: bool = False) -> dict:
    meta: dict = {"name": name, "namespace": "default", "labels": labels or {}}
    if daemonset:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "ds", "uid": "u1", "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}]},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


async def test_drain_evicts_through_the_api_respecting_budgets_and_gangs(tmp_path):
    h = await start_harness(tmp_path, nodes=3, actions=HealthActions(drain=True))
    try:
        api = h.api
        api.create(_pod("lonely", "gpu-00"))
        api.create(_pod("exporter", "gpu-00", daemonset=True))
        gang = {"scheduling.x-k8s.io/pod-group": "train"}
        api.create(_pod("train-0", "gpu-00", labels={**gang, "app": "train"}))
        api.create(_pod("train-1", "gpu-01", labels={**gang, "app": "train"}))
        api.create(_pod("serve-0", "gpu-00", labels={"app": "serve"}))
        api.create(_pod("serve-1", "gpu-02", labels={"app": "serve"}))
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"namespace": "default"}}
        api.create(
            {
                **pdb,
                "metadata": {**pdb["metadata"], "name": "serve"},
                "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "serve"}}},
            }
        )
        api.create(
            {
                **pdb,
                "metadata": {**pdb["metadata"], "name": "train"},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "train"}}},
            }
        )
        h.exporters.sim.override_gpu("gpu-00", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()  # cordon first
        assert h.node("gpu-00")["spec"]["unschedulable"] is True
        result = await h.reconcile()  # then drain
        names = {p["metadata"]["name"] for p in api.list("v1", "Pod")}
        assert "lonely" not in names, "an ordinary pod is evicted"
        assert "exporter" in names, "DaemonSet pods are skipped"
        assert {"train-0", "train-1"} <= names, "the gang's budget allows 1 of 2: none of the gang is evicted"
        assert "serve-0" in names, "the PDB refused (429) and the pod stays"
        held = [e for e in h.events("gpu-00") if e["reason"] == "GangDrainHeld"]
        assert len(held) == 1 and "PodDisruptionBudget default/train" in held[0]["message"]
        assert "pod default/train-0" in held[0]["message"], held[0]["message"]
        await h.reconcile()
        (again,) = [e for e in h.events("gpu-00") if e["reason"] == "GangDrainHeld"]
        assert again["count"] == 1, "said once, not repeated every reconcile"
        evictions = [o for o in result.outcomes if o.write.__class__.__name__ == "Evict"]
        assert sorted((o.write.name, o.result) for o in evictions) == [("lonely", "applied"), ("serve-0", "refused")]
        api.patch("policy/v1", "PodDisruptionBudget", "train", {"spec": {"maxUnavailable": 2}}, namespace="default")
        await h.reconcile()
        names = {p["metadata"]["name"] for p in api.list("v1", "Pod")}
        assert not {"train-0", "train-1"} & names, "the gang went together, from both nodes"
    finally:
        await h.close()


async def test_a_gang_pod_under_two_budgets_holds_the_whole_gang(tmp_path):
    """The Eviction API answers 500 for a pod two PDBs select, whatever they allow: none of its gang goes."""
    h = await start_harness(tmp_path, nodes=3, actions=HealthActions(drain=True))
    try:
        api = h.api
        gang = {"jobset.sigs.k8s.io/jobset-name": "pretrain", "app": "pretrain"}
        for i, node in enumerate(("gpu-00", "gpu-01", "gpu-02")):
            api.create(_pod(f"pretrain-{i}", node, labels={**gang, "rank": str(i)}))
        for name, selector in (("all-ranks", {"app": "pretrain"}), ("rank-0", {"rank": "0"})):
            api.create(
                {
                    "apiVersion": "policy/v1",
                    "kind": "PodDisruptionBudget",
                    "metadata": {"name": name, "namespace": "default"},
                    "spec": {"maxUnavailable": 3, "selector": {"matchLabels": selector}},
                }
            )
        h.exporters.sim.override_gpu("gpu-01", 0, last_xid=79, xid_window=((79, 1),))
        await h.reconcile()
        result = await h.reconcile()
        assert not [o for o in result.outcomes if type(o.write).__name__ == "Evict"], "no eviction was even sent"
        assert len([p for p in api.list("v1", "Pod") if p["metadata"]["name"].startswith("pretrain-")]) == 3
        (held,) = [e for e in h.events("gpu-01") if e["reason"] == "GangDrainHeld"]
        message = held["message"]
        assert "pod default/pretrain-0" in message and "default/all-ranks" in message and "default/rank-0" in message
    finally:
        await h.close()


async def test_a_custom_resource_that_is_not_installed_stays_empty_when_optional(api, rest):
    from gpuscale.errors import KindNotServed

    specs = [WatchSpec("v1", "Node"), WatchSpec("scheduling.x-k8s.io/v1alpha1", "PodGroup", optional=True)]
    cache = ObjectCache(rest, specs)
    await cache.refresh_once()
    assert cache.objects("scheduling.x-k8s.io/v1alpha1", "PodGroup") == []
    assert cache.absent == ["scheduling.x-k8s.io/v1alpha1 PodGroup"]
    with pytest.raises(KindNotServed, match="serves no kind Widget"):
        await ObjectCache(rest, [WatchSpec("v1", "Widget")]).refresh_once()


async def test_two_kinds_of_one_name_in_different_groups_both_sync(api, rest):
    # Volcano's and coscheduling's PodGroups installed side by side: the cache must list both before it is synced.
    from gpuscale.sim.crds import COSCHEDULING_POD_GROUP, VOLCANO_POD_GROUP

    api.create(VOLCANO_POD_GROUP)
    api.create(COSCHEDULING_POD_GROUP)
    specs = [
        WatchSpec("scheduling.volcano.sh/v1beta1", "PodGroup", optional=True),
        WatchSpec("scheduling.x-k8s.io/v1alpha1", "PodGroup", optional=True),
    ]
    cache = ObjectCache(rest, specs)
    await cache.start()
    try:
        await cache.wait_synced(10)
        assert cache.synced
    finally:
        await cache.stop()


async def test_caches_started_while_the_api_is_away_sync_once_it_is_back(api, rest):
    await api.go_away()
    cache = ObjectCache(rest, [WatchSpec("v1", "Node")], backoff_max_seconds=0.05)
    try:
        await cache.start()  # no exception: discovery goes on in the background
        assert not cache.synced and "discovery" in cache.last_errors
        api.create({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-a"}})
        await api.come_back()
        await cache.wait_synced(timeout=10)
        assert cache.get("v1", "Node", "gpu-a") is not None and "discovery" not in cache.last_errors
    finally:
        await cache.stop()


async def test_an_rbac_gap_is_said_once_with_the_fix_while_the_cache_backs_off(api, rest, caplog):
    api.fail_next(403, verb="list", resource="nodes", times=3)
    cache = ObjectCache(rest, [WatchSpec("v1", "Node")], backoff_max_seconds=0.05)
    await cache.start()
    try:
        await cache.wait_synced(timeout=10)
        lines = [r.getMessage() for r in caplog.records if "cannot list/watch Node" in r.getMessage()]
        assert len(lines) == 1, lines
        assert "HTTP 403" in lines[0] and "needs list and watch on it: apply deploy/'s RBAC" in lines[0]
        assert [(f.verb, f.code) for f in api.faults_served] == [("list", 403)] * 3
    finally:
        await cache.stop()
