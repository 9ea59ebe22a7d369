"""GPU-hours and their cost per pool and namespace, requested-but-idle nodes, health incidents, a timeline.

Pure. A GPU-step counts only when some activity signal was sampled (``usage.activity_of``): a gap is not
idle time, it is unknown time, and the report says how much of it there was (``History.gaps``).

* allocated hours: steps a pod held the GPU × step; active hours: the same steps weighted by activity (0–1);
  idle = allocated − active; unallocated: sampled steps no pod held the GPU.
* cost = hours × ``prices.yaml``'s price of the GPU's product; a product without a price adds its hours to
  ``unpriced_hours`` and nothing to a cost (never a made-up price).
* incidents: an Xid is a step where ``DCGM_FI_DEV_XID_ERRORS`` changes to a non-zero value (the gauge keeps
  the last Xid); ECC DBE is an increase of the volatile counter (a decrease is a counter reset, not an
  incident); a throttle is ``throttle_incident_min`` or more of abnormal clock-event reasons in total.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

import numpy as np

from gpuscale.metrics.diagnosis import CLOCK_EVENT_BITS, decode_clock_events
from gpuscale.metrics.history import GpuHistory, History
from gpuscale.report.policy import ReportPolicy
from gpuscale.report.schema import CostFigures, Group, IdleNode, Incident, TimelinePoint
from gpuscale.report.usage import GpuActivity, pods_of


class CostAccumulator:
    """GPU-steps summed per group, converted to hours and cost at the end."""

    def __init__(self, step_seconds: float) -> None:
        self.hours_per_step = step_seconds / 3600.0
        self.gpus: set[str] = set()
        self.allocated: dict[str | None, float] = defaultdict(float)  # product → steps
        self.active: dict[str | None, float] = defaultdict(float)
        self.unallocated: dict[str | None, float] = defaultdict(float)

    def add(self, gpu: str, product: str | None, *, allocated: float, active: float, unallocated: float) -> None:
        self.gpus.add(gpu)
        self.allocated[product] += allocated
        self.active[product] += active
        self.unallocated[product] += unallocated

    def figures(self, price_of: Callable[[str | None], float | None]) -> CostFigures:
        h = self.hours_per_step
        alloc = sum(self.allocated.values()) * h
        active = sum(self.active.values()) * h
        unalloc = sum(self.unallocated.values()) * h
        costs = {"allocated": 0.0, "idle": 0.0, "unallocated": 0.0}
        priced_any = False
        unpriced = 0.0
        for product in set(self.allocated) | set(self.unallocated):
            price = price_of(product)
            if price is None:
                unpriced += self.allocated[product] * h
                continue
            priced_any = True
            costs["allocated"] += self.allocated[product] * h * price
            costs["idle"] += (self.allocated[product] - self.active[product]) * h * price
            costs["unallocated"] += self.unallocated[product] * h * price
        return CostFigures(
            gpus=len(self.gpus),
            allocated_hours=round(alloc, 3),
            active_hours=round(active, 3),
            idle_hours=round(alloc - active, 3),
            unallocated_hours=round(unalloc, 3),
            allocated_cost=round(costs["allocated"], 2) if priced_any else None,
            idle_cost=round(costs["idle"], 2) if priced_any else None,
            unallocated_cost=round(costs["unallocated"], 2) if priced_any else None,
            unpriced_hours=round(unpriced, 3),
        )


def fleet_costs(history: History, activities: list[GpuActivity], policy: ReportPolicy):
    """(per pool, per namespace, total, per workload key → accumulator, idle nodes, timeline)."""
    pools: dict[str, CostAccumulator] = {}
    namespaces: dict[str, CostAccumulator] = {}
    total = CostAccumulator(history.step_seconds)
    nodes: dict[str, CostAccumulator] = {}
    step = history.step_seconds
    hour = max(1, round(3600.0 / step))
    blocks = (history.steps + hour - 1) // hour
    timeline_alloc = np.zeros(blocks)
    timeline_active = np.zeros(blocks)
    even = history.steps == blocks * hour
    for gpu, act in zip(history.gpus, activities, strict=True):
        held = (gpu.pod >= 0) & act.sampled
        always = act.clean and bool(held.all())  # NB: the common case, without masked copies
        free = (gpu.pod < 0) & act.sampled
        a = act.activity if always else np.where(held, act.activity, np.float32(0.0))
        pool = history.node_pools.get(gpu.node, gpu.node)
        figures = {"allocated": float(held.sum()), "active": float(a.sum()), "unallocated": float(free.sum())}
        for acc in (
            pools.setdefault(pool, CostAccumulator(step)),
            total,
            nodes.setdefault(gpu.node, CostAccumulator(step)),
        ):
            acc.add(gpu.key, gpu.product, **figures)
        # namespaces: per pod the GPU held
        for pod_index in pods_of(gpu.pod, held):
            mask = held & (gpu.pod == pod_index)
            ns = history.pods[int(pod_index)].namespace
            namespaces.setdefault(ns, CostAccumulator(step)).add(
                gpu.key, gpu.product, allocated=float(mask.sum()), active=float(a[mask].sum()), unallocated=0.0
            )
        if always and even:
            timeline_alloc += hour
            timeline_active += a.reshape(blocks, hour).sum(axis=1, dtype=np.float64)
            continue
        pad = blocks * hour - history.steps
        timeline_alloc += np.pad(held.astype(np.float64), (0, pad)).reshape(blocks, hour).sum(axis=1)
        timeline_active += np.pad(a.astype(np.float64), (0, pad)).reshape(blocks, hour).sum(axis=1)
    price_of = price_lookup(policy)
    idle_nodes = find_idle_nodes(nodes, node_pools=history.node_pools, policy=policy)
    samples_per_block = np.minimum(hour, history.steps - np.arange(blocks) * hour)
    timeline = [
        TimelinePoint(
            t=history.start + i * hour * step,
            allocated_gpus=round(float(timeline_alloc[i] / samples_per_block[i]), 3),
            active_gpus=round(float(timeline_active[i] / samples_per_block[i]), 3),
        )
        for i in range(blocks)
    ]
    return (
        [Group(name=k, cost=v.figures(price_of)) for k, v in sorted(pools.items())],
        [Group(name=k, cost=v.figures(price_of)) for k, v in sorted(namespaces.items())],
        total.figures(price_of),
        idle_nodes,
        timeline,
    )


def find_idle_nodes(
    nodes: Mapping[str, CostAccumulator], *, node_pools: Mapping[str, str], policy: ReportPolicy
) -> list[IdleNode]:
    """Nodes whose GPUs were mostly requested (``min_allocated_share`` of the samples) yet barely active
    (at most ``max_active_share`` of the allocated time): rightsizing.yaml's ``idle_node`` rule, both modes."""
    price_of = price_lookup(policy)
    rule = policy.rightsizing.idle_node
    found = []
    for node, acc in sorted(nodes.items()):
        allocated = sum(acc.allocated.values())
        sampled = allocated + sum(acc.unallocated.values())
        if not sampled or not allocated:
            continue
        allocated_share = allocated / sampled
        active_share = sum(acc.active.values()) / allocated
        if allocated_share >= rule.min_allocated_share and active_share <= rule.max_active_share:
            f = acc.figures(price_of)
            found.append(
                IdleNode(
                    node=node,
                    pool=node_pools.get(node, node),
                    gpus=f.gpus,
                    allocated_share=round(allocated_share, 4),
                    active_share=round(active_share, 4),
                    idle_hours=f.idle_hours,
                    idle_cost=f.idle_cost,
                )
            )
    return found


