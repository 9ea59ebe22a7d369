"""GPU health remediation: DCGM findings → Event, node condition, autoscaler status taint, cordon, drain; undone
on recovery. A planner (pure): ``HealthPlanner.plan(view, telemetry, now=…)`` → writes.

What a node goes through (each step switchable, ``HealthActions``)::

    problem found ─► Event GpuUnhealthy ─► GpuHealthy=False ─► status taint ─► cordon ─► (drain)
                                             │ breaker says no: Event RemediationHeldBack, condition only
    recovered     ─► GpuHealthy=True, our taint removed, uncordoned (if we cordoned), Event GpuRecovered

What it never does:

- act on a node opted out (``gpuscale.io/remediation=disabled``) or, when configured, one NVSentinel manages;
- uncordon a node a person cordoned (only a node carrying our ``cordoned-by`` annotation is ever uncordoned);
- revert a person: if someone uncordons (or removes our taint from) a node we acted on, the step is recorded as
  overridden and not taken again for this episode;
- decide on a node whose exporter did not answer (its GPUs are unknown, not healthy);
- take a disruptive step (taint, cordon, drain) on more than the breaker's share of a pool or of the cluster,
  counting nodes acted on now and within the breaker's window (kept in a ConfigMap across restarts).

The record of what was done (who, why, when) is in node annotations under ``gpuscale.io/``; see ``ANNOTATIONS``.
Writes are planned only where something differs, so an unchanged cluster plans nothing.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuscale.controller.drain import DrainPolicy, plan_drain
from gpuscale.controller.gpu_problems import Problem, node_problems
from gpuscale.controller.pools import GPU_COUNT_LABEL, pool_of
from gpuscale.controller.remediation_policy import RemediationPolicy
from gpuscale.controller.telemetry import ClusterTelemetry, NodeGpuTelemetry
from gpuscale.controller.writes import ClusterView, Create, Emit, ObjectKey, Patch, Write
from gpuscale.metrics.diagnosis import DiagnosisPolicy
from gpuscale.settings import HealthActions  # NB: the settings group, handed whole by cli/controller.py

__all__ = [
    "ANNOTATIONS",
    "HealthActions",
    "HealthPlanner",
]

PREFIX = "gpuscale.io/"
RECORD = PREFIX + "gpu-health"  # JSON {reason, message, since, by}: the current episode
TAINTED_BY = PREFIX + "tainted-by"
CORDONED_BY = PREFIX + "cordoned-by"
AHR_BY = PREFIX + "accelerated-hardware-ready-by"
OVERRIDDEN = PREFIX + "overridden"  # steps a person undid during this episode ("cordon,taint")
HELD_BACK = PREFIX + "held-back"  # why the breaker held this node back
WARNINGS = PREFIX + "gpu-warnings"  # the warn-only problems last reported (reason:gpu, …)
ANNOTATIONS = (RECORD, TAINTED_BY, CORDONED_BY, AHR_BY, OVERRIDDEN, HELD_BACK, WARNINGS)
AHR = "AcceleratedHardwareReady"
_HAD_ANNOTATIONS = "_gpuscale_had_annotations"  # set on this plan's copy of a node (see node_json_patch)


def _iso(now: float) -> str:
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _parse_iso(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except (ValueError, AttributeError):
        return None


def _annotations(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("annotations") or {}


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _name(obj: Mapping[str, Any]) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def _pointer(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def node_json_patch(
    node: Mapping[str, Any],
    *,
    annotations: Mapping[str, str | None] | None = None,
    taints: list[dict[str, Any]] | None = None,
    unschedulable: bool | None = None,
) -> list[dict[str, Any]]:
    """RFC 6902 operations changing only what is given (None: leave alone).

    NB: JSON patch, not merge patch: ``spec.taints`` is an atomic list (replaced whole), so every change of it is
    guarded by a ``test`` of the list as read — a taint someone added meanwhile fails the write (422) instead of
    being dropped — while the node's other changes (its status, heartbeats) do not get in the way as a
    resourceVersion precondition would. Where the copy read has no taints (or no annotations), the ``add`` that
    creates the member is guarded by a ``test`` that it is still absent (RFC 6902 ``add`` replaces an existing
    member: from a stale copy it would wipe what others wrote).
    """
    ops: list[dict[str, Any]] = []
    current = _annotations(node)
    if annotations:
        # NB: a node read without annotations gets the whole map, also from a later patch of the same reconcile
        # (an earlier one may not have been stored: dry-run), since adding a key needs the map to exist — always
        # guarded by a test that the map is still absent: after an earlier patch of this plan created it, that
        # test fails and the loop re-reads the node (one more round, only for a node read without annotations).
        if not node.get(_HAD_ANNOTATIONS, bool(current)):
            merged = {**current, **annotations}
            added = {k: v for k, v in merged.items() if v is not None}
            if added:
                ops.append({"op": "test", "path": "/metadata/annotations", "value": None})
                ops.append({"op": "add", "path": "/metadata/annotations", "value": added})
        else:
            for k, v in annotations.items():
                path = f"/metadata/annotations/{_pointer(k)}"
                if v is None:
                    if k in current:
                        ops.append({"op": "remove", "path": path})
                else:
                    ops.append({"op": "add", "path": path, "value": v})
    spec = node.get("spec") or {}
    if taints is not None:
        old = spec.get("taints")
        if old:
            ops.append({"op": "test", "path": "/spec/taints", "value": old})
            ops.append(
                {"op": "replace", "path": "/spec/taints", "value": taints}
                if taints
                else {"op": "remove", "path": "/spec/taints"}
            )
        elif taints:
            ops.append({"op": "test", "path": "/spec/taints", "value": None})
            ops.append({"op": "add", "path": "/spec/taints", "value": taints})
    if unschedulable is True:
        ops.append({"op": "add", "path": "/spec/unschedulable", "value": True})
    elif unschedulable is False and "unschedulable" in spec:
        ops.append({"op": "remove", "path": "/spec/unschedulable"})
    return ops


def _condition(node: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for c in (node.get("status") or {}).get("conditions") or []:
        if c.get("type") == kind:
            return c
    return None


def _record(node: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = _annotations(node).get(RECORD)
    if not raw:
        return None
    try:
        record = json.loads(raw)
    except ValueError:
        return {"reason": "Unknown", "message": raw, "since": "", "by": ""}
    return record if isinstance(record, dict) else None


def _pool_of(node: Mapping[str, Any], labels: Sequence[str]) -> str:
    return pool_of(node, labels=labels) or ""  # NB: nodes without a pool label form one pool for the breaker


def _is_gpu_node(node: Mapping[str, Any], telemetry: ClusterTelemetry) -> bool:
    if _name(node) in telemetry.nodes:
        return True
    labels = _labels(node)
    if labels.get("nvidia.com/gpu.present") == "true" or labels.get(GPU_COUNT_LABEL):
        return True
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return str(allocatable.get("nvidia.com/gpu", "0")) not in ("", "0")


@dataclass
class _Breaker:
    """Which nodes count against the limits, and the limits. Pure bookkeeping for one plan."""

    pool_size: dict[str, int]
    cluster_size: int
    acting: dict[str, set[str]]  # pool → nodes acted on now or within the window
    recent: dict[str, float]  # node → when acted on (from the state ConfigMap), within the window
    policy: RemediationPolicy
    added: dict[str, float] = field(default_factory=dict)

    def limit(self, size: int, share: float) -> int:
        return max(self.policy.breaker.min_nodes, math.floor(share * size + 1e-9))

    def admit(self, node: str, pool: str, now: float) -> str | None:
        """None when ``node`` may be acted on (and counts from now on), else why not."""
        if any(node in nodes for nodes in self.acting.values()):
            return None
        in_pool = self.acting.setdefault(pool, set())
        pool_limit = self.limit(self.pool_size.get(pool, 0), self.policy.breaker.max_pool_share)
        if len(in_pool) + 1 > pool_limit:
            share = self.policy.breaker.max_pool_share
            size = self.pool_size.get(pool, 0)
            where = pool or "(unpooled)"
            return f"pool {where}: {len(in_pool)} of {size} GPU nodes acted on (limit {pool_limit}, {share:.0%})"
        total = sum(len(nodes) for nodes in self.acting.values())
        cluster_limit = self.limit(self.cluster_size, self.policy.breaker.max_cluster_share)
        if total + 1 > cluster_limit:
            share = self.policy.breaker.max_cluster_share
            size = self.cluster_size
            return f"cluster: {total} of {size} GPU nodes acted on (limit {cluster_limit}, {share:.0%})"
        in_pool.add(node)
        self.added[node] = now
        return None


@dataclass(frozen=True)
class HealthPlanner:
    """The health remediation planner. ``identity`` is written as "who" in annotations; ``state_namespace`` /
    ``state_name`` name the ConfigMap keeping the breaker's recent actions."""

    policy: RemediationPolicy
    diagnosis: DiagnosisPolicy
    actions: HealthActions = field(default_factory=HealthActions)
    drain_policy: DrainPolicy = field(default_factory=DrainPolicy)
    identity: str = "gpuscale-controller"
    state_namespace: str = "gpuscale"
    state_name: str = "gpuscale-controller-state"
    name: str = "health"

    # -- the plan

    def plan(self, view: ClusterView, telemetry: ClusterTelemetry, *, now: float) -> list[Write]:
        policy = self.policy
        nodes = [n for n in view.objects("v1", "Node") if _is_gpu_node(n, telemetry)]
        breaker = self._breaker(view, nodes, now=now)
        writes: list[Write] = []
        for node in nodes:
            if self._opted_out(node):
                writes.extend(self._release({**node, _HAD_ANNOTATIONS: bool(_annotations(node))}, now=now))
                continue
            node = {**node, _HAD_ANNOTATIONS: bool(_annotations(node))}  # NB: this plan's copy: see _patch
            tel = telemetry.node(_name(node))
            if tel is None or not tel.reporting:
                continue  # NB: unknown is not healthy: no new step and no undo
            problems = node_problems(tel, labels=_labels(node), policy=policy, diagnosis=self.diagnosis)
            fatal = [p for p in problems if p.action == "remediate"]
            if fatal:
                writes.extend(self._remediate(view, node, fatal, breaker, now=now))
            elif _record(node) is not None:
                writes.extend(self._recover(node, now=now))
            writes.extend(self._warnings(node, [p for p in problems if p.action == "warn"]))
        # NB: the breaker's record goes first, as a barrier: if it cannot be written (another leader wrote it
        # meanwhile), none of the steps it admitted is taken; a step taken is always on record.
        return [*self._save_breaker(view, breaker, now=now), *writes]

    def remediates(self, node: Mapping[str, Any], telemetry: NodeGpuTelemetry) -> bool:
        """Whether this planner takes a disruptive step on ``node`` for what ``telemetry`` shows (or keeps it out):
        a remediating problem, taint or cordon switched on, not opted out. Pure; other planners ask it."""
        if self._opted_out(node) or not telemetry.reporting or not (self.actions.taint or self.actions.cordon):
            return False
        problems = node_problems(telemetry, labels=_labels(node), policy=self.policy, diagnosis=self.diagnosis)
        return any(p.action == "remediate" for p in problems)

    def _opted_out(self, node: Mapping[str, Any]) -> bool:
        labels, rule = _labels(node), self.policy.opt_out
        if labels.get(rule.label) == rule.value:
            return True
        return rule.defer_to_nvsentinel and labels.get(rule.nvsentinel_label) != "false"

    # -- breaker

    def _breaker(self, view: ClusterView, nodes: Iterable[Mapping[str, Any]], *, now: float) -> _Breaker:
        pool_size: dict[str, int] = {}
        acting: dict[str, set[str]] = {}
        pool_by_node: dict[str, str] = {}
        for node in nodes:
            pool = _pool_of(node, self.policy.pool_labels)
            pool_by_node[_name(node)] = pool
            pool_size[pool] = pool_size.get(pool, 0) + 1
            if self._acted_on(node):
                acting.setdefault(pool, set()).add(_name(node))
        # NB: the window's memory is the ConfigMap and, should it be lost, the recoveries our condition records
        # (its lastTransitionTime to True): deleting the ConfigMap cannot reset the breaker.
        remembered = {**self._recovered_at(nodes), **self._breaker_state(view)}
        recent = {
            node: at
            for node, at in remembered.items()
            if now - at < self.policy.breaker.window and node in pool_by_node
        }
        for node in recent:
            acting.setdefault(pool_by_node[node], set()).add(node)
        return _Breaker(pool_size, len(pool_by_node), acting, recent, self.policy)

    def _acted_on(self, node: Mapping[str, Any]) -> bool:
        """Whether a disruptive step of ours is on the node now: our annotations, or our taint (a step is
        counted even if someone removed the annotations that record it)."""
        annotations = _annotations(node)
        if annotations.get(TAINTED_BY) or annotations.get(CORDONED_BY):
            return True
        return any(t.get("key") == self.policy.taint.key for t in (node.get("spec") or {}).get("taints") or [])

    def _recovered_at(self, nodes: Iterable[Mapping[str, Any]]) -> dict[str, float]:
        """node → when our condition last turned True after a remediation (``GpuRecovered``)."""
        out = {}
        for node in nodes:
            condition = _condition(node, self.policy.condition_type)
            if condition and condition.get("status") == "True" and condition.get("reason") == "GpuRecovered":
                at = _parse_iso(condition.get("lastTransitionTime") or "")
                if at is not None:
                    out[_name(node)] = at
        return out

    def _breaker_state(self, view: ClusterView) -> dict[str, float]:
        cm = view.get("v1", "ConfigMap", self.state_name, self.state_namespace)
        raw = ((cm or {}).get("data") or {}).get("breaker", "")
        try:
            acted = json.loads(raw).get("acted", {}) if raw else {}
        except (ValueError, AttributeError):
            return {}
        out = {}
        for node, when in acted.items() if isinstance(acted, dict) else ():
            at = _parse_iso(when) if isinstance(when, str) else None
            if at is not None:
                out[node] = at
        return out

    def _save_breaker(self, view: ClusterView, breaker: _Breaker, *, now: float) -> list[Write]:
        if not breaker.added:
            return []
        acted = {**breaker.recent, **breaker.added}
        data = {"breaker": json.dumps({"acted": {n: _iso(t) for n, t in sorted(acted.items())}}, sort_keys=True)}
        why = f"breaker: acted on {', '.join(sorted(breaker.added))}"
        current = view.get("v1", "ConfigMap", self.state_name, self.state_namespace)
        if current is None:
            manifest = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": self.state_name, "namespace": self.state_namespace},
                "data": data,
            }
            return [Create(manifest, why, barrier=True)]
        key = ObjectKey("v1", "ConfigMap", self.state_name, self.state_namespace)
        # NB: read-modify-write of the record: conditional on the version read (another leader's entries stay).
        version = (current.get("metadata") or {}).get("resourceVersion")
        return [Patch(key, {"data": data}, why, resource_version=version, barrier=True)]

    # -- remediation

    def _remediate(
        self,
        view: ClusterView,
        node: Mapping[str, Any],
        problems: list[Problem],
        breaker: _Breaker,
        *,
        now: float,
    ) -> list[Write]:
        name = _name(node)
        key = ObjectKey("v1", "Node", name)
        annotations = _annotations(node)
        old = _record(node)
        reason = problems[0].reason
        message = "; ".join(dict.fromkeys(p.text for p in problems))[:1000]
        record = {
            "reason": reason,
            "message": message,
            "since": (old or {}).get("since") or _iso(now),
            "by": self.identity,
        }
        record_text = json.dumps(record, sort_keys=True)
        why = f"{reason}: {message}"
        writes: list[Write] = []
        if self.actions.events and (old is None or old.get("message") != message):
            writes.append(Emit(key, "Warning", "GpuUnhealthy", message))
        writes.extend(self._conditions(node, "False", reason, message, now=now))
        overridden = set(filter(None, annotations.get(OVERRIDDEN, "").split(",")))
        notes: dict[str, Any] = {}
        if old is None or record_text != annotations.get(RECORD):
            notes[RECORD] = record_text
        taints = list((node.get("spec") or {}).get("taints") or [])
        has_taint = any(t.get("key") == self.policy.taint.key for t in taints)
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        # A person undid one of our steps: record it, never redo it this episode.
        if annotations.get(TAINTED_BY) and not has_taint:
            notes[TAINTED_BY] = None
            overridden.add("taint")
        if annotations.get(CORDONED_BY) and not cordoned:
            notes[CORDONED_BY] = None
            overridden.add("cordon")
        if ",".join(sorted(overridden)) != annotations.get(OVERRIDDEN, ""):
            notes[OVERRIDDEN] = ",".join(sorted(overridden))
        want_taint = self.actions.taint and "taint" not in overridden and not has_taint
        want_cordon = self.actions.cordon and "cordon" not in overridden and not cordoned
        disruptive = want_taint or want_cordon or (self.actions.drain and bool(annotations.get(CORDONED_BY)))
        held = breaker.admit(name, _pool_of(node, self.policy.pool_labels), now) if disruptive else None
        if held is not None:
            if annotations.get(HELD_BACK) != held:
                notes[HELD_BACK] = held
                if self.actions.events:
                    writes.append(Emit(key, "Warning", "RemediationHeldBack", f"{message} — held back: {held}"))
            if notes:
                writes.append(self._patch(node, f"{why} (held back: {held})", annotations=notes))
            return writes
        if annotations.get(HELD_BACK):
            notes[HELD_BACK] = None
        # NB: taint, cordon and their record in one JSON patch: atomic, and one guard for all of it.
        steps = [s for s, wanted in (("taint", want_taint), ("cordon", want_cordon)) if wanted]
        changes: dict[str, Any] = {}
        if want_taint:
            taint = {"key": self.policy.taint.key, "value": reason, "effect": self.policy.taint.effect}
            notes[TAINTED_BY] = self.identity
            changes["taints"] = [*taints, taint]
        if want_cordon:
            notes[CORDONED_BY] = self.identity
            changes["unschedulable"] = True
        if notes or changes:
            prefix = f"{', '.join(steps)}: " if steps else ""
            writes.append(self._patch(node, f"{prefix}{why}", annotations=notes, **changes))
        if self.actions.drain and annotations.get(CORDONED_BY) and cordoned:
            writes.extend(plan_drain(view, name, policy=self.drain_policy, why=f"drain: {why}"))
        return writes

    def _patch(self, node: dict[str, Any], why: str, **changes: Any) -> Patch:
        """A JSON patch of ``node``; ``node`` (this plan's copy) then shows the change, so the next patch planned
        for it in the same reconcile is computed against what the first one leaves."""
        key = ObjectKey("v1", "Node", _name(node))
        patch = Patch(key, node_json_patch(node, **changes), why, patch_type="json")
        meta = node["metadata"] = dict(node.get("metadata") or {})
        spec = node["spec"] = dict(node.get("spec") or {})
        notes = {**(meta.get("annotations") or {}), **(changes.get("annotations") or {})}
        meta["annotations"] = {k: v for k, v in notes.items() if v is not None}
        if changes.get("taints") is not None:
            spec["taints"] = changes["taints"]
        if changes.get("unschedulable") is not None:
            spec["unschedulable"] = changes["unschedulable"]
        return patch

    def _conditions(
        self, node: Mapping[str, Any], status: str, reason: str, message: str, *, now: float
    ) -> list[Write]:
        if not self.actions.condition:
            return []
        wanted = [self.policy.condition_type]
        annotations = _annotations(node)
        if self.policy.owns_accelerated_hardware_ready and (status == "False" or annotations.get(AHR_BY)):
            wanted.append(AHR)
        changes = []
        for kind in wanted:
            current = _condition(node, kind)
            if current is not None and (current.get("status"), current.get("reason"), current.get("message")) == (
                status,
                reason,
                message,
            ):
                continue
            if current is None and status == "True":
                continue
            transition = current.get("lastTransitionTime") if current and current.get("status") == status else None
            changes.append(
                {
                    "type": kind,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": _iso(now),
                    "lastTransitionTime": transition or _iso(now),
                }
            )
        if not changes:
            return []
        key = ObjectKey("v1", "Node", _name(node))
        writes: list[Write] = [
            Patch(
                key,
                {"status": {"conditions": changes}},
                f"condition {', '.join(c['type'] for c in changes)}={status}: {reason}",
                patch_type="strategic",
                subresource="status",
            )
        ]
        if AHR in wanted and status == "False" and not annotations.get(AHR_BY):
            writes.append(self._patch(node, f"{AHR} set by us", annotations={AHR_BY: self.identity}))
        return writes

    # -- recovery

    def _recover(self, node: dict[str, Any], *, now: float) -> list[Write]:
        name = _name(node)
        key = ObjectKey("v1", "Node", name)
        annotations = _annotations(node)
        old = _record(node) or {}
        # NB: undo only once the node has stayed clean for recovery.healthy_for (a flapping GPU stays out); when
        # it was first seen clean is kept in the record, so a restart does not restart the wait.
        clean_since = _parse_iso(old.get("clean_since", "")) if old.get("clean_since") else None
        if self.policy.recovery.healthy_for > 0 and (
            clean_since is None or now - clean_since < self.policy.recovery.healthy_for
        ):
            if clean_since is not None:
                return []
            record = json.dumps({**old, "clean_since": _iso(now)}, sort_keys=True)
            return [
                self._patch(node, f"{old.get('reason', '')}: clean since {_iso(now)}", annotations={RECORD: record})
            ]
        message = f"GPU health problems cleared ({old.get('reason', 'unknown')} since {old.get('since', '?')})"
        writes: list[Write] = list(self._conditions(node, "True", "GpuRecovered", message, now=now))
        spec = node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        ours = [t for t in taints if t.get("key") == self.policy.taint.key]
        writes.append(
            self._patch(
                node,
                f"recovered: undo {old.get('reason', '')} remediation",
                annotations={k: None for k in ANNOTATIONS if k in annotations and k != WARNINGS},
                taints=[t for t in taints if t not in ours] if annotations.get(TAINTED_BY) and ours else None,
                # NB: only a node we cordoned is uncordoned; a person's cordon stays
                unschedulable=False if annotations.get(CORDONED_BY) and spec.get("unschedulable") else None,
            )
        )
        if self.actions.events:
            writes.append(Emit(key, "Normal", "GpuRecovered", message))
        return writes

    # -- opt-out

    def _release(self, node: dict[str, Any], *, now: float) -> list[Write]:
        """A node opted out after we acted on it: take off our taint, our condition(s), our annotations and the
        cordon we put there — nothing anyone else wrote."""
        annotations = _annotations(node)
        spec = node.get("spec") or {}
        taints = list(spec.get("taints") or [])
        ours = [t for t in taints if t.get("key") == self.policy.taint.key] if annotations.get(TAINTED_BY) else []
        notes = {k: None for k in ANNOTATIONS if k in annotations}
        uncordon = bool(annotations.get(CORDONED_BY) and spec.get("unschedulable"))
        owned = [self.policy.condition_type] + ([AHR] if annotations.get(AHR_BY) else [])
        conditions = [c for c in owned if _condition(node, c) is not None]
        if not (ours or notes or uncordon or conditions):
            return []
        why = "opted out: gpuscale's own marks removed"
        writes: list[Write] = []
        if conditions:
            patch = {"status": {"conditions": [{"type": c, "$patch": "delete"} for c in conditions]}}
            writes.append(
                Patch(ObjectKey("v1", "Node", _name(node)), patch, f"{why}: condition {', '.join(conditions)}",
                      patch_type="strategic", subresource="status")
            )  # fmt: skip
        if ours or notes or uncordon:
            writes.append(
                self._patch(
                    node,
                    why,
                    annotations=notes or None,
                    taints=[t for t in taints if t not in ours] if ours else None,
                    unschedulable=False if uncordon else None,
                )
            )
        if self.actions.events:
            writes.append(Emit(ObjectKey("v1", "Node", _name(node)), "Normal", "RemediationOptedOut", why))
        return writes

    # -- warnings

    def _warnings(self, node: Mapping[str, Any], problems: list[Problem]) -> list[Write]:
        summary = ",".join(dict.fromkeys(f"{p.reason}:{p.gpu}" for p in problems))
        if summary == _annotations(node).get(WARNINGS, ""):
            return []
        key = ObjectKey("v1", "Node", _name(node))
        writes: list[Write] = []
        if problems and self.actions.events:
            writes.append(Emit(key, "Warning", "GpuWarning", "; ".join(dict.fromkeys(p.text for p in problems))))
        writes.append(self._patch(node, f"warnings: {summary or 'cleared'}", annotations={WARNINGS: summary or None}))
        return writes
