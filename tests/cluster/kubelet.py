"""What the kubelets and the scheduler would do, done by the tests through the API's own subresources.

The control plane has no kubelet and no scheduler (tests/cluster/controlplane.py). ``make_node`` creates a
Node and reports it Ready with its GPUs through ``nodes/{name}/status``; ``FakeKubelet`` is a background
thread that, for the namespaces it looks after, binds each unscheduled pod to a node through
``pods/{name}/binding`` (round robin over its nodes), reports bound pods Running and Ready through
``pods/{name}/status`` (with a loopback pod IP a test may serve on), and completes graceful deletions the way a kubelet
does once containers stopped (DELETE with gracePeriodSeconds=0). Everything it does is an ordinary API call, so
watches, controllers and the HPA see the same objects and events they would in a real cluster.
"""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Iterable, Mapping

from tests.cluster.rest import Rest

__all__ = ["FakeKubelet", "make_node", "now_rfc3339", "running_status"]


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(
    rest: Rest, name: str, *, labels: Mapping[str, str] | None = None, gpus: int = 8, address: str = "127.0.0.1"
) -> dict:
    """Create the Node (or keep an existing one) and report it Ready with ``gpus`` nvidia.com/gpu."""
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(labels or {})}}
    created = rest.post("/api/v1/nodes", body)
    created.expect(201, 409)
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": address}, {"type": "Hostname", "address": name}],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status (tests/cluster/kubelet.py)",
                    "lastHeartbeatTime": now_rfc3339(),
                    "lastTransitionTime": now_rfc3339(),
                }
            ],
        }
    }
    node = rest.patch(f"/api/v1/nodes/{name}/status", status, "strategic").expect(200)
    # What the node lifecycle controller (not run here) does once a node is Ready: take off the not-ready taint
    # the TaintNodesByCondition admission put on at create — guarded, so another agent's taints stay.
    taints = node["spec"].get("taints") or []
    if any(t["key"] == "node.kubernetes.io/not-ready" for t in taints):
        kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
        patch = [
            {"op": "test", "path": "/spec/taints", "value": taints},
            {"op": "replace", "path": "/spec/taints", "value": kept},
        ]
        node = rest.patch(f"/api/v1/nodes/{name}", patch, "json").expect(200)
    return node


def running_status(pod: Mapping, ip: str) -> dict:
    now = now_rfc3339()
    containers = [c["name"] for c in pod["spec"].get("containers", [])]
    return {
        "status": {
            "phase": "Running",
            "hostIP": "127.0.0.1",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "startTime": now,
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": now}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c,
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "image": "gpuscale.test/none",
                    "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ],
        }
    }


class FakeKubelet:
    """Schedules, starts and finishes pods of ``namespaces`` on ``nodes`` until stopped (a context manager)."""

    def __init__(self, rest: Rest, *, namespaces: Iterable[str], nodes: Iterable[str], interval_seconds: float = 0.2):
        self.rest = rest
        self.namespaces = list(namespaces)
        self.nodes = list(nodes)
        assert self.nodes, "a kubelet needs at least one node"
        self.interval = interval_seconds
        self._next_node = itertools.cycle(self.nodes)
        # NB: pod IPs on loopback (127.2.0.0/16; the API accepts them for pods, unlike for Endpoints), so a test
        # can serve a pod's "container" on its IP and the adapter scrape it by IP as in a cluster.
        self._ips = (f"127.2.{i // 250}.{i % 250 + 2}" for i in itertools.count())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fake-kubelet", daemon=True)
        self.errors: list[str] = []

    def __enter__(self) -> FakeKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def sync_once(self) -> None:
        for namespace in self.namespaces:
            answer = self.rest.get(f"/api/v1/namespaces/{namespace}/pods")
            if not answer.ok:
                continue
            for pod in answer.body.get("items", []):
                self._sync_pod(namespace, pod)

    def _sync_pod(self, namespace: str, pod: Mapping) -> None:
        meta, spec, status = pod["metadata"], pod["spec"], pod.get("status") or {}
        name = meta["name"]
        base = f"/api/v1/namespaces/{namespace}/pods/{name}"
        if meta.get("deletionTimestamp"):
            self.rest.delete(base, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
            return
        if not spec.get("nodeName"):
            binding = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace},
                "target": {"apiVersion": "v1", "kind": "Node", "name": next(self._next_node)},
            }
            answer = self.rest.post(f"{base}/binding", binding)
            if answer.status not in (201, 409):
                self.errors.append(f"bind {namespace}/{name}: {answer.status} {answer.body}")
            return
        if status.get("phase") != "Running":
            answer = self.rest.patch(f"{base}/status", running_status(pod, next(self._ips)), "strategic")
            if not answer.ok and answer.status != 404:
                self.errors.append(f"status {namespace}/{name}: {answer.status} {answer.body}")

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync_once()
            except OSError as e:  # the API restarting is not the kubelet's failure; the next pass retries
                self.errors.append(f"transport: {e}")
            self._stop.wait(self.interval)
