"""build_snapshot's column-wise path against the per-object Partial path, on random clusters.

Each object's value is computed twice: once by build_snapshot (numpy over all devices at once, what a
refresh serves) and once by merging that object's device partials one by one with ``finish_parts`` (the
plain-Python path metric label selectors use). Random clusters mix MIG instances with differing power,
NaN/Inf samples, stale samples, GPUs without pods and Triton series, so a mismatch in device numbering,
membership, deduplication or staleness between the two paths shows up as a differing value.
"""

from __future__ import annotations

import math
import random

import pytest

from gpuscale.config import read_yaml
from gpuscale.metrics.aggregation import build_snapshot, finish_parts
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import DEFAULT_CATALOGUE_PATH, parse_catalogue
from gpuscale.model import pod
from gpuscale.sources.base import SeriesValue, TermQuery

NOW = 1_790_000_000.0
DCGM = (
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_POWER_USAGE",
)
TRITON = (
    "nv_inference_pending_request_count",
    "nv_inference_request_success",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_infer_duration_us",
)


@pytest.fixture(scope="module")
def catalogue():
    data = read_yaml(DEFAULT_CATALOGUE_PATH)
    # The built-in catalogue has no `max` metric; one more makes the test cover that aggregate too.
    data["metrics"].append(
        {"name": "gpu_utilization_max", "help": "x", "unit": "percent", "aggregate": "max",
         "series": ["DCGM_FI_DEV_GPU_UTIL"]}
    )  # fmt: skip
    return parse_catalogue(data)


def sample(rng: random.Random) -> tuple[float, float]:
    """A value and its time: mostly fresh and finite, sometimes NaN, Inf or older than any max-age."""
    r = rng.random()
    value = math.nan if r < 0.05 else math.inf if r < 0.08 else rng.uniform(0, 1000)
    return value, NOW - (10_000 if rng.random() < 0.1 else rng.uniform(0, 5))


def cluster(seed: int) -> tuple[dict[str, list[SeriesValue]], dict[str, Target]]:
    """Series by name, and the Triton targets' pods."""
    rng = random.Random(seed)
    by_name: dict[str, list[SeriesValue]] = {name: [] for name in DCGM + TRITON}
    for n in range(rng.randint(1, 6)):
        url = f"http://10.0.0.{n}:9400/metrics"
        for g in range(4):
            instances = [str(i) for i in range(rng.randint(1, 3))] if rng.random() < 0.3 else [None]
            # MIG instances repeat their GPU's power, each possibly stale or NaN on its own.
            power = sample(rng)
            for instance in instances:
                labels = {"gpu": str(g), "UUID": f"GPU-{n}-{g}", "Hostname": f"node-{n}"}
                if instance is not None:
                    labels["GPU_I_ID"] = instance
                if rng.random() < 0.8:  # else an idle GPU: no pod labels, it counts for its node only
                    labels |= {"pod": f"pod-{rng.randint(0, 7)}", "namespace": f"ns-{rng.randint(0, 2)}"}
                for name in DCGM:
                    if rng.random() < 0.9:  # a field can be missing for a device
                        value, ts = sample(rng)
                        if name == "DCGM_FI_DEV_POWER_USAGE":
                            value, ts = rng.choice([power, power, (power[0], NOW - 10_000), (math.nan, power[1])])
                        by_name[name].append(SeriesValue(name, labels, value, ts, url))
    targets = {}
    for p in range(rng.randint(0, 4)):
        url = f"http://10.1.0.{p}:8002/metrics"
        targets[url] = Target(url, pod(f"ns-{p % 3}", f"pod-{p}"))
        for model in ("bert", "resnet")[: rng.randint(1, 2)]:
            for name in TRITON:
                value, ts = sample(rng)
                window = None if name == "nv_inference_pending_request_count" else 60.0
                by_name[name].append(SeriesValue(name, {"model": model, "version": "1"}, value, ts, url, window))
    return by_name, targets


