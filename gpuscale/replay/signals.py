"""What the adapter would serve about the replayed replicas, refreshed as often as the adapter refreshes.

Every ``refresh_s`` the view takes each pod's exporter readings (gauges now, counters now and one catalogue
window ago) and turns them into the catalogue's values; between refreshes the HPA reads the last ones, so
the emulated HPA sees exactly the adapter's delay. A pod whose model is still loading has a GPU (util 0)
but no inference server yet: it reports GPU metrics and no inference metrics, so the HPA counts it as a pod
with a missing metric, as it would in a cluster.

Object and External metrics aggregate the pods as the catalogue says (sum, mean, or Σ numerator /
Σ denominator for ratios). Values are in the catalogue's units; the HPA gets thousandths.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from gpuscale.errors import ConfigError
from gpuscale.hpa import MetricUnavailable
from gpuscale.hpa.spec import CrossVersionObjectReference, HorizontalPodAutoscaler, MetricIdentifier
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.model import milli_value
from gpuscale.replay.serving import Replica, ServingModel

GPU_METRICS = ("gpu_utilization", "gpu_sm_active", "gpu_tensor_active")
# (numerator, denominator, floor) of the ratio metrics, from the counters' increase over the window
RATIO_METRICS = {
    "inference_queue_time_seconds": ("queue_s", "success", 1.0),
    "inference_queue_compute_ratio": ("queue_s", "compute_s", 1e-6),
}
PRODUCED = (*GPU_METRICS, "inference_queue_depth", "inference_requests_per_second", *RATIO_METRICS)

# A pod's reading of one metric: (value, numerator, denominator); the parts let objects aggregate ratios.
Reading = tuple[float, float, float]


def check_metrics(hpas: list[tuple[str, HorizontalPodAutoscaler]], catalogue: Catalogue) -> None:
    """Every metric the manifests name must be in the catalogue and produced by the serving model."""
    for source, hpa in hpas:
        for i, spec in enumerate(hpa.spec.metrics):
            name = spec.metric_name
            kind = {"Pods": "pods", "Object": "object", "External": "external"}[spec.type]
            where = f"spec.metrics[{i}].{kind}.metric.name"
            if catalogue.get(name) is None:
                known = ", ".join(sorted(m.name for m in catalogue))
                raise ConfigError(f"{where}: {name!r} is not in the metric catalogue (known: {known})", path=source)
            if name not in PRODUCED:
                raise ConfigError(
                    f"{where}: {name!r} is in the catalogue but the replay's serving model does not produce it "
                    f"(it produces: {', '.join(PRODUCED)})",
                    path=source,
                )


class AdapterView:
    """The adapter's last refresh over a ServingModel; implements gpuscale.hpa's ``Readings``."""

    def __init__(self, model: ServingModel, *, catalogue: Catalogue, window_s: float | None = None) -> None:
        self.model = model
        self.catalogue = catalogue
        self.window_s = window_s if window_s is not None else catalogue.defaults.window
        self._history: dict[str, deque[tuple[float, int, float, float]]] = {}
        self.latest: dict[str, dict[str, Reading]] = {}
        self.refreshed_at: float | None = None

    def refresh(self, now: float) -> None:
        latest: dict[str, dict[str, Reading]] = {}
        for r in self.model.replicas:
            if r.gone_at is not None and r.gone_at <= now:
                self._history.pop(r.name, None)
                continue
            latest[r.name] = self._read(r, now)
        self.latest = latest
        self.refreshed_at = now

    def _read(self, r: Replica, now: float) -> dict[str, Reading]:
        util, sm, tensor = self.model.gpu_activity(r)
        values: dict[str, Reading] = {
            "gpu_utilization": (util, util, 1.0),
            "gpu_sm_active": (sm, sm, 1.0),
            "gpu_tensor_active": (tensor, tensor, 1.0),
        }
        if now < r.ready_at:
            return values  # the server is still loading its model: no inference metrics yet
        c = r.counters
        history = self._history.setdefault(r.name, deque())
        history.append((now, c.success, c.queue_s, c.compute_s))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.popleft()
        then = history[0]
        span = max(now - then[0], 1e-9)
        delta = {"success": c.success - then[1], "queue_s": c.queue_s - then[2], "compute_s": c.compute_s - then[3]}
        values["inference_queue_depth"] = (float(len(r.waiting)), float(len(r.waiting)), 1.0)
        rps = delta["success"] / span if span >= 1e-6 else 0.0
        values["inference_requests_per_second"] = (rps, rps, 1.0)
        for name, (num, den, floor) in RATIO_METRICS.items():
            values[name] = (delta[num] / max(delta[den], floor), delta[num], delta[den])
        return values

    # --- gpuscale.hpa.Readings ------------------------------------------------------------------------

    def pods(self, metric: MetricIdentifier) -> Mapping[str, int]:
        # NB: like the adapter, answer only for pods that still exist (the last refresh may predate a deletion)
        live = {r.name for r in self.model.replicas if r.gone_at is None}
        out = {
            pod: milli_value(float(v[metric.name][0]))
            for pod, v in self.latest.items()
            if metric.name in v and pod in live
        }
        if not out:
            raise MetricUnavailable(f"no pod has a value for {metric.name}")
        return out

    def object(self, described: CrossVersionObjectReference, metric: MetricIdentifier) -> int:
        return self._aggregate(metric.name)

    def external(self, metric: MetricIdentifier) -> int:
        return self._aggregate(metric.name)

    def _aggregate(self, name: str) -> int:
        readings = [v[name] for v in self.latest.values() if name in v]
        if not readings:
            raise MetricUnavailable(f"no pod has a value for {name}")
        definition = self.catalogue.get(name)
        aggregate = definition.aggregate if definition is not None else "sum"
        if name in RATIO_METRICS:
            floor = RATIO_METRICS[name][2]
            value = sum(r[1] for r in readings) / max(sum(r[2] for r in readings), floor)
        elif aggregate == "mean":
            value = sum(r[0] for r in readings) / len(readings)
        elif aggregate == "max":
            value = max(r[0] for r in readings)
        else:
            value = sum(r[0] for r in readings)
        return milli_value(float(value))
