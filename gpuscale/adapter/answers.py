"""Encoded answers, built once per (query, snapshot) — before the first request for queries asked before.

An HPA polls every 15 s and the store is refreshed every few seconds, so nearly every poll is the first
request for its query since the last refresh: a cache filled by requests would miss on almost all of them
(measured at 10,000 GPUs: the first request after a refresh ran at 0.063× a bare aiohttp server, ~0.9 ms
of ``json.dumps`` per request). So the cache also remembers which queries were asked recently, and the
refresh builds their bodies against the new snapshot in steps between requests, before the swap
(``AnswerCache.prepare``); the swap installs them in the same event-loop step that makes the snapshot
visible. The first request after a refresh is then a dictionary lookup, like every later one.

A query is the request's meaning, not its URL text (``MetricQuery``): API group and version, resource,
namespace, object name (``*`` for a selector), metric, and the parsed ``labelSelector`` and
``metricLabelSelector``, both canonical (sorted requirements), so every distinct selector is a distinct
key and the same selector spelt two ways is one. ``fieldSelector`` is not part of it: the metrics
handlers do not read it (only authorization does), so it cannot change a body.

An entry is valid for one state token (``MetricsProvider.state_token``: store version, watch-cache
generation and sync) and until its first value would turn stale, so a cached answer is always what
recomputing would give. Errors (404, 503 stale, 400 bad selector) are never cached: they are raised
again by the request that asks, as the same metav1 Status.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuscale.adapter.provider import MetricsProvider, Values
from gpuscale.adapter.wire import EXTERNAL_GROUP, ItemEncoder, external_item, external_list
from gpuscale.errors import GpuscaleError, SelectorError
from gpuscale.metrics.chunked import spans
from gpuscale.metrics.steps import STEP, Steps
from gpuscale.metrics.store import MetricsStore, Snapshot
from gpuscale.piecemeal import free_piecemeal
from gpuscale.selectors import LabelSelector

log = logging.getLogger(__name__)

# NB: a cluster's distinct HPA queries: 1,000 HPAs × 4 metrics are 4,000 (at 2,048, half of them were never
# prepared and each poll computed its answer on request); the bytes cap bounds the memory
DEFAULT_MAX_ENTRIES = 16384
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_KEEP_WARM_SECONDS = 300.0  # NB: 20 polls of an HPA's default 15 s period; KEDA polls every 30 s


@dataclass(frozen=True, slots=True)
class MetricQuery:
    """What one metrics request asks, independent of how its URL spells it (module docstring)."""

    group: str
    version: str
    resource: str  # "pods", "deployments.apps", …; for external metrics the metric name again
    namespace: str | None
    name: str  # an object's name, "*" for a selector; "" for external metrics
    metric: str
    selector: LabelSelector  # labelSelector: objects (custom) or metric labels (external)
    metric_selector: LabelSelector  # metricLabelSelector (custom only)


def answer(provider: MetricsProvider, query: MetricQuery, encoder: ItemEncoder) -> tuple[bytes, float]:
    """The encoded body of ``query`` and until when it holds (provider clock); the provider's errors propagate."""
    if query.group == EXTERNAL_GROUP:
        assert query.namespace is not None
        items = provider.external(query.namespace, query.metric, query.selector)
        document = external_list([external_item(query.metric, i.labels, i.point) for i in items])
        return json.dumps(document, separators=(",", ":")).encode(), provider.expiry(query.metric, items)
    if query.name == "*":
        values = provider.values_by_selector(
            query.metric, query.resource, query.namespace, query.selector, query.metric_selector
        )
    else:
        values = Values.of(
            provider.by_name(query.resource, query.namespace, query.name, query.metric, query.metric_selector)
        )
    echoed = _echo(query.metric_selector)
    body = encoder.values(query.version, query.metric, values.objs, values.points, echoed, stamps=values.stamps)
    return body, provider.expires(query.metric, values.oldest)


@functools.lru_cache(maxsize=4096)
def _echo(selector: LabelSelector) -> str:
    """The metricLabelSelector as the answer echoes it (JSON; ``null`` when empty: the Go struct has no omitempty).
    NB: after the provider's answer, so that its errors come first; SelectorError for what metav1 cannot say."""
    return json.dumps(selector.to_dict(), separators=(",", ":"))


@dataclass(slots=True)
class _Entry:
    token: tuple
    expires: float  # provider clock (epoch seconds): the first item's timestamp + its metric's max-age
    body: bytes
    prepared: bool  # built by a refresh and not served yet: its first request counts as "prepared"


