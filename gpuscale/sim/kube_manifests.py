"""The simulated cluster rendered as Kubernetes API objects: Namespaces, Nodes, the dcgm-exporter DaemonSet and its
pods, Deployments + ReplicaSets, StatefulSets and Pods, as plain dicts in API JSON shape.

Pure: ``kube_objects(scenario)`` depends only on the scenario (its seed names and UIDs everything) and the
placements. Every pod's IP is 127.0.0.1, so a scraper that discovers targets from the Pods finds the simulated
exporters on loopback.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuscale.sim.gpu_nodes import SimNode, mig_counts
from gpuscale.sim.object_names import name_suffix, object_uid, template_hash
from gpuscale.sim.workloads import Placement, PodKey, SimWorkload

if TYPE_CHECKING:
    from gpuscale.sim.scenario import Scenario

__all__ = ["CREATION_TIMESTAMP", "DCGM_EXPORTER_NAMESPACE", "kube_objects"]

DCGM_EXPORTER_NAMESPACE = "gpu-operator"
DCGM_EXPORTER_NAME = "nvidia-dcgm-exporter"
DCGM_EXPORTER_IMAGE = "nvcr.io/nvidia/k8s/dcgm-exporter:4.4.2-4.7.1-ubuntu22.04"
DEFAULT_EXPORTER_PORT = 9400
DEFAULT_TRITON_METRICS_PORT = 8002
POD_IP = "127.0.0.1"
CREATION_TIMESTAMP = "2026-01-05T08:00:00Z"


def kube_objects(
    scenario: Scenario,
    *,
    triton_ports: Mapping[PodKey, int] | None = None,
    exporter_ports: Mapping[str, int] | None = None,
    placements: Sequence[Placement] | None = None,
) -> list[dict[str, Any]]:
    """The cluster as Kubernetes API objects (plain dicts, API JSON shape, no resourceVersion).

    ``triton_ports``: the metrics port of each Triton pod (default 8002); ``exporter_ports``: the
    dcgm-exporter port per node (default 9400). Every pod's IP is 127.0.0.1 so a scraper that
    discovers targets from the Pods finds the simulated exporters on loopback.
    """
    if placements is None:
        placements = scenario.placements()
    triton_ports = triton_ports or {}
    exporter_ports = exporter_ports or {}
    objects: list[dict[str, Any]] = []
    namespaces = sorted({DCGM_EXPORTER_NAMESPACE, *(w.namespace for w in scenario.workloads)})
    objects.extend(_namespace(scenario, ns) for ns in namespaces)
    objects.extend(_node(scenario, node) for node in scenario.nodes)
    objects.append(_dcgm_daemonset(scenario))
    objects.extend(
        _dcgm_pod(scenario, node, exporter_ports.get(node.name, DEFAULT_EXPORTER_PORT)) for node in scenario.nodes
    )
    by_workload: dict[str, list[Placement]] = {w.key: [] for w in scenario.workloads}
    for p in placements:
        by_workload.setdefault(p.workload_key, []).append(p)
    for w in scenario.workloads:
        pods = by_workload[w.key]
        if w.kind == "Deployment":
            objects.append(_deployment(scenario, w, pods))
            objects.append(_replicaset(scenario, w, pods))
        else:
            objects.append(_statefulset(scenario, w, pods))
    for w in scenario.workloads:
        for p in by_workload[w.key]:
            objects.append(_pod(scenario, w, p, triton_ports.get(p.key, DEFAULT_TRITON_METRICS_PORT)))
    return objects


def _meta(scenario: Scenario, kind: str, name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta["namespace"] = namespace
    meta["uid"] = object_uid(scenario.seed, kind, namespace, name)
    meta["creationTimestamp"] = CREATION_TIMESTAMP
    meta.update(extra)
    return meta


def _owner_ref(scenario: Scenario, kind: str, name: str, namespace: str | None) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": object_uid(scenario.seed, kind, namespace, name),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _namespace(scenario: Scenario, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": _meta(scenario, "Namespace", name, labels={"kubernetes.io/metadata.name": name}),
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"},
    }


def _node(scenario: Scenario, node: SimNode) -> dict[str, Any]:
    whole = sum(1 for g in node.gpus if not g.mig)
    capacity = {
        "cpu": str(node.cpu_cores),
        "ephemeral-storage": "3905109820Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": f"{node.memory_gib * 1024 * 1024}Ki",
        "nvidia.com/gpu": str(whole),
        "pods": "110",
    }
    for profile, count in mig_counts(node.gpus).items():
        capacity[f"nvidia.com/mig-{profile}"] = str(count)
    allocatable = dict(capacity)
    allocatable["cpu"] = f"{node.cpu_cores * 1000 - 550}m"
    allocatable["memory"] = f"{node.memory_gib * 1024 * 1024 - 1_968_000}Ki"
    allocatable["ephemeral-storage"] = "3598798019722"
    conditions = [
        _condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
        _condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
        _condition("PIDPressure", "False", "KubeletHasSufficientPID"),
        _condition("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
    ]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": _meta(scenario, "Node", node.name, labels=dict(node.labels)),
        "spec": {"providerID": f"sim:///{node.name}"},
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": conditions,
            "addresses": [
                {"type": "InternalIP", "address": POD_IP},
                {"type": "Hostname", "address": node.name},
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://1.7.23",
                "kernelVersion": "6.1.119-129.201.amzn2023.x86_64",
                "kubeProxyVersion": "v1.31.4",
                "kubeletVersion": "v1.31.4",
                "operatingSystem": "linux",
                "osImage": "Amazon Linux 2023.6.20250107",
            },
        },
    }


def _dcgm_daemonset(scenario: Scenario) -> dict[str, Any]:
    labels = {"app": DCGM_EXPORTER_NAME}
    n = len(scenario.nodes)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _meta(
            scenario, "DaemonSet", DCGM_EXPORTER_NAME, DCGM_EXPORTER_NAMESPACE, labels=dict(labels), generation=1
        ),
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "hostNetwork": True,
                    "nodeSelector": {"nvidia.com/gpu.deploy.dcgm-exporter": "true"},
                    "containers": [{"name": DCGM_EXPORTER_NAME, "image": DCGM_EXPORTER_IMAGE}],
                },
            },
        },
        "status": {
            "currentNumberScheduled": n,
            "desiredNumberScheduled": n,
            "numberAvailable": n,
            "numberMisscheduled": 0,
            "numberReady": n,
            "observedGeneration": 1,
            "updatedNumberScheduled": n,
        },
    }


def _dcgm_pod(scenario: Scenario, node: SimNode, port: int) -> dict[str, Any]:
    name = f"{DCGM_EXPORTER_NAME}-{name_suffix(scenario.seed, DCGM_EXPORTER_NAME, node.name)}"
    revision = template_hash(scenario.seed, "DaemonSet", DCGM_EXPORTER_NAME)
    labels = {"app": DCGM_EXPORTER_NAME, "controller-revision-hash": revision, "pod-template-generation": "1"}
    container = {
        "name": DCGM_EXPORTER_NAME,
        "image": DCGM_EXPORTER_IMAGE,
        "args": [f"--address=:{port}", "--kubernetes=true"],
        "env": [
            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "DCGM_EXPORTER_KUBERNETES", "value": "true"},
            {"name": "DCGM_EXPORTER_LISTEN", "value": f":{port}"},
        ],
        "ports": [{"name": "metrics", "containerPort": port, "hostPort": port, "protocol": "TCP"}],
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _meta(
            scenario,
            "Pod",
            name,
            DCGM_EXPORTER_NAMESPACE,
            labels=labels,
            ownerReferences=[_owner_ref(scenario, "DaemonSet", DCGM_EXPORTER_NAME, DCGM_EXPORTER_NAMESPACE)],
        ),
        "spec": {
            "nodeName": node.name,
            "hostNetwork": True,
            "containers": [container],
            "restartPolicy": "Always",
            "schedulerName": "default-scheduler",
            "serviceAccountName": DCGM_EXPORTER_NAME,
        },
        "status": _running_status(DCGM_EXPORTER_NAME, DCGM_EXPORTER_IMAGE),
    }


def _template_spec(w: SimWorkload, *, triton_port: int = DEFAULT_TRITON_METRICS_PORT) -> dict[str, Any]:
    count = str(w.gpus_per_pod)
    container: dict[str, Any] = {
        "name": w.container,
        "image": w.container_image,
        "resources": {
            "limits": {w.gpu_resource: count, "cpu": "8", "memory": "64Gi"},
            "requests": {w.gpu_resource: count, "cpu": "4", "memory": "32Gi"},
        },
    }
    if w.triton_models:
        container["args"] = [
            "tritonserver",
            "--model-repository=/models",
            f"--metrics-port={triton_port}",
        ]
        container["ports"] = [
            {"name": "http", "containerPort": 8000, "protocol": "TCP"},
            {"name": "grpc", "containerPort": 8001, "protocol": "TCP"},
            {"name": "metrics", "containerPort": triton_port, "protocol": "TCP"},
        ]
    spec: dict[str, Any] = {
        "containers": [container],
        "restartPolicy": "Always",
        "schedulerName": "default-scheduler",
    }
    if w.node_selector:
        spec["nodeSelector"] = dict(w.node_selector)
    return spec


def _workload_status(pods: Sequence[Placement]) -> tuple[int, int]:
    return len(pods), sum(1 for p in pods if p.scheduled)


def _deployment(scenario: Scenario, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
    total, ready = _workload_status(pods)
    labels = w.pod_labels
    status: dict[str, Any] = {
        "observedGeneration": 1,
        "replicas": total,
        "updatedReplicas": total,
        "readyReplicas": ready,
        "availableReplicas": ready,
        "conditions": [
            _condition(
                "Available",
                "True" if ready >= w.replicas else "False",
                "MinimumReplicasAvailable" if ready >= w.replicas else "MinimumReplicasUnavailable",
            ),
            _condition("Progressing", "True", "NewReplicaSetAvailable"),
        ],
    }
    if total - ready:
        status["unavailableReplicas"] = total - ready
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": _meta(
            scenario,
            "Deployment",
            w.name,
            w.namespace,
            labels=dict(labels),
            generation=1,
            annotations={"deployment.kubernetes.io/revision": "1"},
        ),
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": _template_spec(w)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "revisionHistoryLimit": 10,
            "progressDeadlineSeconds": 600,
        },
        "status": status,
    }


def _replicaset(scenario: Scenario, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
    total, ready = _workload_status(pods)
    pod_hash = scenario.pod_template_hash(w)
    labels = {**w.pod_labels, "pod-template-hash": pod_hash}
    name = scenario.owner_name(w)
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": _meta(
            scenario,
            "ReplicaSet",
            name,
            w.namespace,
            labels=dict(labels),
            generation=1,
            annotations={"deployment.kubernetes.io/desired-replicas": str(w.replicas)},
            ownerReferences=[_owner_ref(scenario, "Deployment", w.name, w.namespace)],
        ),
        "spec": {
            "replicas": w.replicas,
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": _template_spec(w)},
        },
        "status": {
            "observedGeneration": 1,
            "replicas": total,
            "fullyLabeledReplicas": total,
            "readyReplicas": ready,
            "availableReplicas": ready,
        },
    }


def _statefulset(scenario: Scenario, w: SimWorkload, pods: Sequence[Placement]) -> dict[str, Any]:
    total, ready = _workload_status(pods)
    labels = w.pod_labels
    revision = f"{w.name}-{scenario.pod_template_hash(w)}"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": _meta(scenario, "StatefulSet", w.name, w.namespace, labels=dict(labels), generation=1),
        "spec": {
            "replicas": w.replicas,
            "serviceName": w.name,
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": _template_spec(w)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"partition": 0}},
        },
        "status": {
            "observedGeneration": 1,
            "replicas": total,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "currentReplicas": total,
            "updatedReplicas": total,
            "currentRevision": revision,
            "updateRevision": revision,
            "collisionCount": 0,
        },
    }


def _pod(scenario: Scenario, w: SimWorkload, p: Placement, triton_port: int) -> dict[str, Any]:
    labels = w.pod_labels
    if w.kind == "Deployment":
        labels["pod-template-hash"] = scenario.pod_template_hash(w)
        owner = _owner_ref(scenario, "ReplicaSet", scenario.owner_name(w), w.namespace)
    else:
        labels["apps.kubernetes.io/pod-index"] = str(p.ordinal)
        labels["controller-revision-hash"] = f"{w.name}-{scenario.pod_template_hash(w)}"
        labels["statefulset.kubernetes.io/pod-name"] = p.pod
        owner = _owner_ref(scenario, "StatefulSet", w.name, w.namespace)
    meta = {
        "name": p.pod,
        "namespace": p.namespace,
        "uid": p.uid,
        "creationTimestamp": CREATION_TIMESTAMP,
        "labels": labels,
        "ownerReferences": [owner],
    }
    if w.kind == "Deployment":
        meta["generateName"] = f"{scenario.owner_name(w)}-"
    if w.triton_models:
        meta["annotations"] = {
            "gpuscale.io/scrape": "true",
            "prometheus.io/scrape": "true",
            "prometheus.io/port": str(triton_port),
            "prometheus.io/path": "/metrics",
        }
    spec = _template_spec(w, triton_port=triton_port)
    if w.kind == "StatefulSet":
        spec["hostname"] = p.pod
        spec["subdomain"] = w.name
    if p.node is not None:
        spec["nodeName"] = p.node
        status = _running_status(w.container, w.container_image)
    else:
        status = {
            "phase": "Pending",
            "qosClass": "Burstable",
            "conditions": [
                _condition(
                    "PodScheduled",
                    "False",
                    "Unschedulable",
                    f"0/{len(scenario.nodes)} nodes are available: Insufficient {w.gpu_resource}.",
                )
            ],
        }
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def _condition(kind: str, status: str, reason: str | None = None, message: str | None = None) -> dict[str, Any]:
    cond: dict[str, Any] = {
        "type": kind,
        "status": status,
        "lastTransitionTime": CREATION_TIMESTAMP,
    }
    if reason:
        cond["reason"] = reason
    if message:
        cond["message"] = message
    return cond


def _running_status(container: str, image: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "qosClass": "Burstable",
        "hostIP": POD_IP,
        "hostIPs": [{"ip": POD_IP}],
        "podIP": POD_IP,
        "podIPs": [{"ip": POD_IP}],
        "startTime": CREATION_TIMESTAMP,
        "conditions": [
            _condition("PodReadyToStartContainers", "True"),
            _condition("Initialized", "True"),
            _condition("Ready", "True"),
            _condition("ContainersReady", "True"),
            _condition("PodScheduled", "True"),
        ],
        "containerStatuses": [
            {
                "name": container,
                "image": image,
                "ready": True,
                "started": True,
                "restartCount": 0,
                "state": {"running": {"startedAt": CREATION_TIMESTAMP}},
            }
        ],
    }
