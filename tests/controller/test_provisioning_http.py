"""The ProvisioningRequest flow over HTTP, with the controller's own caches and actuator.

The simulated API server runs on a socket. The controller side is what ``gpuscale controller`` runs: an
``ObjectCache`` of the capacity planners' kinds (listed over HTTP) as the view, the planner, and
``KubeActuator`` applying its writes over HTTP. The cluster side (CRDs, the Volcano PodGroup, the conditions the
cluster-autoscaler sets) goes through another real client, kubernetes-asyncio's dynamic client. A "restart" is a
new client, cache and actuator: no duplicate request, the attempt count read back from the objects.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes_asyncio.config import new_client_from_config
from kubernetes_asyncio.dynamic import DynamicClient

from gpuscale.controller.actuator import KubeActuator
from gpuscale.controller.capacity import CAPACITY_KINDS, GangCapacityPlanner
from gpuscale.controller.pools import load_pools_policy
from gpuscale.controller.provisioning import PROVISIONING_REQUEST
from gpuscale.controller.writes import Create, Delete, Write
from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.objects import ObjectCache, WatchSpec

from .test_provisioning import T0, volcano_group


@pytest.fixture
async def sim():
    api = SimKubeApi()
    await api.start()
    yield api
    await api.stop()


async def connect(sim: SimKubeApi, tmp_path) -> tuple[Any, DynamicClient]:
    api = await new_client_from_config(config_file=sim.write_kubeconfig(tmp_path / "kubeconfig"), persist_config=False)
    return api, await DynamicClient(api)


class Controller:
    """The controller side of one process: its cache (the view), the gang planner and its actuator."""

    def __init__(self, api: Any) -> None:
        rest = KubeRest(api)
        self.cache = ObjectCache(rest, [WatchSpec(v, k, optional=v != "v1") for v, k in CAPACITY_KINDS])
        self.actuator = KubeActuator(rest, backoff_seconds=0.01)
        self.planner = GangCapacityPlanner(load_pools_policy())

    async def plan(self, now: float) -> list[Write]:
        await self.cache.refresh_once()
        return self.planner.plan(self.cache, None, now=now)

    async def reconcile(self, now: float) -> list[Write]:
        writes = await self.plan(now)
        outcomes = await self.actuator.apply(writes)
        assert {o.result for o in outcomes} <= {"applied"}, outcomes
        return writes


async def items(dyn: DynamicClient, api_version: str, kind: str) -> list[dict[str, Any]]:
    resource = await dyn.resources.get(api_version=api_version, kind=kind)
    return (await dyn.get(resource, namespace="ml")).to_dict()["items"]


async def set_status(dyn: DynamicClient, api_version: str, kind: str, name: str, status: dict[str, Any]) -> None:
    """What the cluster's other controllers (Volcano, the cluster-autoscaler) write: the status subresource."""
    resource = await dyn.resources.get(api_version=api_version, kind=kind)
    await dyn.patch(
        resource.subresources["status"],
        body={"status": status},
        name=name,
        namespace="ml",
        content_type="application/merge-patch+json",
    )


async def test_provisioning_request_flow_over_http(sim, tmp_path) -> None:
    api, dyn = await connect(sim, tmp_path)
    try:
        crds = await dyn.resources.get(api_version="apiextensions.k8s.io/v1", kind="CustomResourceDefinition")
        for crd in BATCH_SCHEDULING_CRDS:
            await dyn.create(crds, body=crd)
        namespaces = await dyn.resources.get(api_version="v1", kind="Namespace")
        await dyn.create(namespaces, body={"metadata": {"name": "ml"}})
    finally:
        await api.close()
    # NB: a new client, as the controller starting after the CRDs were installed (discovery is cached per client)
    api, dyn = await connect(sim, tmp_path)
    try:
        groups = await dyn.resources.get(api_version="scheduling.volcano.sh/v1beta1", kind="PodGroup")
        group = volcano_group()
        status = group.pop("status")
        await dyn.create(groups, body=group, namespace="ml")
        await set_status(dyn, "scheduling.volcano.sh/v1beta1", "PodGroup", "train", status)
        writes = await Controller(api).reconcile(T0)
        assert [type(w) for w in writes] == [Create, Create]
        listed = await items(dyn, *PROVISIONING_REQUEST)
        assert len(listed) == 1
        (pod_set,) = listed[0]["spec"]["podSets"]
        templates = await dyn.resources.get(api_version="v1", kind="PodTemplate")
        template = (await dyn.get(templates, name=pod_set["podTemplateRef"]["name"], namespace="ml")).to_dict()
        gpus = int(template["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert pod_set["count"] * gpus == 16
    finally:
        await api.close()

    # restart: a new client, cache and actuator, nothing remembered
    api, dyn = await connect(sim, tmp_path)
    try:
        controller = Controller(api)
        assert await controller.plan(T0 + 30) == []
        # a replayed plan (the old process died before it learned its writes were applied) changes nothing: the
        # AlreadyExists answers are conflicts (the loop re-reads and plans again), never counted as done
        outcomes = await controller.actuator.apply(writes)
        assert [o.result for o in outcomes] == ["conflict", "conflict"]
        assert all("AlreadyExists" in o.detail for o in outcomes)
        assert len(await items(dyn, *PROVISIONING_REQUEST)) == 1
        # the cluster-autoscaler gives up on it: Failed, written as CA writes it
        name = listed[0]["metadata"]["name"]
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "FailedToCreatePods",
            "message": "quota exceeded",
            "lastTransitionTime": "2026-12-03T07:00:30Z",
        }
        await set_status(dyn, *PROVISIONING_REQUEST, name, {"conditions": [failed]})
        assert await controller.plan(T0 + 60) == []  # backing off
        await controller.reconcile(T0 + 91)
        assert [r["metadata"]["name"] for r in await items(dyn, *PROVISIONING_REQUEST)] == [
            name.replace("-try1", "-try2")
        ]
        assert [e["reason"] for e in await items(dyn, "v1", "Event")] == ["ProvisioningRetry"]
        assert await controller.plan(T0 + 92) == []  # the Event is in the cache: nothing said twice
        # the gang runs: request and template are cleaned up
        await set_status(
            dyn, "scheduling.volcano.sh/v1beta1", "PodGroup", "train", {"phase": "Running", "conditions": None}
        )
        writes = await controller.reconcile(T0 + 120)
        assert {type(w) for w in writes} == {Delete}
        assert await items(dyn, *PROVISIONING_REQUEST) == [] and await items(dyn, "v1", "PodTemplate") == []
        assert await controller.plan(T0 + 150) == []
    finally:
        await api.close()