def same(served, merged) -> bool:
    if served is None or merged is None:
        return served is merged
    if served.stale or merged.stale:
        return served.stale == merged.stale and served.timestamp == merged.timestamp
    return (
        served.value == pytest.approx(merged.value, rel=1e-12)
        and served.timestamp == merged.timestamp
        and served.window_seconds == merged.window_seconds
    )


@pytest.mark.parametrize("seed", range(40))
def test_every_served_value_equals_merging_the_objects_device_partials(catalogue, seed):
    by_name, targets = cluster(seed)

    def read(query: TermQuery) -> list[SeriesValue]:
        return [v for name in query.series for v in by_name.get(name, [])]

    snapshot = build_snapshot(
        catalogue, read, Attributor(lambda url: targets.get(url, Target(url))), now=NOW
    )  # fmt: skip
    assert snapshot.members, "the random cluster must place some devices"
    for metric in catalogue:
        served = snapshot.values[metric.name]
        for obj in snapshot.members:
            merged = finish_parts(metric, snapshot.parts(metric.name, obj))
            assert same(served.get(obj), merged), (metric.name, obj, served.get(obj), merged)
        assert set(served) <= set(snapshot.members)


def test_the_random_clusters_exercise_every_case(catalogue):
    """Guards the test above: its clusters do contain MIG, stale, non-finite and pod-less devices."""
    seen = {"mig": False, "stale": False, "nan": False, "no pod": False, "stale marker": False}
    for seed in range(40):
        by_name, targets = cluster(seed)
        values = [v for vs in by_name.values() for v in vs]
        seen["mig"] |= any("GPU_I_ID" in v.labels for v in values)
        seen["stale"] |= any(v.timestamp < NOW - 3600 for v in values)
        seen["nan"] |= any(not math.isfinite(v.value) for v in values)
        seen["no pod"] |= any(v.name.startswith("DCGM") and "pod" not in v.labels for v in values)
        snapshot = build_snapshot(
            catalogue,
            lambda q, by_name=by_name: [v for n in q.series for v in by_name.get(n, [])],
            Attributor(lambda url, targets=targets: targets.get(url, Target(url))),
            now=NOW,
        )
        seen["stale marker"] |= any(p.stale for points in snapshot.values.values() for p in points.values())
    assert all(seen.values()), seen


@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan])
def test_a_non_finite_sample_is_left_out_not_summed(catalogue, bad):
    url = "http://10.0.0.1:9400/metrics"
    trainer = {"pod": "trainer", "namespace": "ml", "Hostname": "node-1"}
    series = [
        SeriesValue("DCGM_FI_DEV_POWER_USAGE", {"UUID": "GPU-0", **trainer}, 300.0, NOW, url),
        SeriesValue("DCGM_FI_DEV_POWER_USAGE", {"UUID": "GPU-1", **trainer}, bad, NOW, url),
    ]
    snapshot = build_snapshot(
        catalogue, lambda q: [v for v in series if v.name in q.series], Attributor(Target), now=NOW
    )  # fmt: skip
    assert snapshot.values["gpu_power_watts"][pod("ml", "trainer")].value == 300.0
    # The GPU with only a non-finite sample is no device at all: it places nothing anywhere.
    assert [len(devices) for devices in snapshot.members.values()] == [1, 1, 1]


@pytest.mark.parametrize("seed", range(10))
def test_values_do_not_depend_on_the_order_series_arrive_in(catalogue, seed):
    by_name, targets = cluster(seed)
    shuffled = {name: random.Random(seed).sample(values, len(values)) for name, values in by_name.items()}
    snapshots = [
        build_snapshot(
            catalogue,
            lambda q, series=series: [v for n in q.series for v in series.get(n, [])],
            Attributor(lambda url: targets.get(url, Target(url))),
            now=NOW,
        )
        for series in (by_name, shuffled)
    ]
    for metric in catalogue:
        first, second = (s.values[metric.name] for s in snapshots)
        assert first.keys() == second.keys()
        for obj, point in first.items():
            assert same(point, second[obj]), (metric.name, obj)
