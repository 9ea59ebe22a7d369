"""`gpuscale controller`: GPU health remediation, autoscaler hints and gang-aware capacity.

The shape (see ../shared ENGINEERING.md §1, "Decisions are pure"): each concern is a *planner*, a pure function
from what the controller knows (a ``ClusterView`` of raw Kubernetes objects, GPU telemetry, the time, its
policy) to a list of typed ``Write``s (``writes.py``). One actuator applies writes to the Kubernetes API,
honouring ``--dry-run`` (server-side ``dryRun=All``) and retrying 409/429/5xx; the loop wires planners, the
actuator, leader election and the caches. Planners never do I/O, so a reconcile can be tested by comparing
writes, and running it twice on an unchanged cluster plans nothing.

    sources/objects.ObjectCache (list+watch) ──► ClusterView ─┐
    observe.TelemetryFeed → telemetry.TelemetryHistory ─► ClusterTelemetry ─┤
                                                              ▼
    planners: health.HealthPlanner (+ drain), hints.HintsPlanner, capacity.GangCapacityPlanner,
              capacity.ExpanderPlanner                        │ [Write]
                                                              ▼
    loop.Controller ── leader.LeaseElector says who acts ──► actuator.KubeActuator ──► Kubernetes API
                     └─ metrics.ControllerMetrics (/metrics); cli/controller.py serves /healthz, /readyz

Policies: ``policies/remediation.yaml`` (health), ``hints.yaml``, ``pools.yaml`` + ``prices.yaml`` (capacity);
the Xid table stays in ``health.yaml``.
"""
