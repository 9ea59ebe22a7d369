"""The controller's fault-injection suite: one body per fault, run against gpuscale/sim
(tests/controller/test_faults.py) and the real kube-apiserver (tests/cluster/test_controller_faults_real.py).

Everything is real except the GPUs: `gpuscale controller` runs as a process (as its ServiceAccount on the real API),
the test reads and writes the API as an admin or as another agent would (tests/cluster/rest.py, never gpuscale's
client), faults are made by killing processes and by a TCP proxy in front of the API (``FaultProxy``). Each body
returns its counts — what the closing note of the controller-safety issue reports:

- ``concurrent_writer_outage``: another agent adds taints, annotations and conditions to the node being remediated
  while watches are dropped and the API goes away for longer than the renew deadline. Foreign fields lost (must be
  0), Events and patches written after the outage (nothing changed: must be 0), duplicate Events.
- ``breaker_across_leaders``: 4 of 10 nodes of a pool go bad at once under a 20 % breaker (limit 2); the leader is
  SIGKILLed right after its first action and the breaker's ConfigMap deleted, twice. Nodes acted on (≤ 2).
- ``gang_under_two_budgets``: a gang pod covered by two PDBs on the drained node: evictions made (must be 0) and
  the GangDrainHeld Event naming the pod and both budgets.

Node names carry a per-scenario prefix, and every count is taken over those nodes only, so the bodies can share
one control plane with other tests.
"""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.policy_files import shipped
from gpuscale.sim.exporters import SimExporters
from gpuscale.sim.gpu_activity import H100_SXM
from gpuscale.sim.gpu_nodes import SimNode
from gpuscale.sim.scenario import Scenario
from tests.cluster.rest import Rest
from tests.controller.fault_proxy import FaultProxy
from tests.e2e.backends import free_port
from tests.e2e.controller_process import controller_command, controller_process, until

TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gpu-unhealthy"
NOT_READY = "node.kubernetes.io/not-ready"


@dataclass
class Backend:
    """An API server under test. ``kubeconfig(server)`` is the controller's kubeconfig (its ServiceAccount on the
    real API) pointed at ``server`` — the API itself, or a ``FaultProxy`` in front of it."""

    name: str
    admin: Rest
    upstream: tuple[str, int]
    scheme: str
    kubeconfig: Callable[[str], Path]
    counts: dict[str, dict[str, Any]] = field(default_factory=dict)


