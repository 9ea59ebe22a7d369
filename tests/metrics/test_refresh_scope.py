"""Demand-driven refresh, the pure part: what an HPA references, what stays warm, what a refresh fetches.

The I/O around it is tested elsewhere: the PromQL a namespace scope becomes (tests/sources/test_prometheus.py),
and the whole loop — an HPA created on the real control plane, a real Prometheus answering — in
tests/cluster/test_demand_real.py.
"""

from __future__ import annotations

import pytest

from gpuscale.metrics.aggregation import term_query
from gpuscale.metrics.refresh_scope import RefreshScope, references


def hpa(namespace: str, *metrics: dict) -> dict:
    return {"metadata": {"namespace": namespace, "name": "h"}, "spec": {"metrics": list(metrics)}}


PODS = {"type": "Pods", "pods": {"metric": {"name": "gpu_utilization"}, "target": {"type": "AverageValue"}}}
OBJECT = {
    "type": "Object",
    "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "metric": {"name": "inference_queue_depth"},
    },
}
NODE_OBJECT = {
    "type": "Object",
    "object": {
        "describedObject": {"apiVersion": "v1", "kind": "Node", "name": "n1"},
        "metric": {"name": "gpu_power_watts"},
    },
}
EXTERNAL = {"type": "External", "external": {"metric": {"name": "gpu_sm_active", "selector": {"matchLabels": {}}}}}
RESOURCE = {"type": "Resource", "resource": {"name": "cpu", "target": {"type": "Utilization"}}}


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        ([PODS], [("gpu_utilization", "ml")]),
        ([OBJECT], [("inference_queue_depth", "ml")]),
        ([NODE_OBJECT], [("gpu_power_watts", None)]),  # a node aggregates every namespace's GPUs
        ([EXTERNAL], [("gpu_sm_active", "ml")]),
        ([RESOURCE], []),  # metrics-server's, not ours
        ([PODS, RESOURCE, EXTERNAL], [("gpu_utilization", "ml"), ("gpu_sm_active", "ml")]),
        ([{"type": "Pods", "pods": {}}, {"type": "Pods"}, "junk"], []),  # malformed entries are skipped
    ],
)
def test_what_an_hpa_references(metrics, expected):
    assert references(hpa("ml", *metrics)) == expected


def test_referenced_scopes_are_fetched_and_others_are_not(catalogue):
    demand = RefreshScope(catalogue, keep_warm_seconds=60)
    demand.set_referenced([("gpu_utilization", "ml"), ("not_ours", "ml")], now=0)
    terms = demand.begin(now=0)
    util = catalogue.get("gpu_utilization")
    assert terms == {term_query(util.terms[0], window_seconds=catalogue.window(util)): frozenset({"ml"})}
    assert not demand.covers("gpu_utilization", "ml")  # NB: not until the refresh is in the store
    demand.completed()
    assert demand.covers("gpu_utilization", "ml")
    assert not demand.covers("gpu_utilization", "other")
    assert not demand.covers("gpu_utilization", None)  # the fleet-wide aggregate needs every namespace
    assert not demand.covers("gpu_sm_active", "ml")


def test_a_request_makes_its_scope_warm_until_keep_warm_passes(catalogue):
    demand = RefreshScope(catalogue, keep_warm_seconds=60)
    demand.begin(now=0)
    demand.completed()
    assert demand.note_request("gpu_sm_active", "web", now=10) is False  # not fetched: wait for a refresh
    demand.begin(now=11)
    demand.completed()
    assert demand.note_request("gpu_sm_active", "web", now=12) is True
    assert ("gpu_sm_active", "web") in demand.wanted(now=72)  # 60 s after the last request
    assert ("gpu_sm_active", "web") not in demand.wanted(now=73)
    demand.begin(now=73)
    demand.completed()
    assert not demand.covers("gpu_sm_active", "web")


def test_an_unknown_metric_never_waits(catalogue):
    demand = RefreshScope(catalogue)
    assert demand.note_request("no_such_metric", "ml", now=0) is True
    assert demand.wanted(now=0) == frozenset()


