"""Reading one Prometheus ``/api/v1/query`` answer: pure, standard library only.

Shared by the Prometheus source (sources/prometheus.py), which reads answers in a worker thread or hands them to
the answer decoder process (sources/decoder_process.py), which imports only this module so that it starts fast.
The rules (DCGM blank sentinels, label sets shared across answers, every way a body can be malformed) are
described in sources/prometheus.py's docstring, "Reading the answer".
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.exposition import is_dcgm_blank
from gpuscale.sources.base import SeriesValue, series_value

__all__ = [
    "DEFAULT_MAX_LABEL_SETS",
    "Answer",
    "LabelSets",
    "PlannedQuery",
    "decode_answer",
    "decode_body",
    "read_answer",
    "short",
]

# dcgm_structs.h: DCGM_FP64_BLANK = 2**47, then NOT_FOUND, NOT_SUPPORTED, NO_PERMISSION (+1, +2, +3).
_FP64_BLANK_CODES = frozenset(float(2**47 + i) for i in range(4))
_ERROR_TEXT_LIMIT = 300
# NB: ~15,000 label sets at 10,000 GPUs (a DCGM set per GPU, a serving set per pod): room for ~30,000 GPUs. Under
# churn (20,000 new pods in every answer) the adapter and its decoder plateau at ~760 MB with this cap, 3.4+ GB and
# growing without (benchmarks/bench_label_churn.py, docs/benchmarks.md).
DEFAULT_MAX_LABEL_SETS = 50_000
_WARNINGS_KEPT = 10
_LENGTHS_KEPT = 64  # position lists of LabelSets.by_length: the built-in catalogue sends 50 queries
# SourceUnavailable.kind of a failed query, one word each (a /metrics label)
MALFORMED, QUERY_ERROR, HTTP_STATUS = "malformed", "query_error", "http_status"


@dataclass(frozen=True, slots=True)
class PlannedQuery:
    """One PromQL instant query and how to read its answer.

    ``name`` names samples that come back without ``__name__`` (rate/increase results); ``input`` and
    ``window_seconds`` (None for gauges) describe the values; ``match`` is re-applied to the result labels
    (a no-op for default queries, which carry it as matchers; the contract for overrides).
    """

    promql: str
    name: str
    input: str = "gauge"
    window_seconds: float | None = None
    match: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Answer:
    """The usable part of one query's response."""

    values: list[SeriesValue]
    warnings: tuple[str, ...] = ()
    partial: bool = False
    over_cap: int = 0  # series left out: their label set would have passed LabelSets.limit


def _is_blank(name: str, value: float) -> bool:
    """DCGM "no value" markers among floats of unknown origin (module docstring)."""
    if not name.startswith("DCGM_") or not (1.4e14 <= value < math.inf):  # NB: NaN/Inf are not sentinels
        return False
    if value.is_integer():
        return is_dcgm_blank(name, value, integer=True) or value in _FP64_BLANK_CODES
    return is_dcgm_blank(name, value)


class LabelSets:
    """The label sets of one refresh of one source, each as one dict with its target URL.

    The eight DCGM fields of a GPU arrive in eight answers with identical labels: sharing keeps one dict
    instead of eight and lets attribution recognise a label set by identity. ``index`` finds a label set by
    its (keys, values); ``by_length`` remembers, per answer length, which label set each position had.
    A backend lists the series of each DCGM field of the same exporters in the same order, so series i of
    an answer mostly has the labels of series i of the previous answer of the same length: one dict
    comparison confirms it, and only a miss builds and hashes the index key (in bench_refresh.py, 12,000
    misses of 88,000 series). Any other order is still read right, through the index, only slower.

    ``limit`` bounds the sets held, so series churn (every answer with new pods) cannot grow memory without bound:
    a new set past it first asks ``make_room`` (the decoder process forgets sets this refresh has not had) and,
    if no room is made, its series is left out and counted in its Answer's ``over_cap``.
    """

    __slots__ = ("by_length", "index", "limit", "make_room", "reading", "roomless")

    def __init__(self, *, limit: int | None = None, make_room: Callable[[], bool] | None = None) -> None:
        self.index: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[dict[str, str], str]] = {}
        self.by_length: dict[int, list[tuple[dict[str, str], str] | None]] = {}
        self.limit = limit
        self.make_room = make_room
        self.reading: list[SeriesValue] = []  # the answer being read so far: its sets are not ``make_room``'s to free
        self.roomless = False  # make_room freed nothing during this answer: it will not until the next one

    def full(self) -> bool:
        """No room for one more set, even after ``make_room``."""
        if self.limit is None or len(self.index) < self.limit:
            return False
        if self.make_room is None or self.roomless:
            return True
        self.roomless = not self.make_room()
        return len(self.index) >= self.limit


