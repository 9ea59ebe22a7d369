"""Workload owners from the Kubernetes API, for pods kube-state-metrics did not describe (``--kubeconfig``).

Only pods that still exist can be asked about: a pod gone before the report ran, with no ``kube_pod_owner`` in
the history either, stays a bare pod, and the report's gaps say so. A pod's controller ``ownerReference``
names its owner; a ReplicaSet's own controller reference names its Deployment. Two list calls (pods and
ReplicaSets, all namespaces), whatever the number of pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.history import Owner, PodRef

SOURCE = "kubernetes"


def _controller(meta: dict[str, Any]) -> tuple[str, str] | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") and ref.get("name"):
            return ref["kind"], ref["name"]
    return None


async def _list(call: Any) -> list[dict[str, Any]]:
    # NB: the raw JSON, not kubernetes_asyncio's models: only metadata is read, and the models reject objects a
    # controller has not filled in yet (a ReplicaSet without status.replicas).
    resp = await call(_preload_content=False)
    body = json.loads(await resp.read())
    return list(body.get("items") or [])


async def owners_from_kubernetes(api: Any, pods: Iterable[PodRef]) -> dict[PodRef, Owner]:
    """Owners of ``pods`` that exist now (``api`` is a kubernetes_asyncio ApiClient)."""
    from kubernetes_asyncio import client
    from kubernetes_asyncio.client.exceptions import ApiException

    wanted = set(pods)
    if not wanted:
        return {}
    try:
        pod_list = await _list(client.CoreV1Api(api).list_pod_for_all_namespaces)
        rs_list = await _list(client.AppsV1Api(api).list_replica_set_for_all_namespaces)
    except ApiException as e:
        raise SourceUnavailable(SOURCE, f"listing pods and ReplicaSets: HTTP {e.status} {e.reason}") from e
    except (OSError, ValueError) as e:
        raise SourceUnavailable(SOURCE, f"listing pods and ReplicaSets: {e}") from e
    deployments = {}
    for rs in rs_list:
        meta = rs.get("metadata") or {}
        owner = _controller(meta)
        if owner is not None:
            deployments[(meta.get("namespace"), meta.get("name"))] = owner
    out: dict[PodRef, Owner] = {}
    for pod in pod_list:
        meta = pod.get("metadata") or {}
        ref = PodRef(meta.get("namespace", ""), meta.get("name", ""))
        if ref not in wanted:
            continue
        owner = _controller(meta)
        if owner is None:
            out[ref] = Owner("Pod", ref.name, SOURCE)
            continue
        kind, name = owner
        if kind == "ReplicaSet" and (ref.namespace, name) in deployments:
            kind, name = deployments[(ref.namespace, name)]
        out[ref] = Owner(kind, name, SOURCE)
    return out
