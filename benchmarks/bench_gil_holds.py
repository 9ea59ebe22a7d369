"""What holds the interpreter lock for long in the adapter's process during a refresh (issue 36, item 1).

The adapter runs as benchmarks/bench_cluster_serving.py runs it (10,000 GPUs, the 4,000 distinct HPA queries asked
once, so every refresh prepares their answers), in this process, against that benchmark's fake Prometheus (a child
process); no HPA requests are sent while measuring, so what delays a thread here is the adapter's own work.

Two measures, on separate refreshes:

* **watchdog** (the first ``--refreshes``): a thread sleeps 0.5 ms in a loop and records every wake-up more than
  1 ms late, with the CPU time each thread of the process used meanwhile (``pthread_getcpuclockid``) and the stack
  of the thread that used most: where it was when it let go, i.e. in the call that held the lock (py-spy style). On
  a quiet machine a thread that used ≈ the lateness held the lock; on a busy one the watchdog also waits for a core
  while the others run, so read it there as where to look, not as holds.
* **lines** (the next ``--profiled``): a trace function on every thread times, by the thread's own CPU clock (which
  a busy machine does not inflate), each line of gpuscale's code (``--everywhere``: every module's) up to the next
  trace event, and what follows each return (the frame's locals freed, the rest of the caller's line); spans over
  0.5 ms are listed at their line, and the count over 1 ms per thread. A long line that is one operation (a C call,
  a dict built from an iterator, a container freed) held the interpreter lock throughout; one that waits in the
  kernel (``select``) did not.

Usage: .venv/bin/python benchmarks/bench_gil_holds.py [--refreshes 3] [--profiled 1] [--everywhere]
(about a minute; needs the load generator of bench_cluster_serving.py)
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_adapter_peers import loadgen_binary
from bench_cluster_serving import _fake_prometheus, paths, start_bench_adapter

NAP = 0.0005
LATE = 0.001


class Watchdog(threading.Thread):
    """Wakes every NAP; a wake-up over LATE late is written down with who used the CPU meanwhile and where it was."""

    def __init__(self) -> None:
        super().__init__(name="watchdog", daemon=True)
        self.stalls: list[tuple[float, float, float, str, list[str]]] = []  # at, late, cpu, thread, stack
        self.stop = threading.Event()

    def run(self) -> None:
        sys.settrace(None)  # NB: not traced itself
        me = threading.get_ident()
        clocks: dict[int, tuple[str, int]] = {}
        listed = 0.0
        while not self.stop.is_set():
            now = time.perf_counter()
            if now - listed > 0.1:  # NB: the executor's threads come and go
                clocks = {}
                for t in threading.enumerate():
                    if t.ident != me and t.ident is not None:
                        try:
                            clocks[t.ident] = (t.name, time.pthread_getcpuclockid(t.ident))
                        except (OSError, ProcessLookupError):
                            continue
                listed = now
            before = {i: _cpu(c) for i, (_, c) in clocks.items()}
            t0 = time.perf_counter()
            time.sleep(NAP)
            late = time.perf_counter() - t0 - NAP
            if late <= LATE:
                continue
            used = {i: _cpu(c) - before[i] for i, (_, c) in clocks.items()}
            culprit = max(used, key=used.__getitem__)
            frame = sys._current_frames().get(culprit)
            stack = []
            while frame is not None and len(stack) < 6:
                stack.append(f"{_short(frame.f_code.co_filename)}:{frame.f_lineno} {frame.f_code.co_name}")
                frame = frame.f_back
            self.stalls.append((time.time() - late, late, used[culprit], clocks[culprit][0], stack))


def _cpu(clock: int) -> float:
    try:
        return time.clock_gettime(clock)
    except OSError:
        return 0.0  # NB: the thread ended


def _short(path: str) -> str:
    for marker in ("/gpuscale/", "/site-packages/", "/lib/python3"):
        if marker in path:
            return path[path.index(marker) + 1 :]
    return path


class LineTimer:
    """A trace function for every thread: while ``active``, the thread CPU time from one trace event of gpuscale's
    code (a line, a call, a return: then the caller's line) to the next event of the same thread; a span over 0.5 ms
    is written down at its line. A line of one operation that long held the interpreter lock throughout (the lines
    are read to tell)."""

    def __init__(self, *, only_gpuscale: bool = True) -> None:
        self.active = False
        self.only_gpuscale = only_gpuscale
        self.last: dict[int, tuple[float, Any, int]] = {}  # thread → (CPU time, code, line) of its last event
        self.lines: list[tuple[float, str, str]] = []  # (ms, thread, where)

    def __call__(self, frame, event: str, arg):
        if not self.active:
            return None
        now = time.thread_time()
        me = threading.get_ident()
        last = self.last.pop(me, None)
        if last is not None and now - last[0] > 0.0005:
            self.lines.append(((now - last[0]) * 1e3, threading.current_thread().name, _where(last[1], last[2])))
        if not self._traced(frame):
            return None
        # NB: the place now (the frame moves on); after a return, the caller's line: its locals are freed and the
        # rest of that line runs before the next event
        back = frame.f_back if event == "return" else None
        if back is not None and self._traced(back):
            self.last[me] = (time.thread_time(), back.f_code, back.f_lineno)
        elif event != "return":
            self.last[me] = (time.thread_time(), frame.f_code, frame.f_lineno)
        return self

    def _traced(self, frame) -> bool:
        return not self.only_gpuscale or "/gpuscale/" in frame.f_code.co_filename

    def start(self) -> None:
        self.last.clear()
        self.active = True

    def stop(self) -> None:
        self.active = False


def _where(code, line: int) -> str:
    return f"{_short(code.co_filename)}:{line} {code.co_name}"


async def measure(prometheus: str, refreshes: int, profiled: int, everywhere: bool, work: Path) -> None:
    tracer = LineTimer(only_gpuscale=not everywhere)
    if profiled:
        # NB: every thread started from now on (the adapter's), and this one; idle until a profiled refresh, yet
        # called at every Python call: --profiled 0 leaves the watched refreshes untouched
        threading.settrace(tracer)
        sys.settrace(tracer)
    log = (work / "events").open("a", buffering=1)
    adapter = await start_bench_adapter(prometheus, log)
    urls = work / "urls"
    urls.write_text("".join(f"{adapter.url}{p}\n" for p in paths()))
    while not adapter.store.ready:
        await asyncio.sleep(0.1)
    # NB: every query asked once, so that each refresh prepares its answer (as in the benchmark)
    warm = await asyncio.create_subprocess_exec(
        loadgen_binary(), "-urls", str(urls), "-warmup", "0s", "-mode", "closed", "-connections", "8",
        "-count", str(len(paths())), stdout=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    await warm.wait()
    pipeline = adapter.pipeline
    build, refresh_once = pipeline._build, pipeline.refresh_once
    builds: list[tuple[float, float, float]] = []  # wall start, wall end, the loop thread's CPU seconds meanwhile

    def timed_build(**kwargs):
        # NB: the build is steps run on the serving loop (metrics/steps.py): its span, and the loop's CPU across it
        started, cpu = time.time(), time.thread_time()
        try:
            return (yield from build(**kwargs))
        finally:
            builds.append((started, time.time(), time.thread_time() - cpu))

    async def traced_refresh():
        tracer.start()
        try:
            return await refresh_once()
        finally:
            tracer.stop()

    pipeline._build = timed_build  # type: ignore[method-assign]
    watchdog = Watchdog()
    done = pipeline.refreshes
    watchdog.start()
    while pipeline.refreshes < done + refreshes:
        await asyncio.sleep(0.1)
    watchdog.stop.set()
    await asyncio.to_thread(watchdog.join)
    report_watchdog(watchdog, builds)
    if profiled:
        pipeline.refresh_once = traced_refresh  # type: ignore[method-assign]
        done = pipeline.refreshes
        while pipeline.refreshes < done + profiled:
            await asyncio.sleep(0.1)
        report_lines(tracer, profiled)
    await adapter.stop()


def report_watchdog(watchdog: Watchdog, builds: list[tuple[float, float, float]]) -> None:
    print(f"watchdog: {len(builds)} refreshes (build {', '.join(f'{b - a:.2f}' for a, b, _ in builds)} s wall, "
          f"{', '.join(f'{c:.2f}' for _, _, c in builds)} s CPU); {len(watchdog.stalls)} wake-ups over "
          f"{LATE * 1e3:g} ms late", flush=True)  # fmt: skip
    held = [s for s in watchdog.stalls if s[2] >= 0.5 * s[1]]
    print(f"  of which the busiest thread used ≥ half the lateness in CPU (a hold, on a quiet machine): {len(held)}; "
          f"longest {max((s[2] for s in held), default=0) * 1e3:.2f} ms CPU")  # fmt: skip
    for at, late, cpu, thread, stack in sorted(held, key=lambda s: -s[2])[:20]:
        phase = next((f"build +{at - a:.3f} s" for a, b, _ in builds if a <= at <= b), "outside the build")
        print(f"  late {late * 1e3:6.2f} ms, {thread} used {cpu * 1e3:6.2f} ms CPU ({phase})")
        for line in stack[:3]:
            print(f"        {line}")


def report_lines(tracer: LineTimer, refreshes: int) -> None:
    by_where: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ms, thread, where in tracer.lines:
        by_where[thread, where].append(ms)
    longest = max((ms for ms, _, _ in tracer.lines), default=0.0)
    print(f"lines, {refreshes} traced refresh(es) (thread CPU time): longest "
          f"{longest:.2f} ms; over 1 ms: {sum(1 for ms, _, _ in tracer.lines if ms > 1)}; over 0.5 ms: "
          f"{len(tracer.lines)}", flush=True)  # fmt: skip
    threads: dict[str, int] = defaultdict(int)
    for ms, thread, _ in tracer.lines:
        threads[thread] += ms > 1
    print(f"  over 1 ms by thread: {dict(sorted(threads.items()))}")
    for (thread, where), held in sorted(by_where.items(), key=lambda kv: -max(kv[1]))[:30]:
        print(f"  {max(held):6.2f} ms max, {len(held):4d} over 0.5 ms  [{thread}] {where}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--refreshes", type=int, default=3, help="refreshes watched by the watchdog (default 3)")
    parser.add_argument("--profiled", type=int, default=1, help="refreshes with lines timed (default 1)")
    parser.add_argument(
        "--everywhere", action="store_true", help="time the lines of every module (libraries too), not gpuscale's only"
    )
    args = parser.parse_args()
    import gpuscale.cli.adapter as composition

    sys.setswitchinterval(composition.SWITCH_INTERVAL_S)  # NB: as `gpuscale adapter` runs
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    fake = ctx.Process(target=_fake_prometheus, args=(q,), daemon=True)
    fake.start()
    try:
        prometheus = f"http://127.0.0.1:{q.get(timeout=300)}"
        with tempfile.TemporaryDirectory(prefix="gpuscale-gil-") as tmp:
            asyncio.run(measure(prometheus, args.refreshes, args.profiled, args.everywhere, Path(tmp)))
    finally:
        fake.terminate()
        fake.join(10)


if __name__ == "__main__":
    main()
