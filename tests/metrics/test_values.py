"""Values on the upstream-format fixtures, checked against numbers computed by hand.

Each expected number is written out from the fixture's raw values (see the comments), so a change
in attribution, deduplication or aggregation that alters a value fails here.
"""

from __future__ import annotations

import pytest

from gpuscale.metrics.aggregation import finish_parts
from gpuscale.metrics.attribution import Target
from gpuscale.model import NODE, ObjectRef, format_quantity, namespace, node, pod
from gpuscale.selectors import LabelSelector
from tests.helpers import H100, H100_NODE, LEGACY, MIG, T0, TRITON, TRITON_POD, TRITON_T0, fixture_store

TRAINING = pod("ml-training", "llm-finetune-worker-0")


@pytest.fixture
def h100():
    return fixture_store([("http://dcgm:9400/metrics", H100, T0)])


def value(store, metric, obj):
    point = store.point(metric, obj)
    assert point is not None, f"no {metric} for {obj}"
    return point.value


def test_four_gpu_training_pod_means_percent_and_sums_bytes_and_watts(h100):
    # GPUs 2-5 belong to llm-finetune-worker-0.
    assert value(h100, "gpu_utilization", TRAINING) == pytest.approx(100.0)
    # SM_ACTIVE 0.902331, 0.897148, 0.911056, 0.661923 → mean 0.84311450 → 84.31145 %
    assert value(h100, "gpu_sm_active", TRAINING) == pytest.approx(84.31145)
    assert format_quantity(value(h100, "gpu_sm_active", TRAINING)) == "84312m"
    # FB_USED 76210 + 76178 + 76242 + 76190 = 304820 MiB
    assert value(h100, "gpu_memory_used_bytes", TRAINING) == 304820 * 1048576
    # FB_FREE 4812 + 4844 + 4780 + 4832 = 19268 MiB → 304820 / 324088
    assert value(h100, "gpu_memory_utilization", TRAINING) == pytest.approx(100 * 304820 / 324088)
    # POWER 694.118 + 698.702 + 691.305 + 611.274
    assert value(h100, "gpu_power_watts", TRAINING) == pytest.approx(2695.399)
    assert format_quantity(value(h100, "gpu_power_watts", TRAINING)) == "2695399m"


def test_single_gpu_pods_see_their_own_gpu_not_the_exporter(h100):
    assert value(h100, "gpu_utilization", pod("nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh")) == 100
    assert value(h100, "gpu_sm_active", pod("nim", "llama3-8b-instruct-5c6b9d8f47-qz7mh")) == pytest.approx(37.6559)
    assert value(h100, "gpu_utilization", TRITON_POD) == 63
    assert value(h100, "gpu_utilization", pod("ml-batch", "embeddings-batch-28471-8xk2p")) == 27


def test_node_covers_every_gpu_including_the_idle_unlabelled_one(h100):
    # GPU_UTIL 63, 100, 100×4, 0 (idle GPU6, no pod labels), 27 → 590 / 8
    assert value(h100, "gpu_utilization", node(H100_NODE)) == pytest.approx(73.75)
    assert format_quantity(value(h100, "gpu_utilization", node(H100_NODE))) == "73750m"
    # 312.447 + 468.912 + 2695.399 + 68.425 + 187.903
    assert value(h100, "gpu_power_watts", node(H100_NODE)) == pytest.approx(3733.086)


def test_idle_gpu_without_pod_labels_belongs_to_no_pod_or_namespace(h100):
    namespaces = {o.name for o in h100.objects("gpu_utilization", "Namespace")}
    assert namespaces == {"inference", "nim", "ml-training", "ml-batch"}
    pods = h100.objects("gpu_utilization", "Pod")
    assert len(pods) == 4


def test_namespace_aggregates_its_pods(h100):
    assert value(h100, "gpu_memory_used_bytes", namespace("ml-training")) == 304820 * 1048576


