"""Request traces: (arrival offset, input tokens, output tokens) per request, from the formats users have.

Formats, chosen by the file's content (``.gz`` is read transparently):

- Azure LLM inference trace 2023 CSV: ``TIMESTAMP,ContextTokens,GeneratedTokens`` (wall clock with up to
  7 fractional digits, 100 ns).
- Mooncake FAST'25 JSONL: ``{"timestamp": ms, "input_length": n, "output_length": n, ...}`` (its timestamps
  have coarse resolution: about one distinct value per 3 s).
- Plain CSV: ``timestamp,input_tokens,output_tokens`` with timestamp in seconds (float) or ISO 8601.
- Service-time CSV (any service, not only LLMs): a header with ``timestamp`` and ``service_time`` (seconds a
  request keeps one of a replica's slots busy) and optionally ``model`` (the model or adapter it needs), in any
  order; other columns are ignored. Replayed by the general service model (gpuscale/replay/general.py).

Equal timestamps are valid (a coarse clock, a burst logged in the same millisecond) and kept in file order;
so are zero costs. Bad rows are errors naming the file, the line and the field: unsorted timestamps, missing,
non-integer or negative token counts, missing or negative service times. Offsets start at 0.

Limits: the file holds at most DATA_LIMIT_BYTES once decompressed (gpuscale/files.py), at most
MAX_ROWS requests and token counts below MAX_TOKENS; a UTF-8 byte-order mark is skipped.
"""

from __future__ import annotations

import csv
import functools
import io
import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from importlib.abc import Traversable
from pathlib import Path
from typing import TypeVar

import numpy as np

from gpuscale.errors import ConfigError
from gpuscale.files import DATA_LIMIT_BYTES, decode_utf8, read_bytes

_T = TypeVar("_T")

MAX_ROWS = 5_000_000
"""Rows a trace (its requests), a metric history, an --external series or an @file of samples may hold
(docs/simulate.md's longest benchmark has 2.2 million requests); counted as lines first, so a larger file is
refused before a row is parsed."""
MAX_TOKENS = 10**9
"""Tokens one request may have in or out (a model's context is < 10⁷); held as int64 counts."""


@dataclass(frozen=True)
class Trace:
    """Requests sorted by arrival; arrays of equal length."""

    name: str
    arrival_s: np.ndarray  # float64 seconds from the first request
    input_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    service_s: np.ndarray | None = None  # float64 seconds per request (service-time traces)
    model: np.ndarray | None = None  # int64 index into ``models`` per request
    models: tuple[str, ...] = ()
    origin: float = 0.0  # the file's timestamp of offset 0 (to align other series, e.g. --external, with it)

    def _take(self, index: np.ndarray, arrival: np.ndarray, *, shift: float = 0.0) -> Trace:
        return Trace(
            self.name,
            arrival,
            self.input_tokens[index],
            self.output_tokens[index],
            None if self.service_s is None else self.service_s[index],
            None if self.model is None else self.model[index],
            self.models,
            self.origin + shift,
        )

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def window(self, *, start_s: float = 0.0, duration_s: float | None = None, speedup: float = 1.0) -> Trace:
        """The requests in [start, start + duration), re-based to 0 and compressed ``speedup`` times."""
        end = np.inf if duration_s is None else start_s + duration_s
        keep = (self.arrival_s >= start_s) & (self.arrival_s < end)
        return self._take(keep, (self.arrival_s[keep] - start_s) / speedup, shift=start_s)

    def scaled(self, factor: float, *, seed: int = 0) -> Trace:
        """The same arrival pattern with ``factor`` times the requests: each request is repeated
        ⌊factor⌋ times and once more with probability frac(factor) (seeded, so deterministic); the
        traces' README suggests scaling the rate this way rather than compressing time, which would
        also shrink the bursts relative to a replica's start-up delay."""
        if factor == 1.0:
            return self
        if factor <= 0:
            raise ValueError("rate scale must be positive")
        whole = int(factor)
        copies = np.full(len(self), whole, dtype=np.int64)
        copies += np.random.default_rng(seed).random(len(self)) < factor - whole
        index = np.repeat(np.arange(len(self)), copies)
        return self._take(index, self.arrival_s[index])


def read_trace(path: str | Path | Traversable) -> Trace:
    """Load a trace file (any format above); ConfigError naming the file, line and field otherwise."""
    raw = read_bytes(path, limit_bytes=DATA_LIMIT_BYTES, what="trace", gunzip=True)
    text = decode_utf8(raw, path=str(path))
    del raw  # NB: a 256 MiB trace need not be held twice while it is parsed
    return parse_trace(text, source=str(path))


