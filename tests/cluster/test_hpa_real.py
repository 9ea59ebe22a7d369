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

import pytest

from gpuscale.hpa import controller as hpa
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from tests.cluster.metrics_stack import CUSTOM, NS, until

pytestmark = pytest.mark.e2e

TARGET = "40"  # gpu_sm_active, percent
HPA_PATH = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"
SCALE = f"/apis/apps/v1/namespaces/{NS}/deployments/llm/scale"


def _hpa(*, min_replicas: int = 1, max_replicas: int, behavior: Mapping) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "parity", "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llm"},
            "minReplicas": min_replicas,
            "maxReplicas": max_replicas,
            "metrics": [
                {
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
]


class _Readings:
    def __init__(self, pods: list[str], value_milli: int) -> None:
        self._values = dict.fromkeys(pods, value_milli)

    def pods(self, metric):
        return self._values

    def object(self, described, metric):
        raise hpa.MetricUnavailable("no object metrics in these cases")

    def external(self, metric):
        raise hpa.MetricUnavailable("no external metrics in these cases")


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


def _metric_settled(rest, replicas: int, value: int) -> bool:
    answer = rest.get(f"{CUSTOM}/v1beta2/namespaces/{NS}/pods/*/gpu_sm_active", labelSelector="app=llm")
    items = answer.body.get("items", []) if answer.ok else []
    return len(items) == replicas and all(i["value"] == str(value) for i in items)


def _quiet_seconds(manifest: dict) -> float:
    """How long without a change ends a run: the longest policy period or window, plus two syncs."""
    rules = manifest["spec"]["behavior"].values()
    longest = max(
        [r.get("stabilizationWindowSeconds", 0) for r in rules]
        + [p["periodSeconds"] for r in rules for p in r.get("policies", [])]
    )
    return max(longest, 1) + 2.0


def real_path(stack, manifest: dict, *, start: int, value_percent: int) -> tuple[list[int], float]:
    """The sizes kube-controller-manager writes for ``manifest``, until none changed for a quiet spell."""
    quiet = _quiet_seconds(manifest)
    rest = stack.plane.rest()
    rest.delete(f"{HPA_PATH}/parity")
    rest.delete(f"{HPA_PATH}/llm")  # the adapter tests' HPA: two HPAs on one target would both stop
    rest.patch(SCALE, {"spec": {"replicas": start}}).expect(200)
    stack.exporter.sm_active = value_percent / 100
    until(
        lambda: _metric_settled(rest, start, value_percent),
        timeout=30,
        what=f"{start} pods reporting gpu_sm_active {value_percent}",
    )
    rest.post(HPA_PATH, manifest).expect(201)
    began = last_change = time.monotonic()
    path = [start]
    try:
        while time.monotonic() - last_change < quiet and time.monotonic() - began < 45:
            replicas = rest.get(SCALE).body["spec"]["replicas"]
            if replicas != path[-1]:
                path.append(replicas)
                last_change = time.monotonic()
            time.sleep(0.1)
    finally:
        rest.delete(f"{HPA_PATH}/parity")
    return path, time.monotonic() - began


@pytest.mark.parametrize(("case", "start", "value", "manifest"), CASES, ids=[c[0] for c in CASES])
def test_gpuscale_hpa_makes_the_real_controllers_decisions(metrics_stack, case, start, value, manifest):
    real, seconds = real_path(metrics_stack, copy.deepcopy(manifest), start=start, value_percent=value)
    ours = gpuscale_path(manifest, start=start, value_percent=value, seconds=seconds)
    assert ours == real, f"{case}: real HPA controller {real}, gpuscale/hpa {ours}"
