"""DRA: dcgm-exporter series of GPUs allocated through ResourceClaims count towards the pod and the claim.

Fixture: tests/fixtures/dcgm/dcgm-exporter-dra.prom (format and provenance in tests/fixtures/README.md):
node gpu-node-7, GPU 0 whole to inference/vllm-llama-0 through claim inference/vllm-llama-0-gpu-7x2kq;
GPU 1 in MIG mode, instance 1 (3g.40gb) to speech/asr-6f9d8c7b5-q8w3z through a claim, instance 2 free.
"""

from __future__ import annotations

import pytest

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.attribution import Target, attribute
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.model import RESOURCE_CLAIM, ObjectRef, node, pod
from tests.helpers import FIXTURES, T0, fixture_store

DRA = FIXTURES / "dcgm" / "dcgm-exporter-dra.prom"
URL = "http://10.0.7.2:9400/metrics"
MIB = 1048576
VLLM, ASR = pod("inference", "vllm-llama-0"), pod("speech", "asr-6f9d8c7b5-q8w3z")
VLLM_CLAIM = ObjectRef(RESOURCE_CLAIM, "vllm-llama-0-gpu-7x2kq", "inference")
ASR_CLAIM = ObjectRef(RESOURCE_CLAIM, "asr-6f9d8c7b5-q8w3z-mig-k4m2p", "speech")


@pytest.fixture(scope="module")
def store():
    return fixture_store([(URL, DRA, T0)])


def value(store, metric, obj):
    point = store.point(metric, obj)
    assert point is not None and not point.stale, (metric, obj)
    return point.value


def test_a_whole_gpu_claim_counts_towards_its_pod_and_the_claim(store):
    for obj in (VLLM, VLLM_CLAIM):
        assert value(store, "gpu_memory_used_bytes", obj) == 72000 * MIB
        assert value(store, "gpu_sm_active", obj) == pytest.approx(41.0)
        assert value(store, "gpu_utilization", obj) == 100


def test_a_mig_claim_counts_towards_its_pod_and_the_claim_and_power_once_per_gpu(store):
    for obj in (ASR, ASR_CLAIM):
        assert value(store, "gpu_memory_used_bytes", obj) == 30210 * MIB
        assert value(store, "gpu_sm_active", obj) == pytest.approx(32.0)
    assert value(store, "gpu_power_watts", node("gpu-node-7")) == pytest.approx(455.512 + 210.25)
    assert value(store, "gpu_memory_used_bytes", node("gpu-node-7")) == (72000 + 30210 + 13) * MIB
    assert store.point("gpu_memory_used_bytes", ObjectRef(RESOURCE_CLAIM, "nope", "speech")) is None


def test_dra_labels_are_placement_not_metric_labels(store):
    parts = store.parts("gpu_memory_used_bytes", VLLM)
    assert parts and all(not k.startswith("dra_") for p in parts for k, _ in p.labels)


GPU = {"gpu": "1", "UUID": "GPU-9b40", "Hostname": "gpu-node-7"}
CLAIM = {"dra_claim_name": "shared", "dra_claim_namespace": "ml", "namespace": "ml"}


def test_mig_devices_without_gpu_i_id_are_told_apart_by_the_dra_mig_device_uuid():
    target = Target(URL)
    a = attribute("DCGM_FI_DEV_FB_USED", GPU | CLAIM | {"pod": "a", "dra_mig_device_uuid": "MIG-1"}, target)
    b = attribute("DCGM_FI_DEV_FB_USED", GPU | CLAIM | {"pod": "a", "dra_mig_device_uuid": "MIG-2"}, target)
    assert a.key != b.key and a.physical == b.physical


def test_a_claim_shared_by_two_pods_gives_each_pod_its_own_device_of_the_same_gpu():
    target = Target(URL)
    a = attribute("DCGM_FI_DEV_FB_USED", GPU | CLAIM | {"pod": "a"}, target)
    b = attribute("DCGM_FI_DEV_FB_USED", GPU | CLAIM | {"pod": "b"}, target)
    assert a.key != b.key and a.physical == b.physical
    assert a.claim == b.claim == ObjectRef(RESOURCE_CLAIM, "shared", "ml")
    assert (a.pod, b.pod) == (pod("ml", "a"), pod("ml", "b")) and a.claim in a.objects


# --- served through the custom metrics API: an HPA Object metric on a ResourceClaim ------------------

CLAIMS = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/resourceclaims.resource.k8s.io"


@pytest.fixture
async def client(aiohttp_client, store):
    catalogue = load_catalogue()
    provider = MetricsProvider(catalogue, store, None, clock=lambda: T0 + 1)
    return await aiohttp_client(
        make_app(provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
    )


async def test_the_adapter_serves_a_claims_value_as_an_object_metric(client):
    response = await client.get(f"{CLAIMS}/vllm-llama-0-gpu-7x2kq/gpu_sm_active")
    assert response.status == 200
    (item,) = (await response.json())["items"]
    assert item["describedObject"] == {
        "kind": "ResourceClaim",
        "namespace": "inference",
        "name": "vllm-llama-0-gpu-7x2kq",
        "apiVersion": "resource.k8s.io/v1",
    }
    assert item["value"] == "41"
    listed = await (await client.get(f"{CLAIMS}/*/gpu_memory_used_bytes")).json()
    assert [i["describedObject"]["name"] for i in listed["items"]] == ["vllm-llama-0-gpu-7x2kq"]
    assert (await client.get(f"{CLAIMS}/unknown-claim/gpu_sm_active")).status == 404
    assert (await client.get(f"{CLAIMS}/*/gpu_sm_active?labelSelector=a%3Db")).status == 400
