"""`gpuscale controller`: GPU health remediation, autoscaler hints and gang-aware capacity.

The shape (see ../shared ENGINEERING.md §1, "Decisions are pure"): each concern is a *planner*, a pure function
from what the controller knows (a ``ClusterView`` of raw Kubernetes objects, GPU telemetry, the time, its
policy) to a list of typed ``Write``s (``writes.py``). One actuator applies writes to the Kubernetes API,
honouring ``--dry-run`` (server-side ``dryRun=All``) and retrying 409/429/5xx; the loop wires planners, the
actuator, leader election and the caches. Planners never do I/O, so a reconcile can be tested by comparing
writes, and running it twice on an unchanged cluster plans nothing.
"""
