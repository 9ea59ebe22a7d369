"""The cluster-autoscaler priority expander ConfigMap, from a ranking of GPU pools. A pure planner.

CA (``--expander=priority``) reads ``data.priorities`` of the ConfigMap ``cluster-autoscaler-priority-expander``
in its namespace: a YAML map of integer priority → regexes of node-group names; among the node groups that can
host a pending pod it picks one matching the highest priority (kubernetes/autoscaler
``cluster-autoscaler/expander/priority/readme.md``).

gpuscale ranks pools by what a *useful* GPU-hour costs there: the price per GPU-hour (``prices.yaml``) divided
by the pool's measured mean GPU activity (0–1, e.g. SM active; the controller's telemetry feeds it). A pool
without a measurement is costed at ``expander.unmeasured_activity`` (default: the mean of the measured pools, or
1.0 when none was), activity is floored at ``expander.min_activity``, and a pool without a price ranks below
every priced one (its cost is unknown, not zero). When gangs are pending, pools that can host none of their pods
(GPU product or GPUs per node too small) rank below those that can host at least one gang's pods.

Once written, the order changes only where a pool is clearly better than one ranked above it: another tier,
or cheaper by more than ``expander.reorder_margin`` (default 10 %), so activity wobbling around a tie does not
patch the ConfigMap every reconcile. The written ConfigMap is the only memory of the order (restart-safe).

Each pool gets its own priority (10, 20, 30… highest for the cheapest), so values never repeat, as CA requires.
The ConfigMap is created if missing and patched only when ``priorities`` changes; one that exists without the
``app.kubernetes.io/managed-by: gpuscale`` label belongs to someone else and is left alone (with one Event). A
table in gpuscale's ConfigMap that cannot be read (edited into junk or a YAML bomb: it is read within the limits
of a config file) holds no order: the ranking replaces it, with one Warning Event ``ExpanderTableUnreadable``.

Evidence first: the ranking is written only when every pool that has GPU nodes has fresh activity figures from
the controller's telemetry. Without them (an exporter or Prometheus outage) a ranking would rest on price alone
and flip the autoscaler's preference for no reason, so nothing is written: the last ranking stays, a Warning Event
``ExpanderHeld`` names the pools without telemetry (once), and ``gpuscale_controller_expander_stale`` is 1. A pool
with no node at all (a node group scaled to zero) cannot be measured and is costed as unmeasured.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from gpuscale.config import load_yaml_documents
from gpuscale.controller.events import already_reported
from gpuscale.controller.gangs import Gang
from gpuscale.controller.pools import Pool, PoolsPolicy
from gpuscale.controller.writes import ClusterView, Create, Emit, ObjectKey, Patch, Write
from gpuscale.errors import ConfigError, one_line
from gpuscale.files import CONFIG_LIMIT_BYTES

__all__ = [
    "CONFIG_MAP",
    "PoolRank",
    "explain_ranks",
    "keep_order",
    "plan_expander",
    "priorities_text",
    "rank_pools",
    "read_priorities",
    "unmeasured_pools",
]

CONFIG_MAP = ("v1", "ConfigMap")
_MANAGED_BY = {"app.kubernetes.io/managed-by": "gpuscale"}
_STEP = 10


@dataclass(frozen=True, slots=True)
class PoolRank:
    pool: Pool
    activity: float | None
    """The measured mean activity (None: not measured)."""
    cost_per_useful_gpu_hour: float | None
    """Price / activity used for ranking (None: the pool has no price)."""
    hosts_pending: bool
    """Whether one of its nodes can run a pod of some pending gang (True when no gang is pending)."""


def _hosts(pool: Pool, gang: Gang) -> bool:
    gpu_sets = [s for s in gang.pod_sets if s.gpus_per_pod > 0]
    return bool(gpu_sets) and all(pool.can_host(gpus_per_pod=s.gpus_per_pod, product=s.gpu_product) for s in gpu_sets)


def rank_pools(
    pools: Sequence[Pool], *, activity: Mapping[str, float], pending: Sequence[Gang], policy: PoolsPolicy
) -> list[PoolRank]:
    """``pools`` best first: hosting a pending gang, then cheapest per useful GPU-hour, then priced, then name."""
    settings = policy.expander
    measured = {name: a for name, a in activity.items() if 0 <= a <= 1}
    assumed = settings.unmeasured_activity
    if assumed is None:
        assumed = sum(measured.values()) / len(measured) if measured else 1.0
    gpu_gangs = [g for g in pending if g.gpus > 0]
    ranks = []
    for pool in pools:
        used = max(measured.get(pool.name, assumed), settings.min_activity)
        price = pool.price_per_gpu_hour
        ranks.append(
            PoolRank(
                pool=pool,
                activity=measured.get(pool.name),
                cost_per_useful_gpu_hour=price / used if price is not None else None,
                hosts_pending=not gpu_gangs or any(_hosts(pool, g) for g in gpu_gangs),
            )
        )
    return sorted(
        ranks,
        key=lambda r: (
            not r.hosts_pending,
            r.cost_per_useful_gpu_hour is None,
            r.cost_per_useful_gpu_hour or 0.0,
            r.pool.name,
        ),
    )


def _tier(rank: PoolRank) -> tuple[bool, bool]:
    return (not rank.hosts_pending, rank.cost_per_useful_gpu_hour is None)


def _clearly_better(a: PoolRank, b: PoolRank, margin: float) -> bool:
    if _tier(a) != _tier(b):
        return _tier(a) < _tier(b)
    if a.cost_per_useful_gpu_hour is None or b.cost_per_useful_gpu_hour is None:
        return False
    return a.cost_per_useful_gpu_hour < b.cost_per_useful_gpu_hour * (1 - margin)


def read_priorities(text: Any) -> tuple[list[tuple[str, ...]], str]:
    """The node-group regex lists of a written ``priorities`` table, highest priority first, and why it could not
    be read ("" when it could; then [] and the reason). NB: someone else in the cluster can write the ConfigMap:
    it is loaded as a config file is (config.load_yaml_documents: aliases and nesting bounded, no key twice), so a
    "billion laughs" table costs nothing and never stops the reconcile."""
    if not isinstance(text, str):
        return [], "no priorities text"
    if len(text) > CONFIG_LIMIT_BYTES:  # NB: the API server stores at most 1 MiB; a fake or a proxy might not
        return [], f"priorities larger than {CONFIG_LIMIT_BYTES} bytes"
    try:
        documents = load_yaml_documents(text, path="data.priorities")
    except ConfigError as e:
        return [], str(e)
    table = documents[0][0] if len(documents) == 1 else None
    if not isinstance(table, dict):
        return [], "data.priorities: not one YAML mapping of priority to node-group regexes"
    rows = [(k, v) for k, v in table.items() if isinstance(k, int) and isinstance(v, list)]
    return [tuple(str(r) for r in v) for _, v in sorted(rows, key=lambda kv: -kv[0])], ""


def keep_order(ranks: Sequence[PoolRank], *, current: Sequence[tuple[str, ...]], margin: float) -> list[PoolRank]:
    """``ranks`` in the order already written (``current``, from read_priorities), except where a pool is clearly
    better than one above it (another tier, or cheaper by more than ``margin``): small swings in measured activity
    do not reorder the expander."""
    position = {groups: i for i, groups in enumerate(current)}
    known = sorted((r for r in ranks if r.pool.node_groups in position), key=lambda r: position[r.pool.node_groups])
    order = known + [r for r in ranks if r.pool.node_groups not in position]
    result: list[PoolRank] = []
    for rank in order:
        i = len(result)
        while i > 0 and _clearly_better(rank, result[i - 1], margin):
            i -= 1
        result.insert(i, rank)
    return result


def priorities_text(ranks: Sequence[PoolRank]) -> str:
    """``data.priorities``: the best pool gets the highest number; one distinct priority per pool."""
    top = _STEP * len(ranks)
    table = {top - _STEP * i: list(rank.pool.node_groups) for i, rank in enumerate(ranks)}
    return yaml.safe_dump(table, sort_keys=False, default_flow_style=False)


def explain_ranks(ranks: Sequence[PoolRank]) -> str:
    """One line for the log and the write's ``why``: each pool in rank order with its cost, activity and fit."""
    parts = []
    for rank in ranks:
        cost = (
            f"{rank.cost_per_useful_gpu_hour:.2f}/useful GPU-h"
            if rank.cost_per_useful_gpu_hour is not None
            else "no price"
        )
        seen = f"activity {rank.activity:.0%}" if rank.activity is not None else "activity not measured"
        fit = "" if rank.hosts_pending else ", hosts no pending gang"
        parts.append(f"{rank.pool.name} ({cost}, {seen}{fit})")
    return "pools ranked: " + "; ".join(parts)


