"""What ``gpuscale top`` shows: the resolved ``-n/-A/-l`` of a view, and which items fall in it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from gpuscale.errors import GpuscaleError, MetricNotFound, ObjectNotFound
from gpuscale.metrics.devices import GpuStatus
from gpuscale.metrics.rollups import NodeStatus, PodStatus
from gpuscale.selectors import LabelSelector
from gpuscale.top.document import Scope, View

if TYPE_CHECKING:
    from gpuscale.sources.cluster_index import ClusterObjects

__all__ = ["Selection", "resolve_selection"]

_I = TypeVar("_I", GpuStatus, PodStatus, NodeStatus)


@dataclass(frozen=True, slots=True)
class Selection:
    """The resolved -n/-A/-l: ``namespace`` None = every namespace (or a cluster-scoped view)."""

    view: View
    namespace: str | None
    selector: LabelSelector | None
    cluster: ClusterObjects | None

    @property
    def scope(self) -> Scope:
        text = str(self.selector) if self.selector is not None and not self.selector.is_empty else None
        return Scope(namespace=self.namespace, all_namespaces=self.namespace is None, selector=text)

    def pod_in_scope(self, namespace: str, name: str) -> bool:
        if self.namespace is not None and namespace != self.namespace:
            return False
        if self.selector is None or self.selector.is_empty:
            return True
        info = self.cluster.pod(namespace, name) if self.cluster is not None else None
        return info is not None and self.selector.matches(info.labels)

    def node_in_scope(self, name: str) -> bool:
        if self.selector is None or self.selector.is_empty:
            return True
        labels = self.cluster.node_labels(name) if self.cluster is not None else None
        return labels is not None and self.selector.matches(labels)

    @property
    def narrows_pods(self) -> bool:
        """True when only some pods are asked for (-n, or -l on pods/gpus; -l on nodes selects nodes)."""
        if self.view == "nodes":
            return False
        return self.namespace is not None or (self.selector is not None and not self.selector.is_empty)

    def check_namespace(self) -> None:
        """ObjectNotFound for a namespace the Kubernetes API does not have (when one is known)."""
        cluster = self.cluster
        if cluster is None or not cluster.synced or self.namespace is None:
            return
        if self.namespace not in cluster.namespaces():
            raise ObjectNotFound(f'namespaces "{self.namespace}" not found')

    def nothing_found(self) -> MetricNotFound:
        what = {"gpus": "GPUs", "pods": "GPU pods", "nodes": "GPU nodes", "workloads": "workloads with a request rate"}
        where = ""
        namespaced = self.view in ("pods", "workloads")
        if self.namespace is not None:
            where = f' in namespace "{self.namespace}"'
        elif namespaced:
            where = " in any namespace"
        matching = f" matching -l {self.scope.selector}" if self.scope.selector else ""
        hint = " (use -A for every namespace)" if namespaced and self.namespace is not None else ""
        return MetricNotFound(f"no {what[self.view]} found{where}{matching}{hint}")

    def wanted(self, item: GpuStatus | PodStatus | NodeStatus) -> bool:
        if isinstance(item, NodeStatus):
            return self.node_in_scope(item.name)
        if isinstance(item, PodStatus):
            return self.pod_in_scope(item.namespace, item.name)
        if not self.narrows_pods:
            return True  # NB: the gpus view shows idle GPUs too unless pods are narrowed down
        return item.pod is not None and item.namespace is not None and self.pod_in_scope(item.namespace, item.pod)

    def kept(self, items: list[_I]) -> list[_I]:
        """Items in scope; MetricNotFound when none are."""
        everything = not self.narrows_pods and (self.selector is None or self.selector.is_empty)
        kept = items if everything else [i for i in items if self.wanted(i)]  # NB: -A: 5,000 pods, no test each
        if not kept:
            raise self.nothing_found()
        return kept


def resolve_selection(
    view: View,
    *,
    namespace: str | None,
    all_namespaces: bool,
    selector: str | None,
    kubeconfig: str | None,
    cluster: ClusterObjects | None,
) -> Selection:
    """-n/-A/-l as given, with kubectl's default namespace (the kubeconfig context's, else "default")."""
    if namespace is None and not all_namespaces and view in ("pods", "workloads"):
        namespace = _context_namespace(kubeconfig) if kubeconfig else "default"
    if view == "nodes":
        namespace = None  # NB: nodes are cluster-scoped; -n is accepted and ignored, as by kubectl top node
    return Selection(view, namespace, LabelSelector.parse(selector) if selector else None, cluster)


def _context_namespace(kubeconfig: str) -> str:
    """The current context's namespace in a kubeconfig, else "default" (as kubectl)."""
    from gpuscale.sources.kubeconfig import current_context, read_kubeconfig

    try:
        namespace = (current_context(read_kubeconfig(kubeconfig)) or {}).get("namespace")
    except GpuscaleError:
        return "default"  # NB: load_api_client reports a broken kubeconfig; here only the default matters
    return namespace if isinstance(namespace, str) and namespace else "default"