def price_lookup(policy: ReportPolicy) -> Callable[[str | None], float | None]:
    """product → its price per GPU-hour (the product's own, else its catalogue name's), None when unknown."""

    def price(product: str | None) -> float | None:
        known = policy.gpus.product(product)
        return policy.prices.per_gpu_hour(product) or (policy.prices.per_gpu_hour(known.name) if known else None)

    return price


def workload_cost(
    allocated_by_product: dict[str, float], active_by_product: dict[str, float], *, step_seconds: float, policy
) -> CostFigures:
    acc = CostAccumulator(step_seconds)
    for product, allocated in allocated_by_product.items():
        acc.add("", product, allocated=allocated, active=active_by_product.get(product, 0.0), unallocated=0.0)
    figures = acc.figures(price_lookup(policy))
    return figures.model_copy(update={"gpus": 0})


def incidents(history: History, policy: ReportPolicy) -> list[Incident]:
    out: list[Incident] = []
    times = history.times()
    abnormal = set(policy.diagnosis.diagnosis.clock_events.abnormal)
    abnormal_mask = 0
    for bit, name in CLOCK_EVENT_BITS:
        if name in abnormal:
            abnormal_mask |= bit
    min_steps = policy.rightsizing.throttle_incident_min / history.step_seconds
    for gpu in history.gpus:
        out += _xid_incidents(gpu, history, times, policy)
        out += _ecc_incidents(gpu, history, times)
        reasons = gpu.values.get("clock_event_reasons")
        if reasons is not None:
            ok = ~np.isnan(reasons)
            masks = np.where(ok, reasons, 0).astype(np.int64)
            hit = (masks & abnormal_mask) != 0
            n = int(hit.sum())
            if n and n >= min_steps:
                seen = np.flatnonzero(hit)
                combined = int(np.bitwise_or.reduce(masks[hit] & abnormal_mask))
                out.append(
                    Incident(
                        kind="throttle",
                        node=gpu.node,
                        gpu=gpu.key,
                        pod=_pod_at(history, gpu, int(seen[0])),
                        first_seen=float(times[seen[0]]),
                        last_seen=float(times[seen[-1]]),
                        count=n,
                        value=", ".join(decode_clock_events(combined)),
                        meaning=f"{n * history.step_seconds / 60:.0f} min of abnormal clock-event reasons",
                    )
                )
    return sorted(out, key=lambda i: (i.first_seen, i.node, i.gpu))


