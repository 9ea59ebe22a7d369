"""An HPA controller loop over HTTP, built on gpuscale.hpa: what kube-controller-manager does each sync.

Per sync, for one HorizontalPodAutoscaler: read the target's ``scale`` subresource (replicas and the pod
selector), list the selected pods, read each metric from the metrics APIs exactly as the controller's
metrics client asks (``custom.metrics.k8s.io/v1beta2`` for Pods and Object metrics, ``external.metrics.k8s.io
/v1beta1`` for External ones), run ``gpuscale.hpa.Autoscaler.reconcile`` and, when it rescales, write the
``scale`` subresource, then the HPA object's ``status`` (current and desired replicas, each metric's current
value, conditions), so ``kubectl get hpa`` shows what it decided. The demo runs it against the simulated API
and the real adapter; ``now`` is passed in, so a replay can run the controller's clock faster than the wall
clock.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import aiohttp

from gpuscale.errors import SourceUnavailable
from gpuscale.hpa import Autoscaler, Decision, MetricUnavailable, ResourceSample, SelectedPod
from gpuscale.hpa.spec import CrossVersionObjectReference, HorizontalPodAutoscaler, MetricIdentifier
from gpuscale.model import format_quantity, milli_value, parse_quantity, rfc3339
from gpuscale.selectors import LabelSelector

_RESOURCES = {"Deployment": "deployments.apps", "StatefulSet": "statefulsets.apps", "ReplicaSet": "replicasets.apps"}


def _selector_query(selector: Mapping[str, Any] | None) -> str:
    """A metav1.LabelSelector as the text form the metrics APIs take (matchLabels and matchExpressions)."""
    return str(LabelSelector.from_dict(selector)) if selector else ""


def _metric_selector(metric: MetricIdentifier, sep: str) -> str:
    """``metric.selector`` as the controller's metrics client sends it (``metricLabelSelector``), if set."""
    query = _selector_query(metric.selector)
    return f"{sep}metricLabelSelector={quote(query)}" if query else ""


@dataclass
class Fetched:
    """One sync's answers from the metrics APIs (thousandths); implements gpuscale.hpa's Readings."""

    pod_values: dict[str, dict[str, int] | None]
    object_values: dict[str, int | None]
    external_values: dict[str, int | None]

    def pods(self, metric: MetricIdentifier) -> Mapping[str, int]:
        return _or_unavailable(self.pod_values.get(metric.name), metric.name)

    def object(self, described: CrossVersionObjectReference, metric: MetricIdentifier) -> int:
        return _or_unavailable(self.object_values.get(metric.name), metric.name)

    def external(self, metric: MetricIdentifier) -> int:
        return _or_unavailable(self.external_values.get(metric.name), metric.name)

    def resource(self, name: str) -> Mapping[str, ResourceSample]:
        raise MetricUnavailable(f"unable to get metrics for resource {name}: the demo serves no metrics.k8s.io")


def _or_unavailable(value: Any, name: str) -> Any:
    if value is None:
        raise MetricUnavailable(f"unable to get metric {name}")
    return value


def hpa_status(hpa: HorizontalPodAutoscaler, decision: Decision, *, wall: float, last_scale: float | None) -> dict:
    """The ``status`` kube-controller-manager writes after a sync (autoscaling/v2), from one decision."""
    usage = {p.metric: p.usage_milli for p in decision.proposals if p.replicas is not None}
    current = []
    for spec in hpa.spec.metrics:
        source = spec.pods or spec.object or spec.external
        milli = usage.get(spec.metric_name)
        if source is None or milli is None:
            continue  # NB: an invalid metric has no current value; kube leaves it out as well
        key = "averageValue" if source.target.average_value is not None else "value"
        status: dict = {"metric": {"name": spec.metric_name}, "current": {key: format_quantity(milli / 1000)}}
        if spec.object is not None:
            ref = spec.object.described_object
            status["describedObject"] = {"apiVersion": ref.api_version, "kind": ref.kind, "name": ref.name}
        current.append({"type": spec.type, spec.type.lower(): status})
    stamp = rfc3339(wall)
    valid = bool(current) or not hpa.spec.metrics
    errors = "; ".join(p.error for p in decision.proposals if p.replicas is None and p.error)
    conditions = [
        {
            "type": "AbleToScale",
            "status": "True",
            "reason": "SucceededRescale" if decision.rescale else "ReadyForNewScale",
            "message": f"the HPA controller was able to update the target scale to {decision.desired_replicas}"
            if decision.rescale
            else "recommended size matches current size",
            "lastTransitionTime": stamp,
        },
        {
            "type": "ScalingActive",
            "status": "True" if valid else "False",
            "reason": "ValidMetricFound" if valid else "FailedGetPodsMetric",
            "message": "the HPA was able to successfully calculate a replica count" if valid else errors,
            "lastTransitionTime": stamp,
        },
    ]
    out: dict = {
        "currentReplicas": decision.current_replicas,
        "desiredReplicas": decision.desired_replicas,
        "currentMetrics": current,
        "conditions": conditions,
    }
    if last_scale is not None:
        out["lastScaleTime"] = rfc3339(last_scale)
    return out


@dataclass
class SyncResult:
    decision: Decision
    fetched: Fetched
    pods: list[SelectedPod]


