"""The seam between the controller's planners (pure) and its actuator (the only Kubernetes writer).

A planner returns ``Write`` values; it never calls the API. Every write carries ``why``: one line for the log
and, where the write is an action on a node or pod, the text recorded in the annotation or Event. Writes are
*desired state*: a planner only emits one when what it wants differs from what the ``ClusterView`` shows, so an
unchanged cluster yields no writes (idempotent reconcile).

``ClusterView`` is what planners read: raw objects as the API serves them (dicts with ``apiVersion``/``kind``
set), from the controller's list+watch caches or, in tests, ``StaticClusterView``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from gpuscale.controller.telemetry import ClusterTelemetry

__all__ = [
    "Actuator",
    "ClusterView",
    "Create",
    "Delete",
    "Emit",
    "Evict",
    "LiveClusterView",
    "ObjectKey",
    "Patch",
    "Planner",
    "StaticClusterView",
    "Write",
    "WriteOutcome",
]


@dataclass(frozen=True, slots=True)
class ObjectKey:
    """Names one object: ``ObjectKey("v1", "Node", "gpu-1")`` or with a namespace."""

    api_version: str
    kind: str
    name: str
    namespace: str | None = None

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> ObjectKey:
        meta = obj.get("metadata") or {}
        return cls(obj["apiVersion"], obj["kind"], meta["name"], meta.get("namespace"))

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{where}{self.name}"


@dataclass(frozen=True, slots=True)
class Create:
    """Create ``obj`` (a full manifest). An AlreadyExists answer is a ``conflict``, never "done": the object
    exists in a state this plan did not see, so the loop re-reads it and plans again.

    ``barrier``: if this write does not apply, the planner's later writes of this reconcile are not sent
    (a breaker's record is written before the actions it admits, never after)."""

    obj: Mapping[str, Any]
    why: str
    barrier: bool = False

    @property
    def key(self) -> ObjectKey:
        return ObjectKey.of(self.obj)


@dataclass(frozen=True, slots=True)
class Patch:
    """Patch one object. ``patch_type`` is the Content-Type family; ``subresource`` e.g. ``"status"``.

    ``resource_version`` (optional) makes the write conditional: the API answers 409 if the object changed.
    A JSON patch guards itself with ``test`` operations; the API answers 422 when one fails. Either answer is a
    ``conflict``: the loop re-reads the object and plans again from what it holds now. ``barrier``: see ``Create``.
    """

    key: ObjectKey
    patch: Any
    why: str
    patch_type: Literal["merge", "strategic", "json"] = "merge"
    subresource: str | None = None
    resource_version: str | None = None
    barrier: bool = False


@dataclass(frozen=True, slots=True)
class Delete:
    """Delete one object (a NotFound answer counts as done)."""

    key: ObjectKey
    why: str


@dataclass(frozen=True, slots=True)
class Evict:
    """Evict one pod through the Eviction API (``pods/eviction``), so PodDisruptionBudgets are respected.

    A 429 answer (a PDB forbids it now) is not an error: the pod stays, and a later reconcile tries again.
    ``group`` (a gang): once one eviction of a group does not apply, the group's later evictions are not sent.
    """

    namespace: str
    name: str
    why: str
    group: str = ""


@dataclass(frozen=True, slots=True)
class Emit:
    """Record a core v1 Event about ``regarding``; the actuator aggregates repeats (count, lastTimestamp)."""

    regarding: ObjectKey
    type: Literal["Normal", "Warning"]
    reason: str
    message: str

    @property
    def why(self) -> str:
        return f"{self.reason}: {self.message}"


Write = Create | Patch | Delete | Evict | Emit


Result = Literal["applied", "dry-run", "already-done", "conflict", "refused", "skipped", "failed"]


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    """What became of one write: ``applied`` (or validated only, under dry-run), or why not.

    ``conflict``: the object is not as the plan saw it (409, AlreadyExists, a failed JSON-patch ``test``);
    ``refused``: the API said not now (an eviction a PDB forbids); ``skipped``: not sent, because a write it
    depends on (a barrier, an earlier eviction of its gang) did not apply. ``obj``: the object as the API
    answered it, when it did (what the loop records in its view, so the next plan sees its own write)."""

    write: Write
    result: Result
    detail: str = ""
    obj: Mapping[str, Any] | None = None


class Actuator(Protocol):
    """The only Kubernetes writer. Applies writes in order; never raises for an API answer, reports it."""

    async def apply(self, writes: Sequence[Write]) -> list[WriteOutcome]: ...


class ClusterView(Protocol):
    """Raw objects by kind, as last seen by the caches. Lists are in a stable order (namespace, name)."""

    def objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[Mapping[str, Any]]: ...

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None: ...


@runtime_checkable
class LiveClusterView(ClusterView, Protocol):
    """A view kept by watches, which can say whether it is confirmed — every kind listed since its last watch
    error — and be brought up to date: what the loop needs to act only on a view just confirmed."""

    @property
    def confirmed(self) -> bool: ...

    def unconfirmed(self) -> str:
        """Why the view is not confirmed now ("" when it is)."""
        ...

    async def reconfirm(self, timeout: float) -> bool:
        """List every kind again (after a leadership change); True once all are listed within ``timeout``."""
        ...

    async def reread(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> None:
        """Read one object from the API into the view (or drop it there when it is gone)."""
        ...

    def record(self, obj: Mapping[str, Any]) -> None:
        """Store an object as a write's answer returned it (never over a newer one the watch delivered)."""
        ...


class Planner(Protocol):
    """One concern of the controller (health, hints, gangs…): what it wants written, given what is known.

    Pure: no I/O, no clock (``now`` is passed in, seconds since the epoch), no state outside its arguments.
    Its policy is bound at construction; any state it must keep across reconciles and restarts (a breaker's
    recent actions) lives in the cluster — annotations or a ConfigMap it writes and reads back from ``view``.
    ``name`` labels its writes in logs and metrics (``health``, ``hints``, ``gangs``). An unchanged cluster and
    unchanged telemetry plan no writes.
    """

    name: str

    def plan(self, view: ClusterView, telemetry: ClusterTelemetry, *, now: float) -> list[Write]: ...


@dataclass
class StaticClusterView:
    """A fixed set of objects: for unit tests of planners and for one-shot tools."""

    items: Iterable[Mapping[str, Any]] = ()
    _by_kind: dict[tuple[str, str], dict[tuple[str, str], Mapping[str, Any]]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._by_kind = {}
        for obj in self.items:
            meta = obj.get("metadata") or {}
            bucket = self._by_kind.setdefault((obj["apiVersion"], obj["kind"]), {})
            bucket[(meta.get("namespace") or "", meta["name"])] = obj

    def objects(self, api_version: str, kind: str, namespace: str | None = None) -> list[Mapping[str, Any]]:
        bucket = self._by_kind.get((api_version, kind), {})
        return [bucket[k] for k in sorted(bucket) if namespace is None or k[0] == namespace]

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> Mapping[str, Any] | None:
        return self._by_kind.get((api_version, kind), {}).get((namespace or "", name))
