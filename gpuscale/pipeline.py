"""The refresh loop: source → attribution → aggregation → store, once per interval.

Thin on purpose (kopf's loop style): ``refresh_once`` does one whole cycle and is what tests call;
``run`` only repeats it on a timer. Request handlers never wait on this loop: the snapshot is built on the event
loop in time slices between requests (``run_sliced``) and swapped into the store in one assignment.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterator

from gpuscale.metrics.aggregation import snapshot_steps
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.metrics.series import MetricsSource, SeriesValue, TermQuery
from gpuscale.metrics.steps import Steps, already, run_sliced
from gpuscale.metrics.store import MetricsStore, Snapshot
from gpuscale.piecemeal import free_piecemeal

log = logging.getLogger(__name__)


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector (reference counting still frees everything acyclic).

    NB: a refresh of a large cluster allocates ~10⁶ objects (decoded JSON, samples) while ~10⁶ others are
    alive, and every automatic collection on the way walks them: on 1,250 nodes × 8 GPUs that tripled the
    time of a `top` frame (benchmarks/bench_top.py) and of an adapter refresh (bench_refresh.py). The
    data has no reference cycles to speak of, so refreshes run with the collector paused.

    NB: on the way out, everything the refresh left alive goes straight to the oldest generation (freeze, then
    unfreeze: two list splices, no traversal). Resumed as it was, the collector's next young collection walked
    those ~10⁵ new objects in one C call holding the GIL: 18–19 ms after every 10,000-GPU refresh, on whichever
    thread allocated next — usually the event loop, so an HPA request waited that long (bench_refresh_lag.py).
    They are still collected with the oldest generation, as anything long-lived is.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.unfreeze()
        if enabled:
            gc.enable()


SNAPSHOT_CONTAINERS = ("values", "members", "device_partials", "dropped")


class Pipeline:
    def __init__(
        self,
        catalogue: Catalogue,
        source: MetricsSource,
        store: MetricsStore,
        attributor: Attributor,
        *,
        interval_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
        on_refresh: Callable[[Snapshot, float], None] | None = None,
        before_refresh: Callable[[], None] | None = None,
        prepare: Callable[[Snapshot], Steps[Callable[[], None]]] | None = None,
        gather: Callable[[float], Awaitable[None]] | None = None,
    ) -> None:
        self.catalogue = catalogue
        self.source = source
        self.store = store
        self.attributor = attributor
        self.interval_seconds = interval_seconds
        self.clock = clock
        self.on_refresh = on_refresh
        self.before_refresh = before_refresh  # e.g. target discovery from the watch cache
        # Steps run with the build, on the new snapshot before it is served (e.g. the adapter's answers to the
        # queries asked recently); what they return runs on the loop in the same step as the swap.
        self.prepare = prepare
        # I/O the preparation needs, awaited after the source's refresh with the build's time (e.g. the forecasts'
        # recorded history): the build's steps never wait on I/O.
        self.gather = gather
        self.refreshes = 0
        self._wake = asyncio.Event()  # set by refresh_soon: run() starts the next cycle now
        self._started = 0  # cycles started
        self._finished = 0  # the number of the newest cycle that ended (in success or failure)
        self._ended = asyncio.Condition()

    async def refresh_once(self) -> Snapshot:
        started = time.perf_counter()
        self._started += 1
        number = self._started
        try:
            with cyclic_gc_paused():
                if self.before_refresh:
                    self.before_refresh()
                await self.source.refresh(now=self.clock())
                now = self.clock()
                if self.gather is not None:
                    await self.gather(now)
                # NB: the build is ~0.5 s of pure Python at 10,000 GPUs; in one go on the event loop it held every
                # HPA request for that long (issue 21), in a thread it delayed them at every system call
                # (run_sliced). Nothing else mutates the source or the attributor while this runs: refreshes
                # never overlap.
                snapshot, install = await run_sliced(self._build(now=now))
            retired = self.store.snapshot
            self.store.update(snapshot)  # NB: on the loop, one reference swap: a request sees one whole snapshot
            if install is not None:
                install()  # NB: no await in between: no request sees the new snapshot without what was prepared
            freeing = self._retire(retired)
            del retired
            self.refreshes += 1
            if self.on_refresh:
                self.on_refresh(snapshot, time.perf_counter() - started)
            if freeing is not None:
                await run_sliced(freeing)  # NB: the refresh ends once its garbage is gone: none overlaps the next one
            return snapshot
        finally:
            async with self._ended:
                self._finished = max(self._finished, number)
                self._ended.notify_all()

    def _retire(self, snapshot: Snapshot | None) -> Steps[int] | None:
        """Free the snapshot just replaced piecemeal (gpuscale/piecemeal.py), in slices: dropped here, its ~10⁵
        objects at 10,000 GPUs were freed on the event loop in one go, holding every request for 10–40 ms."""
        # NB: held by refresh_once's name, this argument and getrefcount's: nobody reads it any more
        if snapshot is None or sys.getrefcount(snapshot) != 3:
            return None
        return free_piecemeal(snapshot, SNAPSHOT_CONTAINERS)

    async def refresh_soon(self, *, timeout: float) -> None:
        """Return once a refresh that started after this call has ended (``run`` is woken to start it now).

        For a request that needs something the current snapshot lacks (demand-driven refresh): a cycle already
        running was planned before the request, so it waits for the next. TimeoutError after ``timeout``
        seconds (e.g. when no ``run`` loop is refreshing).
        """
        wanted = self._started + 1
        self._wake.set()
        async with asyncio.timeout(timeout), self._ended:
            await self._ended.wait_for(lambda: self._finished >= wanted)

    def _build(self, *, now: float) -> Steps[tuple[Snapshot, Callable[[], None] | None]]:
        # NB: in steps too: dropping the last refresh's ~10⁴ device memos took ~3 ms of the event loop in one go
        yield from self.attributor.begin_refresh_steps()
        snapshot = yield from snapshot_steps(self.catalogue, self._read_steps, self.attributor, now=now)
        install = (yield from self.prepare(snapshot)) if self.prepare is not None else None
        return snapshot, install

    def _read_steps(self, query: TermQuery) -> Steps[list[SeriesValue]]:
        """A term's values in steps where the source computes them at length (ScrapeSource.read_steps: rates target by
        target), else at once (a Prometheus answer is a list already)."""
        read_steps = getattr(self.source, "read_steps", None)
        return read_steps(query) if read_steps is not None else already(self.source.read(query))

    async def run(self) -> None:
        """Refresh forever, on a fixed cadence (a slow cycle delays the next, never stacks them); a
        ``refresh_soon`` starts the next cycle at once."""
        while True:
            started = time.monotonic()
            self._wake.clear()
            try:
                await self.refresh_once()
            except asyncio.CancelledError:
                raise
            except Exception:  # NB: a bug in one cycle must not stop the loop; it is logged with its traceback
                log.exception("refresh failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._wake.wait(), timeout=max(0.0, self.interval_seconds - (time.monotonic() - started))
                )
