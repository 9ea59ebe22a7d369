"""gpuscale/hpa against the real HPA controller: the same HPA spec and metric values give the same replicas.

Each case runs on the real control plane: the Deployment ``llm`` is set to a starting size, every pod's
``gpu_sm_active`` (served through gpuscale's adapter behind the aggregator) is set to one value, an HPA with the
case's spec is created, and the replica counts kube-controller-manager writes are recorded until they stop
changing. The same spec and value then go through ``gpuscale.hpa.Autoscaler``, one sync per second as the real
controller runs here (--horizontal-pod-autoscaler-sync-period=1s), for as long as the real run lasted. The
*sequence of sizes* is compared, not their times: every case is built so that the path is fixed by the
algorithm (tolerance, policies, selectPolicy, stabilization, min/max), not by when a sync happens to land.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuscale.hpa import controller as hpa
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from tests.cluster.metrics_stack import CUSTOM, EXTERNAL, NS, llm_deployment, until

pytestmark = pytest.mark.e2e

TARGET = "40"  # gpu_sm_active, percent
HPA_PATH = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"


def _hpa(*, min_replicas: int = 1, max_replicas: int, behavior: Mapping, metric: Mapping | None = None) -> dict:
    """The case's HPA; ``real_path`` names it and its Deployment after the case (and the External metric's
    selector after its app). ``metric``: default, gpu_sm_active of the pods (a Pods metric)."""
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "parity", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "parity"},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                metric
                or {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "gpu_sm_active"},
                        "target": {"type": "AverageValue", "averageValue": TARGET},
                    },
                }
            ],
            "behavior": behavior,
        },
    }


def _up(policies: list, select: str = "Max", window: int = 0, **extra) -> dict:
    return {"scaleUp": {"stabilizationWindowSeconds": window, "selectPolicy": select, "policies": policies, **extra}}


def _down(policies: list, select: str = "Max", window: int = 0, **extra) -> dict:
    return {"scaleDown": {"stabilizationWindowSeconds": window, "selectPolicy": select, "policies": policies, **extra}}


# The case's app's queue (NIM num_requests_waiting, the case's value on every pod) summed as one External
# metric with a Value target: what HPAScaleToZero needs, as no pod is left to report a Pods metric at zero
EXTERNAL_QUEUE = {
    "type": "External",
    "external": {
        "metric": {"name": "inference_queue_depth", "selector": {"matchLabels": {"app": "parity"}}},
        "target": {"type": "Value", "value": TARGET},
    },
}


def _pods(n: int, period: int) -> dict:
    return {"type": "Pods", "value": n, "periodSeconds": period}


def _percent(n: int, period: int) -> dict:
    return {"type": "Percent", "value": n, "periodSeconds": period}


# (case, start replicas, gpu_sm_active percent on every pod, HPA manifest)
CASES = [
    ("within-default-tolerance", 1, 43, _hpa(max_replicas=3, behavior=_up([_pods(1, 2)]))),
    ("per-hpa-tolerance-5%", 1, 43, _hpa(max_replicas=3, behavior=_up([_pods(1, 2)], tolerance="0.05"))),
    ("select-min-pods-vs-percent", 1, 400, _hpa(max_replicas=6, behavior=_up([_pods(4, 2), _percent(100, 2)], "Min"))),
    ("select-max-pods-vs-percent", 1, 400, _hpa(max_replicas=6, behavior=_up([_pods(4, 2), _percent(100, 2)], "Max"))),
    ("scale-up-percent-rounds-up", 3, 400, _hpa(max_replicas=6, behavior=_up([_percent(50, 2)]))),
    ("scale-down-percent-truncates", 5, 4, _hpa(max_replicas=6, behavior=_down([_percent(50, 2)], window=2))),
    ("scale-down-disabled", 3, 4, _hpa(max_replicas=6, behavior=_down([_percent(100, 1)], "Disabled"))),
    ("min-replicas-floor", 3, 4, _hpa(min_replicas=2, max_replicas=6, behavior=_down([_pods(5, 1)]))),
    # HPAScaleToZero (beta, on by default in 1.37): idle GPUs take the Deployment to 0, one pod a second
    (
        "scale-to-zero",
        3,
        0,
        _hpa(min_replicas=0, max_replicas=6, behavior=_down([_pods(1, 1)]), metric=EXTERNAL_QUEUE),
    ),
    # ... and a busy app's External metric under minReplicas 0 scales up by its ratio (2 × 100 / 40 × 2 ready)
    (
        "min-zero-external-scale-up",
        2,
        100,
        _hpa(min_replicas=0, max_replicas=6, behavior=_up([_pods(4, 1)]), metric=EXTERNAL_QUEUE),
    ),
]


class _Readings:
    def __init__(self, pods: list[str], value_milli: int) -> None:
        self._values = dict.fromkeys(pods, value_milli)

    def pods(self, metric):
        return self._values

    def object(self, described, metric):
        raise hpa.MetricUnavailable("no object metrics in these cases")

    def external(self, metric):
        # the app's queue summed over its pods, as the adapter serves inference_queue_depth; none without pods
        if not self._values:
            raise hpa.MetricUnavailable("no series match the selector")
        return sum(self._values.values())


def gpuscale_path(manifest: dict, *, start: int, value_percent: int, seconds: float) -> list[int]:
    """The sizes gpuscale/hpa writes, one sync per second, every pod ready and reporting ``value_percent``."""
    autoscaler = hpa.Autoscaler(HorizontalPodAutoscaler.model_validate(manifest))
    current, path = start, [start]
    for tick in range(int(seconds) + 1):
        pods = [f"llm-{i}" for i in range(current)]
        decision = autoscaler.reconcile(
            float(tick),
            spec_replicas=current,
            pods=[hpa.PodInfo(name) for name in pods],
            readings=_Readings(pods, value_percent * 1000),
        )
        if decision.desired_replicas != current:
            current = decision.desired_replicas
            path.append(current)
    return path


def _metric_settled(rest, app: str, replicas: int, value: int) -> bool:
    answer = rest.get(f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_sm_active", labelSelector=f"app={app}")
    items = answer.body.get("items", []) if answer.ok else []
    return len(items) == replicas and all(i["value"] == str(value) for i in items)


def _external_settled(rest, app: str, replicas: int, value: int) -> bool:
    answer = rest.get(f"{EXTERNAL}/v1beta1/namespaces/{NS}/inference_queue_depth", labelSelector=f"app={app}")
    items = answer.body.get("items", []) if answer.ok else []
    return replicas == 0 or (len(items) == 1 and items[0]["value"] == str(value * replicas))


def _quiet_seconds(manifest: dict) -> float:
    """How long without a change ends a run: the longest policy period or window, plus two syncs."""
    rules = manifest["spec"]["behavior"].values()
    longest = max(
        [r.get("stabilizationWindowSeconds", 0) for r in rules]
        + [p["periodSeconds"] for r in rules for p in r.get("policies", [])]
    )
    return max(longest, 1) + 2.0


CONDITIONS: dict[str, list[str]] = {}
"""The real HPA's status conditions at the end of each case, shown when a case differs."""


