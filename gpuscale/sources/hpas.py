"""The HorizontalPodAutoscalers of the cluster, cached by list+watch: which metrics they will ask for, and where.

The adapter's demand-driven refresh (metrics/refresh_scope.py) fetches at the full rate only the (metric, namespace)
scopes some HPA references; this cache is where those come from. It is the same list+watch loop as the pod
cache (``reflector.Reflector``: paged list, watch from its resourceVersion, 410 → relist, backoff), over
``autoscaling/v2`` HorizontalPodAutoscalers in every namespace, and keeps only each HPA's references.

The adapter's ServiceAccount needs ``list`` and ``watch`` on ``horizontalpodautoscalers.autoscaling``
(deploy/base/rbac.yaml). Until the first list succeeds (``synced``), or while it is refused, the adapter
refreshes every metric, as without demand — never less than what HPAs could ask for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes_asyncio import client

from gpuscale.metrics.refresh_scope import Scope, references
from gpuscale.sources.reflector import Reflector, WatchedKind, namespaced_name

__all__ = ["HpaCache"]


class HpaCache(Reflector):
    """Each HPA's (metric, namespace) references, kept current by list+watch (module docstring)."""

    name = "kubernetes-hpa"

    def __init__(
        self, api_client: client.ApiClient, *, watch_timeout_seconds: int = 300, backoff_max_seconds: float = 30
    ) -> None:
        super().__init__(watch_timeout_seconds=watch_timeout_seconds, backoff_max_seconds=backoff_max_seconds)
        self._refs: dict[tuple[str, str], tuple[Scope, ...]] = {}
        self.generation = 0
        """Bumped on every change of the references (an HPA added, changed or removed)."""
        autoscaling = client.AutoscalingV2Api(api_client)
        self._kinds = (
            WatchedKind(
                "horizontalpodautoscalers",
                autoscaling.list_horizontal_pod_autoscaler_for_all_namespaces,
                self._replace,
                self._put,
                self._remove,
            ),
        )

    def references(self) -> frozenset[Scope]:
        """Every (metric, namespace) some HPA names."""
        return frozenset(scope for refs in self._refs.values() for scope in refs)

    @property
    def count(self) -> int:
        """How many HPAs are cached."""
        return len(self._refs)

    def _replace(self, objects: list[dict[str, Any]]) -> None:
        self._refs = {namespaced_name(o): tuple(references(o)) for o in objects}
        self.generation += 1

    def _put(self, obj: Mapping[str, Any]) -> None:
        refs = tuple(references(obj))
        key = namespaced_name(obj)
        if self._refs.get(key) != refs:
            self._refs[key] = refs
            self.generation += 1

    def _remove(self, obj: Mapping[str, Any]) -> None:
        if self._refs.pop(namespaced_name(obj), None) is not None:
            self.generation += 1
