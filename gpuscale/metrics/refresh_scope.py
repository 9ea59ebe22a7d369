"""RefreshScope: which metrics, in which namespaces, a refresh must fetch — what HPAs reference, and what was asked for.

prometheus-adapter queries Prometheus on every HPA poll; gpuscale refreshes a store and answers from it. With a
store covering the whole fleet the refresh costs what the fleet has (10,000 GPUs: ~1 s of CPU per cycle, and
100,000 GPUs would exceed the interval), whatever the HPAs ask. A RefreshScope narrows the refresh to what is used:

* **referenced** — every (metric, namespace) some HorizontalPodAutoscaler names (``references``: its Pods,
  Object and External metrics, in the HPA's namespace), refreshed at the full rate while the HPA exists;
* **warm** — a (metric, namespace) asked for by a request that no HPA references (``kubectl get --raw``, a
  dashboard, an HPA the watch has not delivered yet): fetched on that first request, then refreshed at the full
  rate for ``keep_warm_seconds`` after the last request, then dropped. A scope an HPA stops referencing is
  kept warm the same way, so deleting and re-creating an HPA does not go cold.

* **derived** — a metric the adapter computes from a catalogue metric rather than reads (the forecasts,
  ``forecast_*`` and ``workload_requests_per_second``, from the workloads' request rate): an HPA or request naming
  it in a namespace wants its input there, referenced or warm as above. The input's history starts when it is
  first fetched in that namespace; what is derived from a history (a forecast needs 10 minutes) is absent until
  it has enough, never made up (docs/forecast.md). A request for it therefore does not wait for a refresh:
  one refresh would not give it enough history, so it is answered at once, saying what it lacks.

A scope's namespace is ``None`` for "every namespace": node metrics, and namespaces listed by selector, are
aggregates over the whole fleet and are only ever computed from unfiltered series.

The unit is the namespace, not the pod: a namespace filter is a fixed PromQL matcher whose text does not grow
with the pods (prometheus-adapter's ``pod=~"p1|p2|…"`` does), and it covers every object kind an HPA can name
in that namespace (pods, workloads, the namespace itself, external metrics). Discovery is unaffected: it lists
the catalogue, fetched or not.

Timing: ``begin`` (at the start of a refresh) fixes what that refresh fetches; ``completed`` (when its snapshot
is in the store) makes it what ``covers`` answers for. A request for a scope not covered waits for the next
refresh (the adapter wakes the refresh loop) and is then answered from the store like any other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from gpuscale.metrics.aggregation import term_query
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.metrics.series import TermQuery

__all__ = ["RefreshScope", "Scope", "references"]

Scope = tuple[str, str | None]
"""(metric name, namespace), the namespace None for every namespace."""

DEFAULT_KEEP_WARM_SECONDS = 600.0
# HPA metric source types that name a metric of an adapter (Resource/ContainerResource are metrics-server's).
_METRIC_SOURCES = {"Pods": "pods", "Object": "object", "External": "external"}


def references(hpa: Mapping[str, Any]) -> list[Scope]:
    """The (metric, namespace) scopes an autoscaling/v2 HorizontalPodAutoscaler (a JSON dict) names.

    Pods, Object and External metrics count, in the HPA's namespace; an Object metric describing a Node is
    fleet-wide (namespace None). Metrics are named as the HPA names them; ``RefreshScope`` ignores names that are not
    in the catalogue (another adapter's metrics). Malformed entries are skipped: the API server validated the
    object, and a reference we cannot read costs only laziness (the metric is fetched on first request).
    """
    namespace = (hpa.get("metadata") or {}).get("namespace") or None
    out: list[Scope] = []
    for entry in (hpa.get("spec") or {}).get("metrics") or []:
        if not isinstance(entry, Mapping):
            continue
        key = _METRIC_SOURCES.get(str(entry.get("type")))
        source = entry.get(key) if key else None
        if not isinstance(source, Mapping):
            continue
        name = (source.get("metric") or {}).get("name") if isinstance(source.get("metric"), Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        described = source.get("describedObject") if key == "object" else None
        node = isinstance(described, Mapping) and described.get("kind") == "Node"
        out.append((name, None if node else namespace))
    return out


class RefreshScope:
    """The scopes a refresh fetches (module docstring). Pure: the caller passes the clock's ``now``."""

    def __init__(
        self,
        catalogue: Catalogue,
        *,
        keep_warm_seconds: float = DEFAULT_KEEP_WARM_SECONDS,
        derived: Mapping[str, str] | None = None,
    ) -> None:
        """``derived``: served metric → the catalogue metric it is computed from (module docstring)."""
        if not keep_warm_seconds >= 0:
            raise ValueError(f"keep-warm must be ≥ 0 seconds, got {keep_warm_seconds!r}")
        self.catalogue = catalogue
        self.keep_warm_seconds = float(keep_warm_seconds)
        self.derived = dict(derived or {})
        unknown = sorted({m for m in self.derived.values() if catalogue.get(m) is None})
        if unknown:
            raise ValueError(f"derived metrics read {', '.join(unknown)}, which the catalogue does not have")
        self._referenced: frozenset[Scope] = frozenset()
        self._warm: dict[Scope, float] = {}  # scope → when it was last asked for (or stopped being referenced)
        self._pending: frozenset[Scope] = frozenset()
        self._fetched: frozenset[Scope] = frozenset()

    # --- what is wanted -------------------------------------------------------------------------------------

    def set_referenced(self, scopes: Iterable[Scope], *, now: float) -> None:
        """Replace the scopes HPAs reference; those no longer referenced stay warm for a while."""
        new = frozenset(
            (name, namespace)
            for metric, namespace in scopes
            if self.catalogue.get(name := self.derived.get(metric, metric)) is not None
        )
        for gone in self._referenced - new:
            self._warm[gone] = now
        self._referenced = new

    def note_request(self, metric: str, namespace: str | None, *, now: float) -> bool:
        """A request for ``metric`` in ``namespace`` (None: every namespace). Keeps its scope warm; returns
        whether the last completed refresh fetched it (False: the caller waits for the next refresh)."""
        derived = metric in self.derived
        metric = self.derived.get(metric, metric)
        if self.catalogue.get(metric) is None:
            return True  # NB: nothing to fetch; the provider answers 404 as usual
        if not self.covers(metric, namespace):
            self._warm[(metric, namespace)] = now
            # NB: a derived metric's history starts with the next refresh, and one refresh is not enough history:
            # answered now (absent, saying why) rather than after a wait that cannot help
            return derived
        if (metric, namespace) not in self._referenced:
            self._warm[(metric, namespace)] = now
        return True

    def covers(self, metric: str, namespace: str | None) -> bool:
        """Whether the last completed refresh fetched ``metric`` for ``namespace``."""
        return (metric, None) in self._fetched or (namespace is not None and (metric, namespace) in self._fetched)

    def wanted(self, *, now: float) -> frozenset[Scope]:
        """Referenced scopes plus those asked for within the keep-warm time (older warm scopes are dropped)."""
        expired = [s for s, at in self._warm.items() if now - at > self.keep_warm_seconds]
        for scope in expired:
            del self._warm[scope]
        return self._referenced | frozenset(self._warm)

    @property
    def referenced(self) -> frozenset[Scope]:
        return self._referenced

    @property
    def fetched(self) -> frozenset[Scope]:
        return self._fetched

    # --- one refresh ------------------------------------------------------------------------------------------

    def begin(self, *, now: float) -> dict[TermQuery, frozenset[str] | None]:
        """Fix what the refresh starting now fetches: each term query the wanted metrics read, with the
        namespaces to read it in (None: every namespace)."""
        self._pending = self.wanted(now=now)
        return self.terms(self._pending)

    def begin_all(self) -> None:
        """The refresh starting now fetches every metric in every namespace (no HPA list to go by)."""
        self._pending = frozenset((m.name, None) for m in self.catalogue)

    def fetching(self, metric: str) -> frozenset[str] | None:
        """The namespaces the refresh ``begin`` started fetches ``metric`` in (None: every namespace). For what
        is computed from it in that refresh (the forecasts update only the workloads whose rate was read)."""
        pending = self._pending
        if (metric, None) in pending:
            return None
        return frozenset(ns for m, ns in pending if m == metric and ns is not None)

    def completed(self) -> None:
        """The refresh ``begin`` started is in the store: requests for its scopes are served without waiting."""
        self._fetched = self._pending

    def terms(self, scopes: Iterable[Scope]) -> dict[TermQuery, frozenset[str] | None]:
        # NB: on the event loop at every refresh's start: each metric's queries made once, the namespaces gathered in
        # sets and frozen at the end (a frozenset grown by one namespace at a time, a query made per scope: 15 ms for
        # 1,000 HPAs × 4 metrics over 100 namespaces, held requests that long)
        queries_of: dict[str, list[TermQuery]] = {}
        namespaces: dict[TermQuery, set[str] | None] = {}  # None: every namespace
        for name, namespace in scopes:
            queries = queries_of.get(name)
            if queries is None:
                metric = self.catalogue.get(name)
                terms = metric.terms if metric is not None else ()
                window = self.catalogue.window(metric) if metric is not None else 0.0
                queries = queries_of[name] = [term_query(t, window_seconds=window) for t in terms if t is not None]
            for query in queries:
                if namespace is None:
                    namespaces[query] = None
                elif (where := namespaces.setdefault(query, set())) is not None:
                    where.add(namespace)
        return {query: None if where is None else frozenset(where) for query, where in namespaces.items()}
