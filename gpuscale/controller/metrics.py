"""The controller's own /metrics (prometheus-client, one registry per controller so tests never share state).

What an operator looks at: actions taken (by action and result), actions the circuit breaker held back, nodes
under remediation, GPU nodes per pool, requested-but-idle GPUs and the GPU-seconds (hours × 3600) they have idled,
reconcile duration and failures, leadership, and the health of every source (exporters, Prometheus, the caches).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuscale.buildinfo import register_build_info
from gpuscale.metrics.series import TargetHealth

__all__ = ["ControllerMetrics"]


class _SourceHealth(Collector):
    def __init__(self, health: Callable[[], Iterable[tuple[str, TargetHealth]]]) -> None:
        self._health = health

    def collect(self) -> Iterable[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "gpuscale_controller_source_up", "1 when the source answered its last read", labels=["source", "target"]
        )
        failures = GaugeMetricFamily(
            "gpuscale_controller_source_failures", "failed reads since start", labels=["source", "target"]
        )
        for source, h in self._health():
            up.add_metric([source, h.target], 1.0 if h.healthy else 0.0)
            failures.add_metric([source, h.target], float(h.failures_total))
        yield up
        yield failures


class ControllerMetrics:
    def __init__(self, health: Callable[[], Iterable[tuple[str, TargetHealth]]] = lambda: ()) -> None:
        self.registry = CollectorRegistry()
        register_build_info(self.registry)
        r = self.registry
        # NB: registered in this order, the order /metrics lists them in.
        self._add_remediation(r)
        self._add_pools(r)
        self._add_reconcile(r)
        self._add_plan_state(r)
        r.register(_SourceHealth(health))

    def _add_remediation(self, r: CollectorRegistry) -> None:
        """Writes by planner and result; remediations held back and under way."""
        self.actions = Counter(
            "gpuscale_controller_actions",
            "Kubernetes writes by planner, action (create, patch, patch-status, evict, event…) and result "
            "(applied, dry-run, already-done, conflict, refused, skipped, failed)",
            ["planner", "action", "result"],
            registry=r,
        )
        self.held_back = Counter(
            "gpuscale_controller_held_back",
            "remediations the circuit breaker held back (one per node and episode)",
            registry=r,
        )
        self.held_back_nodes = Gauge(
            "gpuscale_controller_held_back_nodes", "GPU nodes with a problem the breaker holds back now", registry=r
        )
        self.remediated_nodes = Gauge(
            "gpuscale_controller_remediated_nodes", "GPU nodes under this controller's remediation now", registry=r
        )

    def _add_pools(self, r: CollectorRegistry) -> None:
        """GPU nodes per pool; GPUs requested but idle, and the GPU-seconds they idled."""
        self.pool_nodes = Gauge("gpuscale_controller_pool_nodes", "GPU nodes per pool", ["pool"], registry=r)
        self.pools = Gauge("gpuscale_controller_pools", "GPU node pools", registry=r)
        self.idle_gpus = Gauge(
            "gpuscale_controller_idle_gpus",
            "GPUs requested by a pod but idle for the idle window, per node",
            ["node"],
            registry=r,
        )
        self.idle_gpu_seconds = Counter(
            "gpuscale_controller_idle_gpu_seconds",
            "GPU-seconds spent requested but idle, counted once a GPU has been idle for the idle window "
            "(idle GPU-hours: divide by 3600)",
            registry=r,
        )

    def _add_reconcile(self, r: CollectorRegistry) -> None:
        """The reconcile's duration and failures, leadership, whether the view is confirmed, plans held."""
        self.reconcile_seconds = Histogram(
            "gpuscale_controller_reconcile_duration_seconds",
            "wall time of one reconcile (telemetry refresh, plan, apply)",
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
            registry=r,
        )
        self.reconcile_failures = Counter(
            "gpuscale_controller_reconcile_failures", "reconciles or planners that failed", ["stage"], registry=r
        )
        self.leader = Gauge(
            "gpuscale_controller_leader",
            "1 while this replica acts as the leader (holds the Lease, or acts alone with --no-leader-elect); "
            "0 in dry-run, which takes no Lease",
            registry=r,
        )
        self.view_confirmed = Gauge(
            "gpuscale_controller_view_confirmed",
            "1 when every watch cache has listed since its last error (and since this replica became leader); "
            "0: the controller plans and writes nothing",
            registry=r,
        )
        self.reconciles_held = Counter(
            "gpuscale_controller_reconciles_held",
            "reconciles that planned nothing, by why: view (caches not confirmed), telemetry (unreadable)",
            ["stage"],
            registry=r,
        )

    def _add_plan_state(self, r: CollectorRegistry) -> None:
        """What a plan stood on: the expander's ranking held, replans, telemetry answering, dry-run."""
        self.expander_stale = Gauge(
            "gpuscale_controller_expander_stale",
            "1 while the priority-expander ranking is held (kept as last written) for want of fresh GPU telemetry "
            "for every pool it ranks",
            registry=r,
        )
        self.replans = Counter(
            "gpuscale_controller_replans",
            "re-reads and new plans after a write found its object changed (409, AlreadyExists, failed test)",
            registry=r,
        )
        self.telemetry_nodes = Gauge(
            "gpuscale_controller_telemetry_nodes",
            "GPU nodes by whether their exporter answered",
            ["reporting"],
            registry=r,
        )
        self.dry_run = Gauge("gpuscale_controller_dry_run", "1 when writes are only validated (dryRun=All)", registry=r)
