"""CustomResourceDefinitions of common batch-scheduling and autoscaling projects, for the simulated API server.

Each is the upstream CRD's identity only — group, served/storage versions, kind, plural, short names, scope and
subresources, as the projects publish them — with an open schema (``x-kubernetes-preserve-unknown-fields``),
since the simulated server does not validate schemas. Sources (names and versions read from the upstream
manifests; no schema text copied):

* Volcano ``PodGroup``: volcano-sh/apis ``pkg/apis/scheduling/v1beta1``
  (config/crd/bases/scheduling.volcano.sh_podgroups.yaml); Volcano ``Job``: ``pkg/apis/batch/v1alpha1``
  (config/crd/bases/batch.volcano.sh_jobs.yaml)
* coscheduling ``PodGroup``: kubernetes-sigs/scheduler-plugins ``apis/scheduling/v1alpha1``
  (manifests/crds/scheduling.x-k8s.io_podgroups.yaml)
* Kueue ``Workload``, ``AdmissionCheck``, ``LocalQueue``, ``ClusterQueue``: kubernetes-sigs/kueue
  ``apis/kueue/v1beta2`` (config/components/crd/bases)
* ``ProvisioningRequest``: kubernetes/autoscaler
  ``cluster-autoscaler/apis/provisioningrequest/autoscaling.x-k8s.io/v1`` (config/crd)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "ADMISSION_CHECK",
    "BATCH_SCHEDULING_CRDS",
    "CLUSTER_QUEUE",
    "COSCHEDULING_POD_GROUP",
    "KUEUE_WORKLOAD",
    "LOCAL_QUEUE",
    "PROVISIONING_REQUEST",
    "VOLCANO_JOB",
    "VOLCANO_POD_GROUP",
    "custom_resource_definition",
]


def custom_resource_definition(
    group: str,
    kind: str,
    plural: str,
    versions: Iterable[str],
    *,
    namespaced: bool = True,
    status: bool = True,
    short_names: Iterable[str] = (),
    categories: Iterable[str] = (),
) -> dict[str, Any]:
    """An ``apiextensions.k8s.io/v1`` CRD; the first of ``versions`` is the storage version."""
    names: dict[str, Any] = {"kind": kind, "plural": plural, "singular": kind.lower(), "listKind": f"{kind}List"}
    if short_names:
        names["shortNames"] = list(short_names)
    if categories:
        names["categories"] = list(categories)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced" if namespaced else "Cluster",
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": i == 0,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                    **({"subresources": {"status": {}}} if status else {}),
                }
                for i, version in enumerate(versions)
            ],
        },
    }


VOLCANO_POD_GROUP = custom_resource_definition(
    "scheduling.volcano.sh", "PodGroup", "podgroups", ["v1beta1"], short_names=["pg", "podgroup-v1beta1"]
)
VOLCANO_JOB = custom_resource_definition("batch.volcano.sh", "Job", "jobs", ["v1alpha1"], short_names=["vcjob", "vj"])
COSCHEDULING_POD_GROUP = custom_resource_definition(
    "scheduling.x-k8s.io", "PodGroup", "podgroups", ["v1alpha1"], short_names=["pg", "pgs"]
)
KUEUE_WORKLOAD = custom_resource_definition(
    "kueue.x-k8s.io", "Workload", "workloads", ["v1beta2"], short_names=["wl"], categories=["kueue"]
)
ADMISSION_CHECK = custom_resource_definition(
    "kueue.x-k8s.io", "AdmissionCheck", "admissionchecks", ["v1beta2"], namespaced=False, categories=["kueue"]
)
LOCAL_QUEUE = custom_resource_definition(
    "kueue.x-k8s.io", "LocalQueue", "localqueues", ["v1beta2"], short_names=["queue", "queues", "lq"]
)
CLUSTER_QUEUE = custom_resource_definition(
    "kueue.x-k8s.io", "ClusterQueue", "clusterqueues", ["v1beta2"], namespaced=False, short_names=["cq"]
)
PROVISIONING_REQUEST = custom_resource_definition(
    "autoscaling.x-k8s.io", "ProvisioningRequest", "provisioningrequests", ["v1"], short_names=["provreq", "provreqs"]
)
BATCH_SCHEDULING_CRDS = (
    VOLCANO_POD_GROUP,
    VOLCANO_JOB,
    COSCHEDULING_POD_GROUP,
    KUEUE_WORKLOAD,
    ADMISSION_CHECK,
    LOCAL_QUEUE,
    CLUSTER_QUEUE,
    PROVISIONING_REQUEST,
)
"""Every CRD above, ready for ``SimKubeApi.create``."""
