"""The embedded scrape source: polls exporter /metrics URLs and keeps just what the catalogue needs.

Per target it keeps the latest value of every series the catalogue reads, and for series read as
rate/increase a short history (the longest window plus one interval), so rates need no Prometheus.
A target that fails (timeout, HTTP error, body over the size bound, malformed text) is marked unhealthy
with the reason, and its previous values are kept with their old timestamps: they age into "stale"
and are never served as fresh.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import math
import operator
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import aiohttp

from gpuscale.errors import ExpositionError, SourceUnavailable, one_line
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.histograms import BUCKET_SUFFIX, quantiles
from gpuscale.metrics.steps import Steps, finish
from gpuscale.settings import ExporterScrape
from gpuscale.sources.base import SeriesValue, TargetHealth, TermQuery, series_value
from gpuscale.sources.bounded import read_bounded, size_text
from gpuscale.sources.loop_thread import IoLoop

log = logging.getLogger(__name__)
_name_of = operator.attrgetter("name")

DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024
_STRAGGLER_GRACE_SECONDS = 0.25
_ACCEPT = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.9,*/*;q=0.1"

# One scrape's windowed series: name → label set (_series_key) → (the sample's labels, value).
Windowed = dict[str, dict[str, tuple[Mapping[str, str], float]]]


def _series_key(labels: Mapping[str, str]) -> str:
    """A series' labels as one string, to find it again in the next scrape.

    NB: a string, not a frozenset of pairs: a rate looks each series up in an older scrape, and a string
    compares in one memcmp where a frozenset compares pair by pair through objects long out of the CPU
    cache (2,881 Triton pods, three rates each: 43 ms instead of 68 ms). Label order counts, as exporters keep it; a
    series whose labels change order has no rate for one window. The separator is a lone surrogate, which
    text decoded from UTF-8 (an exposition body) cannot contain, so two label sets never share a key.
    """
    return _KEY_SEPARATOR.join(itertools.chain.from_iterable(labels.items()))


_KEY_SEPARATOR = "\udfff"
# NB: targets read between two pauses of read_steps: a gauge's rows are ~1.6 µs a target, a rate's or increase's
# ~25 µs a target that has the series (Triton's counters at 10,000 GPUs)
TARGETS_PER_STEP = 128
TARGETS_PER_WINDOWED_STEP = 8


@dataclass(slots=True)
class _Target:
    url: str
    latest_at: float | None = None
    # NB: kept as the SeriesValues reads hand out (immutable, shared by every read until the next scrape):
    # a gauge read is then one list extend per series name, not one tuple per series.
    latest: dict[str, list[SeriesValue]] = field(default_factory=dict)
    history: deque[tuple[float, Windowed]] = field(default_factory=deque)
    health: TargetHealth | None = None
    peak_devices: int = 0  # the most GPUs (MIG instances) its scrapes have held
    inflight: asyncio.Task[None] | None = None


class _Reading(NamedTuple):
    """One scrape's kept values, before they replace the target's."""

    latest: dict[str, list[SeriesValue]]
    windowed: Windowed
    kept: int
    finite: bool  # any value that is a number (not NaN or ±Inf)
    devices: int


def _delta(prev: float, cur: float) -> float:
    """A counter's increase between two samples; a drop is a reset (the counter restarted at 0)."""
    return cur - prev if cur >= prev else cur


def _increase(points: list[float]) -> float:
    """Counter increase across consecutive samples."""
    return sum(itertools.starmap(_delta, itertools.pairwise(points)), 0.0)