def test_mig_power_counts_each_physical_gpu_once():
    store = fixture_store([("http://dcgm-mig:9400/metrics", MIG, T0)])
    # Naive sum over series is 1540.9 W; per physical GPU: 231.806 + 118.342 + 377.015
    assert value(store, "gpu_power_watts", node("ip-10-1-22-14.ec2.internal")) == pytest.approx(727.163)


def test_mig_instances_are_separate_devices():
    store = fixture_store([("http://dcgm-mig:9400/metrics", MIG, T0)])
    # MIG instances report no GPU_UTIL; only GPU2 (MIG disabled) does: its pod gets 96.
    assert value(store, "gpu_utilization", pod("ml-training", "resnet-train-worker-1")) == 96
    assert store.point("gpu_utilization", pod("ml-training", "bert-finetune-0")) is None
    # A pod on one MIG instance sees that instance's memory only.
    used = value(store, "gpu_memory_used_bytes", pod("inference", "triton-tiny-584c7f6d9b-9wz7n"))
    assert 0 < used <= 10 * 1024**3


def test_legacy_exporter_with_empty_pod_labels():
    store = fixture_store([("http://dcgm-legacy:9400/metrics", LEGACY, T0)])
    assert value(store, "gpu_utilization", pod("genai", "sd-xl-api-6d5b8c9f7-pq2vd")) == 88
    assert [o.name for o in store.objects("gpu_utilization", "Pod")] == ["sd-xl-api-6d5b8c9f7-pq2vd"]
    # Hostname is the exporter pod's name here; without the Kubernetes API that is all we know.
    assert store.objects("gpu_utilization", NODE) == [ObjectRef(NODE, "dcgm-exporter-7xk2q")]


def test_legacy_exporter_node_comes_from_the_kubernetes_api_when_known():
    url = "http://10.0.0.9:9400/metrics"
    store = fixture_store(
        [(url, LEGACY, T0)],
        targets={url: Target(url, pod("gpu-operator", "dcgm-exporter-7xk2q"), "gpu-node-3")},
    )
    assert store.objects("gpu_utilization", NODE) == [ObjectRef(NODE, "gpu-node-3")]


@pytest.fixture
def triton():
    url = "http://10.0.0.5:8002/metrics"
    target = Target(url, TRITON_POD, H100_NODE)
    return fixture_store([(url, TRITON_T0, T0), (url, TRITON, T0 + 60)], targets={url: target})


def test_triton_queue_compute_ratio_sums_before_dividing(triton):
    # Δqueue_us: resnet 2441335120-2401735120 = 39.6e6, bert 5871108200-5785008200 = 86.1e6
    # Δcompute_us: resnet 3083791200-3034291200 = 49.5e6, bert 3941246600-3916056200 = 25.1904e6
    ratio = value(triton, "inference_queue_compute_ratio", TRITON_POD)
    assert ratio == pytest.approx(125.7e6 / 74.6904e6)
    assert format_quantity(ratio) == "1683m"
    point = triton.point("inference_queue_compute_ratio", TRITON_POD)
    assert point.window_seconds == pytest.approx(60)


def test_triton_rates_and_queue_time(triton):
    # Δsuccess: resnet 19800 + bert 2460 over 60 s
    assert value(triton, "inference_requests_per_second", TRITON_POD) == pytest.approx(371.0)
    assert value(triton, "inference_queue_time_seconds", TRITON_POD) == pytest.approx(125.7e6 / 22260 / 1e6)


def test_triton_queue_depth_sums_model_level_series(triton):
    # model-level pending: resnet 3 + bert 118 (per-instance series are 0)
    assert value(triton, "inference_queue_depth", TRITON_POD) == 121


def test_per_model_values_through_a_metric_label_selector(triton, catalogue):
    parts = triton.parts("inference_queue_compute_ratio", namespace("inference"))
    chosen = [p for p in parts if LabelSelector.parse("model=bert_qa_onnx").matches(dict(p.labels))]
    point = finish_parts(catalogue.get("inference_queue_compute_ratio"), chosen)
    assert point.value == pytest.approx(86.1e6 / 25.1904e6)  # the fixture README's 3.42
    chosen = [p for p in parts if LabelSelector.parse("model=resnet50_trt").matches(dict(p.labels))]
    assert finish_parts(catalogue.get("inference_queue_compute_ratio"), chosen).value == pytest.approx(0.8)


