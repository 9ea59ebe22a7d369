"""Custom resources, PodTemplates and Jobs in the simulated API server, as kube-apiserver serves them.

Scope: a CustomResourceDefinition serves its resource at once (discovery, CRUD, list/watch, the status
subresource, generation), is validated, and takes its objects with it when deleted; core v1 PodTemplates and
batch/v1 Jobs (defaults, generated selector) — through kubernetes-asyncio over HTTP and through kubectl.
"""

from __future__ import annotations

import asyncio
import os
import shutil

import pytest
from kubernetes_asyncio import client, watch

from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS, PROVISIONING_REQUEST, VOLCANO_POD_GROUP
from gpuscale.sim.kubeapi import ApiStatusError

from . import test_kubeapi

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
sim, api_client = test_kubeapi.sim, test_kubeapi.api_client  # the same fixtures
GROUP, VERSION, PLURAL = "scheduling.volcano.sh", "v1beta1", "podgroups"


def podgroup(name: str, *, min_member: int = 2, status: dict | None = None) -> dict:
    obj = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"minMember": min_member, "minResources": {"nvidia.com/gpu": "16"}},
    }
    if status is not None:
        obj["status"] = status
    return obj


def test_a_crd_is_established_and_its_resource_served_in_process(sim) -> None:
    for crd in BATCH_SCHEDULING_CRDS:
        created = sim.create(crd)
        conditions = {c["type"]: c["status"] for c in created["status"]["conditions"]}
        assert conditions == {"NamesAccepted": "True", "Established": "True"}
    # the status subresource is declared: a create's status is dropped, the in-process helper writes it after
    pg = sim.create(podgroup("train", status={"phase": "Pending"}))
    assert pg["status"] == {"phase": "Pending"} and pg["metadata"]["generation"] == 1
    # the main resource cannot change the status; a spec change bumps the generation
    pg["status"] = {"phase": "Running"}
    pg["spec"]["minMember"] = 4
    updated = sim.replace(pg)
    assert updated["status"] == {"phase": "Pending"} and updated["metadata"]["generation"] == 2
    status = sim.patch(
        GROUP + "/" + VERSION, "PodGroup", "train", {"status": {"phase": "Inqueue"}}, subresource="status"
    )
    assert status["status"] == {"phase": "Inqueue"} and status["metadata"]["generation"] == 2


def test_crd_validation_and_deletion_take_the_objects_with_it(sim) -> None:
    bad = {**VOLCANO_POD_GROUP, "metadata": {"name": "wrong.example.com"}}
    with pytest.raises(ApiStatusError) as e:
        sim.create(bad)
    assert e.value.code == 422 and "spec.names.plural" in e.value.message
    clash = {
        **PROVISIONING_REQUEST,
        "metadata": {"name": "pods.example.com"},
        "spec": {**PROVISIONING_REQUEST["spec"], "versions": []},
    }
    with pytest.raises(ApiStatusError, match="storage version"):
        sim.create(clash)
    with pytest.raises(ApiStatusError) as e:
        sim.create(podgroup("early"))
    assert e.value.code == 404  # not served before its CRD exists
    sim.create(VOLCANO_POD_GROUP)
    sim.create(podgroup("a"))
    sim.delete("apiextensions.k8s.io/v1", "CustomResourceDefinition", "podgroups.scheduling.volcano.sh")
    with pytest.raises(ApiStatusError) as e:
        sim.list(f"{GROUP}/{VERSION}", "PodGroup")
    assert e.value.code == 404
    sim.create(VOLCANO_POD_GROUP)
    assert sim.list(f"{GROUP}/{VERSION}", "PodGroup") == []  # the old objects went with the old CRD


async def test_custom_resources_over_http_with_kubernetes_asyncio(sim, api_client) -> None:
    ext = client.ApiextensionsV1Api(api_client)
    await ext.create_custom_resource_definition(VOLCANO_POD_GROUP)
    groups = await client.ApisApi(api_client).get_api_versions()
    assert GROUP in [g.name for g in groups.groups]
    resources = await client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
    assert {r.name for r in resources.resources} == {"podgroups", "podgroups/status"}
    custom = client.CustomObjectsApi(api_client)
    listed = await custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL)
    await custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, podgroup("train"))
    await custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        "default",
        PLURAL,
        "train",
        {"status": {"phase": "Pending"}},
        _content_type="application/merge-patch+json",  # NB: the client would send a dict as a JSON patch
    )
    seen = []
    rv = listed["metadata"]["resourceVersion"]
    async with watch.Watch() as w:
        stream = w.stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "default",
            PLURAL,
            resource_version=rv,
            timeout_seconds=1,
        )
        async for event in stream:
            seen.append((event["type"], (event["object"].get("status") or {}).get("phase")))
    assert seen == [("ADDED", None), ("MODIFIED", "Pending")]
    got = await custom.get_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "train")
    assert got["kind"] == "PodGroup" and got["spec"]["minMember"] == 2
    with pytest.raises(client.ApiException) as e:
        await custom.create_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, podgroup("train"))
    assert e.value.status == 409
    await custom.delete_namespaced_custom_object(GROUP, VERSION, "default", PLURAL, "train")
    assert (await custom.list_namespaced_custom_object(GROUP, VERSION, "default", PLURAL))["items"] == []


async def test_podtemplates_and_jobs_with_typed_clients(sim, api_client) -> None:
    core, batch = client.CoreV1Api(api_client), client.BatchV1Api(api_client)
    template = {"metadata": {"labels": {"app": "train"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    await core.create_namespaced_pod_template(
        "default", {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
    )
    read = await core.read_namespaced_pod_template("t", "default")
    assert read.template.spec.containers[0].image == "i"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"suspend": True, "template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}}},
    }
    created = await batch.create_namespaced_job("default", job)
    uid = created.metadata.uid
    assert created.spec.selector.match_labels == {"batch.kubernetes.io/controller-uid": uid}
    assert created.spec.template.metadata.labels["batch.kubernetes.io/job-name"] == "train"
    assert (created.spec.parallelism, created.spec.completions, created.spec.backoff_limit) == (1, 1, 6)
    bad = {**job, "metadata": {"name": "bad"}, "spec": {"template": template}}
    with pytest.raises(client.ApiException) as e:
        await batch.create_namespaced_job("default", bad)
    assert e.value.status == 422 and "restartPolicy" in e.value.body


async def test_kubectl_gets_custom_resources_by_short_name(sim, tmp_path) -> None:
    for crd in BATCH_SCHEDULING_CRDS:
        sim.create(crd)
    sim.create(
        {
            "apiVersion": "autoscaling.x-k8s.io/v1",
            "kind": "ProvisioningRequest",
            "metadata": {"name": "gang-a", "namespace": "default"},
            "spec": {"provisioningClassName": "check-capacity.autoscaling.x-k8s.io", "podSets": []},
        }
    )
    kubeconfig = sim.write_kubeconfig(tmp_path / "kubeconfig")
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        "--kubeconfig",
        kubeconfig,
        "--cache-dir",
        str(tmp_path / "cache"),
        "get",
        "provreq",
        "-o",
        "name",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path)},
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert out.decode().split() == ["provisioningrequest.autoscaling.x-k8s.io/gang-a"]
