"""Raw Kubernetes objects of any kind, cached by list+watch: what the controller's planners read.

The adapter's ``KubeCache`` keeps only the facts it needs (``PodInfo``…); the controller's planners read whole
objects (conditions, taints, annotations, PDB selectors), so ``ObjectCache`` keeps each object as the API
serves it, with ``apiVersion`` and ``kind`` set (list items come without them). The loop is the same
``Reflector`` (list, watch from the list's resourceVersion, 410 → relist, backoff honouring Retry-After).
It answers ``objects`` / ``get`` from memory, which is the ``controller.writes.ClusterView`` protocol.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import KindNotServed, SourceUnavailable
from gpuscale.sources.kube import Reflector, _Kind
from gpuscale.sources.kuberest import KubeRest

__all__ = ["ObjectCache", "WatchSpec"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WatchSpec:
    """One kind to cache: all namespaces (``namespace`` None) or one, optionally narrowed by a selector."""

    api_version: str
    kind: str
    namespace: str | None = None
    label_selector: str = ""
    field_selector: str = ""
    optional: bool = False
    """A kind whose API may not be installed (a CRD): when the server does not serve it, it stays empty."""


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name", "")


class ObjectCache(Reflector):
    """Whole objects of the watched kinds, by (apiVersion, kind) then (namespace, name).

    ``prepare()`` (or ``start()``/``refresh_once()``, which call it) resolves each kind's resource through
    discovery, so a kind the server does not serve fails there, with its name. ``generation`` changes with
    every object change.
    """

    name = "kubernetes-objects"

    def __init__(
        self,
        rest: KubeRest,
        specs: Iterable[WatchSpec],
        *,
        watch_timeout_seconds: int = 300,
        backoff_max_seconds: float = 30,
    ) -> None:
        super().__init__(watch_timeout_seconds=watch_timeout_seconds, backoff_max_seconds=backoff_max_seconds)
        self._rest = rest
        self.specs = tuple(specs)
        # NB: one bucket per spec, so two narrow specs of one kind (ConfigMaps in two namespaces) never clear
        # each other's objects on a relist; reads merge the buckets of a kind.
        self._buckets: dict[WatchSpec, dict[tuple[str, str], Mapping[str, Any]]] = {s: {} for s in self.specs}
        self._by_kind: dict[tuple[str, str], list[dict[tuple[str, str], Mapping[str, Any]]]] = {}
        for spec, bucket in self._buckets.items():
            self._by_kind.setdefault((spec.api_version, spec.kind), []).append(bucket)
        self.generation = 0
        self.absent: list[str] = []
        """Optional kinds the server does not serve (``apiVersion kind``)."""

    async def prepare(self) -> None:
        if self._kinds:
            return
        kinds = []
        for spec in self.specs:
            try:
                path = await self._rest.path(spec.api_version, spec.kind, namespace=spec.namespace)
            except KindNotServed:
                if not spec.optional:
                    raise
                log.info("%s %s is not served; it stays empty", spec.api_version, spec.kind)
                self.absent.append(f"{spec.api_version} {spec.kind}")
                continue
            kinds.append(self._kind(spec, path))
        self._kinds = tuple(kinds)

    def _kind(self, spec: WatchSpec, path: str) -> _Kind:
        bucket = self._buckets[spec]
        list_call = self._rest.list_call(path)

        async def call(**kwargs: Any) -> Any:
            return await list_call(
                **kwargs, label_selector=spec.label_selector or None, field_selector=spec.field_selector or None
            )

        def typed(obj: dict[str, Any]) -> dict[str, Any]:
            obj["apiVersion"], obj["kind"] = spec.api_version, spec.kind
            return obj

        def replace(objs: list[dict[str, Any]]) -> None:
            self.generation += 1
            bucket.clear()
            for obj in objs:
                bucket[_key(obj)] = typed(obj)

        def put(obj: dict[str, Any]) -> None:
            self.generation += 1
            bucket[_key(obj)] = typed(obj)

        def remove(obj: dict[str, Any]) -> None:
            self.generation += 1
            bucket.pop(_key(obj), None)

        where = f" in {spec.namespace}" if spec.namespace else ""
        # NB: the group qualifies the name (PodGroup.scheduling.volcano.sh, PodGroup.scheduling.x-k8s.io): the
        # reflector counts kinds by name to know it has listed them all.
        group = spec.api_version.rpartition("/")[0]
        return _Kind(f"{spec.kind}{'.' + group if group else ''}{where}", call, replace, put, remove)

    async def start(self) -> None:
        """Start the list+watch loops. If the API cannot be reached for discovery yet, keep trying in the
        background (doubling backoff) and start the loops once it answers; ``wait_synced`` and ``last_errors``
        say why nothing is listed meanwhile. A required kind the server does not serve fails here."""
        if self._tasks:
            return
        try:
            await self.prepare()
        except KindNotServed:
            raise
        except SourceUnavailable as e:
            self.last_errors["discovery"] = e.reason
            log.warning("%s; retrying discovery in the background", e)
            self._tasks = [asyncio.create_task(self._prepare_then_run(), name="kube-discovery")]
            return
        await super().start()

    async def _prepare_then_run(self) -> None:
        delay = self._backoff_min
        while True:
            try:
                await self.prepare()
                break
            except SourceUnavailable as e:
                self.last_errors["discovery"] = e.reason
                await asyncio.sleep(self._jitter(delay))
                delay = min(delay * 2, self._backoff_max)
        self.last_errors.pop("discovery", None)
        self._tasks.extend(asyncio.create_task(self._run(kind), name=f"kube-watch-{kind.name}") for kind in self._kinds)

    async def refresh_once(self) -> None:
        await self.prepare()
        await super().refresh_once()

    # -- ClusterView

    def objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[Mapping[str, Any]]:
        buckets = self._by_kind.get((api_version, kind), ())
        if len(buckets) == 1:
            bucket = buckets[0]
            return [bucket[k] for k in sorted(bucket) if namespace is None or k[0] == namespace]
        merged = {k: o for b in buckets for k, o in b.items() if namespace is None or k[0] == namespace}
        return [merged[k] for k in sorted(merged)]

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        for bucket in self._by_kind.get((api_version, kind), ()):
            found = bucket.get((namespace or "", name))
            if found is not None:
                return found
        return None