def test_rates_need_two_scrapes():
    url = "http://10.0.0.5:8002/metrics"
    store = fixture_store([(url, TRITON, T0)], targets={url: Target(url, TRITON_POD)})
    assert store.point("inference_requests_per_second", TRITON_POD) is None
    assert value(store, "inference_queue_depth", TRITON_POD) == 121  # gauges need only one


def test_counter_reset_counts_from_zero():
    url = "http://10.0.0.5:8002/metrics"
    # t0 → t (+60 s) → t0's values again (+120 s): the counters dropped, so Triton restarted and the
    # increase over the last 60 s window is the new cumulative value itself (never a negative rate).
    store = fixture_store(
        [(url, TRITON_T0, T0), (url, TRITON, T0 + 60), (url, TRITON_T0, T0 + 120)],
        targets={url: Target(url, TRITON_POD)},
    )
    expected = (1265113 + 399657) / 60
    assert value(store, "inference_requests_per_second", TRITON_POD) == pytest.approx(expected)


def test_values_older_than_max_age_are_marked_stale():
    store = fixture_store([("http://dcgm:9400/metrics", H100, T0)], now=T0 + 3600)
    point = store.point("gpu_utilization", TRAINING)
    assert point is not None and point.stale


def test_nan_and_inf_samples_never_become_values():
    from gpuscale.metrics.aggregation import build_snapshot
    from gpuscale.metrics.attribution import Attributor
    from gpuscale.metrics.catalogue import load_catalogue
    from gpuscale.metrics.exposition import parse_samples
    from gpuscale.metrics.store import MetricsStore
    from gpuscale.sources.scrape import ScrapeSource

    catalogue = load_catalogue()
    source = ScrapeSource([], series=catalogue.series_names, windowed_series=catalogue.windowed_series)
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-a",Hostname="n1",namespace="ns",pod="p"} NaN\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-b",Hostname="n1",namespace="ns",pod="q"} +Inf\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="2",UUID="GPU-c",Hostname="n1",namespace="ns",pod="q"} 40\n'
    )
    source.ingest("http://n1:9400/metrics", parse_samples(text), timestamp=T0)
    store = MetricsStore()
    store.update(build_snapshot(catalogue, source.read, Attributor(Target), now=T0))
    assert store.point("gpu_utilization", pod("ns", "p")) is None
    # q's +Inf GPU is left out: the mean is over the one GPU with a real number, not Inf and not 20.
    assert value(store, "gpu_utilization", pod("ns", "q")) == 40
    assert value(store, "gpu_utilization", node("n1")) == 40


def test_mig_power_counts_a_gpu_once_even_when_one_instance_lacks_the_value(tmp_path, catalogue):
    # Drop GPU0 / GPU_I_ID=2's power line: instances 3, 9 and 10 still repeat the parent's 231.806 W,
    # so the node total must not lose GPU0 (the representative is chosen among devices with a value).
    lines = [
        line
        for line in MIG.read_text().splitlines()
        if not (line.startswith("DCGM_FI_DEV_POWER_USAGE{") and 'gpu="0"' in line and 'GPU_I_ID="2"' in line)
    ]
    path = tmp_path / "mig.prom"
    path.write_text("\n".join(lines) + "\n")
    store = fixture_store([("http://dcgm-mig:9400/metrics", path, T0)])
    mig_node = node("ip-10-1-22-14.ec2.internal")
    assert value(store, "gpu_power_watts", mig_node) == pytest.approx(727.163)
    merged = finish_parts(catalogue.get("gpu_power_watts"), store.parts("gpu_power_watts", mig_node))
    assert merged.value == pytest.approx(727.163)