def read_answer(body: Any, planned: PlannedQuery, *, source: str, label_sets: LabelSets | None = None) -> Answer:
    """One decoded ``/api/v1/query`` body → series values; SourceUnavailable(source, reason) if unusable.

    ``source`` (the Prometheus URL) is also the target of samples without an ``instance`` label.
    ``label_sets`` (one per refresh of one source) makes equal label sets one dict across answers.
    """
    if not isinstance(body, Mapping):
        raise _unusable(source, f"a JSON {type(body).__name__}, not an object")
    status = body.get("status")
    if status != "success":
        kind = short(str(body.get("errorType") or "error"), 60)
        raise SourceUnavailable(
            source, f"{kind}: {short(str(body.get('error') or f'status {status!r}'))}", kind=QUERY_ERROR
        )
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise _unusable(source, "no 'data' object")
    result_type = data.get("resultType")
    result = data.get("result")
    if result_type == "scalar":
        ts, value = _sample(result, "result", source)
        answer = Answer([SeriesValue(planned.name, {}, value, ts, source, planned.window_seconds)])
    elif result_type == "vector":
        if not isinstance(result, list):
            raise _unusable(source, "'result' is not a list")
        answer = _read_vector(result, planned, source, label_sets if label_sets is not None else LabelSets())
    else:
        raise SourceUnavailable(
            source,
            f"unexpected resultType {short(repr(result_type), 60)} (the query must return an instant vector)",
            kind=MALFORMED,
        )
    return Answer(answer.values, answer_warnings(body), body.get("isPartial") is True, answer.over_cap)


def answer_warnings(body: dict[str, Any]) -> tuple[str, ...]:
    """An answer's ``warnings``, as text: a lone string is one warning, at most 10 are kept, each cut short."""
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list):
        warnings = [warnings]
    return tuple(short(str(w)) for w in warnings[:_WARNINGS_KEPT] if w)


def _read_vector(result: list[Any], planned: PlannedQuery, source: str, sets: LabelSets) -> Answer:
    values: list[SeriesValue] = []
    gauge = planned.input == "gauge"
    match = planned.match
    window = planned.window_seconds
    targets: dict[str | None, str] = {None: source}  # instance → target URL, formatted once each
    placed = sets.by_length.get(len(result))  # read and updated in place
    if placed is None:
        if len(sets.by_length) >= _LENGTHS_KEPT:
            sets.by_length.clear()  # NB: answers of ever new lengths (churn) must not pile up position lists
        placed = sets.by_length[len(result)] = [None] * len(result)
    append = values.append
    sets.reading, sets.roomless = values, False
    over_cap = 0
    for i, item in enumerate(result):
        # NB: the well-formed path does no isinstance checks (100,000 series per refresh at 10,000 GPUs);
        # anything malformed raises inside and is reported with its index by _malformed.
        try:
            # NB: the decoded object itself (this answer owns it; __name__ is popped below), not a copy.
            labels = item["metric"]
            if type(labels) is not dict:
                raise TypeError("'metric' is not an object")
            pair = item["value"]
            if type(pair) is not list:
                raise TypeError("not a list")
            ts_raw, value_raw = pair
            ts, value = float(ts_raw), float(value_raw)  # float() reads "NaN", "+Inf", "-Inf"
        except (TypeError, KeyError, ValueError, AttributeError, OverflowError) as e:
            raise _malformed(item, i, source) from e
        name = labels.pop("__name__", None) or planned.name
        if type(name) is not str:
            raise _unusable(source, f"result[{i}].metric.__name__ is not a string")
        if match and any(labels.get(k) != v for k, v in match):
            continue
        if gauge and value >= 1.4e14 and _is_blank(name, value):
            continue  # NB: rate/increase values are derived; the sentinel test means nothing there
        known = placed[i]
        if known is None or known[0] != labels:
            found = _label_set(sets, labels, targets, i, source)
            if found is None:
                over_cap += 1
                continue
            known = placed[i] = found
        append(series_value((name, known[0], value, ts, known[1], window)))
    sets.reading = []
    _refuse_repeats(values, source)
    return Answer(values, over_cap=over_cap)


def _refuse_repeats(values: list[SeriesValue], source: str) -> None:
    """Prometheus never answers one label set twice ("vector cannot contain metrics with the same labelset"): a
    backend that does is broken, and which of the two values is right cannot be told, so the answer is refused."""
    # NB: equal label sets are one dict (LabelSets), so identity finds repeats; one set of ids is ~3 ms per 100,000.
    if len({id(v.labels) for v in values}) == len(values):
        return
    first: dict[tuple[str, int], int] = {}
    for j, v in enumerate(values):
        at = first.setdefault((v.name, id(v.labels)), j)
        if at != j:
            raise _unusable(source, f"series {j} repeats the label set of series {at} ({short(str(v.labels), 120)})")