class HpaLoop:
    """One HPA, reconciled on demand (``sync``); the caller chooses the period and the clock."""

    def __init__(
        self, hpa: HorizontalPodAutoscaler, *, session: aiohttp.ClientSession, adapter_url: str, kube_url: str
    ) -> None:
        self.hpa = hpa
        self.session = session
        self.adapter_url = adapter_url.rstrip("/")
        self.kube_url = kube_url.rstrip("/")
        self.namespace = hpa.metadata.namespace
        self.autoscaler = Autoscaler(hpa)
        ref = hpa.spec.scale_target_ref
        group = "apps/v1" if ref.kind in _RESOURCES else (ref.api_version or "apps/v1")
        self.scale_path = f"/apis/{group}/namespaces/{self.namespace}/{ref.kind.lower()}s/{ref.name}/scale"
        self.status_path = (
            f"/apis/autoscaling/v2/namespaces/{self.namespace}/horizontalpodautoscalers/{hpa.metadata.name}/status"
        )
        self.last_scale: float | None = None

    async def _json(self, url: str) -> tuple[int, Any]:
        try:
            async with self.session.get(url) as resp:
                return resp.status, (await resp.json() if resp.status == 200 else None)
        except (aiohttp.ClientError, TimeoutError) as e:
            raise SourceUnavailable(url, str(e) or type(e).__name__) from e

    async def _metric(self, path: str) -> list[dict[str, Any]] | None:
        status, body = await self._json(self.adapter_url + path)
        if status != 200 or not body or not body.get("items"):
            return None  # NB: a 404, a 503 or an empty list: the controller counts the metric as invalid
        return body["items"]

    async def fetch(self, selector: str) -> Fetched:
        pods: dict[str, dict[str, int] | None] = {}
        objects: dict[str, int | None] = {}
        external: dict[str, int | None] = {}
        base = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{self.namespace}"
        for spec in self.hpa.spec.metrics:
            name = spec.metric_name
            if spec.pods is not None:
                items = await self._metric(
                    f"{base}/pods/*/{name}?labelSelector={quote(selector)}" + _metric_selector(spec.pods.metric, "&")
                )
                pods[name] = (
                    None
                    if items is None
                    else {i["describedObject"]["name"]: milli_value(parse_quantity(i["value"])) for i in items}
                )
            elif spec.object is not None:
                ref = spec.object.described_object
                resource = _RESOURCES.get(ref.kind, ref.kind.lower() + "s")
                items = await self._metric(
                    f"{base}/{resource}/{ref.name}/{name}" + _metric_selector(spec.object.metric, "?")
                )
                objects[name] = None if items is None else milli_value(parse_quantity(items[0]["value"]))
            elif spec.external is not None:
                query = _selector_query(spec.external.metric.selector)
                path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{self.namespace}/{name}"
                items = await self._metric(path + (f"?labelSelector={quote(query)}" if query else ""))
                external[name] = None if items is None else sum(milli_value(parse_quantity(i["value"])) for i in items)
        return Fetched(pods, objects, external)

    async def list_pods(self, selector: str) -> list[SelectedPod]:
        status, body = await self._json(
            f"{self.kube_url}/api/v1/namespaces/{self.namespace}/pods?labelSelector={quote(selector)}"
        )
        if status != 200:
            raise SourceUnavailable(self.kube_url, f"listing pods answered HTTP {status}", kind="http_status")
        out = []
        for pod in body["items"]:
            conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions") or []}
            out.append(
                SelectedPod(
                    pod["metadata"]["name"],
                    phase=pod.get("status", {}).get("phase", "Pending"),
                    ready=conditions.get("Ready") == "True",
                    deleting=bool(pod["metadata"].get("deletionTimestamp")),
                )
            )
        return out

    async def sync(self, now: float) -> SyncResult:
        """One reconcile at controller time ``now`` (seconds); writes the scale subresource on a change."""
        status, scale = await self._json(self.kube_url + self.scale_path)
        if status != 200:
            raise SourceUnavailable(
                self.kube_url, f"reading {self.scale_path} answered HTTP {status}", kind="http_status"
            )
        selector = scale["status"].get("selector") or ""
        pods = await self.list_pods(selector)
        fetched = await self.fetch(selector)
        decision = self.autoscaler.reconcile(
            now,
            # NB: kube-apiserver omits spec.replicas from a Scale when it is 0 (tests/cluster/test_conformance.py).
            spec_replicas=int((scale.get("spec") or {}).get("replicas") or 0),
            status_replicas=scale["status"].get("replicas"),
            pods=pods,
            readings=fetched,
        )
        if decision.rescale:
            body = {**scale, "spec": {"replicas": decision.desired_replicas}}
            async with self.session.put(self.kube_url + self.scale_path, json=body) as resp:
                if resp.status != 200:
                    text = await resp.text()
                    raise SourceUnavailable(self.kube_url, f"scale update answered HTTP {resp.status}: {text[:200]}")
            self.last_scale = time.time()
        await self._write_status(decision)
        return SyncResult(decision, fetched, pods)

    async def _write_status(self, decision: Decision) -> None:
        """The HPA object's status, as the controller writes it; no HPA object in the API (404) is fine: the
        manifest may live only in a file."""
        body = {"status": hpa_status(self.hpa, decision, wall=time.time(), last_scale=self.last_scale)}
        headers = {"Content-Type": "application/merge-patch+json"}
        try:
            async with self.session.patch(self.kube_url + self.status_path, json=body, headers=headers) as resp:
                if resp.status not in (200, 404):
                    text = await resp.text()
                    raise SourceUnavailable(
                        self.kube_url, f"HPA status update answered HTTP {resp.status}: {text[:200]}"
                    )
        except aiohttp.ClientError as e:
            raise SourceUnavailable(self.kube_url, str(e) or type(e).__name__) from e
