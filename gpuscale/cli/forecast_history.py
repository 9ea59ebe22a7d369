"""The forecasts' request rate as Prometheus recorded it: how a restarted adapter warms its forecasts (issue 38).

Composition-root wiring (it does I/O through the Prometheus client and hands the result to the pure core's
``WorkloadDemand.backfill`` via ``WorkloadForecasts``' ``history`` hook).
"""

from __future__ import annotations

from gpuscale.adapter.forecasts import RateHistory
from gpuscale.metrics.catalogue import Catalogue, MetricDefinition
from gpuscale.metrics.demand import DemandSettings
from gpuscale.model import POD, ObjectRef
from gpuscale.settings import AdapterSettings
from gpuscale.sources.kube import KubeCache
from gpuscale.sources.promapi import PrometheusClient


def rate_history(
    settings: AdapterSettings, catalogue: Catalogue, metric: MetricDefinition, cluster: KubeCache, rate: DemandSettings
) -> RateHistory:
    """The forecasts' rate as Prometheus recorded it (one range query per namespaces first forecast), so a restarted
    adapter serves forecasts from its first refresh instead of 10 minutes later (issue 38). Called from the
    refresh before its build (``WorkloadForecasts.gather``), on the serving loop; bounded by --prometheus-timeout (not
    cut to the refresh interval: it runs once per namespace, when a workload there is first forecast)."""
    from gpuscale.replay.metric_history import promql_for

    promql = promql_for(metric, window_s=catalogue.window(metric))
    # NB: the history a forecast needs, then its checked forecasts and a whole window of the model-or-last-value choice
    span_s = rate.min_history_s + (rate.min_residuals + rate.loss_window + 12) * rate.step_s

    async def fetch(namespaces: frozenset[str], now: float) -> dict[ObjectRef, list[tuple[float, float]]]:
        client = PrometheusClient.connect(settings.prometheus)
        try:
            result = await client.query_range(promql, start=now - span_s, end=now - 1.0, step=rate.step_s)
        finally:
            await client.close()
        # NB: the query sums by pod; a pod is placed by its name among the pods of these namespaces now
        where = {p.name: p.namespace for namespace in namespaces for p in cluster.pods(namespace)}
        out = {}
        for series in result:
            labels = series.get("metric") if isinstance(series, dict) else None
            pod = labels.get("pod") if isinstance(labels, dict) else None
            namespace = where.get(pod) if isinstance(pod, str) else None
            if namespace is None:
                continue
            try:
                out[ObjectRef(POD, pod, namespace)] = [(float(t), float(v)) for t, v in series.get("values") or []]
            except (TypeError, ValueError):
                continue  # NB: a malformed series is left out, like a missing one
        return out

    return fetch
