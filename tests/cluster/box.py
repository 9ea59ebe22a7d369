"""The cluster in a box: the real kube-scheduler, kwok and Karpenter (its kwok provider) beside a control plane of
their own, so that what gpuscale writes for the autoscaler is judged by the autoscaler.

Parts (each built once per machine by ``tests/cluster/build-part <part>``, cached outside the clone): kube-scheduler
of the control plane's release, kwok v0.8.0, Karpenter v1.15.0 ``kwok/main.go``. ``start_box`` starts, in order:

    etcd, kube-apiserver, kube-controller-manager   tests/cluster/controlplane.py, with BOX_CONTROLLERS
    kube-scheduler                                  as system:kube-scheduler; places every pod (no hand binding)
    kwok                                            the kubelet of Karpenter's nodes: Ready, leases, pods Running,
                                                    graceful deletions finished (kwok's own Stage files)
    Karpenter                                       NodePools → NodeClaims → kwok Nodes from GPU_INSTANCE_TYPES

Why a control plane of its own rather than the session's: node lifecycle must run here (it lifts the
``node.kubernetes.io/not-ready`` taint off new nodes, as in a cluster), and it would mark every hand-made node of
the other tests unreachable (they have no kubelet and no lease); a real scheduler and Karpenter would also place
and provision for the other tests' pods, which tests/cluster/kubelet.py binds by hand.

Karpenter's CRDs (``kwok/charts/crds``, ``kwok/apis/crds``) and kwok's Stage files are read from the Go module
cache, where building the part put them: they are then exactly those of the pinned release the binaries were built
from (``go.sum`` verified them on download), and no copy of upstream files in the clone can drift from it.

Nodes get GPU Feature Discovery labels (``nvidia.com/gpu.product``, ``.count``, ``.memory``, ``.present``) through
their instance type's offering requirements, and ``nvidia.com/gpu`` through its resources (as allocatable: the kwok
provider sets a node's capacity to what its NodeClaim requested).
``GpuExporter`` is dcgm-exporter for every kwok node's GPUs (gpuscale/sim's renderer): each GPU given to a running
pod, in pod-name order; activity per pod ``app`` label and an Xid per node set by the test.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuscale.sim.device_gauges import device_signals
from gpuscale.sim.exporters.dcgm import render_dcgm
from gpuscale.sim.gpu_activity import A100_SXM4_80GB, H100_SXM, Activity, GpuModel
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode
from tests.cluster.controlplane import (
    CONTROLLERS,
    ControlPlane,
    ControlPlaneUnavailable,
    _insecure,
    _spawn,
    _wait_healthy,
    cached_binaries,
    start_control_plane,
)
from tests.cluster.metrics_stack import DcgmExporter
from tests.cluster.parts import PartUnavailable, part_dir
from tests.cluster.rest import Rest
from tests.ports import free_port

__all__ = [
    "GPU_INSTANCE_TYPES",
    "Box",
    "GpuExporter",
    "gpu_pod_spec",
    "start_box",
    "start_box_for_tests",
]

HERE = Path(__file__).parent
PARTS = ("kube-scheduler", "kwok", "karpenter")
# The session control plane's controllers plus node lifecycle (not-ready taint lifted once kwok reports a node
# Ready; unreachable when its lease lapses), as in a cluster Karpenter runs in.
BOX_CONTROLLERS = (*CONTROLLERS, "nodelifecycle")
KARPENTER_CRDS = ("kwok/charts/crds", "kwok/apis/crds")
KWOK_STAGES = (
    "kustomize/stage/node/fast/node-initialize.yaml",
    "kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
    "kustomize/stage/pod/fast/pod-ready.yaml",
    "kustomize/stage/pod/fast/pod-complete.yaml",
    "kustomize/stage/pod/fast/pod-delete.yaml",
)
KWOK_NODE = ("kwok.x-k8s.io/node", "fake")  # the annotation and label Karpenter's kwok provider puts on its nodes
NODE_CLASS = "default"
POOL_TAINT = "gpuscale.test/pool"
ZONE = "test-zone-a"


@dataclass(frozen=True)
class GpuInstanceType:
    name: str
    hardware: GpuModel
    gpus: int
    price_per_gpu_hour: float  # NB: policies/prices.yaml's price for the product, so both rankings agree

    def entry(self) -> dict[str, Any]:
        """The instance type as the kwok provider's ``INSTANCE_TYPES_FILE_PATH`` file lists it (the shape of its
        ``kwok/cloudprovider/instance_types.json``); single-valued offering requirements become node labels."""
        gfd = {
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": self.hardware.product_label,
            "nvidia.com/gpu.count": str(self.gpus),
            "nvidia.com/gpu.memory": str(self.hardware.fb_total_mib),
        }
        requirements = [
            {"key": "karpenter.sh/capacity-type", "operator": "In", "values": ["on-demand"]},
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [ZONE]},
            *({"key": k, "operator": "In", "values": [v]} for k, v in gfd.items()),
        ]
        return {
            "name": self.name,
            "offerings": [
                {"Price": self.price_per_gpu_hour * self.gpus, "Available": True, "Requirements": requirements}
            ],
            "architecture": "amd64",
            "operatingSystems": ["linux"],
            "resources": {"cpu": "96", "memory": "1024Gi", "pods": "110", "nvidia.com/gpu": str(self.gpus)},
        }


GPU_INSTANCE_TYPES = (
    GpuInstanceType("h100-8x", H100_SXM, 8, 12.30),
    GpuInstanceType("a100-8x", A100_SXM4_80GB, 8, 5.12),
)
_HARDWARE = {t.hardware.product_label: t.hardware for t in GPU_INSTANCE_TYPES}


def module_dir(part: str, module: str) -> Path:
    """Where the Go module cache holds ``module`` at the version ``part`` pins (build-part downloaded it)."""
    gomod = (HERE / "go" / part / "go.mod").read_text()
    found = re.search(rf"^\s*(?:require\s+)?{re.escape(module)} (v\S+)", gomod, re.MULTILINE)
    if found is None:
        raise PartUnavailable(f"tests/cluster/go/{part}/go.mod pins no {module}")
    cache = (
        os.environ.get("GOMODCACHE")
        or subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True).stdout.strip()
    )
    # NB: module paths with capitals are escaped in the cache ("!x"); these modules have none.
    where = Path(cache) / f"{module}@{found.group(1)}"
    if not where.is_dir():
        raise PartUnavailable(
            f"{module}@{found.group(1)} is not in the module cache (run: bash tests/cluster/build-part {part})"
        )
    return where


@dataclass
class Box:
    """A running cluster in a box: ``plane`` (admin REST, kubectl) plus the scheduler, kwok and Karpenter."""

    plane: ControlPlane
    timings: dict[str, float]

    def rest(self) -> Rest:
        return self.plane.rest()

    def apply(self, *manifests: Mapping[str, Any]) -> None:
        """Server-side apply as the test (field manager ``gpuscale-test``)."""
        text = "\n---\n".join(json.dumps(m) for m in manifests)
        done = self.plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-f", "-", input=text)
        assert done.returncode == 0, done.stderr

    def nodepool(
        self,
        name: str,
        instance_types: Sequence[str],
        *,
        consolidate_after: str = "0s",
        policy: str = "WhenEmptyOrUnderutilized",
        weight: int | None = None,
    ) -> None:
        """A NodePool of ``instance_types`` whose nodes carry the taint ``gpuscale.test/pool=<name>:NoSchedule``,
        so only pods made for it (``gpu_pod_spec``) land there and concurrent scenarios never share nodes."""
        spec: dict[str, Any] = {
            "template": {
                "spec": {
                    "nodeClassRef": {"group": "karpenter.kwok.sh", "kind": "KWOKNodeClass", "name": NODE_CLASS},
                    "requirements": [
                        {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": list(instance_types)}
                    ],
                    "taints": [{"key": POOL_TAINT, "value": name, "effect": "NoSchedule"}],
                    "expireAfter": "Never",
                }
            },
            "disruption": {
                "consolidationPolicy": policy,
                "consolidateAfter": consolidate_after,
                "budgets": [{"nodes": "100%"}],
            },
        }
        if weight is not None:
            spec["weight"] = weight
        self.apply({"apiVersion": "karpenter.sh/v1", "kind": "NodePool", "metadata": {"name": name}, "spec": spec})

    def nodes(self, pool: str) -> list[dict[str, Any]]:
        """The Nodes of NodePool ``pool``, by name."""
        answer = self.rest().get("/api/v1/nodes", labelSelector=f"karpenter.sh/nodepool={pool}").expect(200)
        return sorted(answer["items"], key=lambda n: n["metadata"]["name"])

    def pods(self, namespace: str, selector: str = "") -> list[dict[str, Any]]:
        answer = self.rest().get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector or None)
        return sorted(answer.expect(200)["items"], key=lambda p: p["metadata"]["name"])

    def events(self, namespace: str, **params: Any) -> list[dict[str, Any]]:
        return self.rest().get(f"/api/v1/namespaces/{namespace}/events", **params).expect(200)["items"]


def gpu_pod_spec(pools: Sequence[str], *, gpus: int) -> dict[str, Any]:
    """A pod spec asking for ``gpus`` whole GPUs on a node of one of ``pools``: it tolerates those pools' taints
    only (NB: never ``operator: Exists`` — that tolerates the cordon and gpuscale's status taint too, and the
    scheduler would put an evicted pod straight back on the node being replaced)."""
    return {
        "containers": [
            {"name": "main", "image": "gpuscale.test/none", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        ],
        "tolerations": [{"key": POOL_TAINT, "operator": "Equal", "value": p, "effect": "NoSchedule"} for p in pools],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "karpenter.sh/nodepool", "operator": "In", "values": list(pools)}
                            ]
                        }
                    ]
                }
            }
        },
        "terminationGracePeriodSeconds": 0,
    }


def _write_stages(kwok_module: Path, workdir: Path) -> list[str]:
    paths = []
    for stage in KWOK_STAGES:
        source = kwok_module / stage
        target = workdir / f"kwok-{source.name}"
        shutil.copyfile(source, target)
        paths.append(str(target))
    return paths


def start_box(workdir: Path | None = None) -> Box:
    """Start the control plane, kube-scheduler, kwok and Karpenter; return once each is healthy and the node class
    is Ready. Raises ``ControlPlaneUnavailable`` (or ``PartUnavailable``) when something is not built or does not
    come up."""
    parts = {part: part_dir(part) for part in PARTS}
    karpenter_module = module_dir("karpenter", "sigs.k8s.io/karpenter")
    kwok_module = module_dir("kwok", "sigs.k8s.io/kwok")
    started = time.monotonic()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuscale-box-"))
    plane = start_control_plane(cached_binaries(), workdir, controllers=BOX_CONTROLLERS)
    timings = {"control plane": time.monotonic() - started}
    try:
        crds = [arg for d in KARPENTER_CRDS for arg in ("-f", str(karpenter_module / d))]
        applied = plane.kubectl("apply", "--server-side", *crds)
        if applied.returncode != 0:
            raise ControlPlaneUnavailable(f"Karpenter's CRDs: {applied.stderr}")

        scheduler_port = free_port()
        scheduler_config = plane.kubeconfig_for("system:kube-scheduler")
        scheduler = _spawn(
            "kube-scheduler",
            [
                str(parts["kube-scheduler"] / "kube-scheduler"),
                f"--kubeconfig={scheduler_config}",
                f"--authentication-kubeconfig={scheduler_config}",
                f"--authorization-kubeconfig={scheduler_config}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={scheduler_port}",
                "--profiling=false",
                "--v=1",
            ],
            workdir,
        )
        plane._processes.append(scheduler)

        kwok_port = free_port()
        kwok = _spawn(
            "kwok",
            [
                str(parts["kwok"] / "kwok"),
                f"--kubeconfig={plane.admin}",
                f"--config={','.join(_write_stages(kwok_module, workdir))}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={KWOK_NODE[0]}={KWOK_NODE[1]}",
                # NB: pod IPs nothing dials (TEST-NET-2); the tests' exporter stands in for what runs in them.
                "--cidr=198.18.0.0/16",
                "--node-ip=127.0.0.1",
                "--node-lease-duration-seconds=40",
                f"--server-address=127.0.0.1:{kwok_port}",
            ],
            workdir,
        )
        plane._processes.append(kwok)

        instance_types = workdir / "gpu-instance-types.json"
        instance_types.write_text(json.dumps([t.entry() for t in GPU_INSTANCE_TYPES], indent=1))
        health_port, metrics_port = free_port(), free_port()
        environment = {
            **os.environ,
            "KUBECONFIG": str(plane.admin),
            "INSTANCE_TYPES_FILE_PATH": str(instance_types),
            "DISABLE_LEADER_ELECTION": "true",
            "HEALTH_PROBE_PORT": str(health_port),
            "METRICS_PORT": str(metrics_port),
            # NB: provisioning in ~1-4 s instead of the default 1-10 s batching window
            "BATCH_IDLE_DURATION": "500ms",
            "BATCH_MAX_DURATION": "3s",
            "LOG_LEVEL": "info",
        }
        karpenter = _spawn("karpenter", [str(parts["karpenter"] / "karpenter")], workdir, env=environment)
        plane._processes.append(karpenter)

        _wait_healthy(scheduler, f"https://127.0.0.1:{scheduler_port}/healthz", context=_insecure(), timeout=60)
        timings["kube-scheduler"] = time.monotonic() - started
        _wait_healthy(kwok, f"http://127.0.0.1:{kwok_port}/healthz", context=None, timeout=60)
        timings["kwok"] = time.monotonic() - started
        _wait_healthy(karpenter, f"http://127.0.0.1:{health_port}/readyz", context=None, timeout=90)
        timings["karpenter"] = time.monotonic() - started

        box = Box(plane=plane, timings=timings)
        box.apply(
            {"apiVersion": "karpenter.kwok.sh/v1alpha1", "kind": "KWOKNodeClass", "metadata": {"name": NODE_CLASS}}
        )
        _ready_node_class(plane.rest())
        timings["ready"] = time.monotonic() - started
        return box
    except BaseException:
        plane.stop()
        raise


def _ready_node_class(rest: Rest) -> None:
    """What a real provider's node-class controller would do: report the class Ready (kwok's never does), or no
    NodePool is Ready and nothing is provisioned."""
    path = f"/apis/karpenter.kwok.sh/v1alpha1/kwoknodeclasses/{NODE_CLASS}"
    current = rest.get(path).expect(200)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    ready = {
        "type": "Ready",
        "status": "True",
        "reason": "Ready",
        "message": "",
        "lastTransitionTime": now,
        "observedGeneration": current["metadata"]["generation"],
    }
    status = {"status": {"conditions": [ready]}}
    rest.patch(f"{path}/status", status, "merge").expect(200)


def start_box_for_tests(workdir: Path | None = None) -> Box:
    """A started box, or the test skips with the reason (a part not built); under CI (CI=true) it fails instead,
    as the control plane's tests do."""
    import pytest

    try:
        return start_box(workdir)
    except ControlPlaneUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"cluster in a box unavailable under CI: {e}")
        pytest.skip(f"cluster in a box unavailable: {e}")