def csv_errors(parse: Callable[..., _T]) -> Callable[..., _T]:
    """``parse(text, source=...)`` with the csv module's own errors (a field over its 128 KiB limit, a NUL
    byte) as a ConfigError naming the source."""

    @functools.wraps(parse)
    def parse_or_refuse(text: str, *, source: str) -> _T:
        try:
            return parse(text, source=source)
        except csv.Error as e:
            raise ConfigError(f"not CSV: {e}", path=source) from None

    return parse_or_refuse


@csv_errors
def parse_trace(text: str, *, source: str) -> Trace:
    text = text.removeprefix("\ufeff")
    check_rows(text, source=source)
    first = text.lstrip()[:1]
    name = Path(source).name.removesuffix(".gz")
    if first != "{":
        header = [h.strip() for h in next(csv.reader(io.StringIO(text)), [])]
        if "timestamp" in header and "service_time" in header:
            return _service_time_trace(text, header, name=name, source=source)
    rows = _jsonl_rows(text, source) if first == "{" else _csv_rows(text, source)
    if not rows:
        raise ConfigError("no requests in the trace", path=source)
    lines, times, inputs, outputs = zip(*rows, strict=True)
    return Trace(
        name,
        _arrivals(times, lines, source),
        np.asarray(inputs, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        origin=float(times[0]),
    )


def check_rows(text: str, *, source: str) -> None:
    """ConfigError when ``text`` has more lines than MAX_ROWS and a header."""
    if text.count("\n") > MAX_ROWS + 1:  # NB: the header, and the last line's newline
        raise ConfigError(f"more than {MAX_ROWS:,} rows (the limit of a trace, history or samples file)", path=source)


def _arrivals(
    times: tuple[float, ...] | list[float] | np.ndarray, lines: tuple[int, ...] | list[int], source: str
) -> np.ndarray:
    arrival = np.asarray(times, dtype=np.float64)
    odd = np.flatnonzero(~np.isfinite(arrival))
    if len(odd):
        raise ConfigError(f"line {lines[odd[0]]}: timestamp must be a finite number of seconds", path=source)
    bad = np.flatnonzero(np.diff(arrival) < 0)
    if len(bad):
        i = int(bad[0]) + 1
        raise ConfigError(f"line {lines[i]}: timestamp goes back in time (the trace must be sorted)", path=source)
    return arrival - arrival[0]


def _service_time_trace(text: str, header: list[str], *, name: str, source: str) -> Trace:
    reader = csv.reader(io.StringIO(text))
    next(reader)
    at, st = header.index("timestamp"), header.index("service_time")
    mt = header.index("model") if "model" in header else None
    lines, stamps, costs, names = [], [], [], []
    width = len(header)
    for line_no, row in enumerate(reader, 2):
        if not row or not "".join(row).strip():
            continue
        if len(row) < width:
            row += [""] * (width - len(row))
        lines.append(line_no)
        stamps.append(row[at])
        costs.append(row[st])
        if mt is not None:
            names.append(row[mt].strip())
    if not lines:
        raise ConfigError("no requests in the trace", path=source)
    # NB: numpy converts a whole column at once (a 23-day trace has millions of rows); the row-by-row
    # parsers below run only when that fails, to name the line and take ISO 8601 times
    try:
        times = np.asarray(stamps, dtype=np.float64)
    except ValueError:
        times = np.array(
            [
                parse_timestamp(s.strip(), column="timestamp", line=n, source=source)
                for n, s in zip(lines, stamps, strict=True)
            ]
        )
    try:
        service = np.asarray(costs, dtype=np.float64)
    except ValueError:
        service = np.array([_service_time(c, line=n, source=source) for n, c in zip(lines, costs, strict=True)])
    bad = np.flatnonzero(~np.isfinite(service) | (service < 0))
    if len(bad):
        _service_time(costs[bad[0]], line=lines[bad[0]], source=source)
    models: list[int] = []
    codes: dict[str, int] = {}
    for n, model in zip(lines, names, strict=False):  # NB: names is empty without a model column
        if not model:
            raise ConfigError(f"line {n}: model is missing", path=source)
        models.append(codes.setdefault(model, len(codes)))
    zeros = np.zeros(len(lines), dtype=np.int64)
    return Trace(
        name,
        _arrivals(times, lines, source),
        zeros,
        zeros.copy(),
        service,
        np.asarray(models, dtype=np.int64) if mt is not None else None,
        tuple(codes),
        float(times[0]),
    )


def _service_time(cell: str, *, line: int, source: str) -> float:
    try:
        seconds = float(cell)
    except ValueError:
        raise ConfigError(
            f"line {line}: service_time must be a number of seconds (got {cell.strip()!r})", path=source
        ) from None
    if not np.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"line {line}: service_time must be ≥ 0 seconds (got {cell.strip()!r})", path=source)
    return seconds