def test_a_scope_no_longer_referenced_stays_warm(catalogue):
    demand = RefreshScope(catalogue, keep_warm_seconds=30)
    demand.set_referenced([("gpu_utilization", "ml")], now=0)
    demand.set_referenced([], now=100)  # the HPA was deleted
    assert demand.wanted(now=130) == {("gpu_utilization", "ml")}
    assert demand.wanted(now=131) == frozenset()


def test_namespaces_of_one_term_are_merged_and_every_namespace_wins(catalogue):
    demand = RefreshScope(catalogue)
    util = catalogue.get("gpu_utilization")
    query = term_query(util.terms[0], window_seconds=catalogue.window(util))
    assert demand.terms([("gpu_utilization", "a"), ("gpu_utilization", "b")]) == {query: frozenset({"a", "b"})}
    assert demand.terms([("gpu_utilization", "a"), ("gpu_utilization", None)]) == {query: None}
    assert demand.terms([("gpu_utilization", None), ("gpu_utilization", "a")]) == {query: None}


def test_a_fleet_wide_fetch_covers_every_namespace(catalogue):
    demand = RefreshScope(catalogue)
    demand.begin_all()
    demand.completed()
    assert demand.covers("gpu_utilization", "anything") and demand.covers("gpu_utilization", None)


def test_ratio_metrics_fetch_both_terms(catalogue):
    ratio = next(m for m in catalogue if m.terms[1] is not None)
    terms = RefreshScope(catalogue).terms([(ratio.name, "ml")])
    assert len(terms) == len({term_query(t, window_seconds=catalogue.window(ratio)) for t in ratio.terms})
    assert set(terms.values()) == {frozenset({"ml"})}


RATE = "inference_requests_per_second"
FORECASTS = dict.fromkeys(
    ("forecast_requests_per_second", "forecast_desired_replicas", "workload_requests_per_second"), RATE
)
FORECAST_OBJECT = {
    "type": "Object",
    "object": {
        "describedObject": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
        "metric": {"name": "forecast_desired_replicas"},
        "target": {"type": "AverageValue", "averageValue": "1"},
    },
}


def test_a_forecast_an_hpa_names_fetches_its_rate_in_that_namespace_only(catalogue):
    demand = RefreshScope(catalogue, derived=FORECASTS)
    demand.set_referenced(references(hpa("serving", PODS, FORECAST_OBJECT)), now=0)
    assert demand.wanted(now=0) == {("gpu_utilization", "serving"), (RATE, "serving")}
    demand.begin(now=0)
    assert demand.fetching(RATE) == {"serving"}  # what the forecasts update this refresh
    assert demand.fetching("gpu_sm_active") == frozenset()
    demand.completed()
    assert demand.covers(RATE, "serving") and not demand.covers(RATE, "batch")
    demand.begin_all()  # no HPA list: every namespace
    assert demand.fetching(RATE) is None


def test_without_derived_metrics_a_forecast_reference_fetches_nothing(catalogue):
    demand = RefreshScope(catalogue)  # forecasts off
    demand.set_referenced(references(hpa("serving", FORECAST_OBJECT)), now=0)
    assert demand.wanted(now=0) == frozenset()


def test_a_forecast_request_warms_its_rate_and_never_waits(catalogue):
    """One refresh cannot give a forecast 10 minutes of history: the request is answered at once (absent, saying
    why), and the rate is fetched in its namespace from the next refresh on, kept warm like any request's."""
    demand = RefreshScope(catalogue, keep_warm_seconds=60, derived=FORECASTS)
    demand.begin(now=0)
    demand.completed()
    assert demand.note_request("forecast_requests_per_second", "web", now=10) is True  # does not wait
    assert demand.wanted(now=11) == {(RATE, "web")}
    demand.begin(now=11)
    demand.completed()
    assert demand.note_request("workload_requests_per_second", "web", now=50) is True
    assert (RATE, "web") in demand.wanted(now=110) and (RATE, "web") not in demand.wanted(now=111)
    assert demand.note_request(RATE, "other", now=0) is False  # the rate itself: waits, as any catalogue metric


def test_a_derived_metric_must_read_a_catalogue_metric(catalogue):
    with pytest.raises(ValueError, match="derived metrics read no_such_rate, which the catalogue does not have"):
        RefreshScope(catalogue, derived={"forecast_requests_per_second": "no_such_rate"})
