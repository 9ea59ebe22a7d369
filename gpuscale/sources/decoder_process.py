"""Prometheus answers decoded in a child process, so that serving never waits on a decode (issue 21, item 1).

Why a process: ``json.loads`` of one answer of a 10,000-GPU fleet (~5 MB, one DCGM field) is a single C call
that holds the GIL for ~40 ms; in a worker thread the adapter's event loop still could not run for that long, so
the p99 of HPA requests during a refresh was that long (benchmarks/bench_hpa_latency.py: 39.7 ms against 3.7 ms
at rest). The child does the JSON decode and ``read_answer`` (sources/prom_answer.py, the same code the thread
path runs), and sends back a compact answer: the series as three arrays (label-set number, value, timestamp)
plus only the label sets the adapter has not been sent yet. Label sets change rarely from one refresh to the
next (the GPUs and pods of a fleet stay), so after the first refresh an answer costs the adapter ~240 KB of
arrays per 10,000 series and one Python loop in a worker thread, which the interpreter interrupts every switch
interval to serve requests.

Label sets are numbered by the child, never reused; a set no answer has had for ``KEEP_GENERATIONS``
refreshes is forgotten by both sides (the child says which), and neither table ever holds more than
``max_label_sets`` (the adapter's ``--prometheus-max-label-sets``): when a new set finds the table full, the sets
this refresh has not had are forgotten at once, so churn (20,000 new pods per answer) costs at most that many sets
on each side; only a single refresh with more distinct sets than that loses series (counted, Answer.over_cap).

The protocol, on the child's stdin and stdout (both ends are gpuscale of the same installation; pickle is
never read from anywhere else): a request is ``<IQ`` (header length, body length), the pickled header
``(planned, status, content_type, source, generation, max_label_sets)`` and the raw body; a reply is ``<Q``
(length) and the pickled reply, ``("ok", forget, new_set_chunks, names, ids, values, stamps, warnings, partial,
over_cap)`` or ``("error", reason, kind, forget)``. The child exits when its stdin closes, so it never outlives
the adapter.

Faults: whatever is wrong with an answer (sources/prom_answer.decode_answer, shared with the thread mode) fails
its query only, with the reason in the reply. A child that dies, hangs past ``timeout_seconds`` or answers
garbage is killed; the query in flight fails with kind ``decoder`` (its last values keep serving, as for any
failed query: sources/prometheus.py) and the next query starts a new child with empty tables.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import struct
import sys
from array import array
from collections.abc import Sequence
from pathlib import Path
from typing import Any, BinaryIO

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.steps import STEP, Steps, run_sliced
from gpuscale.sources.base import SeriesValue, series_value
from gpuscale.sources.prom_answer import DEFAULT_MAX_LABEL_SETS, Answer, LabelSets, PlannedQuery, decode_answer

__all__ = ["KEEP_GENERATIONS", "DecoderProcess", "main"]

_REQUEST = struct.Struct("<IQ")
_REPLY = struct.Struct("<Q")
KEEP_GENERATIONS = 12  # refreshes a label set stays known without appearing in an answer
_SETS_PER_CHUNK = 1000  # the adapter unpickles new label sets a chunk at a time: no long GIL hold
_STREAM_LIMIT = 1 << 20


# --- the child ----------------------------------------------------------------------------------------------


class _Table:
    """The child's label sets: each shared dict (LabelSets) with its number and the refresh it last appeared in.

    At most ``limit`` sets: when a new one finds the table full, the sets this refresh has not had yet are forgotten
    first (the adapter is told in the reply), and only if that frees nothing is the series left out (Answer.over_cap).
    """

    def __init__(self) -> None:
        self.sets = LabelSets(make_room=self.make_room)
        self.number: dict[int, int] = {}  # id(labels) → number
        self.held: dict[int, dict[str, str]] = {}  # number → labels (keeps id() valid)
        self.seen: dict[int, int] = {}  # number → generation
        self.next = 0
        self.swept = 0
        self.generation = 0
        self.gone: list[int] = []  # forgotten since the last reply

    def sweep(self, generation: int) -> None:
        """Forget the sets no answer had in the last KEEP_GENERATIONS refreshes."""
        self.generation = generation
        if generation < self.swept + KEEP_GENERATIONS:
            return
        self.swept = generation
        self._forget([n for n, g in self.seen.items() if g < generation - KEEP_GENERATIONS])

    def make_room(self) -> bool:
        """The table is full: forget every set this refresh has not had yet; whether any was."""
        reading = {id(v.labels) for v in self.sets.reading}  # NB: had by the answer being read, not yet marked seen
        held = self.held
        gone = [n for n, g in self.seen.items() if g < self.generation and id(held[n]) not in reading]
        self._forget(gone)
        return bool(gone)

    def _forget(self, gone: list[int]) -> None:
        if not gone:
            return
        ids = {id(self.held[n]) for n in gone}
        for n in gone:
            del self.number[id(self.held.pop(n))]
            del self.seen[n]
        index = self.sets.index
        for key in [k for k, v in index.items() if id(v[0]) in ids]:
            del index[key]  # NB: in place: read_answer may be reading through this very index
        for positions in self.sets.by_length.values():
            positions[:] = [None] * len(positions)  # NB: in place, as the answer being read holds one of them
        self.sets.by_length.clear()  # NB: its positions would keep forgotten dicts alive
        self.gone.extend(gone)

    def taken_gone(self) -> list[int]:
        gone, self.gone = self.gone, []
        return gone

    def compact(self, answer: Answer, planned: PlannedQuery, generation: int) -> tuple[Any, ...]:
        numbers, values, stamps = array("q"), array("d"), array("d")
        new: list[tuple[int, dict[str, str], str]] = []
        names: list[str] = []
        odd = False
        known, seen = self.number, self.seen
        for v in answer.values:
            n = known.get(id(v.labels))
            if n is None:
                n = known[id(v.labels)] = self.next
                self.next += 1
                self.held[n] = v.labels
                new.append((n, v.labels, v.target))
            seen[n] = generation
            numbers.append(n)
            values.append(v.value)
            stamps.append(v.timestamp)
            names.append(v.name)
            odd = odd or v.name != planned.name
        chunks = [
            pickle.dumps(new[i : i + _SETS_PER_CHUNK], protocol=pickle.HIGHEST_PROTOCOL)
            for i in range(0, len(new), _SETS_PER_CHUNK)
        ]
        return (
            "ok",
            self.taken_gone(),
            chunks,
            names if odd else None,
            numbers.tobytes(),
            values.tobytes(),
            stamps.tobytes(),
            answer.warnings,
            answer.partial,
            answer.over_cap,
        )


def _handle(table: _Table, header: tuple[Any, ...], raw: bytes) -> tuple[Any, ...]:
    planned, status, content_type, source, generation, max_label_sets = header
    table.sets.limit = max_label_sets
    table.sweep(generation)
    try:
        answer = decode_answer(raw, status, content_type, planned, source=source, label_sets=table.sets)
    except SourceUnavailable as e:
        return ("error", e.reason, e.kind, table.taken_gone())
    return table.compact(answer, planned, generation)


def _read(stream: BinaryIO, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def main() -> None:
    """The child's loop: one request in, one reply out, until stdin closes."""
    # NB: where the adapter shares a core with its child (a CPU limit, a pinned benchmark), serving comes first: at
    # equal priority a decode could take the core from the adapter's event loop while it builds or serves.
    with contextlib.suppress(OSError):
        os.nice(10)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # NB: nothing but replies may ever reach the protocol's pipe
    table = _Table()
    while (head := _read(stdin, _REQUEST.size)) is not None:
        header_size, body_size = _REQUEST.unpack(head)
        header = _read(stdin, header_size)
        raw = _read(stdin, body_size)
        if header is None or raw is None:
            return
        reply = pickle.dumps(_handle(table, pickle.loads(header), raw), protocol=pickle.HIGHEST_PROTOCOL)
        stdout.write(_REPLY.pack(len(reply)))
        stdout.write(reply)
        stdout.flush()