class GpuExporter(DcgmExporter):
    """dcgm-exporter's ``/metrics`` for the GPUs of every kwok node, in dcgm-exporter's exact format.

    A node's GPUs are its allocatable ``nvidia.com/gpu``, of the hardware its ``nvidia.com/gpu.product`` label names;
    each running pod on it is given its next GPUs in pod-name order (as the device plugin would give some). The
    test sets ``activity[app]`` (0-1: SM active, GR engine and GPU util alike) for the pods labelled ``app`` and
    ``xid[node]`` (the last Xid of the node's GPU 0, also counted in the exporter's Xid window)."""

    def __init__(self, plane: ControlPlane) -> None:
        super().__init__(plane)  # NB: its server answers with ``self.render()``
        self.activity: dict[str, float] = {}
        self.xid: dict[str, int] = {}

    def render(self) -> str:
        selector = f"{KWOK_NODE[0]}={KWOK_NODE[1]}"
        nodes = self.rest.get("/api/v1/nodes", labelSelector=selector).body.get("items", [])
        pods = self.rest.get("/api/v1/pods", fieldSelector="status.phase=Running").body.get("items", [])
        on: dict[str, list[dict[str, Any]]] = {}
        for pod in sorted(pods, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
            if not pod["metadata"].get("deletionTimestamp"):
                on.setdefault(pod["spec"].get("nodeName", ""), []).append(pod)
        text = []
        for node in nodes:
            name, labels = node["metadata"]["name"], node["metadata"].get("labels") or {}
            hardware = _HARDWARE.get(labels.get("nvidia.com/gpu.product", ""))
            # NB: allocatable, not capacity: the kwok provider sets a node's capacity to what its NodeClaim requested
            # (the pods Karpenter planned for), its allocatable to the instance type's
            count = int((node.get("status") or {}).get("allocatable", {}).get("nvidia.com/gpu", "0"))
            if hardware is None or count <= 0:
                continue
            owners: dict[GpuSlot, tuple[str, str, str]] = {}
            busy: dict[int, float] = {}
            slot = 0
            for pod in on.get(name, []):
                limits = pod["spec"]["containers"][0].get("resources", {}).get("limits", {})
                app = (pod["metadata"].get("labels") or {}).get("app", "")
                for _ in range(int(limits.get("nvidia.com/gpu", "0"))):
                    if slot < count:
                        owners[GpuSlot(slot)] = (pod["metadata"]["namespace"], pod["metadata"]["name"], "main")
                        busy[slot] = self.activity.get(app, 0.0)
                        slot += 1
            signals = {}
            for gpu in range(count):
                a = busy.get(gpu, 0.0)
                gauges = device_signals(hardware, Activity(busy=a, gr_engine=a, sm_active=a, power=a, fb=a))
                xid = self.xid.get(name, 0) if gpu == 0 else 0
                if xid:
                    gauges = dataclasses.replace(gauges, last_xid=xid, xid_window=((xid, 1),))
                signals[gpu] = gauges
            sim = SimNode.build(name, hardware=hardware, gpu_count=count)
            text.append(render_dcgm(sim, signals, pods_by_gpu=owners))
        return _merge_families(text)


def _merge_families(texts: Sequence[str]) -> str:
    """One exposition from several nodes' texts: each family's HELP/TYPE once, its samples together."""
    order: list[str] = []
    samples: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for text in texts:
        family = ""
        for line in text.splitlines():
            if line.startswith("# HELP "):
                family = line.split()[2]
                if family not in headers:
                    order.append(family)
                    headers[family] = [line]
                    samples[family] = []
            elif line.startswith("# TYPE "):
                if len(headers[family]) == 1:
                    headers[family].append(line)
            elif line:
                samples[family].append(line)
    return "".join("\n".join([*headers[f], *samples[f]]) + "\n" for f in order)
