"""The general service model against queueing theory, and invariants over random traces.

With Poisson arrivals at a fixed replica count (minReplicas = maxReplicas) the replay is an M/G/k queue, so
its mean queue wait must match the closed forms: Erlang C for exponential service on c replicas (M/M/c) and
Pollaczek–Khinchine for deterministic service on one replica (M/D/1), within 10 % at utilisations 0.5, 0.8
and 0.9. 100,000 requests per case (measured errors at the seed used here: docs/simulate.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.distributions import parse_distribution
from gpuscale.replay.general import ServiceProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import Trace

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {{name: hpa}}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: svc}}
  minReplicas: {min}
  maxReplicas: {max}
  metrics:
    - type: Pods
      pods:
        metric: {{name: inference_queue_depth}}
        target: {{type: AverageValue, averageValue: "{target}"}}
"""

CATALOGUE = load_catalogue(None)


def hpa(*, lo: int, hi: int, target: str = "1"):
    return parse_manifests(HPA.format(min=lo, max=hi, target=target), source="hpa.yaml")[0]


def erlang_c_wait(c: int, lam: float, mean_s: float) -> float:
    """Mean queue wait of M/M/c: C(c, a) / (cμ − λ), a = λ/μ."""
    a = lam * mean_s
    top = a**c / math.factorial(c) * c / (c - a)
    return top / (sum(a**i / math.factorial(i) for i in range(c)) + top) / (c / mean_s - lam)


def poisson(lam: float, n: int, *, seed: int) -> Trace:
    arrival = np.cumsum(np.random.default_rng(seed).exponential(1 / lam, n))
    zeros = np.zeros(n, dtype=np.int64)
    return Trace("poisson", arrival - arrival[0], zeros, zeros)


def mean_wait(trace: Trace, *, replicas: int, service: str, concurrency: int = 1) -> float:
    out = replay(
        trace,
        hpa(lo=replicas, hi=replicas),
        catalogue=CATALOGUE,
        profile=ServiceProfile(concurrency=concurrency),
        settings=ReplaySettings(service_time=parse_distribution(service, flag="--service-time"), startup_s=0),
    )
    assert out.requests == {"completed": len(trace), "rejected": 0, "unfinished": 0}
    return out.queue_time_s["mean"]


@pytest.mark.parametrize("rho", [0.5, 0.8, 0.9])
def test_exponential_service_on_c_replicas_waits_as_erlang_c(rho):
    c, mean_s = 4, 0.1
    lam = rho * c / mean_s
    measured = mean_wait(poisson(lam, 100_000, seed=7), replicas=c, service=f"exp:mean={mean_s}s")
    assert measured == pytest.approx(erlang_c_wait(c, lam, mean_s), rel=0.10)


@pytest.mark.parametrize("rho", [0.5, 0.8, 0.9])
def test_deterministic_service_on_one_replica_waits_as_pollaczek_khinchine(rho):
    s = 0.1
    lam = rho / s
    measured = mean_wait(poisson(lam, 100_000, seed=7), replicas=1, service=f"{s}s")
    assert measured == pytest.approx(rho * s / (2 * (1 - rho)), rel=0.10)


def test_concurrency_slots_are_servers_too():
    # one replica serving 4 at once is the same M/M/4 queue as 4 replicas serving one each
    lam, mean_s = 32.0, 0.1
    measured = mean_wait(poisson(lam, 100_000, seed=3), replicas=1, service=f"exp:mean={mean_s}s", concurrency=4)
    assert measured == pytest.approx(erlang_c_wait(4, lam, mean_s), rel=0.10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.sampled_from([0.0, 0.0, 0.01, 0.3, 2.0, 40.0]), min_size=1, max_size=120),
    costs=st.lists(st.sampled_from([0.0, 0.05, 1.0, 7.5, 90.0]), min_size=1, max_size=120),
    concurrency=st.integers(1, 3),
    hi=st.integers(1, 5),
    startup=st.sampled_from(["0s", "20s", "lognormal:p50=10s,p95=45s"]),
)
def test_random_traces_keep_time_and_requests_and_gpu_hours(gaps, costs, concurrency, hi, startup):
    n = len(gaps)
    arrival = np.cumsum(gaps) - gaps[0]
    service = np.resize(np.asarray(costs), n)
    zeros = np.zeros(n, dtype=np.int64)
    trace = Trace("random", arrival, zeros, zeros, service_s=service)
    out = replay(
        trace,
        hpa(lo=1, hi=hi, target="0.5"),
        catalogue=CATALOGUE,
        profile=ServiceProfile(concurrency=concurrency),
        settings=ReplaySettings(startup=parse_distribution(startup, flag="--startup"), max_tail_s=600.0),
    )
    doc = out.to_json()
    for stats in (out.queue_time_s, out.ttft_s):
        assert min(stats.values()) >= 0
    assert sum(out.requests.values()) == n
    assert doc["dropped"] == out.requests["rejected"] + out.requests["unfinished"]
    # GPU-hours are the integral of the pods that hold a GPU: the per-sync timeline's integral agrees to
    # within two sync periods per replica ever started (when it was created and when it went)
    integral_h = sum(s.pods for s in out.timeline) * 15.0 / 3600.0
    started = 1 + sum(max(0, e.to_replicas - e.from_replicas) for e in out.events)
    assert out.gpu_hours == pytest.approx(integral_h, abs=started * 2 * 15.0 / 3600.0 + 1e-9)
