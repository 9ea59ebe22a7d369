"""The Prometheus source: the catalogue's terms read from a Prometheus-compatible ``/api/v1/query``.

Works against Prometheus, VictoriaMetrics, Thanos Query and Mimir/Cortex: anything that answers the
Prometheus HTTP API's instant query. It is the alternative to the embedded scrape source when a
Prometheus already scrapes dcgm-exporter and Triton, and feeds the same pipeline: the same attribution
(device → pod → node → namespace) and the same aggregation run on its values.

Queries: a fixed number per refresh, bounded by the catalogue, never by the cluster
-----------------------------------------------------------------------------------
Each series a catalogue term (``aggregation.queries(catalogue)``) names becomes one instant query, and a
query several terms need is sent once (see "One query per series" below); all are sent concurrently once
per refresh, under one deadline (``timeout_seconds``), as ``POST`` form data so that no query ever meets a
URL length limit (VictoriaMetrics' 16 KB, HTTP 414 in prometheus-adapter #358/#668). No query names a
pod: prometheus-adapter builds ``pod=~"p1|p2|…"`` per HPA request, which grows with the pods (25 KB at
150 pods) and costs one query per HPA poll; here the text of every query is fixed at start and the HPA
is answered from the store.

The PromQL for a term (when the catalogue gives no ``prometheus:`` override)::

    gauge      DCGM_FI_DEV_GPU_UTIL
               DCGM_FI_DEV_FB_USED and DCGM_FI_DEV_FB_FREE       a term naming two series: two queries
    rate       rate(nv_inference_request_success[60s])
    increase   increase(nv_inference_queue_duration_us[60s])
    histogram_quantile   histogram_quantile(0.95, rate(vllm:time_to_first_token_seconds_bucket[60s]))

plus the term's ``match`` as label matchers (``X{model="bert"}``).

* **No ``sum by``.** Every series comes back with all its labels (``UUID``, ``GPU_I_ID``, ``Hostname``,
  ``pod``/``namespace``/``exported_pod``, ``model``/``version``, ``instance`` …), and aggregation happens
  in our pipeline, per device, with exactly the code that serves the scrape source. Summing in PromQL
  would have to know how a DCGM series maps to its workload pod (``exported_pod`` vs ``pod``, the
  exporter's own pod on idle GPUs), how to count MIG parents' power once, which of Triton's two label
  shapes to keep and how to form a ratio of sums per object — the rules of ``metrics/attribution.py``,
  which would then exist twice and drift. It would also lose the per-label partials external metrics
  select from.
* **Result size is bounded by series, not pods.** A query returns one sample per existing series: one
  per GPU (or MIG instance) for DCGM fields, one per model × instance for Triton counters — the same
  rows a scrape of the exporters returns, whatever number of pods or HPAs ask. The body size is capped
  all the same (``max_body_bytes``, the adapter's ``--prometheus-max-response-size``): an answer past it
  is refused while it streams in (``sources/bounded.py``), never decoded, and the query keeps its last values.
* **One query per series.** A term naming several series is queried one series at a time, and the
  answers are concatenated when the term is read. For windowed terms it is the only exact form:
  ``rate()`` and ``increase()`` drop ``__name__``, and two series whose other labels are equal (Triton's
  ``queue_duration_us`` and ``request_success`` share every label) then collide ("vector cannot contain
  metrics with the same labelset"); ``label_replace`` cannot restore a name that was already dropped,
  and a subquery would change the semantics. For gauges it avoids fetching a series twice: the memory
  ratio's ``DCGM_FI_DEV_FB_USED`` is also a term of its own, and a ``{__name__=~"USED|FREE"}`` selector
  would send and decode its 10,000 samples (at 10,000 GPUs) a second time; as two plain queries, the
  FB_USED one is shared by both terms. The count stays bounded by the catalogue: one query per distinct
  (series, function, window, matchers) — 50 for the built-in catalogue (13 for DCGM and Triton, 37 for
  the LLM servers' names; a series no pod exports costs an empty answer).
* **Overrides.** A term's ``prometheus:`` text is used verbatim after replacing ``{window}`` with the
  metric's window as a PromQL duration (``60s``). Its result is read like a default query: labels are
  kept, ``__name__`` names the series when present, else the term's first series does; the term's
  ``match`` is applied to the result labels, exactly as for the scrape source.

Reading the answer
------------------
* ``SeriesValue.name`` is ``__name__`` (rate/increase results have none: the queried series' name),
  ``labels`` every other label, ``value`` the float (``"NaN"``/``"+Inf"`` parse as floats and are
  dropped later by aggregation), ``timestamp`` the sample time the server returned — for an instant query
  that is the evaluation time; Prometheus' own staleness handling (stale markers when a target stops
  answering, the 5-minute lookback otherwise) decides which series still exist. ``window_seconds`` is
  the term's window for rate/increase.
* **One evaluation instant per refresh.** Every query of a refresh carries the same ``time`` (the
  source's clock when the refresh starts), so a ratio's numerator and denominator cover the same window.
  Evaluated a few milliseconds apart, a scrape landing in between gives one side an extra interval:
  VictoriaMetrics' ``increase()`` does not extrapolate, so with a 5 s window and 1 s scrapes
  ``inference_queue_time_seconds`` came out 25 % high in the end-to-end test (with 60 s windows and
  15 s scrapes it would be up to 25 % too). The cost: a gpuscale clock ahead of the server's asks for an
  instant the server has not reached yet (Prometheus answers with its newest samples), so keep NTP.
* ``target`` is ``http://<instance>/metrics`` when the series has an ``instance`` label, so the
  adapter's target resolver maps ``host:port`` to the pod that serves it through the Kubernetes API,
  exactly as for a scraped URL; otherwise the Prometheus URL.
* **DCGM blank sentinels** are dropped from gauge terms. Prometheus returns every value as a float, so
  whether dcgm-exporter printed an INT64 (``%d``) or a DOUBLE (``%f``) is lost: integral values use the
  int64 rule (≥ 0x7ffffffffffffff0) plus the four exact fp64 codes (2**47 … 2**47+3); only non-integral
  values get the fp64 rule (≥ 1.4e14). So ``DCGM_FI_DEV_POWER_VIOLATION`` ≈ 3e14 ns stays a value.
* **VictoriaMetrics** delays instant queries near "now" by ``-search.latencyOffset`` (30 s by default)
  and then stamps the 30-second-old values with the current time; every query therefore carries
  ``nocache=1``, which VictoriaMetrics reads as "answer from the newest data" and Prometheus, Thanos
  and Mimir ignore as an unknown parameter.

Faults
------
``refresh`` never raises for the server's faults: connection refused, timeout (one deadline per refresh,
``timeout_seconds`` from its start, covering each answer's body as well as its headers), HTTP errors (the JSON
``error`` Prometheus sends with 4xx/5xx is quoted), ``{"status": "error"}``, malformed or non-JSON
bodies (an HTML login page from a proxy), bodies over the size cap, an unexpected result type. A failed
query keeps its previous values with their old timestamps, so they age into staleness and the adapter
answers 503 after the metric's max-age instead of serving old numbers as new; the other queries of the
refresh still update. A partial answer (``warnings``, VictoriaMetrics' ``isPartial``) is used: series
it returns replace their old values, series it lacks keep theirs (old timestamps, again), and the
health says why. ``health()`` has one entry, the server.

Whatever is wrong with one answer fails that query only, in either decode mode: arrays nested 100,000 deep
(RecursionError in ``json.loads``), an integer of 400 digits as a value, a label value that is not a string, one
label set twice, bytes that are not UTF-8 — ``prom_answer.decode_answer`` turns every one into the query's
failure, for the worker thread and the decoder process alike. Each failed query is counted by kind in health's
``failed_reads`` (the adapter's ``gpuscale_source_failed_reads``); the log says it once while the reasons stay
the same.

Memory is bounded by the body cap per answer and by ``max_label_sets`` (the adapter's
``--prometheus-max-label-sets``) for the label sets held: a refresh keeps at most that many distinct label sets, on
either side of the decoder process, and forgets older refreshes' sets first; series past it in one refresh are left
out, counted in health's ``dropped_series`` (``gpuscale_source_dropped_series``), shown as ``degraded`` and logged
once. Without it, an answer with 20,000 new pods every refresh kept up to 24 refreshes' label sets on both sides
(docs/benchmarks.md, "label-set churn").
"""

