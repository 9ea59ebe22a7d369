"""A whole simulated GPU cluster: the Kubernetes API, dcgm-exporter per node, Triton or an LLM server per pod.

Used by the demo and the end-to-end tests. The Kubernetes objects the exporters imply (nodes, pods with
their GPUs, workloads, the exporter DaemonSet's pods) are written into the simulated API server through
its in-process helpers — the same code paths as HTTP writes, so watches see every change — and kept in
step when workloads are scaled.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from gpuscale.model import rfc3339
from gpuscale.sim.demo_cluster import demo_scenario
from gpuscale.sim.exporters import SimExporters
from gpuscale.sim.exporters.llm import LlmServer
from gpuscale.sim.kube_manifests import CREATION_TIMESTAMP
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sim.scenario import Scenario

# Objects the scenario owns: anything of these kinds it no longer renders is deleted.
_OWNED_KINDS = ("Pod", "ReplicaSet", "Deployment", "StatefulSet", "DaemonSet", "Node", "Namespace")


def _stamped(value: Any, stamp: str) -> Any:
    """``value`` with the scenario's placeholder time (``CREATION_TIMESTAMP``) replaced by ``stamp`` wherever it
    appears (creationTimestamp, startTime, conditions, container states)."""
    if isinstance(value, dict):
        return {k: _stamped(v, stamp) for k, v in value.items()}
    if isinstance(value, list):
        return [_stamped(v, stamp) for v in value]
    return stamp if value == CREATION_TIMESTAMP else value


def _key(obj: dict[str, Any]) -> tuple[str, str, str | None, str]:
    meta = obj.get("metadata") or {}
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


class SimCluster:
    def __init__(
        self,
        scenario: Scenario | None = None,
        *,
        clock: Callable[[], float] = time.time,
        llm: Mapping[str, LlmServer] | None = None,
        termination_grace_s: float = 0.0,
    ) -> None:
        """``llm``: workload (``namespace/name``) → the LLM server (vLLM, SGLang, TGI, NIM) its pods serve;
        ``termination_grace_s``: how long a scaled-down pod keeps serving its metrics after it left the API."""
        self.scenario = scenario or demo_scenario()
        self.clock = clock
        self.api = SimKubeApi()
        self.exporters = SimExporters(llm=llm, termination_grace_s=termination_grace_s)
        self._tmp = tempfile.TemporaryDirectory(prefix="gpuscale-sim-")
        self.kubeconfig = str(Path(self._tmp.name) / "kubeconfig")
        self._applied: set[tuple[str, str, str | None, str]] = set()

    async def start(self) -> SimCluster:
        await self.api.start()
        self.api.write_kubeconfig(self.kubeconfig)
        await self.exporters.start(self.scenario, clock=self.clock)
        self.apply(self.exporters.kube_objects())
        self.exporters.add_listener(self.apply)
        return self

    async def stop(self) -> None:
        await self.exporters.stop()
        await self.api.stop()
        self._tmp.cleanup()

    async def __aenter__(self) -> SimCluster:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def scrape_urls(self) -> list[str]:
        """Every exporter endpoint; the adapter finds which pod serves each one through the API."""
        exporters = self.exporters
        return (
            sorted(exporters.dcgm_urls.values())
            + sorted(exporters.triton_urls.values())
            + sorted(exporters.llm_urls.values())
        )

    async def follow_scale(self) -> list[tuple[str, int, int]]:
        """The Deployment and StatefulSet controllers' part: a workload whose ``spec.replicas`` was changed
        through the API (e.g. its ``scale`` subresource, as the HPA writes it) gets that many pods, with their
        exporters. Returns ``(namespace/name, old, new)`` per change; call it as often as you like."""
        changes = []
        for w in self.exporters.scenario.workloads:
            obj = self.api.get("apps/v1", w.kind, w.name, namespace=w.namespace)
            wanted = ((obj or {}).get("spec") or {}).get("replicas")
            if isinstance(wanted, int) and wanted != w.replicas:
                await self.exporters.set_replicas(w.key, wanted)
                changes.append((w.key, w.replicas, wanted))
        return changes

    def apply(self, objects: Iterable[dict[str, Any]]) -> None:
        """Make the API hold exactly ``objects`` (create, update in place, delete what disappeared)."""
        objects = list(objects)
        wanted = {_key(o) for o in objects}
        # Namespaces first, pods last, so creates never reference a missing namespace.
        order = {"Namespace": 0, "Node": 1}
        for obj in sorted(objects, key=lambda o: order.get(o["kind"], 2 if o["kind"] != "Pod" else 3)):
            api_version, kind, namespace, name = _key(obj)
            current = self.api.get(api_version, kind, name, namespace=namespace)
            # NB: an object is as old as it is in this cluster: the scenario's fixed time becomes the time it was
            # first applied (kubectl's AGE counts from the start, or from the scale-up that added the pod), kept after.
            obj = _stamped(obj, rfc3339(self.clock()) if current is None else current["metadata"]["creationTimestamp"])
            if current is None:
                self.api.create(obj)
            else:
                desired = {
                    **obj,
                    "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]},
                }
                desired["metadata"].pop("uid", None)
                desired["metadata"].pop("creationTimestamp", None)
                status = desired.pop("status", None)
                updated = self.api.replace(desired)
                if status is not None and status != updated.get("status"):
                    self.api.replace({**updated, "status": status}, subresource="status")
        for key in sorted(self._applied - wanted, key=lambda k: k[1] == "Namespace"):
            api_version, kind, namespace, name = key
            if kind in _OWNED_KINDS and self.api.get(api_version, kind, name, namespace=namespace) is not None:
                self.api.delete(api_version, kind, name, namespace=namespace)
        self._applied = wanted
