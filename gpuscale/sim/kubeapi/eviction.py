"""pods/eviction and PodDisruptionBudgets: an eviction is refused as kube-apiserver's eviction REST refuses it,
and every budget's status is kept as the disruption controller would keep it."""

from __future__ import annotations

import copy
from typing import Any

from aiohttp import web

from gpuscale.disruption import pdb_selects
from gpuscale.sim.api_errors import (
    ApiStatusError,
    bad_request,
)
from gpuscale.sim.disruption_controller import budget_status, can_ignore_budgets, eviction_verdict
from gpuscale.sim.kubeapi.payloads import (
    WriteOptions,
    json_response,
    timestamp,
)
from gpuscale.sim.kubeapi.storage import Commit, ObjectStore
from gpuscale.sim.kubeapi.writer import ObjectWriter
from gpuscale.sim.resources import (
    BY_KIND,
)

# --- pods/eviction: the Eviction API, PodDisruptionBudgets computed as the disruption controller would


def evict(
    store: ObjectStore, writer: ObjectWriter, namespace: str, name: str, body: Any, *, write: WriteOptions
) -> web.Response:
    """POST pods/{name}/eviction, as kube-apiserver's eviction REST does it.

    A Pending, finished (Succeeded/Failed) or terminating pod is deleted without consulting budgets.
    Otherwise the PDBs selecting the pod decide: more than one → 500 (unsupported, as upstream); one that
    forbids it (``eviction_verdict``, from the budget's status) → 429 TooManyRequests with kube-apiserver's
    ``DisruptionBudget`` cause; else the pod is deleted (``dryRun=All`` honoured) and the answer is a 201
    Success Status.
    """
    pods = BY_KIND[("v1", "Pod")]
    if not isinstance(body, dict) or body.get("kind", "Eviction") != "Eviction":
        raise bad_request("the body of the request must be an Eviction")
    meta = body.get("metadata") or {}
    if meta.get("name") not in (None, "", name):
        raise bad_request(f"name in URL does not match name in Eviction object: {meta.get('name')} vs {name}")
    pod = store.require(pods, namespace, name)
    if not can_ignore_budgets(pod):
        budgets = [
            b
            for (ns, _), b in store.of(BY_KIND[("policy/v1", "PodDisruptionBudget")]).items()
            if ns == namespace and pdb_selects(b, pod)
        ]
        if len(budgets) > 1:
            raise ApiStatusError(
                500,
                "",
                "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
            )
        if budgets:
            verdict = eviction_verdict(budgets[0], pod)
            if not verdict.allowed:
                details: dict[str, Any] = {"causes": [{"reason": "DisruptionBudget", "message": verdict.cause}]}
                headers = {}
                if verdict.retry_after_seconds:
                    details["retryAfterSeconds"] = verdict.retry_after_seconds
                    headers["Retry-After"] = str(verdict.retry_after_seconds)
                raise ApiStatusError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    details=details,
                    headers=headers,
                )
    writer.delete(pods, namespace, name, body.get("deleteOptions") or {}, write=write)
    return json_response(
        {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}, status=201
    )


def keep_budget_statuses(store: ObjectStore, namespace: str, *, commit: Commit) -> None:
    """The disruption controller's part: every PodDisruptionBudget of ``namespace`` gets the status computed
    from its pods (gpuscale.sim.disruption_controller), written like any status change (MODIFIED)."""
    budgets_rt = BY_KIND[("policy/v1", "PodDisruptionBudget")]
    budgets = [(k, b) for k, b in store.of(budgets_rt).items() if k[0] == namespace]
    if not budgets:
        return
    pods = [p for (ns, _), p in store.of(BY_KIND[("v1", "Pod")]).items() if ns == namespace]
    for _, budget in budgets:
        status = budget_status(budget, pods, now=timestamp(), previous=budget.get("status"))
        if status != budget.get("status"):
            updated = copy.deepcopy(budget)
            updated["status"] = status
            commit(budgets_rt, "MODIFIED", updated, budget)