from __future__ import annotations

import asyncio
import logging
import math
import re
import ssl
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

from gpuscale.errors import ConfigError, SourceUnavailable, one_line
from gpuscale.metrics.attribution import POD_LABELS
from gpuscale.metrics.chunked import free_in_chunks
from gpuscale.metrics.histograms import BUCKET_SUFFIX
from gpuscale.metrics.steps import run_sliced
from gpuscale.sources.base import SeriesValue, TargetHealth, TermQuery
from gpuscale.sources.decoder_process import DecoderProcess
from gpuscale.sources.loop_thread import IoLoop
from gpuscale.sources.prom_answer import (
    DEFAULT_MAX_LABEL_SETS,
    Answer,
    LabelSets,
    PlannedQuery,
    decode_answer,
    read_answer,
    short,
)
from gpuscale.sources.promapi import DEFAULT_MAX_BODY_BYTES, CredentialFileError, PrometheusClient

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Answer",
    "LabelSets",
    "PlannedQuery",
    "PrometheusSource",
    "duration",
    "namespace_matchers",
    "plan",
    "read_answer",
]

log = logging.getLogger(__name__)

OVER_CAP = "over_label_set_cap"  # dropped_series reason


# --- PromQL (pure) ------------------------------------------------------------------------------------


def duration(seconds: float) -> str:
    """A PromQL duration: ``60s``, or ``1500ms`` for windows that are not whole seconds."""
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"window must be a positive number of seconds, got {seconds!r}")
    if float(seconds).is_integer():
        return f"{int(seconds)}s"
    return f"{max(1, round(seconds * 1000))}ms"