def real_path(stack, case: str, manifest: dict, *, start: int, value_percent: int) -> tuple[list[int], float]:
    """The sizes kube-controller-manager writes for ``manifest`` on a Deployment of the case's own, until none
    changed for a quiet spell (the cases run side by side, each on its own Deployment and HPA)."""
    quiet = _quiet_seconds(manifest)
    rest = stack.plane.rest()
    app = f"parity-{case}".replace("%", "pct")
    deployment = llm_deployment()
    deployment["metadata"]["name"] = app
    deployment["spec"].update(replicas=start, selector={"matchLabels": {"app": app}})
    deployment["spec"]["template"]["metadata"]["labels"] = {"app": app}  # NB: keeps the scrape annotation
    manifest = copy.deepcopy(manifest)
    manifest["metadata"]["name"] = app
    manifest["spec"]["scaleTargetRef"]["name"] = app
    for metric in manifest["spec"]["metrics"]:
        if metric["type"] == "External":
            metric["external"]["metric"]["selector"]["matchLabels"]["app"] = app
    stack.exporter.sm_active_of[app] = value_percent / 100
    stack.nim.waiting_of[app] = value_percent
    rest.post(f"/apis/apps/v1/namespaces/{NS}/deployments", deployment).expect(201)
    scale = f"/apis/apps/v1/namespaces/{NS}/deployments/{app}/scale"
    try:
        until(
            lambda: _metric_settled(rest, app, start, value_percent),
            timeout=40,
            what=f"{case}: {start} pods reporting gpu_sm_active {value_percent}",
        )
        if any(m["type"] == "External" for m in manifest["spec"]["metrics"]):
            until(
                lambda: _external_settled(rest, app, start, value_percent),
                timeout=40,
                what=f"{case}: the app's queue through external.metrics is {value_percent} × {start}",
            )
        rest.post(HPA_PATH, manifest).expect(201)
        began = last_change = time.monotonic()
        path = [start]
        while time.monotonic() - last_change < quiet and time.monotonic() - began < 45:
            replicas = rest.get(scale).body["spec"].get("replicas", 0)  # NB: omitted at 0
            if replicas != path[-1]:
                path.append(replicas)
                last_change = time.monotonic()
            time.sleep(0.2)
        status = rest.get(f"{HPA_PATH}/{app}").body.get("status", {})
        CONDITIONS[case] = [
            f"{c['type']}={c['status']} {c.get('reason')}: {c.get('message')}" for c in status.get("conditions", [])
        ]
        return path, time.monotonic() - began
    finally:
        rest.delete(f"{HPA_PATH}/{app}")
        rest.delete(
            f"/apis/apps/v1/namespaces/{NS}/deployments/{app}",
            {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"},
        )


def test_gpuscale_hpa_makes_the_real_controllers_decisions(metrics_stack):
    """Every case side by side (each on its own Deployment and HPA), then each compared with gpuscale/hpa."""

    def run(case: str, start: int, value: int, manifest: dict) -> tuple[str, list[int], list[int]]:
        real, seconds = real_path(metrics_stack, case, manifest, start=start, value_percent=value)
        return case, real, gpuscale_path(manifest, start=start, value_percent=value, seconds=seconds)

    with ThreadPoolExecutor(len(CASES)) as pool:
        results = list(pool.map(lambda c: run(*c), CASES))
    differences = [
        f"{case}: real HPA controller {real}, gpuscale/hpa {ours} (real HPA's conditions: {CONDITIONS.get(case)})"
        for case, real, ours in results
        if real != ours
    ]
    assert not differences, "\n".join(differences)
    # The cases tell the rules apart: no two share a path, so a rule ignored on both sides would still show.
    assert len({tuple(real) for _, real, _ in results}) == len(CASES), results