class AnswerCache:
    """Bodies per query for the current state token, plus which queries were asked recently (module docstring).

    Bounded twice: ``max_entries`` queries remembered and ``max_bytes`` of bodies kept; beyond either, the
    oldest go first. ``count(how)`` is told how each request was answered: ``prepared`` (built by the
    refresh, its first request since), ``cached`` (served before in this state) or ``computed``.
    """

    def __init__(
        self,
        *,
        max_entries: int = DEFAULT_MAX_ENTRIES,
        max_bytes: int = DEFAULT_MAX_BYTES,
        keep_warm_seconds: float = DEFAULT_KEEP_WARM_SECONDS,
        count: Callable[[str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._entries: dict[MetricQuery, _Entry] = {}
        self._retired: dict[MetricQuery, _Entry] | None = None  # the entries last replaced, freed off the loop
        self._bytes = 0
        self._asked: dict[MetricQuery, float] = {}  # last asked (monotonic), least recent first
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._keep_warm = keep_warm_seconds
        self._count = count or (lambda how: None)
        self._monotonic = monotonic
        self._encoder = ItemEncoder()  # NB: shared by requests and the refresh's steps (wire.py says why)

    def __len__(self) -> int:
        return len(self._entries)

    # --- the request path (event loop) ------------------------------------------------------------------

    def body(self, provider: MetricsProvider, query: MetricQuery) -> bytes:
        """The answer to ``query`` now: from the cache when still valid, else computed and kept."""
        self._asked.pop(query, None)
        self._asked[query] = self._monotonic()
        if len(self._asked) > self._max_entries:
            del self._asked[next(iter(self._asked))]
        token = provider.state_token()
        entry = self._entries.get(query)
        if entry is not None and entry.token == token and provider.clock() < entry.expires:
            self._count("prepared" if entry.prepared else "cached")
            entry.prepared = False
            return entry.body
        body, expires = answer(provider, query, self._encoder)
        self._put(query, _Entry(token, expires, body, prepared=False))
        self._count("computed")
        return body

    def _put(self, query: MetricQuery, entry: _Entry) -> None:
        old = self._entries.pop(query, None)
        if old is not None:
            self._bytes -= len(old.body)
        while self._entries and (
            len(self._entries) >= self._max_entries or self._bytes + len(entry.body) > self._max_bytes
        ):
            self._bytes -= len(self._entries.pop(next(iter(self._entries))).body)
        self._entries[query] = entry
        self._bytes += len(entry.body)

    # --- the refresh (steps on the event loop, between requests) -----------------------------------------

    def prepare(self, provider: MetricsProvider, snapshot: Snapshot) -> Steps[Callable[[], None]]:
        """Build the bodies of the queries asked within ``keep_warm_seconds`` against ``snapshot``, which is not
        served yet, in steps (metrics/steps.py: the pipeline runs them between requests). Returns what installs
        them: call it on the event loop right after the snapshot is swapped into ``provider``'s store, before any
        request can see it."""
        yield from free_piecemeal(self, ("_retired",))
        self._retired = None
        yield
        now = self._monotonic()
        asked = list(reversed(self._asked.items()))  # NB: most recent first; requests add to the original meanwhile
        # NB: forecast answers are not prepared: the forecasts move on after the swap (on_refresh, in the same
        # event-loop step), so a body built here would be one refresh behind what a request computes.
        wanted: list[MetricQuery] = []
        for piece in spans(len(asked), STEP):
            wanted += [
                q for q, at in asked[piece] if now - at <= self._keep_warm and not provider.is_forecast(q.metric)
            ]
            yield
        store = MetricsStore()
        store.update(snapshot)
        view = provider.reading(store)
        cluster_state = provider.cluster_state()  # NB: before reading the watch cache: a later change misses
        # NB: the token these answers hold for once the snapshot is swapped in (the store's next version); install
        # checks it. The entries are made here, so that the swap installs them in one assignment.
        token = (provider.store.version + 1, *cluster_state)
        entries: dict[MetricQuery, _Entry] = {}
        size = 0
        failed = 0
        for query in wanted:
            yield  # NB: one answer per step (~50 µs each)
            if len(entries) >= self._max_entries:
                break
            try:
                body, expires = answer(view, query, self._encoder)
            except (GpuscaleError, SelectorError):
                continue  # an error answer: raised again, as the same Status, by the request that asks
            except Exception:
                # NB: a bug in one answer must not fail the refresh; the request then computes it (and says why).
                failed += 1
                continue
            if size + len(body) > self._max_bytes:
                break
            size += len(body)
            entries[query] = _Entry(token, expires, body, prepared=True)
        if failed:
            log.debug("%d of %d answers not prepared (the request computes them)", failed, len(wanted))

        def install() -> None:
            now = (provider.store.version, *cluster_state)
            if now != token:  # NB: the store was updated by someone else too: the entries hold for this state
                for entry in entries.values():
                    entry.token = now
            # NB: every entry of an older store version is dead (versions only grow): replaced as a whole, the old
            # ones freed by the next preparation, in steps (freed here, 4,000 bodies held the loop ~1 ms)
            self._retired, self._entries, self._bytes = self._entries, entries, size

        return install
