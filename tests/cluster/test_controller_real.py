"""`gpuscale controller` on the real API server, as its ServiceAccount with deploy/controller's RBAC.

The GPU telemetry comes from gpuscale/sim's dcgm-exporters (an Xid 79 injected on one GPU); every Kubernetes
object is real: Nodes reported Ready by the test, the controller's taint, cordon and condition patches, its
Events and its Lease. Another agent (the test, as admin) adds its own taint, annotation and node condition
before and after the controller acts: none of them may be lost — the habit the stale-copy JSON-patch bug
taught (an unguarded ``add`` of /spec/taints replaces the whole list).
"""

from __future__ import annotations

import asyncio
import copy
import re
import sys
from pathlib import Path

import pytest

from gpuscale.sim.exporters import SimExporters
from tests.cluster.controlplane import ControlPlane, free_port
from tests.cluster.kubelet import now_rfc3339
from tests.controller.harness import scenario
from tests.e2e.controller_process import controller_process, until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
TAINT = "status-taint.cluster-autoscaler.kubernetes.io/gpu-unhealthy"
PERSON_TAINT = {"key": "example.com/maintenance", "value": "alice", "effect": "NoSchedule"}
UNREACHABLE = {"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}


def _register(plane: ControlPlane, node: dict) -> None:
    """Create the Node as its kubelet registers it, then what the node lifecycle controller does once Ready."""
    rest = plane.rest()
    body = copy.deepcopy(node)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k in ("name", "labels", "annotations")}
    status = {"status": body.pop("status")}
    status["status"]["conditions"] = [dict(c, lastHeartbeatTime=now_rfc3339()) for c in status["status"]["conditions"]]
    created = rest.post("/api/v1/nodes", body).expect(201)
    name = created["metadata"]["name"]
    rest.patch(f"/api/v1/nodes/{name}/status", status, "strategic").expect(200)
    taints = created["spec"].get("taints") or []
    kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
    guarded = [
        {"op": "test", "path": "/spec/taints", "value": taints},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    rest.patch(f"/api/v1/nodes/{name}", guarded, "json").expect(200)


async def test_the_controller_remediates_on_the_real_api_and_keeps_what_others_wrote(control_plane, tmp_path):
    plane = control_plane
    rest = plane.rest()
    applied = plane.kubectl(
        "apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(REPO / "deploy/controller")
    )
    assert applied.returncode == 0, applied.stderr
    exporters = SimExporters()
    await exporters.start(scenario(3))
    try:
        for obj in exporters.kube_objects():
            if obj["kind"] == "Node":
                _register(plane, obj)
        # Another agent's marks on gpu-02, before the controller starts.
        await asyncio.to_thread(
            rest.patch,
            "/api/v1/nodes/gpu-02",
            [
                {"op": "add", "path": "/spec/taints", "value": [PERSON_TAINT]},
                {"op": "add", "path": "/metadata/annotations", "value": {"example.com/owner": "team-a"}},
            ],
            "json",
        )
        kubeconfig = plane.service_account_kubeconfig("gpuscale", "gpuscale-controller")
        port = free_port()
        command = [
            sys.executable, "-m", "gpuscale.cli.main", "controller",
            "--kubeconfig", str(kubeconfig),
            *[arg for url in exporters.dcgm_urls.values() for arg in ("--scrape-url", url)],
            "--port", str(port), "--bind-address", "127.0.0.1", "--interval", "0.5s",
            "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.5s",
            "--identity", "real-api-replica", "--no-hints",
        ]  # fmt: skip
        stderr = tmp_path / "stderr"
        async with controller_process(command, stderr) as proc:

            def node() -> dict:
                return rest.get("/api/v1/nodes/gpu-02").expect(200)

            async def leading() -> bool:
                assert proc.returncode is None, stderr.read_text()
                lease = await asyncio.to_thread(
                    rest.get, "/apis/coordination.k8s.io/v1/namespaces/gpuscale/leases/gpuscale-controller"
                )
                return lease.ok and lease.body["spec"].get("holderIdentity") == "real-api-replica"

            await until(leading, timeout=30)
            exporters.sim.override_gpu("gpu-02", 1, last_xid=79, xid_window=((79, 1),))

            async def remediated() -> bool:
                assert proc.returncode is None, stderr.read_text()
                return bool((await asyncio.to_thread(node))["spec"].get("unschedulable"))

            await until(remediated, timeout=30)
            # While it runs: node lifecycle's unreachable taint and a condition from another health agent.
            current = await asyncio.to_thread(node)
            await asyncio.to_thread(
                rest.patch,
                "/api/v1/nodes/gpu-02",
                [
                    {"op": "test", "path": "/spec/taints", "value": current["spec"]["taints"]},
                    {"op": "add", "path": "/spec/taints/-", "value": UNREACHABLE},
                ],
                "json",
            )
            condition = {
                "type": "ExampleHealthy",
                "status": "False",
                "reason": "AgentSaysSo",
                "lastTransitionTime": now_rfc3339(),
            }
            await asyncio.to_thread(
                rest.patch, "/api/v1/nodes/gpu-02/status", {"status": {"conditions": [condition]}}, "strategic"
            )
            await asyncio.sleep(3)  # NB: six controller intervals in which a stale write would have landed
            final = await asyncio.to_thread(node)
            keys = [t["key"] for t in final["spec"]["taints"]]
            assert TAINT in keys and PERSON_TAINT["key"] in keys and UNREACHABLE["key"] in keys, keys
            assert final["metadata"]["annotations"].get("example.com/owner") == "team-a"
            conditions = {c["type"]: c["status"] for c in final["status"]["conditions"]}
            assert conditions.get("ExampleHealthy") == "False" and conditions.get("Ready") == "True", conditions
            assert conditions.get("GpuHealthy") == "False", conditions  # the controller's own condition
            events = rest.get("/api/v1/namespaces/default/events", fieldSelector="involvedObject.name=gpu-02").body[
                "items"
            ]
            assert events and all(e["source"].get("component") or e.get("reportingComponent") for e in events), events
            others = [rest.get(f"/api/v1/nodes/{n}").body for n in ("gpu-01", "gpu-03")]
            assert not any(o.get("spec", {}).get("unschedulable") for o in others)
        log = stderr.read_text()
        # NB: 403 as a number of its own: a log line's milliseconds (",403") or seconds ("0.403") are not a status
        assert "Forbidden" not in log and not re.search(r"(?<![\d.,])403(?!\d)", log), log[-2000:]
    finally:
        await exporters.stop()
