"""Reading one Prometheus ``/api/v1/query`` answer: pure, standard library only.

Shared by the Prometheus source (sources/prometheus.py), which reads answers in a worker thread or hands them to
the answer decoder process (sources/decoder_process.py), which imports only this module so that it starts fast.
The rules (DCGM blank sentinels, label sets shared across answers, every way a body can be malformed) are
described in sources/prometheus.py's docstring, "Reading the answer".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import SourceUnavailable
from gpuscale.metrics.exposition import is_dcgm_blank
from gpuscale.sources.base import SeriesValue, series_value

__all__ = ["Answer", "LabelSets", "PlannedQuery", "decode_body", "read_answer", "short"]

# dcgm_structs.h: DCGM_FP64_BLANK = 2**47, then NOT_FOUND, NOT_SUPPORTED, NO_PERMISSION (+1, +2, +3).
_FP64_BLANK_CODES = frozenset(float(2**47 + i) for i in range(4))
_ERROR_TEXT_LIMIT = 300


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
    """

    __slots__ = ("by_length", "index")

    def __init__(self) -> None:
        self.index: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[dict[str, str], str]] = {}
        self.by_length: dict[int, list[tuple[dict[str, str], str] | None]] = {}


def read_answer(body: Any, planned: PlannedQuery, *, source: str, label_sets: LabelSets | None = None) -> Answer:
    """One decoded ``/api/v1/query`` body → series values; SourceUnavailable(source, reason) if unusable.

    ``source`` (the Prometheus URL) is also the target of samples without an ``instance`` label.
    ``label_sets`` (one per refresh of one source) makes equal label sets one dict across answers.
    """
    if not isinstance(body, Mapping):
        raise SourceUnavailable(source, f"malformed response: a JSON {type(body).__name__}, not an object")
    status = body.get("status")
    if status != "success":
        kind = body.get("errorType") or "error"
        raise SourceUnavailable(source, f"{kind}: {short(str(body.get('error') or f'status {status!r}'))}")
    data = body.get("data")
    if not isinstance(data, Mapping):
        raise SourceUnavailable(source, "malformed response: no 'data' object")
    result_type = data.get("resultType")
    result = data.get("result")
    values: list[SeriesValue] = []
    if result_type == "scalar":
        ts, value = _sample(result, "result", source)
        values.append(SeriesValue(planned.name, {}, value, ts, source, planned.window_seconds))
    elif result_type == "vector":
        if not isinstance(result, list):
            raise SourceUnavailable(source, "malformed response: 'result' is not a list")
        gauge = planned.input == "gauge"
        match = planned.match
        window = planned.window_seconds
        targets: dict[str | None, str] = {None: source}  # instance → target URL, formatted once each
        sets = label_sets if label_sets is not None else LabelSets()
        index = sets.index
        placed = sets.by_length.get(len(result))  # read and updated in place
        if placed is None:
            placed = sets.by_length[len(result)] = [None] * len(result)
        append = values.append
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
            except (TypeError, KeyError, ValueError, AttributeError) as e:
                raise _malformed(item, i, source) from e
            name = labels.pop("__name__", None) or planned.name
            if match and any(labels.get(k) != v for k, v in match):
                continue
            if gauge and value >= 1.4e14 and _is_blank(name, value):
                continue  # NB: rate/increase values are derived; the sentinel test means nothing there
            known = placed[i]
            if known is None or known[0] != labels:
                known = placed[i] = _label_set(index, labels, targets, i, source)
            append(series_value((name, known[0], value, ts, known[1], window)))
    else:
        raise SourceUnavailable(
            source, f"unexpected resultType {result_type!r} (the query must return an instant vector)"
        )
    warnings = body.get("warnings") or []
    if not isinstance(warnings, list):
        warnings = [warnings]
    return Answer(values, tuple(str(w) for w in warnings if w), body.get("isPartial") is True)


def _malformed(item: Any, i: int, source: str) -> SourceUnavailable:
    """The specific reason a vector result item is unusable."""
    if not isinstance(item, Mapping) or not isinstance(item.get("metric"), Mapping):
        return SourceUnavailable(source, f"malformed response: result[{i}] has no 'metric' object")
    try:
        _sample(item.get("value"), f"result[{i}].value", source)
    except SourceUnavailable as e:
        return e
    return SourceUnavailable(source, f"malformed response: result[{i}] is not a sample")


def _label_set(
    index: dict[tuple[tuple[str, ...], tuple[str, ...]], tuple[dict[str, str], str]],
    labels: dict[str, str],
    targets: dict[str | None, str],
    i: int,
    source: str,
) -> tuple[dict[str, str], str]:
    """The shared dict equal to ``labels`` (``labels`` itself when new) and its target URL."""
    # NB: keys and values as two flat tuples: cheaper than a tuple of (key, value) pairs.
    key = (tuple(labels), tuple(labels.values()))
    try:
        known = index.get(key)
    except TypeError as e:  # e.g. a list as a label value: unhashable
        raise SourceUnavailable(
            source, f"malformed response: result[{i}].metric has a value that is not a string"
        ) from e
    if known is None:
        instance = labels.get("instance") or None
        target = targets.get(instance)
        if target is None:
            target = targets[instance] = f"http://{instance}/metrics"
        known = index[key] = (labels, target)
    return known


def _sample(pair: Any, where: str, source: str) -> tuple[float, float]:
    if not isinstance(pair, list) or len(pair) != 2:
        raise SourceUnavailable(source, f"malformed response: {where} is not a [timestamp, value] pair")
    try:
        # NB: float() reads Prometheus' "NaN", "+Inf", "-Inf"; aggregation drops them later.
        return float(pair[0]), float(pair[1])
    except (TypeError, ValueError) as e:
        raise SourceUnavailable(source, f"malformed response: {where}: {e}") from e


def short(text: str, limit: int = _ERROR_TEXT_LIMIT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def decode_body(raw: bytes | bytearray, status: int, content_type: str, *, source: str) -> Any:
    """A response body → its JSON; SourceUnavailable(source, reason) naming what came instead (an HTML page from
    a proxy, an HTTP error with Prometheus' own explanation)."""
    try:
        body = json.loads(raw)
    except ValueError as e:
        shown = short(raw[:200].decode("utf-8", errors="replace"), 120)
        if status != 200:
            raise SourceUnavailable(source, f"HTTP {status}: {shown}") from e
        reason = f"malformed JSON response ({content_type or 'no Content-Type'}): {shown!r}"
        raise SourceUnavailable(source, reason) from e
    if status != 200:
        # NB: Prometheus explains its 4xx/5xx in the JSON body (errorType, error): quote it.
        # VictoriaMetrics puts the status code in errorType ("422"); say it once.
        kind = str(body.get("errorType") or "") if isinstance(body, dict) else ""
        error = str(body.get("error") or "") if isinstance(body, dict) else ""
        detail = ": ".join(part for part in (kind if kind != str(status) else "", error) if part)
        raise SourceUnavailable(source, f"HTTP {status}: {short(detail)}" if detail else f"HTTP {status}")
    return body
