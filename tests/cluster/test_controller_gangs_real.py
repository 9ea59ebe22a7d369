"""`gpuscale controller --gangs` on the real API server with the upstream ProvisioningRequest and Volcano PodGroup
CRDs (tests/cluster/crds/, unmodified, with their licences): a pending Volcano gang gets a ProvisioningRequest and
its PodTemplate that kube-apiserver accepts under the published schema, and both go when the gang goes. The
controller runs as its ServiceAccount under deploy/controller's RBAC."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.cluster.rest import Rest
from tests.controller.fault_suite import Backend, point_kubeconfig, pool_breaker_policies, remove_nodes, start_cluster
from tests.e2e.backends import free_port
from tests.e2e.controller_process import controller_command, controller_process, until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
CRDS = Path(__file__).resolve().parent / "crds"
REQUESTS = "/apis/autoscaling.x-k8s.io/v1/namespaces/gang-ml/provisioningrequests"
TEMPLATES = "/api/v1/namespaces/gang-ml/podtemplates"
GROUPS = "/apis/scheduling.volcano.sh/v1beta1/namespaces/gang-ml/podgroups"


def _install(plane) -> None:
    applied = plane.kubectl(
        "apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(REPO / "deploy/controller")
    )
    assert applied.returncode == 0, applied.stderr
    for crd in sorted(CRDS.glob("*.yaml")):
        applied = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-f", str(crd))
        assert applied.returncode == 0, applied.stderr
    names = ["provisioningrequests.autoscaling.x-k8s.io", "podgroups.scheduling.volcano.sh"]
    waited = plane.kubectl("wait", "--for=condition=Established", "--timeout=30s", *(f"crd/{n}" for n in names))
    assert waited.returncode == 0, waited.stderr


def _pending_gang(rest: Rest) -> None:
    rest.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gang-ml"}}).expect(
        201, 409
    )
    group = {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": "train", "namespace": "gang-ml"},
        "spec": {"minMember": 2, "minResources": {"nvidia.com/gpu": "16", "cpu": "16", "memory": "64Gi"}},
        # NB: the Volcano CRD has no status subresource: the status is written with the object, as Volcano does
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "Unschedulable",
                    "status": "True",
                    "reason": "NotEnoughResources",
                    "lastTransitionTime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                }
            ],
        },
    }
    deadline = time.monotonic() + 30
    while (created := rest.post(GROUPS, group)).status == 429 and time.monotonic() < deadline:
        time.sleep(1)  # NB: the CRD's storage is (re)initializing right after it is installed (Retry-After: 1)
    created.expect(201)


async def test_a_pending_volcano_gang_gets_a_provisioning_request_the_real_schema_accepts(control_plane, tmp_path):
    plane = control_plane
    rest = plane.rest()
    await asyncio.to_thread(_install, plane)
    url = urlsplit(plane.server)
    account = plane.service_account_kubeconfig("gpuscale", "gpuscale-controller")
    backend = Backend(
        name="kube-apiserver v1.37",
        admin=rest,
        upstream=(url.hostname, url.port),
        scheme="https",
        kubeconfig=lambda server: point_kubeconfig(account, server, tmp_path / "controller.kubeconfig"),
    )
    exporters = await start_cluster(backend, "g1", 1)
    try:
        await asyncio.to_thread(_pending_gang, rest)
        command = controller_command(
            str(backend.kubeconfig(plane.server)),
            exporters,
            free_port(),
            *("--policies", str(pool_breaker_policies(tmp_path))),
            *("--identity", "gangs-1", "--lease-duration", "3s", "--renew-deadline", "2s", "--retry-period", "0.5s"),
            *("--gangs", "--no-hints", "--no-health"),
        )
        stderr = tmp_path / "stderr"
        async with controller_process(command, stderr) as proc:

            async def listed(path: str, count: int) -> bool:
                assert proc.returncode is None, stderr.read_text()[-3000:]
                assert "result=failed" not in stderr.read_text(), stderr.read_text()[-3000:]
                answer = await asyncio.to_thread(rest.get, path)
                if answer.status == 429:  # NB: a CRD just installed: "storage is (re)initializing", retry after 1 s
                    return False
                return len(answer.expect(200)["items"]) == count

            try:
                await until(lambda: listed(REQUESTS, 1), timeout=30)
                await until(lambda: listed(TEMPLATES, 1), timeout=10)
            except AssertionError as e:
                raise AssertionError(f"{e}; the controller's log ends: {stderr.read_text()[-3000:]}") from None
            (request,) = rest.get(REQUESTS).expect(200)["items"]
            (template,) = rest.get(TEMPLATES).expect(200)["items"]
            (pod_set,) = request["spec"]["podSets"]
            assert pod_set["podTemplateRef"]["name"] == template["metadata"]["name"]
            gpus = int(template["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
            assert pod_set["count"] * gpus == 16
            assert request["spec"]["provisioningClassName"] == "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
            # the gang goes: its request and template go too
            rest.delete(f"{GROUPS}/train").expect(200)
            await until(lambda: listed(REQUESTS, 0), timeout=30)
            await until(lambda: listed(TEMPLATES, 0), timeout=10)
        log = stderr.read_text()
        assert "Forbidden" not in log and "Traceback" not in log, log[-3000:]
    finally:
        await exporters.stop()
        await asyncio.to_thread(remove_nodes, rest, "g1")
