"""Raw Kubernetes objects of any kind, cached by list+watch: what the controller's planners read.

The adapter's ``KubeCache`` keeps only the facts it needs (``PodInfo``…); the controller's planners read whole
objects (conditions, taints, annotations, PDB selectors), so ``ObjectCache`` keeps each object as the API
serves it, with ``apiVersion`` and ``kind`` set (list items come without them). The loop is the same
``Reflector`` (list, watch from the list's resourceVersion, 410 → relist, backoff honouring Retry-After).
It answers ``objects`` / ``get`` from memory, which is the ``controller.writes.ClusterView`` protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import KindNotServed, SelectorError, SourceUnavailable
from gpuscale.selectors import LabelSelector
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.reflector import Reflector, WatchedKind

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


def _older(new: Mapping[str, Any], old: Mapping[str, Any] | None) -> bool:
    """Whether ``new`` is an older version of the object than ``old``.

    NB: resourceVersions are opaque to clients in general, but kube-apiserver's are etcd revisions (integers that
    only grow): a write's answer recorded before the watch delivered it must not be undone by a watch event of
    the version before it. Anything not numeric is taken as newer (the watch's order then decides)."""
    if old is None:
        return False
    a = (new.get("metadata") or {}).get("resourceVersion", "")
    b = (old.get("metadata") or {}).get("resourceVersion", "")
    return a.isdigit() and b.isdigit() and int(a) < int(b)


_FIELDS = {
    "metadata.name": lambda o: (o.get("metadata") or {}).get("name", ""),
    "metadata.namespace": lambda o: (o.get("metadata") or {}).get("namespace", ""),
    "source": lambda o: (o.get("source") or {}).get("component", "") or o.get("reportingComponent", ""),
}


def _selected(spec: WatchSpec, obj: Mapping[str, Any]) -> bool | None:
    """Whether the watch of ``spec`` would deliver ``obj`` (None: a selector this cannot evaluate)."""
    meta = obj.get("metadata") or {}
    if spec.namespace is not None and meta.get("namespace") != spec.namespace:
        return False
    if spec.label_selector:
        try:
            if not LabelSelector.parse(spec.label_selector).matches(meta.get("labels") or {}):
                return False
        except SelectorError:
            return None
    for term in filter(None, spec.field_selector.split(",")):
        field, op, value = term.partition("!=") if "!=" in term else term.partition("=")
        read = _FIELDS.get(field.strip())
        if read is None:
            return None
        equal = read(obj) == value.lstrip("=").strip()
        if equal != (op == "="):
            return False
    return True


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
        self.relist_after_error = True  # NB: the controller acts on this view: confirm it by a list after errors
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

    def _kind(self, spec: WatchSpec, path: str) -> WatchedKind:
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
            if _older(obj, bucket.get(_key(obj))):
                return
            self.generation += 1
            bucket[_key(obj)] = typed(obj)

        def remove(obj: dict[str, Any]) -> None:
            self.generation += 1
            bucket.pop(_key(obj), None)

        where = f" in {spec.namespace}" if spec.namespace else ""
        # NB: the group qualifies the name (PodGroup.scheduling.volcano.sh, PodGroup.scheduling.x-k8s.io): the
        # reflector counts kinds by name to know it has listed them all.
        group = spec.api_version.rpartition("/")[0]
        return WatchedKind(f"{spec.kind}{'.' + group if group else ''}{where}", call, replace, put, remove)

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
        backoff = self._backoff()
        while True:
            try:
                await self.prepare()
                break
            except SourceUnavailable as e:
                self.last_errors["discovery"] = e.reason
                await asyncio.sleep(backoff.next_delay())
        self.last_errors.pop("discovery", None)
        self._tasks.extend(asyncio.create_task(self._run(kind), name=f"kube-watch-{kind.name}") for kind in self._kinds)

    async def refresh_once(self) -> None:
        await self.prepare()
        await super().refresh_once()

    # -- confirmation (controller.writes.LiveClusterView)

    @property
    def confirmed(self) -> bool:
        return bool(self._kinds) and all(k.name in self._confirmed for k in self._kinds)

    def unconfirmed(self) -> str:
        if not self._kinds:
            error = self.last_errors.get("discovery")
            return "kinds not discovered yet" + (f" ({error})" if error else "")
        waiting = [k.name for k in self._kinds if k.name not in self._confirmed]
        if not waiting:
            return ""
        errors = "; ".join(f"{k}: {self.last_errors[k]}" for k in waiting if k in self.last_errors)
        return f"not listed since the last watch error or leadership change: {', '.join(waiting)}" + (
            f" ({errors})" if errors else ""
        )

    async def reconfirm(self, timeout: float) -> bool:
        """List every kind again (each loop restarts with a list) and wait for all, at most ``timeout`` s."""
        if not self._kinds:
            return False
        now = time.time()
        for kind in self._kinds:
            self._confirmed.discard(kind.name)
            self._unconfirmed_since[kind.name] = now
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks = [asyncio.create_task(self._run(k), name=f"kube-watch-{k.name}") for k in self._kinds]
        deadline = time.monotonic() + timeout
        while not self.confirmed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._confirm_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._confirm_changed.wait(), left)
        return True

    async def reread(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """GET one object into the view; a 404 drops it. SourceUnavailable when the API cannot answer."""
        if (api_version, kind) not in self._by_kind:
            return
        path = await self._rest.path(api_version, kind, namespace=namespace, name=name)
        answer = await self._rest.request("GET", path)
        if answer.status == 404:
            self.generation += 1
            for bucket in self._by_kind[(api_version, kind)]:
                bucket.pop((namespace or "", name), None)
        elif answer.ok:
            self.record({**answer.body, "apiVersion": api_version, "kind": kind})
        else:
            raise SourceUnavailable(self.name, f"cannot read {kind} {name}: HTTP {answer.status} {answer.message}")

    def record(self, obj: Mapping[str, Any]) -> None:
        """Put ``obj`` (a write's answer, or a re-read) where the watches would: into the buckets that hold it or
        whose spec selects it, unless the bucket already holds a newer version."""
        key = _key(obj)
        for spec, bucket in self._buckets.items():
            if (spec.api_version, spec.kind) != (obj.get("apiVersion"), obj.get("kind")):
                continue
            if (key in bucket or _selected(spec, obj)) and not _older(obj, bucket.get(key)):
                self.generation += 1
                bucket[key] = dict(obj)

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