def _quote(value: str) -> str:
    """A PromQL double-quoted string (Go escaping: backslash, quote, newline)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def _selector(name: str, match: Iterable[tuple[str, str]], extra: Iterable[str] = ()) -> str:
    matchers = ",".join([*(f"{k}={_quote(v)}" for k, v in match), *extra])
    return f"{name}{{{matchers}}}" if matchers else name


def namespace_matchers(namespaces: Iterable[str]) -> list[tuple[str, ...]]:
    """Label matchers that keep a series when its workload is in one of ``namespaces``, one alternative each.

    A series' workload is named by the first (pod, namespace) label pair whose pod label is set, in the order
    attribution reads them (``attribution.POD_LABELS``: ``exported_pod`` wins over ``pod`` …), so each
    alternative requires the earlier pod labels empty. A series with no pod label at all (Triton scraped
    without target labels, a router's series) is attributed through its scrape target, which PromQL cannot
    see: it is always kept.
    """
    names = sorted(set(namespaces))
    # NB: Kubernetes names are DNS labels; anything else is escaped, so a name only ever matches itself.
    pattern = "|".join(re.sub(r"[^A-Za-z0-9_-]", lambda m: "\\" + m.group(), n) for n in names)
    wanted = f"=~{_quote(pattern)}" if len(names) > 1 else f"={_quote(names[0])}"
    out: list[tuple[str, ...]] = []
    empty: list[str] = []
    for pod_label, namespace_label in POD_LABELS:
        out.append((*empty, f'{pod_label}!=""', f"{namespace_label}{wanted}"))
        empty.append(f'{pod_label}=""')
    out.append(tuple(empty))
    return out


def plan(
    query: TermQuery, *, fresh_within: float | None = None, namespaces: frozenset[str] | None = None
) -> tuple[PlannedQuery, ...]:
    """The PromQL for one term: one query per series it names (module docstring), or its override.

    ``fresh_within`` (seconds) drops series whose newest sample is older than that. An instant query's answer
    is stamped with the evaluation time, and Prometheus looks back up to 5 minutes for a sample: a restarted
    Prometheus (or one whose exporter died before a staleness marker) answers old samples as if they were
    taken now. ``X unless time() - timestamp(X) > N`` keeps the answer's size and lets the server judge each
    series' age (set operators match on the labels without ``__name__``). Overrides are sent as written.

    ``namespaces`` (demand-driven refresh, metrics/refresh_scope.py) keeps only the series of workloads in those
    namespaces: the selector becomes one alternative per ``namespace_matchers`` entry, joined with ``or``
    (disjoint by construction). None reads every series; overrides are always read whole.
    """
    window = None if query.input == "gauge" else query.window_seconds
    if query.promql is not None:
        text = query.promql.replace("{window}", duration(query.window_seconds))
        return (PlannedQuery(text, query.series[0], query.input, window, query.match),)
    planned = []
    histogram = query.input == "histogram_quantile"
    alternatives: list[tuple[str, ...]] = [()] if namespaces is None else namespace_matchers(namespaces)
    for name in query.series:
        function = "rate" if histogram else query.input
        texts = []
        for extra in alternatives:
            selector = _selector(f"{name}{BUCKET_SUFFIX}" if histogram else name, query.match, extra)
            one = selector if window is None else f"{function}({selector}[{duration(window)}])"
            if fresh_within is not None:
                one = f"{one} unless time() - timestamp({selector}) > {fresh_within:g}"
            texts.append(one)
        text = texts[0] if len(texts) == 1 else " or ".join(f"({t})" for t in texts)
        if histogram:
            # NB: per series (every label but le), as metrics/histograms.py computes it for the scrape source.
            text = f"histogram_quantile({query.quantile!r}, {text})"
        planned.append(PlannedQuery(text, name, query.input, window, query.match))
    return tuple(planned)


# --- the source -----------------------------------------------------------------------------------------


class PrometheusSource:
    """Reads the catalogue's terms from a Prometheus-compatible HTTP API (module docstring).

    ``client`` is the server's ``PrometheusClient`` (promapi.py: the connection's credentials, the deadline of a
    refresh — ``timeout_seconds``, answers' bodies included — and the body cap), or a URL with the client's keyword
    arguments in ``client_options`` (tests and tools that need no credentials file). The source closes its client.
    ``queries`` are the terms to answer (``aggregation.queries(catalogue)``).
    ``fresh_within_seconds`` leaves out series whose newest sample is older (``plan``): the adapter passes
    the catalogue's longest max-age, so an old sample is never answered as a fresh one.
    ``decode_in`` is where answers are decoded: ``"thread"`` (a worker thread of this process) or ``"process"``
    (a child process, sources/decoder_process.py: the adapter's choice, so that no decode holds its GIL).
    ``max_label_sets`` bounds the distinct label sets held (``max_label_sets_flag`` names the setting): series past
    it in one refresh are left out, counted in health's ``dropped_series`` and logged once.
    ``off_loop``: queries run on an event loop of their own, in a thread (the adapter: the ~1,000 callbacks
    that read a 10,000-GPU refresh's bodies never queue in front of a request's on the serving loop).
    """

    name = "prometheus"

    def __init__(
        self,
        client: PrometheusClient | str,
        *,
        queries: Iterable[TermQuery],
        max_label_sets: int = DEFAULT_MAX_LABEL_SETS,
        max_label_sets_flag: str | None = None,
        clock: Callable[[], float] = time.time,
        fresh_within_seconds: float | None = None,
        decode_in: Literal["thread", "process"] = "thread",
        off_loop: bool = False,
        **client_options: Any,
    ) -> None:
        if isinstance(client, str):
            client = PrometheusClient(client, **client_options)
        elif client_options:
            raise ValueError(f"client options {sorted(client_options)} go to the PrometheusClient given")
        self._client = client
        self.url = client.url
        self.display_url = client.display_url
        self._timeout_seconds = client.timeout_seconds
        if max_label_sets < 1:
            raise ConfigError(f"the most label sets kept must be at least 1, got {max_label_sets}")
        self._max_label_sets = max_label_sets
        self._max_label_sets_flag = max_label_sets_flag
        self._failed_reads: dict[str, int] = {}  # kind → queries failed since start
        self._dropped: dict[str, int] = {}  # reason → series left out since start
        self._decoding = asyncio.Lock()
        if decode_in not in ("thread", "process"):
            raise ValueError(f"decode_in must be 'thread' or 'process', not {decode_in!r}")
        self._decoder = (
            DecoderProcess(self.display_url, max_label_sets=max_label_sets) if decode_in == "process" else None
        )
        if off_loop and client.session is not None:
            raise ValueError("an off_loop source makes its own session, on its own loop")
        self._io = IoLoop("gpuscale-prometheus", own=off_loop)
        self._refreshes = 0
        self._clock = clock
        self._fresh_within = fresh_within_seconds
        self._queries = list(queries)
        self._scope: dict[TermQuery, frozenset[str] | None] | None = None
        self._plans: dict[TermQuery, tuple[PlannedQuery, ...]] = {
            q: plan(q, fresh_within=fresh_within_seconds) for q in self._queries
        }
        # NB: terms that plan to the same query (one gauge read over two windows) send it once.
        self._kept: dict[PlannedQuery, list[SeriesValue]] = {p: [] for ps in self._plans.values() for p in ps}
        self._health = TargetHealth(self.display_url, False, error="not queried yet")
        self._logged: frozenset[str] = frozenset()
        self._over_cap = 0  # series left out by the last refresh

    @property
    def promql(self) -> list[str]:
        """Every PromQL query one refresh sends, in order (for logs, docs and tests)."""
        return [p.promql for p in self._kept]

    def set_scope(self, scope: Mapping[TermQuery, frozenset[str] | None] | None) -> None:
        """What the next refreshes fetch (demand-driven refresh, metrics/refresh_scope.py): each term with the
        namespaces to read it in (None: every namespace); terms left out are not queried and read as empty.
        ``None`` (the default) queries every term the source was built for, unfiltered."""
        self._scope = None if scope is None else dict(scope)

    async def close(self) -> None:
        await self._io.close(self._close())

    async def _close(self) -> None:
        if self._decoder is not None:
            await self._decoder.close()
        await self._client.close()

    # --- I/O -------------------------------------------------------------------------------------------

    async def refresh(self, *, now: float) -> None:
        """Run every query concurrently, at one evaluation instant, under one deadline; never raises for
        the server's faults.

        The instant is the source's own clock (wall time unless a test injects one), not ``now``: the
        pipeline's clock may be simulated while the server's data is real.
        """
        await self._io.run(self._refresh())

    async def _refresh(self) -> None:
        started = self._clock()
        self._refreshes += 1
        # NB: equal label sets share one dict within a refresh; the index itself is dropped when the refresh
        # ends (its ~50,000 key tuples at 10,000 GPUs would otherwise stay for the garbage collector to walk).
        label_sets = LabelSets(limit=self._max_label_sets)
        plans = self._plans_for(self._scope)
        # NB: terms that plan to the same query (one gauge read over two windows) send it once.
        planned = list(dict.fromkeys(p for ps in plans.values() for p in ps))
        # A query the last refresh also sent keeps its values until answered. So does a term whose query text
        # changed with its scope (demand-driven refresh: other namespaces): the old query's values carry over,
        # so a failure serves them into staleness (503 after max-age), never a sudden 404. Otherwise: empty.
        kept: dict[PlannedQuery, list[SeriesValue]] = {}
        for query, ps in plans.items():
            before = self._plans.get(query, ())
            for i, p in enumerate(ps):
                if p in self._kept:
                    kept[p] = self._kept[p]
                elif p not in kept:
                    carried = before[i] if len(before) == len(ps) else None
                    kept[p] = self._kept.get(carried, []) if carried is not None else []
        self._kept = kept
        self._plans = plans
        try:
            headers, ssl_context = self._client.credentials()
        except CredentialFileError as e:
            self._record(started, {p: str(e) for p in planned}, {})
            return
        deadline = asyncio.get_running_loop().time() + self._timeout_seconds
        form = {
            "time": f"{started:.3f}",  # NB: one instant for every query (module docstring)
            "timeout": duration(self._timeout_seconds),  # NB: the server gives up too
            "nocache": "1",  # VictoriaMetrics: no -search.latencyOffset delay (module docstring)
        }
        answers = await asyncio.gather(
            *(self._query(p, form, headers, ssl_context, deadline, label_sets) for p in planned)
        )
        failed: dict[PlannedQuery, str] = {}
        kinds: set[str] = set()
        partial: dict[PlannedQuery, str] = {}
        over_cap = 0
        for p, answer in zip(planned, answers, strict=True):
            if isinstance(answer, SourceUnavailable):
                failed[p] = answer.reason  # NB: the previous values stay, with their old timestamps
                kinds.add(answer.kind)
                self._failed_reads[answer.kind] = self._failed_reads.get(answer.kind, 0) + 1
                continue
            over_cap += answer.over_cap
            if answer.partial or answer.warnings:
                over_cap += self._merge_partial(p, answer)
                why = "; ".join(answer.warnings) or "the server marked the response partial"
                partial[p] = f"partial response: {short(why)}"
            else:
                replaced, self._kept[p] = self._kept[p], answer.values
                if sys.getrefcount(replaced) == 2:  # NB: this name and the argument: no other query carries it
                    # NB: its 10,000 series (and their 20,000 floats) at 10,000 GPUs, freed in one C call otherwise
                    await run_sliced(free_in_chunks(replaced))
        self._count_over_cap(over_cap)
        self._record(started, failed, partial, kind=kinds.pop() if len(kinds) == 1 else "failed")

    def _merge_partial(self, p: PlannedQuery, answer: Answer) -> int:
        """A partial answer replaces the series it has; the others keep their old values and timestamps, so they age
        out unless a later full answer brings them back. Old series past the label-set cap are let go (churn under
        answers that are always partial must not pile up); how many."""
        fresh = {_key(v) for v in answer.values}
        carried = [v for v in self._kept[p] if _key(v) not in fresh]
        room = max(0, self._max_label_sets - len(answer.values))
        self._kept[p] = answer.values + carried[:room]
        return max(0, len(carried) - room)

    def _count_over_cap(self, over_cap: int) -> None:
        """Series left out this refresh for the label-set cap: counted, logged when it starts and when it ends."""
        if over_cap:
            self._dropped[OVER_CAP] = self._dropped.get(OVER_CAP, 0) + over_cap
        if bool(over_cap) != bool(self._over_cap):
            if over_cap:
                log.warning("prometheus %s: %s", self.display_url, self._over_cap_text(over_cap))
            else:
                log.info("prometheus %s: no series left out for the label-set cap any more", self.display_url)
        self._over_cap = over_cap

    def _over_cap_text(self, over_cap: int) -> str:
        flag = f" ({self._max_label_sets_flag})" if self._max_label_sets_flag else ""
        return (
            f"{over_cap:,} series left out: more than {self._max_label_sets:,} distinct label sets in one refresh{flag}"
        )

    def _plans_for(
        self, scope: Mapping[TermQuery, frozenset[str] | None] | None
    ) -> dict[TermQuery, tuple[PlannedQuery, ...]]:
        if scope is None:
            terms: Iterable[tuple[TermQuery, frozenset[str] | None]] = ((q, None) for q in self._queries)
        else:
            terms = scope.items()
        return {q: plan(q, fresh_within=self._fresh_within, namespaces=ns) for q, ns in terms}

    async def _query(
        self,
        planned: PlannedQuery,
        form: dict[str, str],
        headers: dict[str, str],
        ssl_context: ssl.SSLContext | bool,
        deadline: float,
        label_sets: LabelSets,
    ) -> Answer | SourceUnavailable:
        """One query → its answer, or why it failed (for health())."""
        try:
            # NB: the deadline covers the body too: a server trickling a large answer is cut off at it.
            async with asyncio.timeout_at(deadline):
                raw, status, content_type = await self._post({"query": planned.promql, **form}, headers, ssl_context)
        except TimeoutError:
            return SourceUnavailable(self.display_url, f"timed out after {self._timeout_seconds:g}s", kind="timeout")
        except SourceUnavailable as e:
            return e
        # NB: decoding a 10,000-GPU answer is pure Python for most of its time (read_answer): in a worker
        # thread the event loop keeps answering requests meanwhile, except during json.loads (~40 ms, one C call
        # holding the GIL), hence the decoder process. One decode at a time, as on the loop before, since the
        # answers of a refresh share ``label_sets`` (the process: its tables); and outside the deadline, because
        # a thread cannot be cancelled and the lock must not be released while it still runs.
        # Either way every fault of the answer is this query's failure (prom_answer.decode_answer), never the refresh's.
        async with self._decoding:
            try:
                if self._decoder is not None:
                    return await self._decoder.decode(raw, status, content_type, planned, self._refreshes)
                return await asyncio.to_thread(
                    lambda: decode_answer(
                        b"".join(raw), status, content_type, planned, source=self.display_url, label_sets=label_sets
                    )
                )
            except SourceUnavailable as e:
                return e

    async def _post(
        self, form: dict[str, str], headers: dict[str, str], ssl_context: ssl.SSLContext | bool
    ) -> tuple[list[bytes], int, str]:
        def too_large() -> SourceUnavailable:
            return SourceUnavailable(
                self.display_url,
                f"answer larger than {self._client.limit_text()}: refused unread, last values kept",
                kind="too_large",
            )

        return await self._client.post(
            "/api/v1/query", form, headers=headers, ssl_context=ssl_context, too_large=too_large
        )

    def _record(
        self,
        started: float,
        failed: Mapping[PlannedQuery, str],
        partial: Mapping[PlannedQuery, str],
        *,
        kind: str = "failed",
    ) -> None:
        """Health after a refresh; ``kind`` (one word, a /metrics label) is the failures' common kind if any."""
        finished = self._clock()
        prev = self._health
        problems = {**partial, **failed}
        extra = {"queries": str(len(self._kept))}
        if self._decoder is not None and self._decoder.restarts:
            extra["decoder_restarts"] = str(self._decoder.restarts)
        if failed:
            extra["failed_queries"] = str(len(failed))
        if partial:
            extra["partial_queries"] = str(len(partial))
        if self._over_cap:
            extra["series_over_cap"] = str(self._over_cap)
        error = None
        if problems:
            # NB: the reason first: /readyz and /metrics cut a line at 120 characters, and the query is the longer part.
            shown = [f"{why} ({short(p.promql, 120)})" for p, why in list(problems.items())[:3]]
            more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
            what = "failed or partial" if failed and partial else "failed" if failed else "partial"
            error = f"{len(problems)} of {len(self._kept)} queries {what}: " + "; ".join(shown) + more
            if len(problems) == len(self._kept) and len(set(problems.values())) == 1:
                error = next(iter(problems.values()))  # e.g. "cannot connect: …", once, not 12 times
        self._health = TargetHealth(
            self.display_url,
            not problems,
            last_success=prev.last_success if problems else finished,
            last_attempt=started,
            last_duration_seconds=finished - started,
            error=error,
            series=sum(len(v) for v in self._kept.values()),
            failures_total=prev.failures_total + (1 if problems else 0),
            extra=extra,
            error_kind=(kind if failed else "partial") if problems else None,
            last_error=one_line(error) if error else prev.last_error,
            last_error_kind=(kind if failed else "partial") if problems else prev.last_error_kind,
            last_error_at=finished if problems else prev.last_error_at,
            degraded=self._over_cap_text(self._over_cap) if self._over_cap else None,
            failed_reads=dict(self._failed_reads),
            dropped_series=dict(self._dropped),
        )
        # NB: log when the set of problems changes, not on every refresh of a long outage.
        signature = frozenset(problems.values())
        if signature != self._logged:
            if problems:
                log.warning("prometheus %s: %s", self.display_url, error)
            else:
                log.info("prometheus %s: all %d queries answered again", self.display_url, len(self._kept))
            self._logged = signature

    # --- pure ------------------------------------------------------------------------------------------

    def read(self, query: TermQuery) -> list[SeriesValue]:
        """Values of ``query`` from the last answers (a term the source was not built for has none)."""
        out: list[SeriesValue] = []
        for p in self._plans.get(query, ()):
            out.extend(self._kept.get(p, ()))
        return out

    def health(self) -> list[TargetHealth]:
        return [self._health]


def _key(value: SeriesValue) -> tuple[str, frozenset[tuple[str, str]]]:
    return value.name, frozenset(value.labels.items())
