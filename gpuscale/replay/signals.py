"""What the adapter would serve about the replayed replicas, refreshed as often as the adapter refreshes.

Every ``refresh_s`` the view takes each pod's exporter readings (gauges now, counters now and one catalogue
window ago) and turns them into the catalogue's values; between refreshes the HPA reads the last ones, so
the emulated HPA sees exactly the adapter's delay. A pod whose model is still loading has a GPU (util 0)
but no inference server yet: it reports GPU metrics and no inference metrics, so the HPA counts it as a pod
with a missing metric, as it would in a cluster.

The cpu Resource metric (what metrics.k8s.io would serve) follows a CPU profile (``CpuProfile``, illustrative
like SM activity): a replica loading its model burns ``loading_cores`` (reading and deserialising weights),
then ``idle_cores`` plus up to ``busy_cores`` in proportion to its GPU util; each sample is stamped with the
refresh time and covers ``window_s``. The HPA's cpu readiness rules (gpuscale/hpa/replicas.py) then decide
which of those samples count.

Object and External metrics aggregate the pods as the catalogue says (sum, mean, or Σ numerator /
Σ denominator for ratios), except the queue depth: every waiting request, the balancer's included, as a
gateway counts them, so an HPA with minReplicas 0 can scale from zero on it. Values are in the catalogue's
units; the HPA gets thousandths.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from gpuscale.errors import ConfigError
from gpuscale.hpa import MetricUnavailable, ResourceSample
from gpuscale.hpa.spec import CrossVersionObjectReference, HorizontalPodAutoscaler, MetricIdentifier
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.model import milli_value
from gpuscale.replay.metric_history import Series, value_at
from gpuscale.replay.serving import Replica, ServingModel

GPU_METRICS = ("gpu_utilization", "gpu_sm_active", "gpu_tensor_active")
# (numerator, denominator, floor) of the ratio metrics, from the counters' increase over the window
RATIO_METRICS = {
    "inference_queue_time_seconds": ("queue_s", "success", 1.0),
    "inference_queue_compute_ratio": ("queue_s", "compute_s", 1e-6),
}
TOKEN_RATES = {
    "inference_prompt_tokens_per_second": "prompt_tokens",
    "inference_generation_tokens_per_second": "generation_tokens",
}
TTFT_QUANTILES = {"inference_ttft_p50_seconds": 0.5, "inference_ttft_p95_seconds": 0.95}
PRODUCED = (
    *GPU_METRICS,
    "inference_queue_depth",
    "inference_requests_per_second",
    "inference_batch_size",
    "inference_kv_cache_usage",
    *TOKEN_RATES,
    *TTFT_QUANTILES,
    *RATIO_METRICS,
)

RESOURCES = ("cpu",)  # Resource metrics the replay produces


@dataclass(frozen=True)
class CpuProfile:
    """One replica's CPU, in cores: its request (what Utilization targets divide by) and its usage."""

    request_cores: float = 4.0
    loading_cores: float = 4.0  # while the model loads (before the replica is ready)
    idle_cores: float = 0.5  # ready, GPU idle (HTTP server, scheduler loop)
    busy_cores: float = 2.0  # ready, GPU busy the whole last second (tokenising, batching, detokenising)
    window_s: float = 15.0  # the window each sample covers (metrics-server's default resolution)

    def usage_cores(self, *, loading: bool, gpu_util_percent: float) -> float:
        if loading:
            return self.loading_cores
        return self.idle_cores + (self.busy_cores - self.idle_cores) * gpu_util_percent / 100.0


# A pod's reading of one metric: (value, numerator, denominator); the parts let objects aggregate ratios.
Reading = tuple[float, float, float]


def check_metrics(
    hpas: list[tuple[str, HorizontalPodAutoscaler]], catalogue: Catalogue, *, external: frozenset[str] = frozenset()
) -> None:
    """Every metric the manifests name must be fed (``external``: External or Object metrics given as series), or be in
    the catalogue and produced by the serving model."""
    for source, hpa in hpas:
        for i, spec in enumerate(hpa.spec.metrics):
            name = spec.metric_name
            if spec.type in ("External", "Object") and name in external:
                continue
            if spec.type == "Resource":
                if name not in RESOURCES:
                    raise ConfigError(
                        f"spec.metrics[{i}].resource.name: the replay models the cpu Resource metric only "
                        f"(got {name!r})",
                        path=source,
                    )
                continue
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


def _quantile(ordered: list[float], q: float) -> float:
    """numpy's default (linear) quantile of sorted values; a sort and two lookups, not an array per call."""
    h = (len(ordered) - 1) * q
    lo = int(h)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (h - lo)