def unmeasured_pools(pools: Sequence[Pool], activity: Mapping[str, float]) -> list[str]:
    """Pools that have GPU nodes but no fresh activity figure: the ranking must wait for their telemetry."""
    return [p.name for p in pools if p.nodes and p.name not in activity]


def plan_expander(
    view: ClusterView,
    *,
    pools: Sequence[Pool],
    activity: Mapping[str, float],
    pending: Sequence[Gang],
    policy: PoolsPolicy,
) -> list[Write]:
    """The write that makes CA's priority expander prefer the cheapest useful pools (nothing if unchanged).

    ``activity`` maps pool name → mean GPU activity 0–1 over the controller's window; ``pending`` are the
    pending gangs (``gangs.gangs_of`` filtered on state); ``pools`` from ``pools.pools_of``.
    """
    settings = policy.expander
    if not settings.enabled or not pools:
        return []
    current = view.get(*CONFIG_MAP, settings.name, settings.namespace)
    missing = unmeasured_pools(pools, activity)
    if missing:
        key = ObjectKey(*CONFIG_MAP, settings.name, settings.namespace)
        message = f"priority expander not updated: no fresh GPU telemetry for pool(s) {', '.join(missing)}; " + (
            "the last ranking stays" if current is not None else "nothing written yet"
        )
        if already_reported(view, key, "ExpanderHeld", message):
            return []
        return [Emit(key, "Warning", "ExpanderHeld", message)]
    ranks = rank_pools(pools, activity=activity, pending=pending, policy=policy)
    written = (current.get("data") or {}).get("priorities") if current is not None else None
    order, unreadable = read_priorities(written)
    ranks = keep_order(ranks, current=order, margin=settings.reorder_margin)
    text = priorities_text(ranks)
    why = explain_ranks(ranks)
    if current is None:
        manifest: dict[str, Any] = {
            "apiVersion": CONFIG_MAP[0],
            "kind": CONFIG_MAP[1],
            "metadata": {"name": settings.name, "namespace": settings.namespace, "labels": dict(_MANAGED_BY)},
            "data": {"priorities": text},
        }
        return [Create(manifest, why=why)]
    key = ObjectKey.of(current)
    labels = (current.get("metadata") or {}).get("labels") or {}
    if any(labels.get(k) != v for k, v in _MANAGED_BY.items()):
        message = (
            f"ConfigMap {settings.namespace}/{settings.name} is not managed by gpuscale "
            "(no app.kubernetes.io/managed-by=gpuscale label): leaving the priority expander to its owner"
        )
        if already_reported(view, key, "ExpanderNotManaged", message):
            return []
        return [Emit(key, "Warning", "ExpanderNotManaged", message)]
    if written == text:
        return []
    problem = unreadable if isinstance(written, str) else ""  # NB: no table at all is nothing to report
    return [*_unreadable(view, key, problem), Patch(key, {"data": {"priorities": text}}, why=why)]


def _unreadable(view: ClusterView, key: ObjectKey, problem: str) -> list[Write]:
    """One Warning Event when the written table cannot be read (it is replaced by the ranking: the ConfigMap is
    gpuscale's), so that whoever edited it learns why their order is gone."""
    if not problem:
        return []
    message = f"replacing the unreadable priority expander table: {one_line(problem, 300)}"
    if already_reported(view, key, "ExpanderTableUnreadable", message):
        return []
    return [Emit(key, "Warning", "ExpanderTableUnreadable", message)]
