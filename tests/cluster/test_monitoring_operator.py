"""deploy/monitoring and the chart's monitoring objects, through the real prometheus-operator and Prometheus 3.

The objects are applied to the real API server with the operator's CRDs; the operator turns them into a Prometheus
configuration and rule files; Prometheus 3 runs that configuration (tests/cluster/operator_stack.py) against a real
adapter and controller and a dcgm-exporter serving every field deploy/dcgm-exporter enables. Asserted: the adapter
and controller are scraped (up) through the ServiceMonitor and PodMonitors of both sets, the PrometheusRules are
loaded whole, every rule evaluates without an error over several evaluations with the exporter's data in, and
GPUNVLinkErrors fires when two of a GPU's NVLink error counters grow.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from tests.cluster.metrics_stack import until
from tests.cluster.operator_stack import CHART_NS, GPUS

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
NAMESPACES = ("gpuscale", CHART_NS)
RULES = [
    r
    for f in sorted((REPO / "deploy/alerts").glob("*.rules.yaml"))
    for g in yaml.safe_load(f.read_text())["groups"]
    for r in g["rules"]
]


def _pools(kind: str, name: str) -> set[str]:
    return {f"{kind}/{ns}/{name}/0" for ns in NAMESPACES}


ADAPTER_POOLS = _pools("serviceMonitor", "gpuscale-adapter")
CONTROLLER_POOLS = _pools("podMonitor", "gpuscale-controller")
EXPORTER_POOLS = _pools("podMonitor", "dcgm-exporter")


def _up(stack, pools: set[str], address: str) -> dict[str, dict] | bool:
    """The targets at ``address`` of every pool, once each is up; else False."""
    targets = stack.api("/api/v1/targets", state="active")["activeTargets"]
    ours = {t["scrapePool"]: t for t in targets if t["scrapePool"] in pools and t["labels"]["instance"] == address}
    return ours if len(ours) == len(pools) and all(t["health"] == "up" for t in ours.values()) else False


def _samples(text: str, name: str) -> list[tuple[str, float]]:
    return [(m.group(1) or "", float(m.group(2))) for m in re.finditer(rf"^{name}(\{{.*\}})? (\S+)$", text, re.M)]


def test_the_operator_generates_a_job_per_monitor_for_prometheus_3(operator_stack):
    jobs = {job["job_name"] for job in operator_stack.config["scrape_configs"]}
    assert jobs >= ADAPTER_POOLS | CONTROLLER_POOLS | EXPORTER_POOLS, sorted(jobs)
    roles = {
        job["job_name"].split("/")[0]: {sd["role"] for sd in job["kubernetes_sd_configs"]}
        for job in operator_stack.config["scrape_configs"]
    }
    # NB: endpointslice as the Prometheus asks (serviceDiscoveryRole) only where the API server says it is 1.21 or
    # newer; the unstamped kube-apiserver built here says v0.0.0-master, so the operator falls back to endpoints.
    assert roles["podMonitor"] == {"pod"} and roles["serviceMonitor"] in ({"endpoints"}, {"endpointslice"}), roles
    print("service discovery roles:", roles)
    print("operator stack timings:", {k: round(v, 1) for k, v in operator_stack.timings.items()})


def test_every_rule_is_loaded_and_evaluates_without_failure(operator_stack):
    groups = operator_stack.api("/api/v1/rules")["groups"]
    loaded = [r["name"] for g in groups for r in g["rules"]]
    expected = sorted(r.get("alert") or r["record"] for r in RULES)
    for ns in NAMESPACES:
        ours = sorted(r["name"] for g in groups if f"/{ns}-gpuscale-" in g["file"] for r in g["rules"])
        assert ours == expected, f"rules of the PrometheusRules in {ns}"
    assert len(loaded) == 2 * len(RULES)
    # Every rule evaluated at least twice with the exporter's series in: the data first, then two more rounds.
    until(lambda: _up(operator_stack, EXPORTER_POOLS, operator_stack.exporter.url.split("/")[2]), timeout=75,
          what="dcgm-exporter up through both PodMonitors")  # fmt: skip
    before = dict(_samples(operator_stack.self_metrics(), "prometheus_rule_group_iterations_total"))
    assert len(before) == len(groups), before

    def two_more_rounds() -> bool:
        now = dict(_samples(operator_stack.self_metrics(), "prometheus_rule_group_iterations_total"))
        return all(now.get(group, 0) >= count + 2 for group, count in before.items())

    until(two_more_rounds, timeout=30, what="two more evaluations of every rule group")
    metrics = operator_stack.self_metrics()
    failures = _samples(metrics, "prometheus_rule_evaluation_failures_total")
    evaluations = sum(v for _, v in _samples(metrics, "prometheus_rule_evaluations_total"))
    print(f"rule evaluations {evaluations:.0f}, failures {sum(v for _, v in failures):.0f} over {len(groups)} groups")
    assert len(failures) == len(groups) and sum(v for _, v in failures) == 0, [f for f in failures if f[1]]
    rules = [(g["file"], r) for g in operator_stack.api("/api/v1/rules")["groups"] for r in g["rules"]]
    bad = [(file, r["name"], r.get("lastError")) for file, r in rules if r["health"] != "ok"]
    assert not bad, bad


def test_gpunvlinkerrors_fires_when_two_counters_of_a_gpu_grow(operator_stack):
    until(lambda: _up(operator_stack, EXPORTER_POOLS, operator_stack.exporter.url.split("/")[2]), timeout=75,
          what="dcgm-exporter up through both PodMonitors")  # fmt: skip
    sick, healthy = list(GPUS)
    exporter = operator_stack.exporter
    # A scrape at zero has to be in before the errors: then increase() sees them appear.
    scraped_zero = f'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{UUID="{sick}"}} == 0'
    until(lambda: operator_stack.api("/api/v1/query", query=scraped_zero)["result"], timeout=30, what="a scrape at 0")
    exporter.values[("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", sick)] = 5
    exporter.values[("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", sick)] = 3
    started = time.monotonic()

    def firing() -> dict[str, dict] | bool:
        """GPUNVLinkErrors of each rule file (deploy/monitoring's and the chart's), once both fire."""
        groups = operator_stack.api("/api/v1/rules", type="alert")["groups"]
        rules = {g["file"]: r for g in groups for r in g["rules"] if r["name"] == "GPUNVLinkErrors"}
        return rules if len(rules) == 2 and all(r["state"] == "firing" for r in rules.values()) else False

    rules = until(firing, timeout=30, what="GPUNVLinkErrors firing from both PrometheusRules")
    print(f"GPUNVLinkErrors firing {time.monotonic() - started:.1f} s after the counters grew")
    assert isinstance(rules, dict)
    alerts = [a for r in rules.values() for a in r["alerts"]]
    assert {a["labels"]["UUID"] for a in alerts} == {sick}, alerts
    # Both counters summed: 8 errors (increase() extrapolates a little past the last scrape, never below).
    assert all(float(a["value"]) >= 8 for a in alerts), [a["value"] for a in alerts]
    assert all(a["labels"]["pod"] == GPUS[sick]["pod"] for a in alerts), alerts
    failures = _samples(operator_stack.self_metrics(), "prometheus_rule_evaluation_failures_total")
    assert sum(v for _, v in failures) == 0, [f for f in failures if f[1]]
    assert healthy not in json.dumps(alerts)


def test_the_idle_gpus_panel_says_0_when_the_controller_reports_none(operator_stack):
    chart_pool = {f"podMonitor/{CHART_NS}/gpuscale-controller/0"}  # scraped every 2 s
    until(lambda: _up(operator_stack, chart_pool, operator_stack.controller), timeout=30, what="controller up")
    board = json.loads((REPO / "deploy/dashboards/cost.json").read_text())
    (panel,) = [p for p in board["panels"] if p["title"] == "Idle GPUs (controller)"]
    expr = panel["targets"][0]["expr"].replace("$cluster", ".*")
    # The controller has no idle GPU here, so its gauge has no series: the bare sum would be "No data".
    assert not operator_stack.api("/api/v1/query", query="gpuscale_controller_idle_gpus")["result"]
    result = operator_stack.api("/api/v1/query", query=expr)["result"]
    assert [float(r["value"][1]) for r in result] == [0.0], result


def test_adapter_and_controller_are_scraped_through_the_servicemonitor_and_podmonitors(operator_stack):
    started = time.monotonic()
    # NB: deploy/monitoring scrapes every 30 s; the first scrape of a target falls anywhere in its first interval
    # (this test comes last, so the other tests' time counts towards that wait).
    adapter = until(lambda: _up(operator_stack, ADAPTER_POOLS, operator_stack.adapter), timeout=75,
                    what=f"the adapter up in {sorted(ADAPTER_POOLS)}")  # fmt: skip
    controller = until(lambda: _up(operator_stack, CONTROLLER_POOLS, operator_stack.controller), timeout=75,
                       what=f"the controller up in {sorted(CONTROLLER_POOLS)}")  # fmt: skip
    print(f"adapter and controller up through both sets of monitors after {time.monotonic() - started:.1f} s")
    assert isinstance(adapter, dict) and isinstance(controller, dict)
    for target in adapter.values():
        # Over HTTPS with the CA from Secret gpuscale-ca and Prometheus' ServiceAccount token, authorized by the
        # adapter (get /metrics); the relabeling names the replica the alerts talk about.
        assert target["scrapeUrl"].startswith("https://"), target
        assert target["labels"]["pod"] == "gpuscale-adapter-0", target["labels"]
    scraped = operator_stack.api("/api/v1/query", query="count by (job) (gpuscale_controller_leader)")["result"]
    assert scraped, "no controller series"
    adapter_series = operator_stack.api(
        "/api/v1/query", query='count({__name__=~"gpuscale_.*", pod="gpuscale-adapter-0"})'
    )
    assert adapter_series["result"], "no adapter series"