def _pod_at(history: History, gpu: GpuHistory, i: int) -> str | None:
    p = int(gpu.pod[i])
    return f"{history.pods[p].namespace}/{history.pods[p].name}" if p >= 0 else None


def _xid_incidents(gpu: GpuHistory, history: History, times: np.ndarray, policy: ReportPolicy) -> list[Incident]:
    xid = gpu.values.get("last_xid")
    if xid is None:
        return []
    ok = np.flatnonzero(~np.isnan(xid))
    if ok.size == 0:
        return []
    v = xid[ok]
    prev = np.concatenate(([0.0], v[:-1]))
    changes = ok[(v != prev) & (v > 0)]
    by_code: dict[int, list[int]] = defaultdict(list)
    for i in changes:
        by_code[int(xid[i])].append(int(i))
    out = []
    for code, idx in by_code.items():
        info = policy.diagnosis.health.xid_info(code)
        out.append(
            Incident(
                kind="xid",
                node=gpu.node,
                gpu=gpu.key,
                pod=_pod_at(history, gpu, idx[0]),
                first_seen=float(times[idx[0]]),
                last_seen=float(times[idx[-1]]),
                count=len(idx),
                value=str(code),
                meaning=f"{info.meaning} ({info.severity}, action {info.action})",
            )
        )
    return out


def _ecc_incidents(gpu: GpuHistory, history: History, times: np.ndarray) -> list[Incident]:
    ecc = gpu.values.get("ecc_dbe_volatile")
    if ecc is None:
        return []
    ok = np.flatnonzero(~np.isnan(ecc))
    if ok.size < 1:
        return []
    v = ecc[ok].astype(np.float64)
    # NB: the first sample counts from 0 only if the counter was 0 before the window: unknown, so it is the base.
    d = np.diff(v)
    up = d > 0  # a decrease is a reset (driver reload), not a negative count
    if not up.any():
        return []
    idx = ok[1:][up]
    return [
        Incident(
            kind="ecc-dbe",
            node=gpu.node,
            gpu=gpu.key,
            pod=_pod_at(history, gpu, int(idx[0])),
            first_seen=float(times[idx[0]]),
            last_seen=float(times[idx[-1]]),
            count=int(d[up].sum()),
            value=f"+{int(d[up].sum())}",
            meaning="uncorrectable (double-bit) ECC errors: the GPU's memory is failing; drain and reset or RMA",
        )
    ]
