"""The adapter's watch cache: ``ClusterObjects`` (sources/cluster_index.py) kept current by list+watch
(sources/reflector.py) over kubernetes-asyncio — pods, namespaces, nodes, deployments and statefulsets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from kubernetes_asyncio import client

from gpuscale.sources.cluster_index import IndexedClusterObjects, PodInfo, WorkloadInfo
from gpuscale.sources.reflector import Reflector, WatchedKind, namespaced_name

__all__ = ["KubeCache"]

DEPLOYMENT = "Deployment"
STATEFULSET = "StatefulSet"


class KubeCache(IndexedClusterObjects, Reflector):
    """ClusterObjects kept current by list+watch over kubernetes-asyncio.

    ``start()`` launches one loop per kind (pods, namespaces, nodes, deployments, statefulsets) and returns at
    once; ``wait_synced()`` waits for every kind's first list. ``refresh_once()`` does one list pass, for
    callers that run no loops (tests, one-shot commands). The ApiClient stays the caller's to close.
    ``watch_timeout_seconds`` is the server-side ``timeoutSeconds`` of each watch request;
    ``backoff_max_seconds`` caps the doubling delay after errors.
    """

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        watch_timeout_seconds: int = 300,
        backoff_max_seconds: float = 30,
    ) -> None:
        IndexedClusterObjects.__init__(self)
        Reflector.__init__(self, watch_timeout_seconds=watch_timeout_seconds, backoff_max_seconds=backoff_max_seconds)
        core = client.CoreV1Api(api_client)
        apps = client.AppsV1Api(api_client)
        index = self._index
        self._kinds = (
            WatchedKind(
                "pods",
                core.list_pod_for_all_namespaces,
                lambda objs: index.set_pods(PodInfo.from_object(o) for o in objs),
                lambda obj: index.put_pod(PodInfo.from_object(obj)),
                lambda obj: index.remove_pod(*namespaced_name(obj)),
            ),
            WatchedKind(
                "namespaces",
                core.list_namespace,
                lambda objs: index.set_namespaces(namespaced_name(o)[1] for o in objs),
                lambda obj: index.put_namespace(namespaced_name(obj)[1]),
                lambda obj: index.remove_namespace(namespaced_name(obj)[1]),
            ),
            WatchedKind(
                "nodes",
                core.list_node,
                lambda objs: index.set_nodes({namespaced_name(o)[1]: _labels(o) for o in objs}),
                lambda obj: index.put_node(namespaced_name(obj)[1], _labels(obj)),
                lambda obj: index.remove_node(namespaced_name(obj)[1]),
            ),
            self._workload_kind("deployments", DEPLOYMENT, apps.list_deployment_for_all_namespaces),
            self._workload_kind("statefulsets", STATEFULSET, apps.list_stateful_set_for_all_namespaces),
        )

    def _workload_kind(self, name: str, kind: str, list_call: Callable[..., Awaitable[Any]]) -> WatchedKind:
        index = self._index
        return WatchedKind(
            name,
            list_call,
            lambda objs: index.set_workloads(kind, (WorkloadInfo.from_object(kind, o) for o in objs)),
            lambda obj: index.put_workload(WorkloadInfo.from_object(kind, obj)),
            lambda obj: index.remove_workload(kind, *namespaced_name(obj)),
        )


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})
