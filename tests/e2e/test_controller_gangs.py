"""`gpuscale controller` as a user runs it, for gang-aware capacity: a real process against the simulated Kubernetes
API (with the Volcano, Kueue and ProvisioningRequest CRDs installed) and simulated dcgm-exporters. A pending
16-GPU Volcano gang without pods gets one ProvisioningRequest; the priority expander ConfigMap ranks the pools
(one from the nodes, one declared in pools.yaml); when the gang runs, its request goes."""

from __future__ import annotations

import asyncio
import signal

import yaml

from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from tests.controller.test_provisioning import volcano_group
from tests.e2e.backends import free_port
from tests.e2e.controller_process import controller_command, controller_process, simulated_cluster, until

REQUEST = ("autoscaling.x-k8s.io/v1", "ProvisioningRequest")


async def test_the_controller_process_provisions_a_pending_gang(tmp_path):
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "pools.yaml").write_text(
        "pools:\n  - {name: b200-zero, gpu_product: NVIDIA-B200, gpus_per_node: 8, node_groups: ['eks-b200-.*']}\n"
    )
    async with simulated_cluster(2) as (api, exporters):
        for name in ("gpuscale", "ml"):
            api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        for crd in BATCH_SCHEDULING_CRDS:
            api.create(crd)
        api.create(volcano_group())
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        extra = ("--policies", str(policies), "--no-leader-elect", "--no-health", "--no-hints")
        command = controller_command(kubeconfig, exporters, free_port(), *extra)
        async with controller_process(command, tmp_path / "stderr") as proc:

            async def requested() -> bool:
                assert proc.returncode is None, (tmp_path / "stderr").read_text()
                cm = api.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
                return bool(api.list(*REQUEST, namespace="ml")) and cm is not None

            await until(requested)
            (request,) = api.list(*REQUEST, namespace="ml")
            (pod_set,) = request["spec"]["podSets"]
            template = api.get("v1", "PodTemplate", pod_set["podTemplateRef"]["name"], namespace="ml")
            limits = template["template"]["spec"]["containers"][0]["resources"]["limits"]
            assert pod_set["count"] * int(limits["nvidia.com/gpu"]) == 16
            cm = api.get("v1", "ConfigMap", "cluster-autoscaler-priority-expander", namespace="kube-system")
            priorities = yaml.safe_load(cm["data"]["priorities"])
            # the 2-GPU H100 nodes cannot host an 8-GPU pod of the gang; the declared 8-GPU B200 pool can
            assert list(priorities.values()) == [["eks-b200-.*"], [".*gpu\\-a.*"]]

            # the gang runs: its request and template are deleted
            api.patch(
                "scheduling.volcano.sh/v1beta1",
                "PodGroup",
                "train",
                {"status": {"phase": "Running", "conditions": None}},
                namespace="ml",
                subresource="status",
            )

            async def cleaned() -> bool:
                return not api.list(*REQUEST, namespace="ml") and not api.list("v1", "PodTemplate", namespace="ml")

            await until(cleaned)
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.wait_for(proc.wait(), 20) == 0
        log = (tmp_path / "stderr").read_text()
        assert f"action=create object=ProvisioningRequest/ml/{request['metadata']['name']} result=applied" in log
        assert log.count("action=create object=ProvisioningRequest/") == 1  # one request, however many reconciles
