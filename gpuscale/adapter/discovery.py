"""Discovery documents: /apis, the API groups, and the resource lists built from the catalogue.

Listing never fails (custom-metrics-apiserver: ListAllMetrics "is not allowed to return an error"):
it is answered from the catalogue alone, even when every source is down, and is never empty.
"""

from __future__ import annotations

from gpuscale.adapter.wire import CUSTOM_GROUP, CUSTOM_VERSIONS, EXTERNAL_GROUP, EXTERNAL_VERSIONS
from gpuscale.metrics.catalogue import Catalogue

NAMESPACED = {
    "pods": True,
    "deployments.apps": True,
    "statefulsets.apps": True,
    "resourceclaims.resource.k8s.io": True,
    "nodes": False,
    "namespaces": False,
}


def _group(name: str, versions: tuple[str, ...], preferred: str) -> dict:
    return {
        "name": name,
        "versions": [{"groupVersion": f"{name}/{v}", "version": v} for v in versions],
        "preferredVersion": {"groupVersion": f"{name}/{preferred}", "version": preferred},
    }


class Discovery:
    def __init__(
        self,
        catalogue: Catalogue,
        *,
        serve_custom: bool = True,
        serve_external: bool = True,
        forecasts: tuple[str, ...] = (),
    ) -> None:
        """``forecasts``: the forecast metrics served (adapter/forecasts.py), for Deployments and StatefulSets
        and as external metrics."""
        self.serve_custom = serve_custom
        self.serve_external = serve_external
        self.groups: dict[str, dict] = {}
        if serve_custom:
            # NB: v1beta2 is preferred, as the APIService priorities (200 vs 100) make it on a real cluster.
            self.groups[CUSTOM_GROUP] = _group(CUSTOM_GROUP, CUSTOM_VERSIONS, "v1beta2")
        if serve_external:
            self.groups[EXTERNAL_GROUP] = _group(EXTERNAL_GROUP, EXTERNAL_VERSIONS, "v1beta1")
        pairs = [(m.name, r) for m in catalogue for r in m.resources]
        pairs += [(name, r) for name in forecasts for r in ("deployments.apps", "statefulsets.apps")]
        custom = [
            {
                "name": f"{resource}/{name}",
                "singularName": "",
                "namespaced": NAMESPACED[resource],
                "kind": "MetricValueList",
                "verbs": ["get"],
            }
            for name, resource in pairs
        ]
        external = [
            {
                "name": m,
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
            for m in [*(m.name for m in catalogue if m.external), *forecasts]
        ]
        # An empty list makes client-go warn "Got empty response for …" (custom-metrics-apiserver #146).
        if not custom:
            custom = [
                {
                    "name": "custommetrics",
                    "singularName": "",
                    "namespaced": False,
                    "kind": "MetricValueList",
                    "verbs": ["get"],
                }
            ]
        if not external:
            external = [
                {
                    "name": "externalmetrics",
                    "singularName": "",
                    "namespaced": True,
                    "kind": "ExternalMetricValueList",
                    "verbs": ["get"],
                }
            ]
        self._resources = {CUSTOM_GROUP: custom, EXTERNAL_GROUP: external}
        self.external_names = frozenset(r["name"] for r in external)

    def api_group_list(self) -> dict:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": list(self.groups.values())}

    def api_group(self, group: str) -> dict | None:
        g = self.groups.get(group)
        return {"kind": "APIGroup", "apiVersion": "v1", **g} if g else None

    def resource_list(self, group: str, version: str) -> dict | None:
        g = self.groups.get(group)
        if not g or version not in [v["version"] for v in g["versions"]]:
            return None
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}",
            "resources": self._resources[group],
        }