def point_kubeconfig(source: Path, server: str, target: Path) -> Path:
    config = yaml.safe_load(source.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = server
    target.write_text(yaml.safe_dump(config))
    return target


def gpu_scenario(prefix: str, nodes: int) -> Scenario:
    return Scenario(
        nodes=tuple(
            SimNode.build(
                f"{prefix}-gpu-{i:02d}", hardware=H100_SXM, gpu_count=2, labels={"eks.amazonaws.com/nodegroup": prefix}
            )
            for i in range(nodes)
        ),
        workloads=(),
    )


def register(rest: Rest, node: dict) -> None:
    """Create the Node as its kubelet does, report it Ready, and take the not-ready taint off as the node
    lifecycle controller would (guarded; gpuscale/sim may take it off itself meanwhile)."""
    meta = {k: v for k, v in node["metadata"].items() if k in ("name", "labels", "annotations")}
    name = meta["name"]
    rest.post("/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": meta}).expect(201)
    status = json.loads(json.dumps(node["status"]))
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status["conditions"] = [dict(c, lastHeartbeatTime=now) for c in status.get("conditions") or []]
    rest.patch(f"/api/v1/nodes/{name}/status", {"status": status}, "strategic").expect(200)
    for _ in range(50):
        current = rest.get(f"/api/v1/nodes/{name}").expect(200)
        taints = current["spec"].get("taints") or []
        if not any(t["key"] == NOT_READY for t in taints):
            return
        guarded = [
            {"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": [t for t in taints if t["key"] != NOT_READY]},
        ]
        rest.patch(f"/api/v1/nodes/{name}", guarded, "json").expect(200, 422)
    raise AssertionError(f"{name}: the not-ready taint stayed")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` whose labels include ``labels``."""
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def scrape(port: int) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{port}/metrics") as r:
        return await r.text()


def events_about(rest: Rest, node: str) -> list[dict]:
    items = rest.get("/api/v1/namespaces/default/events", fieldSelector=f"involvedObject.name={node}").body["items"]
    return [e for e in items if (e.get("source") or {}).get("component") == "gpuscale-controller"]


def pool_breaker_policies(tmp_path: Path) -> Path:
    """The shipped remediation policy with the cluster-wide share lifted: the pool's 20 % is the limit under test,
    and other scenarios' nodes (acted on, on a shared control plane) must not count against it."""
    policies = tmp_path / "policies"
    policies.mkdir(exist_ok=True)
    text = shipped("remediation.yaml").read_text()
    assert "max_pool_share: 0.2" in text and "max_cluster_share: 0.2" in text
    (policies / "remediation.yaml").write_text(text.replace("max_cluster_share: 0.2", "max_cluster_share: 1.0"))
    return policies


def _lease_flags(identity: str) -> list[str]:
    # NB: the default Lease name: deploy/controller's Role grants get/update on that one only
    return [
        *("--identity", identity),
        *("--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.5s"),
        "--no-hints",
    ]


async def start_cluster(backend: Backend, prefix: str, nodes: int) -> SimExporters:
    exporters = SimExporters()
    await exporters.start(gpu_scenario(prefix, nodes))
    for obj in exporters.kube_objects():
        if obj["kind"] == "Node":
            await asyncio.to_thread(register, backend.admin, obj)
    return exporters


def remove_nodes(rest: Rest, prefix: str) -> None:
    """Delete the scenario's nodes: later tests on a shared control plane must not count them (a cluster-wide
    breaker share would, and the nodes it acted on stay tainted)."""
    for node in rest.get("/api/v1/nodes").expect(200)["items"]:
        name = node["metadata"]["name"]
        if name.startswith(f"{prefix}-gpu-"):
            rest.delete(f"/api/v1/nodes/{name}").expect(200, 404)


class _Writer(threading.Thread):
    """Another agent on one node: adds a taint (guarded, the careful way), an annotation (merge patch) and a
    condition (status, strategic merge) in turn until stopped; remembers what it added."""

    def __init__(self, rest: Rest, node: str, limit: int = 12) -> None:
        super().__init__(daemon=True)
        self.rest, self.node, self.limit = rest, node, limit
        self.stop = threading.Event()
        self.taints: list[str] = []
        self.annotations: list[str] = []
        self.conditions: list[str] = []

    def run(self) -> None:
        i = 0
        path = f"/api/v1/nodes/{self.node}"
        while not self.stop.is_set() and i < 3 * self.limit:
            kind, n = i % 3, i // 3
            if kind == 0:
                key = f"agent.example.com/t{n}"
                while True:
                    taints = self.rest.get(path).expect(200)["spec"].get("taints") or []
                    ops = [{"op": "test", "path": "/spec/taints", "value": taints or None}]
                    ops.append(
                        {
                            "op": "add",
                            "path": "/spec/taints",
                            "value": [*taints, {"key": key, "effect": "PreferNoSchedule"}],
                        }
                    )
                    if self.rest.patch(path, ops, "json").status == 200:
                        break
                self.taints.append(key)
            elif kind == 1:
                key = f"agent.example.com/a{n}"
                self.rest.patch(path, {"metadata": {"annotations": {key: "x"}}}).expect(200)
                self.annotations.append(key)
            else:
                kind_name = f"AgentCheck{n}"
                condition = {
                    "type": kind_name,
                    "status": "True",
                    "reason": "Fine",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
                self.rest.patch(f"{path}/status", {"status": {"conditions": [condition]}}, "strategic").expect(200)
                self.conditions.append(kind_name)
            i += 1
            self.stop.wait(0.12)

    def lost(self, node: dict) -> list[str]:
        taints = {t["key"] for t in node["spec"].get("taints") or []}
        annotations = node["metadata"].get("annotations") or {}
        conditions = {c["type"] for c in node["status"].get("conditions") or []}
        return [
            *(t for t in self.taints if t not in taints),
            *(a for a in self.annotations if a not in annotations),
            *(c for c in self.conditions if c not in conditions),
        ]


async def concurrent_writer_outage(backend: Backend, tmp_path: Path) -> dict[str, Any]:
    prefix = "f1"
    bad = f"{prefix}-gpu-01"
    exporters = await start_cluster(backend, prefix, 3)
    proxy = await FaultProxy(*backend.upstream).start()
    rest = backend.admin
    writer = _Writer(rest, bad)
    try:
        port = free_port()
        kubeconfig = backend.kubeconfig(proxy.url(backend.scheme))
        command = controller_command(
            str(kubeconfig),
            exporters,
            port,
            "--policies",
            str(pool_breaker_policies(tmp_path)),
            *_lease_flags("writer-1"),
        )
        stderr = tmp_path / "writer.stderr"
        async with controller_process(command, stderr) as proc:

            async def metric_is(name: str, value: float) -> bool:
                assert proc.returncode is None, stderr.read_text()[-3000:]
                try:
                    return metric(await scrape(port), name) == value
                except aiohttp.ClientError:
                    return False

            await until(lambda: metric_is("gpuscale_controller_leader", 1), timeout=30)
            writer.start()
            exporters.sim.override_gpu(bad, 1, last_xid=79, xid_window=((79, 1),))

            async def remediated() -> bool:
                assert proc.returncode is None, stderr.read_text()[-3000:]
                node = await asyncio.to_thread(rest.get, f"/api/v1/nodes/{bad}")
                return bool(node.body["spec"].get("unschedulable")) and TAINT in [
                    t["key"] for t in node.body["spec"].get("taints") or []
                ]

            await until(remediated, timeout=30)
            dropped = 0
            for _ in range(3):  # watches cut mid-stream
                await asyncio.sleep(0.3)
                dropped += proxy.drop()
            await until(lambda: metric_is("gpuscale_controller_view_confirmed", 1), timeout=20)
            before = await scrape(port)
            proxy.cut()  # an outage longer than the renew deadline (2 s): leadership is lost and won again
            await until(lambda: metric_is("gpuscale_controller_view_confirmed", 0), timeout=10)
            await asyncio.sleep(3.5)  # NB: the outage's length is the fault itself
            proxy.restore()
            await until(lambda: metric_is("gpuscale_controller_leader", 1), timeout=20)
            await until(lambda: metric_is("gpuscale_controller_view_confirmed", 1), timeout=20)
            restored = await scrape(port)
            await asyncio.sleep(3)  # NB: six reconciles after the outage, in which a duplicate would be written
            writer.stop.set()
            await asyncio.to_thread(writer.join, 10)
            await asyncio.sleep(1)
            after = await scrape(port)
        node = (await asyncio.to_thread(rest.get, f"/api/v1/nodes/{bad}")).expect(200)
        events = await asyncio.to_thread(events_about, rest, bad)

        def writes(text: str, action: str) -> float:
            return metric(text, "gpuscale_controller_actions_total", action=action, result="applied")

        counts = {
            "foreign fields added": len(writer.taints) + len(writer.annotations) + len(writer.conditions),
            "foreign fields lost": len(writer.lost(node)),
            "watch connections dropped": dropped,
            "reconciles held (view)": metric(after, "gpuscale_controller_reconciles_held_total", stage="view")
            - metric(before, "gpuscale_controller_reconciles_held_total", stage="view"),
            "conflicts re-read and re-planned": metric(after, "gpuscale_controller_replans_total"),
            "patches after the outage": sum(writes(after, a) - writes(restored, a) for a in ("patch", "patch-status")),
            "events after the outage": writes(after, "event") - writes(restored, "event"),
            "duplicate events": sum(int(e.get("count") or 1) for e in events)
            - len({(e["reason"], e["message"]) for e in events}),
            "event objects": len(events),
        }
        backend.counts["concurrent writer, dropped watches, outage"] = counts
        assert counts["foreign fields lost"] == 0, (writer.lost(node), node)
        assert counts["foreign fields added"] >= 20, counts
        assert TAINT in [t["key"] for t in node["spec"]["taints"]] and node["spec"].get("unschedulable")
        assert {c["type"]: c["status"] for c in node["status"]["conditions"]}.get("GpuHealthy") == "False"
        assert counts["patches after the outage"] == 0 and counts["events after the outage"] == 0, counts
        assert counts["duplicate events"] == 0, events
        assert counts["reconciles held (view)"] >= 1, counts
        assert "Traceback" not in stderr.read_text()
        return counts
    finally:
        writer.stop.set()
        await proxy.stop()
        await exporters.stop()
        await asyncio.to_thread(remove_nodes, rest, prefix)


async def breaker_across_leaders(backend: Backend, tmp_path: Path) -> dict[str, Any]:
    prefix = "f2"
    rest = backend.admin
    policies = pool_breaker_policies(tmp_path)
    state = "/api/v1/namespaces/gpuscale/configmaps/gpuscale-controller-state"
    (await asyncio.to_thread(rest.delete, state)).expect(200, 404)
    exporters = await start_cluster(backend, prefix, 10)
    nodes = [f"{prefix}-gpu-{i:02d}" for i in range(10)]
    kubeconfig = backend.kubeconfig(f"{backend.scheme}://{backend.upstream[0]}:{backend.upstream[1]}")
    procs: dict[str, Any] = {}
    peak = 0

    def acted() -> list[str]:
        out = []
        for name in nodes:
            node = rest.get(f"/api/v1/nodes/{name}").expect(200)
            notes = node["metadata"].get("annotations") or {}
            if TAINT in [t["key"] for t in node["spec"].get("taints") or []] or notes.get("gpuscale.io/cordoned-by"):
                out.append(name)
        return out

    async def holder() -> str:
        lease = await asyncio.to_thread(
            rest.get, "/apis/coordination.k8s.io/v1/namespaces/gpuscale/leases/gpuscale-controller"
        )
        return (lease.body.get("spec") or {}).get("holderIdentity") or "" if lease.ok else ""

    async def start(identity: str) -> None:
        command = controller_command(
            str(kubeconfig),
            exporters,
            free_port(),
            "--policies",
            str(policies),
            *_lease_flags(identity),
        )
        stderr = open(tmp_path / f"{identity}.stderr", "wb")  # noqa: SIM115 - closed with the process
        proc = await asyncio.create_subprocess_exec(*command, stderr=stderr)
        procs[identity] = (proc, stderr)

    kills = 0
    try:
        await start("replica-a")
        await start("replica-b")
        await until(lambda: holder_in(holder, {"replica-a", "replica-b"}), timeout=30)
        for name in nodes[:4]:  # four bad nodes at once; the breaker allows two
            exporters.sim.override_gpu(name, 0, last_xid=79, xid_window=((79, 1),))
        for replacement in ("replica-c", "replica-d"):

            async def first_action() -> bool:
                nonlocal peak
                now = await asyncio.to_thread(acted)
                peak = max(peak, len(now))
                return bool(now)

            await until(first_action, timeout=30)
            leader = await holder()
            proc, _ = procs[leader]
            proc.send_signal(signal.SIGKILL)  # mid-action: the leader dies right after its first write
            await proc.wait()
            kills += 1
            (await asyncio.to_thread(rest.delete, state)).expect(200, 404)  # the breaker's memory is lost too
            await start(replacement)
            survivors = {k for k, (p, _) in procs.items() if p.returncode is None}
            await until(lambda alive=survivors: holder_in(holder, alive), timeout=30)
            for _ in range(6):  # three seconds (six reconciles) of the new leader
                peak = max(peak, len(await asyncio.to_thread(acted)))
                await asyncio.sleep(0.5)
        final = await asyncio.to_thread(acted)
        events = [e for n in nodes for e in await asyncio.to_thread(events_about, rest, n)]
        held = [e for e in events if e["reason"] == "RemediationHeldBack"]
        counts = {
            "pool nodes": len(nodes),
            "bad nodes": 4,
            "breaker limit": 2,
            "leaders SIGKILLed": kills,
            "breaker ConfigMap deleted": kills,
            "nodes acted on (peak)": peak,
            "nodes acted on (end)": len(final),
            "nodes held back": len({e["involvedObject"]["name"] for e in held}),
        }
        backend.counts["breaker across leaders"] = counts
        assert peak <= 2 and len(final) == 2, counts
        assert set(final) <= set(nodes[:4])
        assert counts["nodes held back"] >= 1, counts
        for identity in procs:
            log = (tmp_path / f"{identity}.stderr").read_text()
            assert "Traceback" not in log, log[-3000:]
        return counts
    finally:
        for proc, stderr in procs.values():
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            stderr.close()
        await exporters.stop()
        await asyncio.to_thread(remove_nodes, rest, prefix)


async def holder_in(holder: Callable[[], Any], identities: set[str]) -> bool:
    return await holder() in identities


def gang_pod(name: str, node: str, labels: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "registry.example/trainer:1"}]},
    }


def _seed_gang(rest: Rest, prefix: str, pods: list[str]) -> dict[str, dict[str, str]]:
    """The gang's pods, bound and Running, and two PDBs over its rank 1 (all ranks; rank 1 alone)."""
    for i, name in enumerate(pods):
        labels = {"jobset.sigs.k8s.io/jobset-name": f"{prefix}-pretrain", "app": f"{prefix}-pretrain", "rank": str(i)}
        rest.post("/api/v1/namespaces/default/pods", gang_pod(name, f"{prefix}-gpu-{i:02d}", labels)).expect(201)
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        status = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}]}
        rest.patch(f"/api/v1/namespaces/default/pods/{name}/status", {"status": status}, "strategic").expect(200)
    budgets = {
        f"{prefix}-all-ranks": {"app": f"{prefix}-pretrain"},
        f"{prefix}-rank-1": {"rank": "1", "app": f"{prefix}-pretrain"},
    }
    for name, selector in budgets.items():
        pdb = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"maxUnavailable": 3, "selector": {"matchLabels": selector}},
        }
        rest.post("/apis/policy/v1/namespaces/default/poddisruptionbudgets", pdb).expect(201)
    return budgets


async def gang_under_two_budgets(backend: Backend, tmp_path: Path) -> dict[str, Any]:
    prefix = "f3"
    rest = backend.admin
    exporters = await start_cluster(backend, prefix, 3)
    pods = [f"{prefix}-pretrain-{i}" for i in range(3)]
    try:
        budgets = await asyncio.to_thread(_seed_gang, rest, prefix, pods)
        bad = f"{prefix}-gpu-01"
        port = free_port()
        kubeconfig = backend.kubeconfig(f"{backend.scheme}://{backend.upstream[0]}:{backend.upstream[1]}")
        command = controller_command(
            str(kubeconfig),
            exporters,
            port,
            "--health-drain",
            *("--policies", str(pool_breaker_policies(tmp_path))),
            *_lease_flags("gang-1"),
        )
        stderr = tmp_path / "gang.stderr"
        async with controller_process(command, stderr) as proc:
            exporters.sim.override_gpu(bad, 0, last_xid=79, xid_window=((79, 1),))

            async def held() -> bool:
                assert proc.returncode is None, stderr.read_text()[-3000:]
                return any(e["reason"] == "GangDrainHeld" for e in await asyncio.to_thread(events_about, rest, bad))

            await until(held, timeout=30)
            await asyncio.sleep(2)  # NB: four more reconciles, in which an eviction would be sent
            text = await scrape(port)
        (event,) = [e for e in await asyncio.to_thread(events_about, rest, bad) if e["reason"] == "GangDrainHeld"]
        left = [(await asyncio.to_thread(rest.get, f"/api/v1/namespaces/default/pods/{p}")).body for p in pods]
        counts = {
            "gang pods": len(pods),
            "evictions sent": metric(text, "gpuscale_controller_actions_total", action="evict"),
            "gang pods evicted": sum(
                1 for p in left if p.get("kind") != "Pod" or p["metadata"].get("deletionTimestamp")
            ),
            "GangDrainHeld events": int(event.get("count") or 1),
        }
        backend.counts["gang pod under two PDBs"] = counts
        assert counts["evictions sent"] == 0 and counts["gang pods evicted"] == 0, counts
        message = event["message"]
        assert f"pod default/{prefix}-pretrain-1" in message, message
        assert all(f"default/{b}" in message for b in budgets), message
        return counts
    finally:
        await exporters.stop()
        await asyncio.to_thread(remove_nodes, rest, prefix)
        for name in pods:
            await asyncio.to_thread(rest.delete, f"/api/v1/namespaces/default/pods/{name}", gracePeriodSeconds=0)