# --- the adapter's side ---------------------------------------------------------------------------------------


class DecoderProcess:
    """The adapter's end: sends raw answers to the child, turns its compact replies into Answers.

    One decode at a time (the caller holds a lock); ``close`` ends the child. ``restarts`` counts children that
    had to be killed (shown in the source's health).
    """

    def __init__(
        self, source: str, *, timeout_seconds: float = 30.0, max_label_sets: int = DEFAULT_MAX_LABEL_SETS
    ) -> None:
        self._source = source
        self._timeout = timeout_seconds
        self._max_label_sets = max_label_sets
        self._proc: asyncio.subprocess.Process | None = None
        self._sets: dict[int, tuple[dict[str, str], str]] = {}
        self._reaping: set[asyncio.Task[int]] = set()
        self.restarts = 0
        self.started = 0

    async def decode(
        self, raw: Sequence[bytes], status: int, content_type: str, planned: PlannedQuery, generation: int
    ) -> Answer:
        """The answer to the body ``raw`` (the chunks it came in), or SourceUnavailable: the server's fault (as
        read_answer says) or the child's (kind decoder)."""
        try:
            async with asyncio.timeout(self._timeout):
                proc = await self._running()
                assert proc.stdin is not None and proc.stdout is not None
                header = pickle.dumps((planned, status, content_type, self._source, generation, self._max_label_sets))
                proc.stdin.write(_REQUEST.pack(len(header), sum(map(len, raw))))
                proc.stdin.write(header)
                # NB: a chunk at a time, each drained: the pipe takes 64 KB at once, and the rest of a 4 MB body
                # written whole was copied into the transport's buffer in one C call holding the interpreter lock
                for chunk in raw:
                    proc.stdin.write(chunk)
                    await proc.stdin.drain()
                await proc.stdin.drain()
                (size,) = _REPLY.unpack(await proc.stdout.readexactly(_REPLY.size))
                data = await proc.stdout.readexactly(size)
        except TimeoutError:
            raise self._failed(f"did not answer within {self._timeout:g}s") from None
        except (OSError, asyncio.IncompleteReadError) as e:
            code = await self._exit_code()
            if code is None:
                raise self._failed(f"failed: {type(e).__name__}: {e}") from None
            raise self._failed(f"exited (killed by signal {-code})" if code < 0 else f"exited (code {code})") from None
        except BaseException:
            self._kill()  # NB: cancelled mid-exchange: the pipe is out of step
            raise
        # NB: in slices on the caller's loop (the adapter's serving loop): in a worker thread this loop over 10,000
        # series took the interpreter lock from the loop at each of its system calls (metrics/steps.py)
        return await run_sliced(self._answer(data, planned))

    def _answer(self, data: bytes, planned: PlannedQuery) -> Steps[Answer]:
        reply = pickle.loads(data)
        if reply[0] == "error":
            _, reason, kind, forget = reply
            self._forget(forget)
            raise SourceUnavailable(self._source, reason, kind=kind)
        _, forget, chunks, names, numbers_b, values_b, stamps_b, warnings, partial, over_cap = reply
        self._forget(forget)
        sets = self._sets
        for chunk in chunks:
            for n, labels, target in pickle.loads(chunk):
                sets[n] = (labels, target)
            yield
        numbers, values, stamps = array("q"), array("d"), array("d")
        numbers.frombytes(numbers_b)
        values.frombytes(values_b)
        stamps.frombytes(stamps_b)
        window = planned.window_seconds
        name = planned.name
        out: list[SeriesValue] = []
        append = out.append
        for start in range(0, len(numbers), STEP):  # NB: not chunked.spans: the child must not import numpy
            piece = slice(start, start + STEP)
            if names is None:
                for n, value, ts in zip(numbers[piece], values[piece], stamps[piece], strict=True):
                    labels, target = sets[n]
                    append(series_value((name, labels, value, ts, target, window)))
            else:
                for n, value, ts, named in zip(numbers[piece], values[piece], stamps[piece], names[piece], strict=True):
                    labels, target = sets[n]
                    append(series_value((named, labels, value, ts, target, window)))
            yield
        return Answer(out, warnings, partial, over_cap)

    def _forget(self, numbers: list[int]) -> None:
        for n in numbers:
            self._sets.pop(n, None)

    async def _running(self) -> asyncio.subprocess.Process:
        if self._proc is not None and self._proc.returncode is None:
            return self._proc
        if self._proc is not None:
            self._kill()
        # NB: the child imports the gpuscale this process runs (not one in its working directory: -P).
        env = dict(os.environ)
        here = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-P",
            "-m",
            "gpuscale.sources.decoder_process",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
            limit=_STREAM_LIMIT,
        )
        self.started += 1
        return self._proc

    @property
    def pid(self) -> int | None:
        """The running child's process id (None before the first decode and after a failure)."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def _exit_code(self) -> int | None:
        """The child's exit code once its pipe closed (a moment to reap it), or None if it still runs."""
        if self._proc is None:
            return None
        with contextlib.suppress(TimeoutError):
            return await asyncio.wait_for(self._proc.wait(), 1.0)
        return None

    def _failed(self, why: str) -> SourceUnavailable:
        self._kill()
        self.restarts += 1
        return SourceUnavailable(
            self._source, f"answer decoder process {why}: killed; a new one starts with the next query", kind="decoder"
        )

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._sets.clear()  # NB: a new child numbers label sets from 0 again
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        # NB: reaped in the background, so that no zombie is left; the set keeps the task alive until then
        reap = asyncio.get_running_loop().create_task(proc.wait())
        self._reaping.add(reap)
        reap.add_done_callback(self._reaping.discard)

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        self._sets.clear()
        if self._reaping:
            await asyncio.gather(*self._reaping, return_exceptions=True)
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()  # NB: the child exits at end of input
        try:
            await asyncio.wait_for(proc.wait(), 5.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


if __name__ == "__main__":
    main()