def _tokens(value: object, *, field: str, line: int, source: str) -> int:
    if value is None or value == "":
        raise ConfigError(f"line {line}: {field} is missing", path=source)
    try:
        n = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        n = None
    if n is None or isinstance(value, bool):
        raise ConfigError(f"line {line}: {field} must be a whole number of tokens (got {value!r})", path=source)
    if n < 0:
        raise ConfigError(f"line {line}: {field} must not be negative (got {n})", path=source)
    if n >= MAX_TOKENS:
        raise ConfigError(f"line {line}: {field} must be below {MAX_TOKENS:,} (got {n})", path=source)
    return n


Row = tuple[int, float, int, int]


def _jsonl_rows(text: str, source: str) -> list[Row]:
    out = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(f"line {line_no}: not JSON: {e.msg}", path=source) from None
        except ValueError as e:  # NB: e.g. an integer of more than 4,300 digits
            raise ConfigError(f"line {line_no}: not JSON: {e}", path=source) from None
        except RecursionError:  # NB: json nests by recursion; [[[[…10,000 deep would end in a traceback
            raise ConfigError(f"line {line_no}: JSON nested too deep for a trace row", path=source) from None
        if not isinstance(obj, dict):
            raise ConfigError(f"line {line_no}: expected a JSON object", path=source)
        ts = obj.get("timestamp")
        if isinstance(ts, bool) or not isinstance(ts, int | float) or not abs(ts) < 1e300:
            shown = ts if not isinstance(ts, int) or abs(ts) < 1e300 else "an integer too large for a float"
            raise ConfigError(
                f"line {line_no}: timestamp must be a finite number of milliseconds (got {shown!r})", path=source
            )
        ins = _tokens(obj.get("input_length"), field="input_length", line=line_no, source=source)
        outs = _tokens(obj.get("output_length"), field="output_length", line=line_no, source=source)
        out.append((line_no, ts / 1000.0, ins, outs))
    return out


_AZURE = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_PLAIN = ("timestamp", "input_tokens", "output_tokens")


def _csv_rows(text: str, source: str) -> list[Row]:
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None:
        raise ConfigError("empty file", path=source)
    header = [h.strip() for h in header]
    if tuple(header[:3]) == _AZURE:
        columns = _AZURE
    elif tuple(header[:3]) == _PLAIN:
        columns = _PLAIN
    else:
        raise ConfigError(
            f"line 1: unknown header {','.join(header)!r}; expected {','.join(_PLAIN)} "
            f"(seconds or ISO 8601), timestamp,service_time[,model], {','.join(_AZURE)} (Azure LLM trace) "
            "or Mooncake JSON lines",
            path=source,
        )
    out = []
    for line_no, row in enumerate(reader, 2):
        if not row or not "".join(row).strip():
            continue
        row += [""] * (3 - len(row))
        ts = parse_timestamp(row[0].strip(), column=columns[0], line=line_no, source=source)
        ins = _tokens(row[1].strip(), field=columns[1], line=line_no, source=source)
        outs = _tokens(row[2].strip(), field=columns[2], line=line_no, source=source)
        out.append((line_no, ts, ins, outs))
    return out


def parse_timestamp(text: str, *, column: str, line: int, source: str) -> float:
    if not text:
        raise ConfigError(f"line {line}: {column} is missing", path=source)
    try:
        return float(text)
    except ValueError:
        pass
    # NB: datetime takes at most 6 fractional digits; the Azure trace has 7 (100 ns)
    head, dot, frac = text.partition(".")
    try:
        when = datetime.fromisoformat(head.replace(" ", "T"))
    except ValueError:
        raise ConfigError(
            f"line {line}: {column} is not seconds or an ISO 8601 time (got {text!r})", path=source
        ) from None
    if dot and not frac.isdigit():
        raise ConfigError(f"line {line}: {column} is not seconds or an ISO 8601 time (got {text!r})", path=source)
    return when.timestamp() + (float("0." + frac) if dot else 0.0)
