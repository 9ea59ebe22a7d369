"""The ProvisioningRequest flow over HTTP with a real client (kubernetes-asyncio's dynamic client).

The simulated API server runs on a socket; CRDs, the Volcano PodGroup and the conditions the
cluster-autoscaler would set all go through HTTP; the view is listed over HTTP; the planner's writes are
applied over HTTP. A "restart" is a new client and a fresh view: no duplicate request, the attempt count
read back from the objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiException
from kubernetes_asyncio.config import new_client_from_config
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic.exceptions import ResourceNotFoundError

from gpuscale.controller.gangs import GANG_KINDS
from gpuscale.controller.pools import load_pools_policy
from gpuscale.controller.provisioning import PROVISIONING_KINDS, PROVISIONING_REQUEST, plan_provisioning
from gpuscale.controller.writes import Create, Delete, Emit, Patch, StaticClusterView, Write
from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from gpuscale.sim.kubeapi import SimKubeApi

from .test_provisioning import T0, volcano_group

KINDS = (*GANG_KINDS, *PROVISIONING_KINDS)
_PATCH_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}


@pytest.fixture
async def sim():
    api = SimKubeApi()
    await api.start()
    yield api
    await api.stop()


async def connect(sim: SimKubeApi, tmp_path) -> tuple[Any, DynamicClient]:
    api = await new_client_from_config(config_file=sim.write_kubeconfig(tmp_path / "kubeconfig"), persist_config=False)
    return api, await DynamicClient(api)


async def http_view(dyn: DynamicClient, kinds: Sequence[tuple[str, str]]) -> StaticClusterView:
    items = []
    for api_version, kind in kinds:
        try:
            resource = await dyn.resources.get(api_version=api_version, kind=kind)
        except ResourceNotFoundError:  # a kind whose CRD is not installed: nothing of it in the view
            continue
        listed = (await dyn.get(resource)).to_dict()
        items.extend({"apiVersion": api_version, "kind": kind, **item} for item in listed["items"])
    return StaticClusterView(items)


async def apply_over_http(dyn: DynamicClient, writes: Sequence[Write]) -> None:
    """Each write as the controller's actuator sends it; AlreadyExists / NotFound count as done."""
    for write in writes:
        try:
            if isinstance(write, Create):
                resource = await dyn.resources.get(api_version=write.obj["apiVersion"], kind=write.obj["kind"])
                await dyn.create(resource, body=dict(write.obj), namespace=write.key.namespace)
            elif isinstance(write, Patch):
                resource = await dyn.resources.get(api_version=write.key.api_version, kind=write.key.kind)
                if write.subresource:
                    resource = resource.subresources[write.subresource]
                await dyn.patch(
                    resource,
                    body=write.patch,
                    name=write.key.name,
                    namespace=write.key.namespace,
                    content_type=_PATCH_TYPES[write.patch_type],
                )
            elif isinstance(write, Delete):
                resource = await dyn.resources.get(api_version=write.key.api_version, kind=write.key.kind)
                await dyn.delete(resource, name=write.key.name, namespace=write.key.namespace)
            elif isinstance(write, Emit):
                events = await dyn.resources.get(api_version="v1", kind="Event")
                regarding = write.regarding
                body = {
                    "metadata": {"generateName": f"{regarding.name}.", "namespace": regarding.namespace},
                    "involvedObject": {
                        "apiVersion": regarding.api_version,
                        "kind": regarding.kind,
                        "name": regarding.name,
                        "namespace": regarding.namespace,
                    },
                    "type": write.type,
                    "reason": write.reason,
                    "message": write.message,
                }
                await dyn.create(events, body=body, namespace=regarding.namespace)
        except ApiException as e:
            if not ((isinstance(write, Create) and e.status == 409) or (isinstance(write, Delete) and e.status == 404)):
                raise


async def test_provisioning_request_flow_over_http(sim, tmp_path) -> None:
    policy = load_pools_policy()
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
        await dyn.patch(
            groups.subresources["status"],
            body={"status": status},
            name="train",
            namespace="ml",
            content_type="application/merge-patch+json",
        )
        writes = plan_provisioning(await http_view(dyn, KINDS), now=T0, policy=policy)
        await apply_over_http(dyn, writes)
        requests = await dyn.resources.get(api_version=PROVISIONING_REQUEST[0], kind=PROVISIONING_REQUEST[1])
        listed = (await dyn.get(requests, namespace="ml")).to_dict()["items"]
        assert len(listed) == 1
        (pod_set,) = listed[0]["spec"]["podSets"]
        templates = await dyn.resources.get(api_version="v1", kind="PodTemplate")
        template = (await dyn.get(templates, name=pod_set["podTemplateRef"]["name"], namespace="ml")).to_dict()
        gpus = int(template["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert pod_set["count"] * gpus == 16
    finally:
        await api.close()

    # restart: a new client, a fresh view, nothing remembered
    api, dyn = await connect(sim, tmp_path)
    try:
        assert plan_provisioning(await http_view(dyn, KINDS), now=T0 + 30, policy=policy) == []
        # the cluster-autoscaler gives up on it: Failed, as CA writes it through the status subresource
        requests = await dyn.resources.get(api_version=PROVISIONING_REQUEST[0], kind=PROVISIONING_REQUEST[1])
        name = listed[0]["metadata"]["name"]
        failed = {
            "type": "Failed",
            "status": "True",
            "reason": "FailedToCreatePods",
            "message": "quota exceeded",
            "lastTransitionTime": "2026-12-03T07:00:30Z",
        }
        await dyn.patch(
            requests.subresources["status"],
            body={"status": {"conditions": [failed]}},
            name=name,
            namespace="ml",
            content_type="application/merge-patch+json",
        )
        assert plan_provisioning(await http_view(dyn, KINDS), now=T0 + 60, policy=policy) == []  # backing off
        writes = plan_provisioning(await http_view(dyn, KINDS), now=T0 + 91, policy=policy)
        await apply_over_http(dyn, writes)
        names = [r["metadata"]["name"] for r in (await dyn.get(requests, namespace="ml")).to_dict()["items"]]
        assert names == [name.replace("-try1", "-try2")]
        events = await dyn.resources.get(api_version="v1", kind="Event")
        reasons = [e["reason"] for e in (await dyn.get(events, namespace="ml")).to_dict()["items"]]
        assert reasons == ["ProvisioningRetry"]
        # the gang runs: request and template are cleaned up
        groups = await dyn.resources.get(api_version="scheduling.volcano.sh/v1beta1", kind="PodGroup")
        await dyn.patch(
            groups.subresources["status"],
            body={"status": {"phase": "Running", "conditions": None}},
            name="train",
            namespace="ml",
            content_type="application/merge-patch+json",
        )
        writes = plan_provisioning(await http_view(dyn, KINDS), now=T0 + 120, policy=policy)
        assert {type(w) for w in writes} == {Delete}
        await apply_over_http(dyn, writes)
        assert (await dyn.get(requests, namespace="ml")).to_dict()["items"] == []
        templates = await dyn.resources.get(api_version="v1", kind="PodTemplate")
        assert (await dyn.get(templates, namespace="ml")).to_dict()["items"] == []
    finally:
        await api.close()