def _unusable(source: str, why: str) -> SourceUnavailable:
    return SourceUnavailable(source, f"malformed response: {why}", kind=MALFORMED)


def _malformed(item: Any, i: int, source: str) -> SourceUnavailable:
    """The specific reason a vector result item is unusable."""
    if not isinstance(item, Mapping) or not isinstance(item.get("metric"), Mapping):
        return _unusable(source, f"result[{i}] has no 'metric' object")
    try:
        _sample(item.get("value"), f"result[{i}].value", source)
    except SourceUnavailable as e:
        return e
    return _unusable(source, f"result[{i}] is not a sample")


def _label_set(
    sets: LabelSets, labels: dict[str, str], targets: dict[str | None, str], i: int, source: str
) -> tuple[dict[str, str], str] | None:
    """The shared dict equal to ``labels`` (``labels`` itself when new) and its target URL; None when ``labels``
    is new and ``sets`` is full."""
    # NB: keys and values as two flat tuples: cheaper than a tuple of (key, value) pairs.
    key = (tuple(labels), tuple(labels.values()))
    if not all(type(v) is str for v in key[1]):  # NB: on a miss only: a hit equals a set that passed this check
        raise _unusable(source, f"result[{i}].metric has a value that is not a string")
    known = sets.index.get(key)
    if known is None:
        if sets.full():
            return None
        instance = labels.get("instance") or None
        target = targets.get(instance)
        if target is None:
            target = targets[instance] = f"http://{instance}/metrics"
        known = sets.index[key] = (labels, target)
    return known


def _sample(pair: Any, where: str, source: str) -> tuple[float, float]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise _unusable(source, f"{where} is not a [timestamp, value] pair")
    try:
        # NB: float() reads Prometheus' "NaN", "+Inf", "-Inf"; aggregation drops them later.
        return float(pair[0]), float(pair[1])
    except (TypeError, ValueError, OverflowError) as e:
        raise _unusable(source, f"{where}: {short(str(e), 120)}") from e


def short(text: str, limit: int = _ERROR_TEXT_LIMIT) -> str:
    text = " ".join(text[: limit * 4].split())  # NB: a 50 MB error text is cut before it is split
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_body(raw: bytes | bytearray, status: int, content_type: str, *, source: str) -> Any:
    """A response body → its JSON; SourceUnavailable(source, reason) naming what came instead (an HTML page from
    a proxy, an HTTP error with Prometheus' own explanation)."""
    try:
        body = json.loads(raw)
    except ValueError as e:  # NB: UnicodeDecodeError (not UTF-8) is one too
        shown = short(raw[:200].decode("utf-8", errors="replace"), 120)
        if status != 200:
            raise SourceUnavailable(source, f"HTTP {status}: {shown}", kind=HTTP_STATUS) from e
        reason = f"malformed JSON response ({short(content_type, 60) or 'no Content-Type'}): {shown!r}"
        raise SourceUnavailable(source, reason, kind=MALFORMED) from e
    if status != 200:
        # NB: Prometheus explains its 4xx/5xx in the JSON body (errorType, error): quote it.
        # VictoriaMetrics puts the status code in errorType ("422"); say it once.
        kind = short(str(body.get("errorType") or ""), 60) if isinstance(body, dict) else ""
        error = short(str(body.get("error") or "")) if isinstance(body, dict) else ""
        detail = ": ".join(part for part in (kind if kind != str(status) else "", error) if part)
        raise SourceUnavailable(source, f"HTTP {status}: {detail}" if detail else f"HTTP {status}", kind=HTTP_STATUS)
    return body


def decode_answer(
    raw: bytes | bytearray, status: int, content_type: str, planned: PlannedQuery, *, source: str, label_sets: LabelSets
) -> Answer:
    """One response → its Answer, or SourceUnavailable for whatever is wrong with it: the one place both decode modes
    (a worker thread, the decoder process) turn a bad answer into that query's failure, so that one query's answer,
    however hostile, never costs the others of its refresh."""
    try:
        return read_answer(
            decode_body(raw, status, content_type, source=source), planned, source=source, label_sets=label_sets
        )
    except SourceUnavailable:
        raise
    except RecursionError as e:  # json.loads (or str() of what it made) of arrays nested ~1,000 deep and more
        raise _unusable(source, "nested too deeply to decode") from e
    except MemoryError as e:  # NB: the decode's own objects are freed by now; what failed was this answer
        raise SourceUnavailable(
            source, f"answer of {len(raw):,} bytes did not fit in memory to decode", kind=MALFORMED
        ) from e
    except Exception as e:  # NB: the last line of defence: a failed query, named, never a lost refresh
        raise SourceUnavailable(
            source, f"answer not readable: {type(e).__name__}: {short(str(e), 120)}", kind=MALFORMED
        ) from e