class AdapterView:
    """The adapter's last refresh over a ServingModel; implements gpuscale.hpa's ``Readings``."""

    def __init__(
        self,
        model: ServingModel,
        *,
        catalogue: Catalogue,
        window_s: float | None = None,
        metrics: frozenset[str] | None = None,
        externals: Mapping[str, Series] | None = None,
        origin: float = 0.0,
        cpu: CpuProfile | None = None,
    ) -> None:
        """``metrics``: the names anyone will read (default: all); the costlier ones are computed only if named.
        ``externals``: External metrics fed as series (``--external``), on the clock ``origin`` + replay time."""
        self.model = model
        self.cpu = cpu or CpuProfile()
        self.externals = dict(externals or {})
        self.origin = origin
        self._ttft = metrics is None or any(m in metrics for m in TTFT_QUANTILES)
        self.catalogue = catalogue
        self.window_s = window_s if window_s is not None else catalogue.defaults.window
        self._history: dict[str, deque[tuple[float, dict[str, float]]]] = {}
        self.latest: dict[str, dict[str, Reading]] = {}
        self.refreshed_at: float | None = None
        self.queued = 0

    def refresh(self, now: float) -> None:
        latest: dict[str, dict[str, Reading]] = {}
        for r in self.model.present:
            if r.gone_at is not None and r.gone_at <= now:
                continue
            latest[r.name] = self._read(r, now)
        for name in [n for n in self._history if n not in latest]:
            del self._history[name]
        self.latest = latest
        self.refreshed_at = now
        # the whole queue, the balancer's included: what a gateway exports as one series (and what an
        # Object/External queue metric can scale from zero on, when there is no pod to report it)
        live = [r for r in self.model.present if r.gone_at is None]
        self.queued = sum(len(r.waiting) for r in live) + len(self.model.unrouted)

    def _read(self, r: Replica, now: float) -> dict[str, Reading]:
        util, sm, tensor = self.model.gpu_activity(r)
        values: dict[str, Reading] = {
            "gpu_utilization": (util, util, 1.0),
            "gpu_sm_active": (sm, sm, 1.0),
            "gpu_tensor_active": (tensor, tensor, 1.0),
        }
        cores = self.cpu.usage_cores(loading=now < r.ready_at, gpu_util_percent=util)
        values["cpu"] = (cores, cores, 1.0)
        if now < r.ready_at:
            return values  # the server is still loading its model: no inference metrics yet
        c = r.counters
        now_counts = {
            "success": float(c.success),
            "queue_s": c.queue_s,
            "compute_s": c.compute_s,
            "prompt_tokens": float(c.prompt_tokens),
            "generation_tokens": float(c.generation_tokens),
        }
        history = self._history.setdefault(r.name, deque())
        history.append((now, now_counts))
        while len(history) > 1 and history[1][0] <= now - self.window_s:
            history.popleft()
        then_t, then = history[0]
        span = now - then_t
        delta = {k: v - then[k] for k, v in now_counts.items()}
        waiting = r.queue_depth
        values["inference_queue_depth"] = (waiting, waiting, 1.0)
        values["inference_batch_size"] = (float(r.running), float(r.running), 1.0)
        kv = r.kv_usage
        if kv is not None:  # NB: a general service has no KV cache: the metric is missing, as it would be
            values["inference_kv_cache_usage"] = (kv, kv, 1.0)
        rps = delta["success"] / span if span >= 1e-6 else 0.0
        values["inference_requests_per_second"] = (rps, rps, 1.0)
        for name, counter in TOKEN_RATES.items():
            rate = delta[counter] / span if span >= 1e-6 else 0.0
            values[name] = (rate, rate, 1.0)
        for name, (num, den, floor) in RATIO_METRICS.items():
            values[name] = (delta[num] / max(delta[den], floor), delta[num], delta[den])
        while r.first_tokens and r.first_tokens[0][0] <= now - self.window_s:
            r.first_tokens.popleft()
        if self._ttft and r.first_tokens:
            ttfts = sorted(x for _, x in r.first_tokens)
            for name, q in TTFT_QUANTILES.items():
                v = _quantile(ttfts, q)
                values[name] = (v, v, 1.0)
        return values

    # --- gpuscale.hpa.Readings ------------------------------------------------------------------------

    def pods(self, metric: MetricIdentifier) -> Mapping[str, int]:
        # NB: like the adapter, answer only for pods that still exist (the last refresh may predate a deletion)
        live = {r.name for r in self.model.present if r.gone_at is None}
        out = {
            pod: milli_value(float(v[metric.name][0]))
            for pod, v in self.latest.items()
            if metric.name in v and pod in live
        }
        if not out:
            raise MetricUnavailable(f"no pod has a value for {metric.name}")
        return out

    def object(self, described: CrossVersionObjectReference, metric: MetricIdentifier) -> int:
        if metric.name in self.externals:  # NB: a series fed by name (e.g. the adapter's forecast of the workload)
            return self.external(metric)
        return self._aggregate(metric.name)

    def resource(self, name: str) -> Mapping[str, ResourceSample]:
        live = {r.name for r in self.model.present if r.gone_at is None}
        stamp = self.refreshed_at or 0.0
        out = {
            pod: ResourceSample(milli_value(v[name][0]), timestamp=stamp, window_s=self.cpu.window_s)
            for pod, v in self.latest.items()
            if name in v and pod in live
        }
        if not out:
            raise MetricUnavailable(f"no pod has a value for resource {name}")
        return out

    def external(self, metric: MetricIdentifier) -> int:
        fed = self.externals.get(metric.name)
        if fed is None:
            return self._aggregate(metric.name)
        value = value_at(fed, self.origin + (self.refreshed_at or 0.0))
        if value is None:
            raise MetricUnavailable(f"no value of {metric.name} in --external within 5 min before {self.refreshed_at}s")
        return milli_value(value)

    def _aggregate(self, name: str) -> int:
        if name == "inference_queue_depth":
            return milli_value(float(self.queued))
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