class ScrapeSource:
    """Scrapes a fixed list of exporter URLs (Triton, dcgm-exporter) concurrently."""

    name = "scrape"

    def __init__(
        self,
        urls: Iterable[str],
        *,
        series: Iterable[str],
        windowed_series: Iterable[str] = (),
        history_seconds: float = 120.0,
        timeout_seconds: float = 3.0,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        concurrency: int = 64,
        session: aiohttp.ClientSession | None = None,
        clock: Callable[[], float] = time.time,
        publish_early: bool = False,
        off_loop: bool = False,
    ) -> None:
        """``publish_early``: a refresh returns once half the targets have answered and the others had twice
        that long again; a slower target's scrape goes on (until its timeout) and lands in the next refresh.
        The adapter uses it so one hung exporter never delays every other pod's values; a one-shot ``top``
        waits for every target.

        ``off_loop``: scrapes run on an event loop of their own, in a thread (the adapter). At 10,000 GPUs a
        refresh is 2,250 HTTP exchanges and ~1.6 s of parsing; on the serving loop a request waited behind every
        scrape callback that was ready before it (benchmarks/bench_scrape_lag.py). On their own loop they only
        share the interpreter, which the serving loop takes back every switch interval. A one-shot ``top``
        scrapes on its own loop anyway."""
        if off_loop and session is not None:
            raise ValueError("off_loop scrapes make their own session, on their own loop")
        self._publish_early = publish_early
        self._io = IoLoop("gpuscale-scrape", own=off_loop)
        self._targets = {u: _Target(u) for u in dict.fromkeys(urls)}
        self._series = frozenset(series)
        self._windowed = frozenset(windowed_series)
        self._history_seconds = history_seconds
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        self._max_body = max_body_bytes
        self._semaphore = asyncio.Semaphore(concurrency)
        self._session = session
        self._own_session = session is None
        self._clock = clock

    @classmethod
    def from_flags(cls, flags: ExporterScrape, urls: Iterable[str], **options: Any) -> ScrapeSource:
        """The scrape source of a command's exporter flags (its deadline and body cap); ``options``: the keyword
        arguments of what the command scrapes for (series, history, session…), or its own deadline."""
        limits = {"timeout_seconds": flags.scrape_timeout, "max_body_bytes": flags.max_body_bytes}
        return cls(urls, **{**limits, **options})

    @property
    def urls(self) -> list[str]:
        return list(self._targets)

    def set_targets(self, urls: Iterable[str]) -> None:
        """Scrape exactly ``urls`` from now on; a dropped target's values go with it (its pod is gone)."""
        wanted = dict.fromkeys(urls)
        for url in list(self._targets):
            if url not in wanted:
                del self._targets[url]
        for url in wanted:
            self._targets.setdefault(url, _Target(url))

    async def close(self) -> None:
        await self._io.close(self._close())

    async def _close(self) -> None:
        inflight = [t.inflight for t in self._targets.values() if t.inflight is not None and not t.inflight.done()]
        for task in inflight:
            task.cancel()
        await asyncio.gather(*inflight, return_exceptions=True)
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    # --- I/O ---------------------------------------------------------------------------------------

    async def refresh(self, *, now: float) -> None:
        """Scrape every target. With ``publish_early``, return once the bulk has answered (see __init__)."""
        await self._io.run(self._refresh())

    async def _refresh(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers={"Accept": _ACCEPT, "User-Agent": "gpuscale"})
        if not self._publish_early:
            await asyncio.gather(*(self._scrape(t) for t in self._targets.values()))
            return
        started = asyncio.get_running_loop().time()
        for target in self._targets.values():
            if target.inflight is None or target.inflight.done():  # NB: never two scrapes of one target at once
                target.inflight = asyncio.create_task(self._scrape(target), name=f"scrape {target.url}")
        pending = {t.inflight for t in self._targets.values() if t.inflight is not None and not t.inflight.done()}
        total = len(pending)
        while pending:
            _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if len(pending) * 2 <= total:
                break
        if pending:
            # Half the targets have answered: give the rest twice that long, then publish without the stragglers
            # (a hung exporter must not hold back everyone's values); they land in the next refresh.
            elapsed = asyncio.get_running_loop().time() - started
            await asyncio.wait(pending, timeout=max(_STRAGGLER_GRACE_SECONDS, 2 * elapsed))

    async def _fetch(self, url: str) -> tuple[str, bool]:
        assert self._session is not None
        try:
            async with self._session.get(url, timeout=self._timeout) as resp:
                if resp.status != 200:
                    raise SourceUnavailable(url, f"HTTP {resp.status} {resp.reason or ''}".strip(), kind="http_status")
                body = await read_bounded(
                    resp,
                    limit_bytes=self._max_body,
                    too_large=lambda: SourceUnavailable(
                        url, f"body exceeds the {size_text(self._max_body)} limit", kind="too_large"
                    ),
                )
                openmetrics = "openmetrics" in resp.headers.get("Content-Type", "")
                return body.decode("utf-8", errors="replace"), openmetrics
        except TimeoutError as e:
            raise SourceUnavailable(url, f"timed out after {self._timeout.total:g}s", kind="timeout") from e
        except aiohttp.ClientError as e:
            raise SourceUnavailable(url, f"{type(e).__name__}: {e}", kind="connection") from e

    async def _scrape(self, target: _Target) -> None:
        started = self._clock()
        async with self._semaphore:
            try:
                text, openmetrics = await self._fetch(target.url)
                count, reading = self._read_page(text, openmetrics, target.url, started)
            except SourceUnavailable as e:
                self._failed(target, started, e.kind, e.reason)
                return
            except ExpositionError as e:
                self._failed(target, started, "malformed", str(e))
                return
        if not count:
            self._failed(target, started, "empty", "the exporter answered with no samples")
            return
        scraped_at = started
        if not reading.latest:
            self._failed(
                target,
                started,
                "no_series",
                f"none of the {len(self._series)} series gpuscale reads is in the exporter's {count} samples",
            )
            return
        if not reading.finite:
            self._failed(target, started, "all_nan", f"every one of the {reading.kept} values gpuscale reads is NaN")
            return
        self._commit(target, reading, timestamp=scraped_at)
        prev = target.health
        target.peak_devices = max(target.peak_devices, reading.devices)
        degraded = None
        if reading.devices < target.peak_devices:
            degraded = (
                f"exports {reading.devices} GPUs, {target.peak_devices} earlier: a GPU is missing from its exporter"
            )
        if prev is not None and not prev.healthy:
            log.info("scrape %s recovered", target.url)
        if degraded and (prev is None or prev.degraded != degraded):
            log.warning("scrape %s degraded: %s", target.url, degraded)
        target.health = TargetHealth(
            target.url,
            True,
            failures_total=prev.failures_total if prev else 0,
            last_success=scraped_at,
            last_attempt=started,
            last_duration_seconds=self._clock() - started,
            series=sum(len(v) for v in target.latest.values()),
            error_kind="gpus_missing" if degraded else None,
            degraded=degraded,
            last_error=degraded or (prev.last_error if prev else None),
            last_error_kind="gpus_missing" if degraded else (prev.last_error_kind if prev else None),
            last_error_at=scraped_at if degraded else (prev.last_error_at if prev else None),
        )

    def _failed(self, target: _Target, started: float, kind: str, reason: str) -> None:
        """Mark a failed or useless read; the target's previous values stay, ageing with their own timestamps."""
        reason = one_line(reason)
        prev = target.health
        if prev is None or prev.error != reason:
            # NB: once per change of reason, not every refresh: a dead exporter would repeat it every 5 s.
            log.warning("scrape %s failed: %s", target.url, reason)
        target.health = TargetHealth(
            target.url,
            False,
            last_success=prev.last_success if prev else None,
            last_attempt=started,
            last_duration_seconds=self._clock() - started,
            error=reason,
            series=prev.series if prev else 0,
            failures_total=(prev.failures_total if prev else 0) + 1,
            error_kind=kind,
            last_error=reason,
            last_error_kind=kind,
            last_error_at=started,
        )

    # --- pure --------------------------------------------------------------------------------------

    def ingest(self, url: str, samples: Iterable, *, timestamp: float) -> None:
        """Record one successful scrape of ``url`` (also used by tests to feed fixtures)."""
        target = self._targets.get(url) or self._targets.setdefault(url, _Target(url))
        self._commit(target, self._collect(samples, url=url, timestamp=timestamp), timestamp=timestamp)

    def _read_page(self, text: str, openmetrics: bool, url: str, started: float) -> tuple[int, _Reading]:
        """A page → (its number of samples, what gpuscale keeps of them)."""
        samples = parse_samples(text, source=url, openmetrics=openmetrics or None)
        # NB: samples are stamped with the request's start, as Prometheus does; stamping after reading and
        # parsing let a busy event loop skew rate windows (up to 15 % on a loaded machine).
        return len(samples), self._collect(samples, url=url, timestamp=started)

    def _collect(self, samples: Iterable, *, url: str, timestamp: float) -> _Reading:
        latest: dict[str, list[SeriesValue]] = {}
        windowed: Windowed = {}
        # NB: the parser shares one mapping between a page's samples with the same label text, and an
        # exporter repeats its label sets across families (Triton: each model's labels on every counter), so
        # each label set's key is built once per page (2,881 Triton pages: 34,500 keys → 11,500).
        keys: dict[int, str] = {}
        # NB: exposition text groups a family's samples together, and groupby skips the runs of series not
        # kept (most of a dcgm-exporter page) without a Python step per sample.
        for name, run in itertools.groupby(samples, _name_of):
            if name not in self._series:
                continue
            values = [series_value((name, s.labels, s.value, timestamp, url, None)) for s in run]
            latest.setdefault(name, []).extend(values)
            if name in self._windowed:
                by_labels = windowed.setdefault(name, {})
                for _, labels, value, *_ in values:
                    key = keys.get(id(labels))  # NB: ``values`` holds each mapping, so its id stays its own
                    if key is None:
                        key = keys[id(labels)] = _series_key(labels)
                    by_labels[key] = (labels, value)
        kept = sum(map(len, latest.values()))
        finite = any(math.isfinite(v.value) for values in latest.values() for v in values)  # NB: stops at the first
        # A GPU that falls off the bus vanishes from every family: count the devices of the largest one only.
        largest = max(latest.values(), key=len, default=[])
        devices = len({(v.labels.get("UUID"), v.labels.get("GPU_I_ID")) for v in largest if "UUID" in v.labels})
        return _Reading(latest, windowed, kept, finite, devices)

    def _commit(self, target: _Target, reading: _Reading, *, timestamp: float) -> None:
        target.latest = reading.latest
        target.latest_at = timestamp
        # NB: a new deque, never the one a reader may be walking: the build reads (on the serving loop, in steps)
        # while late scrapes commit (publish_early), on the scrape thread when off_loop.
        history = target.history.copy()
        history.append((timestamp, reading.windowed))
        while history and history[0][0] < timestamp - self._history_seconds:
            history.popleft()
        target.history = history

    def read(self, query: TermQuery) -> list[SeriesValue]:
        return finish(self.read_steps(query))

    def read_steps(self, query: TermQuery) -> Steps[list[SeriesValue]]:
        """``read`` in steps (metrics/steps.py), a few targets each: a rate over 1,000 Triton pods' histories is
        ~25 ms of Python at 10,000 GPUs, and the adapter builds on its serving loop."""
        out: list[SeriesValue] = []
        match = query.match
        windowed = query.input != "gauge"
        # NB: made once, not per target (a dataclass replace per target was 25 ms of a 10,000-GPU refresh)
        buckets = dataclasses.replace(
            query, input="increase", series=tuple(f"{s}{BUCKET_SUFFIX}" for s in query.series)
        )
        for done, target in enumerate(list(self._targets.values()), 1):
            if not done % (TARGETS_PER_WINDOWED_STEP if windowed else TARGETS_PER_STEP):
                yield
            if target.latest_at is None:
                continue
            if query.input == "gauge":
                for name in query.series:
                    rows = target.latest.get(name)
                    if rows and match:
                        rows = [v for v in rows if all(v.labels.get(k) == m for k, m in match)]
                    if rows:
                        out += rows
            elif len(target.history) < 2:  # a rate needs two scrapes; until then no value (not zero)
                continue
            elif query.input == "histogram_quantile":
                increases: list[SeriesValue] = []
                self._windowed_read(target, buckets, increases)
                out += quantiles(increases, q=query.quantile if query.quantile is not None else math.nan)
            else:
                self._windowed_read(target, query, out)
        return out

    def _windowed_read(self, target: _Target, query: TermQuery, out: list[SeriesValue]) -> None:
        """Append the target's rates or increases over the query's window to ``out``."""
        history = target.history
        newest_at, newest = history[-1]
        # NB: 2 % slack so scrape jitter does not drop the point that opens the window.
        start = newest_at - query.window_seconds * 1.02
        rate, match, url = query.input == "rate", query.match, target.url
        for name in query.series:
            current = newest.get(name)
            if not current:
                continue
            # Only this series name's scrapes in the window, so a query never walks the other counters' series.
            scrapes = [(ts, by_labels) for ts, values in history if ts >= start and (by_labels := values.get(name))]
            if len(scrapes) < 2:
                continue
            if match:
                current = {k: v for k, v in current.items() if all(v[0].get(m) == want for m, want in match)}
            if len(scrapes) == 2:
                # The common case (a one-shot `top`, or a window of two scrapes): one earlier point per series,
                # without the general path's per-series lists (2,881 Triton pods: ~67 ms instead of ~103 ms).
                first_at, first = scrapes[0]
                span = newest_at - first_at
                for key, (labels, last) in current.items():
                    earlier = first.get(key)
                    if earlier is not None:
                        increase = _delta(earlier[1], last)
                        value = increase / span if rate else increase
                        out.append(series_value((name, labels, value, newest_at, url, span)))
                continue
            for key, (labels, _) in current.items():
                points = [(ts, by_labels[key][1]) for ts, by_labels in scrapes if key in by_labels]
                if len(points) < 2:
                    continue
                span = newest_at - points[0][0]
                increase = _increase([v for _, v in points])
                value = increase / span if rate else increase
                out.append(series_value((name, labels, value, newest_at, url, span)))

    def health(self) -> list[TargetHealth]:
        return [t.health or TargetHealth(t.url, False, error="not scraped yet") for t in self._targets.values()]
