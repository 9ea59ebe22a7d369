"""The resources the simulated API serves: their REST coordinates, discovery facts and field-selector labels,
indexed by path and by apiVersion/kind."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscale.sim.api_errors import ApiStatusError


@dataclass(frozen=True, slots=True)
class ResourceType:
    """One served resource: its REST coordinates, discovery facts and field-selector labels.

    ``storage`` names the store the objects live in; two resource types share one when they are views of the
    same objects (core and events.k8s.io Events). ``field_labels`` maps each supported field-selector label to
    the dotted path it reads in the stored object; ``field_defaults`` gives the value of an unset field.
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    subresources: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    tracks_generation: bool = False
    extra_field_labels: Mapping[str, str] = field(default_factory=dict)
    field_defaults: Mapping[str, str] = field(default_factory=dict)
    storage_name: str = ""
    custom: bool = False
    """Served from a CustomResourceDefinition (see ``SimKubeApi``'s custom resources)."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def storage(self) -> str:
        return self.storage_name or self.group_resource

    @property
    def group_resource(self) -> str:
        """``pods``, ``deployments.apps`` — how kube-apiserver names the resource in messages."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """``Pod``, ``Deployment.apps`` — how kube-apiserver names the kind in Invalid messages."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    @property
    def field_labels(self) -> dict[str, str]:
        labels = {"metadata.name": "metadata.name"}
        if self.namespaced:
            labels["metadata.namespace"] = "metadata.namespace"
        labels.update(self.extra_field_labels)
        return labels


INVOLVED = ("kind", "namespace", "name", "uid", "apiVersion", "resourceVersion", "fieldPath")
POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
RESOURCES: tuple[ResourceType, ...] = (
    ResourceType(
        "",
        "v1",
        "pods",
        "Pod",
        namespaced=True,
        short_names=("po",),
        subresources=("status", "binding", "eviction"),
        categories=("all",),
        extra_field_labels={p: p for p in POD_FIELDS},
        field_defaults={"spec.hostNetwork": "false"},
    ),
    ResourceType(
        "",
        "v1",
        "nodes",
        "Node",
        namespaced=False,
        short_names=("no",),
        subresources=("status",),
        extra_field_labels={"spec.unschedulable": "spec.unschedulable"},
        field_defaults={"spec.unschedulable": "false"},
    ),
    ResourceType(
        "",
        "v1",
        "namespaces",
        "Namespace",
        namespaced=False,
        short_names=("ns",),
        subresources=("status",),
        extra_field_labels={"status.phase": "status.phase"},
    ),
    ResourceType("", "v1", "configmaps", "ConfigMap", namespaced=True, short_names=("cm",)),
    ResourceType(
        "",
        "v1",
        "services",
        "Service",
        namespaced=True,
        short_names=("svc",),
        subresources=("status",),
        categories=("all",),
    ),
    ResourceType(
        "",
        "v1",
        "events",
        "Event",
        namespaced=True,
        short_names=("ev",),
        extra_field_labels={
            **{f"involvedObject.{f}": f"involvedObject.{f}" for f in INVOLVED},
            "reason": "reason",
            "reportingComponent": "reportingComponent",
            "source": "source.component",
            "type": "type",
        },
    ),
    ResourceType(
        "autoscaling",
        "v2",
        "horizontalpodautoscalers",
        "HorizontalPodAutoscaler",
        namespaced=True,
        short_names=("hpa",),
        subresources=("status",),
        categories=("all",),
    ),
    ResourceType(
        "apps",
        "v1",
        "deployments",
        "Deployment",
        namespaced=True,
        short_names=("deploy",),
        subresources=("status", "scale"),
        categories=("all",),
        tracks_generation=True,
    ),
    ResourceType(
        "apps",
        "v1",
        "statefulsets",
        "StatefulSet",
        namespaced=True,
        short_names=("sts",),
        subresources=("status", "scale"),
        categories=("all",),
        tracks_generation=True,
    ),
    ResourceType(
        "apps",
        "v1",
        "replicasets",
        "ReplicaSet",
        namespaced=True,
        short_names=("rs",),
        subresources=("status", "scale"),
        categories=("all",),
        tracks_generation=True,
    ),
    ResourceType(
        "apps",
        "v1",
        "daemonsets",
        "DaemonSet",
        namespaced=True,
        short_names=("ds",),
        subresources=("status",),
        categories=("all",),
        tracks_generation=True,
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", namespaced=True),
    # -- workload and extension kinds for batch controllers (PodTemplates, Jobs, CustomResourceDefinitions)
    ResourceType("", "v1", "podtemplates", "PodTemplate", namespaced=True),
    ResourceType(
        "batch",
        "v1",
        "jobs",
        "Job",
        namespaced=True,
        subresources=("status",),
        categories=("all",),
        tracks_generation=True,
        extra_field_labels={"status.successful": "status.succeeded"},
    ),
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        namespaced=False,
        short_names=("crd", "crds"),
        subresources=("status",),
        categories=("api-extensions",),
    ),
    ResourceType(
        "events.k8s.io",
        "v1",
        "events",
        "Event",
        namespaced=True,
        short_names=("ev",),
        extra_field_labels={
            **{f"regarding.{f}": f"involvedObject.{f}" for f in INVOLVED},
            "reason": "reason",
            "reportingController": "reportingComponent",
            "type": "type",
        },
        storage_name="events",  # the same objects as core v1 Events, converted on the way in and out
    ),
    # --- disruption: policy/v1 PodDisruptionBudgets (and pods/eviction above); their ``status`` is kept as the
    # disruption controller keeps it (gpuscale.sim.disruption_controller) whenever a pod or budget changes.
    ResourceType(
        "policy",
        "v1",
        "poddisruptionbudgets",
        "PodDisruptionBudget",
        namespaced=True,
        short_names=("pdb",),
        subresources=("status",),
        tracks_generation=True,
    ),
)
BY_PATH = {(rt.group, rt.version, rt.plural): rt for rt in RESOURCES}
BY_KIND = {(rt.api_version, rt.kind): rt for rt in RESOURCES}
GROUPS: dict[str, list[str]] = {}
for _rt in RESOURCES:
    if _rt.group and _rt.version not in GROUPS.setdefault(_rt.group, []):
        GROUPS[_rt.group].append(_rt.version)
# Create-only review resources: answered from policy, never stored (see SimKubeApi.add_token and allow).
TOKEN_REVIEWS = ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False)
ACCESS_REVIEWS = ResourceType(
    "authorization.k8s.io", "v1", "subjectaccessreviews", "SubjectAccessReview", namespaced=False
)
REVIEWS = {(rt.group, rt.version, rt.plural): rt for rt in (TOKEN_REVIEWS, ACCESS_REVIEWS)}
for _rt in REVIEWS.values():
    GROUPS.setdefault(_rt.group, []).append(_rt.version)


def resource_for(api_version: str, kind: str) -> ResourceType:
    """The served resource for an apiVersion/kind pair; ApiStatusError 404 when it is not served."""
    rt = BY_KIND.get((api_version, kind))
    if rt is None:
        served = ", ".join(sorted(f"{v}/{k}" for v, k in BY_KIND))
        raise ApiStatusError(404, "NotFound", f"no matches for kind {kind!r} in version {api_version!r} ({served})")
    return rt
