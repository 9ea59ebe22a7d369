"""Device readings and pod records on random clusters, each computed two ways that must agree.

``read_devices`` over series as a page is read (field by field, GPUs in order) and over the same series
shuffled: the same readings (values, Xid windows, oldest sample time, placement), since its shortcuts
(label identity, placement memo) must not depend on the order. And the pods view's path
(``pod_statuses_of_readings``) against the general one (``pod_statuses`` over ``gpu_statuses``).

`gpuscale top pods` skips the per-GPU records: a pod of one GPU is diagnosed as that GPU, a pod of several
once on their combined signals. Both paths must give the same records, field for field, for clusters mixing
pods over several GPUs and nodes, MIG instances (power repeated on each), missing fields, NaN values, Xid
windows, throttling masks, idle GPUs and Triton-only pods.
"""

from __future__ import annotations

import math
import random

import pytest

from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.devices import DEVICE_SERIES, gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.metrics.rollups import InferenceStats, pod_statuses, pod_statuses_of_readings
from gpuscale.model import pod
from gpuscale.sources.base import SeriesValue, TermQuery

NOW = 1_790_000_000.0
POLICY = load_policy()
GAUGES = [n for n in DEVICE_SERIES if n != "DCGM_EXP_XID_ERRORS_COUNT"]


def value_of(rng: random.Random, name: str) -> float:
    if rng.random() < 0.03:
        return math.nan
    if "CLOCK" in name and "REASONS" in name:
        return float(rng.choice([0, 0x1, 0x4, 0x8, 0x44, 0x80]))
    if name == "DCGM_FI_DEV_XID_ERRORS":
        return float(rng.choice([0, 0, 0, 13, 79]))
    if name.startswith("DCGM_FI_PROF_"):
        return rng.random()
    return rng.uniform(0, 100) if rng.random() < 0.9 else 0.0


def cluster(seed: int, *, one_time_per_run: bool = False) -> tuple[list[SeriesValue], dict[object, InferenceStats]]:
    rng = random.Random(seed)
    series: list[SeriesValue] = []
    for n in range(rng.randint(1, 4)):
        url = f"http://10.0.0.{n}:9400/metrics"
        for g in range(rng.randint(1, 8)):
            instances = [str(i) for i in range(1, rng.randint(2, 4))] if rng.random() < 0.25 else [None]
            parent_power = rng.uniform(100, 700)
            for instance in instances:
                labels = {"gpu": str(g), "UUID": f"GPU-{n}-{g}", "Hostname": f"node-{n}", "modelName": "H100"}
                if instance is not None:
                    labels |= {"GPU_I_ID": instance, "GPU_I_PROFILE": rng.choice(["1g.10gb", "3g.40gb"])}
                if rng.random() < 0.85:  # else idle: no pod labels
                    labels |= {"pod": f"pod-{rng.randint(0, 5)}", "namespace": f"ns-{rng.randint(0, 1)}"}
                for name in GAUGES:
                    if rng.random() < 0.9:
                        value = parent_power if name == "DCGM_FI_DEV_POWER_USAGE" else value_of(rng, name)
                        at = NOW - n - len(name) % 3 if one_time_per_run else NOW - rng.uniform(0, 5)
                        series.append(SeriesValue(name, labels, value, at, url))
                if rng.random() < 0.5:  # the windowed Xid count: reported empty, or with an Xid
                    xid = rng.choice([None, "13", "79"])
                    xid_labels = labels | ({"xid": xid} if xid else {})
                    count = 0.0 if xid is None else float(rng.randint(1, 3))
                    series.append(SeriesValue("DCGM_EXP_XID_ERRORS_COUNT", xid_labels, count, NOW, url))
    inference = {
        pod(f"ns-{rng.randint(0, 1)}", f"pod-{rng.randint(0, 9)}"): InferenceStats(
            queue_depth=float(rng.randint(0, 9)), sampled_at=NOW - rng.uniform(0, 5)
        )
        for _ in range(rng.randint(0, 4))
    }
    return series, inference


def as_read(series: list[SeriesValue]):
    def read(query: TermQuery) -> list[SeriesValue]:
        return [v for v in series if v.name in query.series]

    return read


def by_device(readings) -> dict[tuple[str, ...], tuple]:
    # NB: not Device.labels: those are the labels of the device's first series, which depends on the order.
    return {
        r.device.key: (r.device.physical, r.device.pod, r.device.node, r.target, r.sampled_at, r.values, r.xid_counts)
        for r in readings
    }


@pytest.mark.parametrize("one_time_per_run", [True, False])
@pytest.mark.parametrize("seed", range(30))
def test_runs_of_series_give_the_readings_series_one_at_a_time_give(seed, one_time_per_run):
    series, _ = cluster(seed, one_time_per_run=one_time_per_run)
    in_runs = sorted(series, key=lambda v: (v.target, v.name))  # a page: field by field, GPUs in order
    shuffled = random.Random(seed).sample(series, len(series))

    def keep(device) -> bool:
        return device.pod is None or device.pod.name != "pod-3"

    for kept in (None, keep):
        fast = read_devices(as_read(in_runs), Attributor(Target), keep=kept)
        plain = read_devices(as_read(shuffled), Attributor(Target), keep=kept)
        assert by_device(fast) == by_device(plain)
        assert fast, "the cluster must have devices"


@pytest.mark.parametrize("seed", range(60))
def test_the_pods_path_equals_pod_statuses_over_gpu_statuses(seed):
    series, inference = cluster(seed)
    rng = random.Random(seed)
    rng.shuffle(series)  # NB: exporters write field by field; the paths must not depend on it

    readings = read_devices(as_read(series), Attributor(Target))
    nodes = {"ns-0/pod-9": "node-x"}

    def node_of(namespace: str, name: str) -> str | None:
        return nodes.get(f"{namespace}/{name}")

    general = pod_statuses(gpu_statuses(readings, POLICY), POLICY, inference=inference, node_of=node_of)
    direct = pod_statuses_of_readings(readings, POLICY, inference=inference, node_of=node_of)
    assert [p.model_dump() for p in direct] == [p.model_dump() for p in general]


def test_the_random_clusters_exercise_every_case():
    """Guards the test above: its pods do span several GPUs, nodes and MIG instances, with Xids and NaNs."""
    seen = {"multi-gpu": False, "multi-node": False, "mig": False, "xid": False, "triton only": False, "nan": False}
    for seed in range(60):
        series, inference = cluster(seed)
        seen["nan"] |= any(math.isnan(v.value) for v in series)
        pods = pod_statuses_of_readings(read_devices(as_read(series), Attributor(Target)), POLICY,
                                        inference=inference)  # fmt: skip
        for p in pods:
            seen["multi-gpu"] |= (p.gpus or 0) > 1
            seen["multi-node"] |= "," in (p.node or "")
            seen["mig"] |= bool(p.signals.mig_profile) and (p.gpus or 0) > 1
            seen["xid"] |= p.verdict.code == "unhealthy"
            seen["triton only"] |= p.gpus == 0 and p.inference is not None
    assert all(seen.values()), seen
