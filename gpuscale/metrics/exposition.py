"""Prometheus text format 0.0.4 and OpenMetrics 1.0 text parser, fast enough to run on every scrape.

Public API: ``parse_samples`` (flat list, document order), ``parse_families`` (grouped by family,
first-appearance order) and ``is_dcgm_blank`` (the DCGM "no value" test). Malformed input raises
``gpuscale.errors.ExpositionError`` naming the source, the 1-based line number, the line and the reason;
no ``ValueError``/``IndexError`` escapes.

Design notes
------------
**Two tokenisers, one meaning.** Every sample line is cut into the same four tokens — metric name,
raw label text (between the braces), value token, optional timestamp token — and everything after
that (label decoding, value conversion, family routing, checks) is shared. The *fast* tokeniser
accepts only the shape exporters actually write (``name{labels} value [timestamp]``, single spaces,
no tabs, a name that is valid as written, no ``#`` after the labels in OpenMetrics) and hands anything
else to the *careful* tokeniser (``_Parser.split``), a scanner that also words the error messages. The
fast tokeniser never raises: it either produces exactly the tokens the careful one would, or gives
up, so errors are always reported in the careful path's order. A property test checks that both
paths agree on generated near-valid input, results and errors alike.

The commonest line, ``name{labels} value`` or ``name value`` (no timestamp), is not tokenised at all
once its parts have been seen: it is cut at its last blank (``rpartition``) and at its first ``{``
(``partition``), and the three pieces are looked up in the parse's caches (label text with its closing
``}``, name, value text); each piece is checked on first sight and cached only if good. Anything else —
a cache miss that fails its check, a timestamp, a doubled blank or a tab, an exemplar, a duplicate series,
a DCGM blank — falls through, untouched, to the general fast cut and the careful tokeniser, which redo
the line; so that path's errors, and their order, are the careful path's.

Why the fast cut is right: it splits a labelled line at the first ``{`` and the **last** ``}``. Label
values may contain ``}``, so the last ``}`` is not always the end of the label set — but the label
text is then accepted only if it is a well-formed label set (``_decode_labels``), and a well-formed
label set has no unquoted ``}``. So whenever it is accepted, the true end of the label set (the first
unquoted ``}``) *is* the last ``}``, and the cut is the scanner's cut. A line whose label set ends
earlier (an OpenMetrics exemplar ``# {trace_id="…"} …``, or garbage) is rejected and goes to the
scanner.

Why it is fast: there is no per-character Python loop on the fast path, only C-level ``str`` methods
and regexes. dcgm-exporter repeats one label set per GPU across ~40 families, so decoded label sets
are cached per parse by their raw text (8×H100: 312 samples, 32 distinct label texts); a hit costs
one dict lookup, and samples with the same label text share one read-only mapping (``MappingProxyType``),
which also lets attribution recognise a GPU's label set by identity across its ~40 families.
A miss in the form every exporter writes (``k="v",…``: no blanks, no escapes) is cut at ``",`` into
pieces ``k="v``, each looked up in a per-parse cache of checked pieces (a GPU's identity recurs in each of
its label sets, the model and driver in all: 59 distinct of the 377 in 8×H100's label sets), so a label set costs a
split, a lookup per piece and its dict (``_common_form``); other forms take one regex ``split`` whose
separators prove the structure (``_decode_labels``). Metric names are validated and routed to their
family once per distinct name, and value texts are converted once per distinct text (exporters repeat
values: zeros, clocks, limits; 129 distinct of 312 in 8×H100). Escapes are decoded only when a value
contains a backslash. Duplicate series are found with a set per sample name holding the label set's
identity: the ``frozenset`` of its pairs written ``k="v`` with the value decoded (one-to-one, as a label
name holds no ``=``) — in the common form exactly the pieces, whose hashes the lookups computed; built once
per cached label set, and frozensets cache their hash. The caches live for one parse only: no state is
shared between calls, so parsing the same page again costs the same.

Dropped on purpose
------------------
* **DCGM blank sentinels.** DCGM reports "blank / not found / not supported / no permission" as
  reserved values (``dcgm_structs.h``: ``DCGM_INT64_BLANK`` = 0x7ffffffffffffff0,
  ``DCGM_FP64_BLANK`` = 2**47 ≈ 1.407e14, each followed by a few related codes); old dcgm-exporters
  leaked them (``MEMORY_TEMP … 9223372036854775794``). They are not measurements, so samples of
  ``DCGM_*`` metrics carrying them are dropped. dcgm-exporter prints INT64 fields with ``%d`` and
  DOUBLE fields with ``%f``, so the parser applies the int64 rule to integer literals and the fp64
  rule to everything else. NB: applying the fp64 threshold to every value would be wrong: int64
  counters legitimately exceed 1.4e14 (``DCGM_FI_DEV_POWER_VIOLATION`` is a nanosecond counter; the
  8×H100 fixture has values around 2.9e14).
* **OpenMetrics exemplars and ``# UNIT``** are validated and discarded (no field for them).
* Comments other than HELP/TYPE (and UNIT/EOF in OpenMetrics) and empty lines are ignored.

Leniency (matching the Prometheus server rather than the strictest reading of the specs)
---------------------------------------------------------------------------------------
* Unknown escapes (``\\t`` …) in label values and HELP text are kept verbatim, like Prometheus'
  own scrape parser and ``prometheus_client``; only ``\\\\``, ``\\"`` and ``\\n`` are decoded.
* A trailing comma in a label set, blanks around ``=``/``,``/braces, runs of blanks or tabs between
  tokens, leading blanks and a trailing ``\\r`` (CRLF) are accepted; NaN/Inf are case-insensitive
  (Triton writes ``Nan``) and ``Infinity`` is accepted, as Go's ``ParseFloat`` does.
* In 0.0.4 mode samples of one family need not be contiguous (Go's expfmt merges them); in
  OpenMetrics mode interleaving is an error. A counter family also owns ``<name>_total`` and
  ``<name>_created`` samples in both modes.
* Not supported: the Prometheus 3 quoted UTF-8 metric/label name syntax (``{"my.metric"}``); such
  lines are reported as an invalid metric name.

Mode: ``openmetrics=None`` decides by the text itself: OpenMetrics iff the last non-blank line is
``# EOF``. A ``# UNIT`` line or an OpenMetrics-only TYPE (unknown, gaugehistogram, info, stateset) in
text that does not end with ``# EOF`` is reported as OpenMetrics without its mandatory ``# EOF``.
Timestamps are integer milliseconds in 0.0.4 and float seconds in OpenMetrics; ``Sample.timestamp``
is always seconds.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, NamedTuple

from gpuscale.errors import ExpositionError

__all__ = ["MetricFamily", "Sample", "is_dcgm_blank", "parse_families", "parse_samples"]


class Sample(NamedTuple):
    """One sample line: the name as written (with any ``_bucket``/``_total``… suffix) and its value.

    NB: a NamedTuple, not a frozen dataclass: the parser builds one per line with a single C-level
    ``tuple.__new__`` (a dataclass took one store per field)."""

    name: str
    labels: Mapping[str, str]  # read-only; shared by the samples of one parse with the same label text
    value: float
    timestamp: float | None  # seconds since the epoch, or None when the line had no timestamp


@dataclass(slots=True)
class MetricFamily:
    """A metric family: its metadata and its samples in document order (DCGM blanks excluded)."""

    name: str
    type: str
    help: str
    samples: list[Sample]


_new_tuple = tuple.__new__


# --- DCGM blank sentinels --------------------------------------------------------------------------

_DCGM_PREFIX: Final = "DCGM_"
# NB: float(0x7ffffffffffffff0) rounds up to 2**63, so integers within ~512 below the sentinel also
# count as blank; no real int64 counter gets there, and comparing floats keeps one rule for callers
# that only have a float.
_INT64_BLANK_FLOOR: Final = float(0x7FFFFFFFFFFFFFF0)
_FP64_BLANK_FLOOR: Final = 1.4e14  # DCGM_FP64_BLANK is 2**47 = 140737488355328.0


def is_dcgm_blank(name: str, value: float, *, integer: bool = False) -> bool:
    """True if ``value`` of metric ``name`` is a DCGM "blank / not supported" marker, not a measurement.

    Only ``DCGM_*`` metrics carry these. ``integer`` says the value was written as an integer literal,
    i.e. it comes from a DCGM INT64 field (dcgm-exporter prints those with ``%d``): the int64 rule
    (>= 0x7ffffffffffffff0) applies. Otherwise the fp64 rule (>= 1.4e14) applies, which is also what a
    caller gets for a float of unknown origin — NB: that drops legitimate int64 counters above 1.4e14
    (e.g. ``DCGM_FI_DEV_POWER_VIOLATION`` after a few days of capping), so pass ``integer=True``
    whenever the value is known to come from an INT64 field.
    """
    if not name.startswith(_DCGM_PREFIX):
        return False
    return value >= (_INT64_BLANK_FLOOR if integer else _FP64_BLANK_FLOOR)


def _is_integer_literal(token: str) -> bool:
    digits = token.strip()
    if digits[:1] in ("+", "-"):
        digits = digits[1:]
    return digits.isdigit()


# --- grammar ---------------------------------------------------------------------------------------

_METRIC_NAME_RE: Final = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def _is_metric_name(name: str) -> bool:
    """``_METRIC_NAME_RE.fullmatch(name)``, in a third of its time: for ASCII text, isidentifier() is exactly
    [a-zA-Z_][a-zA-Z0-9_]*, and ':' may stand wherever '_' may."""
    return name.isascii() and name.replace(":", "_").isidentifier()


_LABEL_NAME_RE: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# A quoted label value, unrolled ("normal* (escape normal*)*") so it never backtracks.
_QUOTED: Final = r'"[^"\\]*(?:\\.[^"\\]*)*"'
_QUOTED_RE: Final = re.compile(_QUOTED)
_PAIR: Final = rf"[ \t]*[a-zA-Z_][a-zA-Z0-9_]*[ \t]*=[ \t]*{_QUOTED}[ \t]*"
# The whole text between the braces: pairs separated by commas, optional trailing comma. It admits
# no unquoted '}' — the fast path's correctness rests on that (module docstring).
_LABEL_SET_RE: Final = re.compile(rf"(?:{_PAIR},)*(?:{_PAIR})?[ \t]*")
# One name="value" pair. Its matches are exactly the pairs, in order, on text _LABEL_SET_RE accepts.
_LABEL_PAIR_RE: Final = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"([^"\\]*(?:\\.[^"\\]*)*)"')
_BLANKS_RE: Final = re.compile(r"[ \t]+")
_ESCAPE_RE: Final = re.compile(r"\\(.)")
_LABEL_ESCAPES: Final = {"\\": "\\", '"': '"', "n": "\n"}
_HELP_TEXT: Final = re.compile(r"#[ \t]+HELP[ \t]+[^ \t]+[ \t]+(.*)", re.S)
_HELP_ESCAPES_TEXT: Final = {"\\": "\\", "n": "\n"}
_HELP_ESCAPES_OPENMETRICS: Final = _LABEL_ESCAPES

_TEXT_TYPES: Final = frozenset({"counter", "gauge", "histogram", "summary", "untyped"})
_OPENMETRICS_TYPES: Final = frozenset(
    {"counter", "gauge", "histogram", "gaugehistogram", "summary", "info", "stateset", "unknown"}
)
_OPENMETRICS_ONLY_TYPES: Final = _OPENMETRICS_TYPES - _TEXT_TYPES
# Sample-name suffixes a family of each type owns; "" is the family name itself.
_SUFFIXES: Final[dict[str, tuple[str, ...]]] = {
    "counter": ("", "_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "stateset": ("",),
    "untyped": ("",),
    "unknown": ("",),
}
_ALL_SUFFIXES: Final = ("_bucket", "_count", "_sum", "_created", "_total", "_info", "_gcount", "_gsum")
# (family type, suffix) → the label that sample must carry, holding a float.
_BOUND_LABELS: Final = {
    ("histogram", "_bucket"): "le",
    ("gaugehistogram", "_bucket"): "le",
    ("summary", ""): "quantile",
}

# Decoded labels and their series identity: the frozenset of the pairs written 'key="value' with the value decoded
# (one string per pair, and one-to-one: a label name holds no '='). The common form's pieces are exactly those
# strings, their hashes already computed by the lookups; a frozenset caches its own hash, so series keys hash cheaply.
_LabelEntry = tuple[Mapping[str, str], frozenset[str]]
# Per sample name: its family, the family's sample list, "is a DCGM metric", the label that must hold a
# float ("le"/"quantile") and the series seen so far under this name.
_Route = tuple[MetricFamily, list[Sample], bool, str | None, set[object]]
_EMPTY_LABELS: Final[_LabelEntry] = (MappingProxyType({}), frozenset())


class _Malformed(Exception):
    """Internal: a reason for the current line; ``_parse`` adds source, line number and line."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _quoted(text: str) -> str:
    """A token for an error reason: quoted, and cut short so a hostile body cannot flood the log."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


def _unescape(raw: str, table: dict[str, str]) -> str:
    return _ESCAPE_RE.sub(lambda m: table.get(m.group(1), m.group(0)), raw)


def _skip_blanks(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    return i


def _ends_with_eof(text: str) -> bool:
    end = len(text)
    while end and text[end - 1] in " \t\r\n":
        end -= 1
    start = text.rfind("\n", 0, end) + 1
    return text[start:end] == "# EOF"


def _decode_labels(label_text: str, pairs: _Pieces) -> _LabelEntry | None:
    """Decode the text between a label set's braces; None if it is not a well-formed label set.

    The common form (no blanks, no escapes, no trailing comma, as every exporter writes it) is cut with str
    methods (below). Otherwise, splitting on the pair regex leaves the separators, and the text is exactly
    ``pair,pair,…[,]`` iff the first separator is empty and all others are single commas. Blanks take the
    general regex. ``pairs`` is the parse's cache of the common form's pieces.
    """
    if label_text[-1:] == '"' and "\\" not in label_text:
        entry = _common_form(label_text[:-1], pairs)
        if entry is not None:
            return entry
    pieces = _LABEL_PAIR_RE.split(label_text)
    separators = pieces[::3]
    last = separators[-1]
    if separators[0] == "" and last in ("", ",") and separators.count(",") == len(separators) - 2 + (last == ","):
        keys, raw_values = pieces[1::3], pieces[2::3]
    elif _LABEL_SET_RE.fullmatch(label_text) is not None:
        matched = _LABEL_PAIR_RE.findall(label_text)
        keys, raw_values = [key for key, _ in matched], [raw for _, raw in matched]
    else:
        return None
    if "\\" in label_text:
        raw_values = [_unescape(raw, _LABEL_ESCAPES) if "\\" in raw else raw for raw in raw_values]
    labels = dict(zip(keys, raw_values, strict=True))
    if len(labels) != len(keys):
        _duplicate(keys)
    return MappingProxyType(labels), frozenset([f'{key}="{value}' for key, value in labels.items()])


def _common_form(body: str, pairs: _Pieces) -> _LabelEntry | None:
    """The label set of ``body``, a label text with no backslash less its final '"', if it is in the common form
    (no blanks, no trailing comma); else None.

    NB: 'k1="v1",…,kn="vn' cut at '",' gives pieces 'ki="vi'; it is exactly those pairs iff every piece is one
    (_Pieces). The label sets of one exporter repeat most pairs (a GPU's identity in each of its label sets, the
    model and driver in all), so a piece is checked once per parse, and a label set costs a split, a lookup per
    piece and the dict: no bytecode per pair.
    """
    pieces = body.split('",')
    found = list(map(pairs.__getitem__, pieces))
    if not all(found):
        return None
    decoded = dict(found)
    if len(decoded) != len(found):
        _duplicate([key for key, _ in found])
    return MappingProxyType(decoded), frozenset(pieces)


class _Pieces(dict[str, "tuple[str, str] | None"]):
    """A parse's checked pieces ``key="value`` of the common form: ``(key, value)``, or None if the piece is not
    one (a missing piece is checked on lookup; bad ones are not kept, so that each lookup of one says so)."""

    def __missing__(self, piece: str) -> tuple[str, str] | None:
        key, separator, value = piece.partition('="')
        # NB: the piece holds exactly one quote, that of its '="', so no key or value holds one; for ASCII text,
        # isidentifier() is exactly the label name grammar [a-zA-Z_][a-zA-Z0-9_]*.
        if not separator or '"' in value or not (key.isascii() and key.isidentifier()):
            return None
        pair = self[piece] = (key, value)
        return pair


def _duplicate(keys: list[str]) -> None:
    """Raise for the first label name ``keys`` has twice."""
    seen: set[str] = set()
    for key in keys:
        if key in seen:
            raise _Malformed(f"duplicate label {key!r}")
        seen.add(key)


def _decode_into(parser: _Parser, label_text: str) -> _LabelEntry | None:
    """The fast paths' cache miss: decode and cache a label set, or None (the careful path then reports this
    line's errors in order)."""
    try:
        entry = _decode_labels(label_text, parser.pairs)
    except _Malformed:
        return None
    if entry is not None:
        parser.label_cache[label_text] = entry
    return entry


def _decode_closed(parser: _Parser, closed_text: str) -> _LabelEntry | None:
    """The fast path's cache miss: the label set of ``closed_text`` (a label text and its closing '}'), or None (the
    tokenisers then take the line and report its errors in order). NB: through the tokenisers' cache, so that a
    label text has one mapping whichever path met it."""
    if closed_text[-1] != "}":
        return None
    label_text = closed_text[:-1]
    return parser.label_cache.get(label_text) or _decode_into(parser, label_text)


def _diagnose_labels(label_text: str) -> _Malformed:
    """Say what is wrong with label text that ``_LABEL_SET_RE`` rejected (the true text between braces)."""
    i, n = 0, len(label_text)
    while True:
        i = _skip_blanks(label_text, i)
        if i == n:
            return _Malformed("malformed label set")
        m = _LABEL_NAME_RE.match(label_text, i)
        if m is None:
            return _Malformed(f"invalid label name at {label_text[i : i + 20]!r}")
        key = m.group()
        i = _skip_blanks(label_text, m.end())
        if label_text[i : i + 1] != "=":
            return _Malformed(f"expected '=' after label name {key!r}")
        i = _skip_blanks(label_text, i + 1)
        if label_text[i : i + 1] != '"':
            return _Malformed(f"expected '\"' to open the value of label {key!r}")
        m = _QUOTED_RE.match(label_text, i)
        if m is None:
            return _Malformed(f"unterminated label value for label {key!r}")
        i = _skip_blanks(label_text, m.end())
        if i == n:
            return _Malformed("malformed label set")
        if label_text[i] != ",":
            return _Malformed(f"expected ',' or '}}' after the value of label {key!r}")
        i += 1


def _find_label_set_end(line: str, brace: int) -> int:
    """Index of the '}' closing the label set opened at ``brace``, skipping quoted values."""
    i, n = brace + 1, len(line)
    while i < n:
        c = line[i]
        if c == '"':
            m = _QUOTED_RE.match(line, i)
            if m is None:
                raise _Malformed("unterminated label value")
            i = m.end()
            continue
        if c == "}":
            return i
        i += 1
    raise _Malformed("missing '}' to close the label set")


class _Parser:
    """Per-parse state. The hot loop lives in ``_parse`` with these containers bound to locals."""

    __slots__ = ("auto", "bases", "eof", "families", "helped", "label_cache", "om", "pairs", "routes", "typed", "types")

    def __init__(self, *, om: bool, auto: bool) -> None:
        self.om = om
        self.auto = auto
        self.types = _OPENMETRICS_TYPES if om else _TEXT_TYPES
        self.eof = False
        self.families: dict[str, MetricFamily] = {}
        self.typed: set[str] = set()
        self.helped: set[str] = set()
        self.routes: dict[str, _Route] = {}
        # Every name a routed sample name could belong to (itself, or itself less a suffix): TYPE's cheap check.
        self.bases: set[str] = set()
        self.label_cache: dict[str, _LabelEntry] = {"": _EMPTY_LABELS}
        self.pairs = _Pieces()

    # -- metadata ----------------------------------------------------------------------------------

    def comment(self, line: str) -> None:
        # NB: one flat function on purpose: exporters write a HELP and a TYPE line per family, and call
        # overhead was most of the cost of a comment line.
        parts = line.rstrip(" \t\r").split(None, 3)
        count = len(parts)
        if count < 3 or parts[0] != "#":
            if count == 2 and parts[0] == "#":
                if parts[1] == "EOF" and (self.om or self.auto):
                    # NB: in auto mode a '# EOF' that is not the last line makes the text malformed
                    # OpenMetrics; the next non-blank line reports it.
                    self.eof = True
                elif parts[1] in ("HELP", "TYPE"):
                    raise _Malformed(f"{parts[1]} line without a metric name")
            return
        keyword, name = parts[1], parts[2]
        if keyword == "HELP":
            if name in self.helped:
                raise _Malformed(f"duplicate HELP for metric {name}")
            family = self.families.get(name) or self._new_family(name, what="HELP")
            self.helped.add(name)
            text = parts[3] if count == 4 else ""
            if not line.isprintable():
                # NB: str.split() also splits on \v, \f, NBSP…; the format separates tokens by blank and tab only.
                exact = _HELP_TEXT.match(line.rstrip(" \t\r"))
                text = exact.group(1) if exact else text
            if "\\" in text:
                text = _unescape(text, _HELP_ESCAPES_OPENMETRICS if self.om else _HELP_ESCAPES_TEXT)
            family.help = text
        elif keyword == "TYPE":
            kind = parts[3] if count == 4 else ""
            suffixes = _SUFFIXES.get(kind) if kind in self.types else None
            if suffixes is None:
                if name not in self.families:
                    self._new_family(name, what="TYPE")  # a bad name is the more useful complaint
                if not kind:
                    raise _Malformed(f"TYPE line for metric {name} without a type")
                if " " in kind or "\t" in kind:
                    raise _Malformed("unexpected text after the metric type")
                if self.auto and kind in _OPENMETRICS_ONLY_TYPES:
                    raise _Malformed(f"type {_quoted(kind)} marks OpenMetrics text, which must end with '# EOF'")
                raise _Malformed(f"unknown metric type {_quoted(kind)}")
            if name in self.typed:
                raise _Malformed(f"duplicate TYPE for metric {name}")
            family = self.families.get(name) or self._new_family(name, what="TYPE")
            routes = self.routes
            if name in self.bases and (name in routes or any(name + suffix in routes for suffix in suffixes)):
                raise _Malformed(f"TYPE for metric {name} after its samples")
            self.typed.add(name)
            family.type = kind
        elif keyword == "UNIT":
            if self.om:
                if not _is_metric_name(name):
                    raise _Malformed(f"invalid metric name {_quoted(name)} in UNIT line")
            elif self.auto:
                raise _Malformed("'# UNIT' marks OpenMetrics text, which must end with '# EOF'")

    def _new_family(self, name: str, *, what: str) -> MetricFamily:
        if not _is_metric_name(name):
            raise _Malformed(f"invalid metric name {_quoted(name)} in {what} line")
        family = self.families[name] = MetricFamily(name, "unknown" if self.om else "untyped", "", [])
        return family

    # -- samples -----------------------------------------------------------------------------------

    def route(self, name: str) -> _Route:
        """Find (or create) the family of a sample name (already validated); once per distinct name."""
        family = self.families.get(name)
        suffix = ""
        if family is not None:
            if "" not in _SUFFIXES[family.type]:
                allowed = ", ".join(name + s for s in _SUFFIXES[family.type])
                raise _Malformed(f"sample {name} of {family.type} {name} needs a suffix ({allowed})")
        else:
            for candidate in _ALL_SUFFIXES:
                if name.endswith(candidate):
                    base = self.families.get(name[: -len(candidate)])
                    if base is not None and candidate in _SUFFIXES[base.type]:
                        family, suffix = base, candidate
                        break
            if family is None:
                family = self._new_family(name, what="sample")
        bound = _BOUND_LABELS.get((family.type, suffix))
        route: _Route = (family, family.samples, name.startswith(_DCGM_PREFIX), bound, set())
        self.routes[name] = route
        self.bases.add(name)
        if name.endswith(_ALL_SUFFIXES):
            self.bases.update(name[: -len(s)] for s in _ALL_SUFFIXES if name.endswith(s))
        return route

    def labels(self, label_text: str) -> _LabelEntry:
        """Decode (and cache) the true text between a label set's braces, or say what is wrong with it."""
        entry = self.label_cache.get(label_text)
        if entry is None:
            entry = _decode_labels(label_text, self.pairs)
            if entry is None:
                raise _diagnose_labels(label_text)
            self.label_cache[label_text] = entry
        return entry

    def timestamp(self, token: str) -> float:
        try:
            if "_" in token or not token.isascii():
                raise ValueError(token)
            # 0.0.4 timestamps are int64 milliseconds; OpenMetrics ones are float seconds.
            return float(token) if self.om else int(token) / 1000
        except (ValueError, OverflowError):
            raise _Malformed(f"invalid timestamp {_quoted(token)}") from None

    def split(self, line: str) -> tuple[str, str, str, str | None] | None:
        """The careful tokeniser: (name, label text, value, timestamp), or None for a blank line."""
        # NB: the caller removed a CRLF '\r'; any other '\r' is data, exactly as for the fast path.
        text = line.strip(" \t")
        if not text:
            return None
        m = _METRIC_NAME_RE.match(text)
        end = m.end() if m is not None else 0
        if end < len(text) and text[end] not in " \t{":
            end = 0  # e.g. "foo-bar 1": a name must end at a blank or a brace
        if not end:
            word = _BLANKS_RE.split(text, maxsplit=1)[0].split("{", 1)[0]
            raise _Malformed(f"invalid metric name {_quoted(word)}")
        name = text[:end]
        i = _skip_blanks(text, end)
        label_text = ""
        if text[i : i + 1] == "{":
            close = _find_label_set_end(text, i)
            label_text = text[i + 1 : close]
            i = close + 1
        rest = text[i:]
        if self.om:
            hash_at = rest.find("#")
            if hash_at >= 0:
                self._exemplar(rest[hash_at + 1 :])
                rest = rest[:hash_at]
        tokens = _BLANKS_RE.split(rest.strip(" \t"))
        if not tokens[0]:
            raise _Malformed("missing value")
        if len(tokens) > 2:
            raise _Malformed(f"unexpected text after the timestamp: {_quoted(tokens[2])}")
        return name, label_text, tokens[0], tokens[1] if len(tokens) == 2 else None

    def _exemplar(self, text: str) -> None:
        text = text.strip(" \t")
        if text[:1] != "{":
            raise _Malformed("an exemplar must start with a label set")
        close = _find_label_set_end(text, 0)
        self.labels(text[1:close])
        tokens = _BLANKS_RE.split(text[close + 1 :].strip(" \t"))
        if not tokens[0] or len(tokens) > 2:
            raise _Malformed("an exemplar needs a value and an optional timestamp")
        _value(tokens[0], what="exemplar value")
        if len(tokens) == 2:
            _value(tokens[1], what="exemplar timestamp")


def _value(token: str, *, what: str = "value") -> float:
    try:
        # NB: float() alone would also accept "1_000" and non-ASCII digits.
        if "_" in token or not token.isascii():
            raise ValueError(token)
        return float(token)
    except ValueError:
        raise _Malformed(f"invalid {what} {_quoted(token)}") from None


def _series_text(name: str, labels: Mapping[str, str]) -> str:
    inner = ",".join(f"{key}={_quoted(value)}" for key, value in labels.items())
    return f"{name}{{{inner}}}" if labels else name


def _check_bound(labels: Mapping[str, str], label: str, name: str) -> None:
    raw = labels.get(label)
    if raw is None:
        raise _Malformed(f"sample {name} has no {label!r} label")
    try:
        float(raw)
    except ValueError:
        raise _Malformed(f"invalid {label!r} label value {_quoted(raw)}") from None


def _parse(
    text: str, source: str, openmetrics: bool | None, *, fast: bool = True, families: bool = True
) -> tuple[list[Sample], list[MetricFamily]]:
    """(samples, families); ``families=False`` leaves the families' sample lists empty (parse_samples)."""
    auto = openmetrics is None
    om = _ends_with_eof(text) if openmetrics is None else openmetrics
    parser = _Parser(om=om, auto=auto)
    routes = parser.routes
    label_cache = parser.label_cache
    samples: list[Sample] = []
    name_ok = _is_metric_name
    blank_floor = _FP64_BLANK_FLOOR
    empty_labels = _EMPTY_LABELS
    new_tuple = _new_tuple
    current: MetricFamily | None = None
    finished: set[str] = set()  # OpenMetrics families whose samples have ended
    values: dict[str, float] = {}  # value text → float, converted once per distinct text
    comment = parser.comment
    closed: dict[str, _LabelEntry] = {}  # the fast path's label cache: the label text with its closing '}'
    sample_type = Sample
    eof = False
    number, line = 0, ""
    try:
        # NB: number and line outlive the loop: the except clauses below report them.
        crlf = "\r" in text
        for number, line in enumerate(text.split("\n"), 1):  # noqa: B007
            if not line:
                continue
            if crlf and line[-1] == "\r":  # CRLF line ends
                line = line[:-1]
                if not line:
                    continue
            if line[0] == "#":
                if eof:
                    raise _Malformed("text after '# EOF'")
                comment(line)
                eof = parser.eof
                continue
            if eof:
                if line.strip(" \t"):
                    raise _Malformed("text after '# EOF'")
                continue

            if fast:
                # The commonest line, "name{labels} value" or "name value", whose label text, name and value text
                # are each checked (and cached) on first sight: one cut at its last blank, one at its first '{'; the
                # label text then ends at the last '}', as below. Anything else (a timestamp, blank runs, tabs, an
                # exemplar, a duplicate, a DCGM blank or NaN, an error) falls through to the tokenisers below, which
                # redo the line. Nothing here raises but route() and _check_bound(), and their errors are then this
                # line's first (the tokens, labels and value are good; so is the series, for the bound).
                head, _, value_token = line.rpartition(" ")
                name, brace, closed_text = head.partition("{")
                if closed_text:
                    entry = closed.get(closed_text)
                    if entry is None:
                        entry = _decode_closed(parser, closed_text)
                        if entry is not None:
                            closed[closed_text] = entry
                else:
                    entry = None if brace else empty_labels
                if entry is not None:
                    value = values.get(value_token)
                    # NB: float() alone would also accept "1_000", non-ASCII digits and surrounding whitespace; a token
                    # never holds a tab (a float that fails leaves the line to the tokenisers, which report it).
                    # contextlib.suppress would cost a context manager per distinct value text.
                    if value is None and "_" not in value_token and "\t" not in value_token and value_token.isascii():
                        try:  # noqa: SIM105
                            value = values[value_token] = float(value_token)
                        except ValueError:
                            pass
                    if value is not None:
                        route = routes.get(name)
                        if route is None and name_ok(name):
                            route = parser.route(name)
                        if route is not None:
                            family, family_samples, dcgm, bound, seen = route
                            labels, label_key = entry
                            if (
                                (not dcgm or value < blank_floor)
                                and label_key not in seen
                                and (not om or family is current)
                            ):
                                if bound is not None:
                                    _check_bound(labels, bound, name)
                                seen.add(label_key)
                                sample = new_tuple(sample_type, (name, labels, value, None))
                                samples.append(sample)
                                if families:
                                    family_samples.append(sample)
                                continue

            # Fast tokeniser: a strict subset of what split() accepts, giving the same tokens.
            name = None
            route = None
            entry = empty_labels
            if fast:
                brace = line.find("{")
                parts = None
                if brace < 0:
                    if "\t" not in line and not (om and "#" in line):
                        parts = line.split(" ")
                else:
                    close = line.rfind("}")
                    rest = line[close + 1 :]
                    # NB: in OpenMetrics a '#' after the labels starts an exemplar: the careful path's job.
                    if close > brace and rest[:1] == " " and "\t" not in rest and not (om and "#" in rest):
                        label_text = line[brace + 1 : close]
                        cached = label_cache.get(label_text)
                        if cached is None:
                            cached = _decode_into(parser, label_text)
                        if cached is not None:
                            entry = cached
                            parts = rest.split(" ")
                            parts[0] = line[:brace]
                if parts is not None and 1 < len(parts) < 4 and all(parts):
                    candidate = parts[0]
                    route = routes.get(candidate)
                    if route is not None or name_ok(candidate):
                        name = candidate
                        value_token = parts[1]
                        time_token = parts[2] if len(parts) == 3 else None
            if name is None:
                tokens = parser.split(line)
                if tokens is None:
                    continue
                name, label_text, value_token, time_token = tokens
                entry = parser.labels(label_text)

            if route is None:
                route = routes.get(name) or parser.route(name)
            family, family_samples, dcgm, bound, seen = route
            if om and family is not current:
                if family.name in finished:
                    raise _Malformed(f"samples of metric family {family.name} are not contiguous")
                if current is not None:
                    finished.add(current.name)
                current = family

            value = values.get(value_token)
            if value is None:
                try:  # _value(), inlined: this runs once per distinct value text
                    if "_" in value_token or not value_token.isascii():
                        raise ValueError(value_token)
                    value = values[value_token] = float(value_token)
                except ValueError:
                    raise _Malformed(f"invalid value {_quoted(value_token)}") from None
            labels, label_key = entry
            series: object = label_key
            timestamp = None
            if time_token is not None:
                # NB: OpenMetrics allows several points of one series when their timestamps differ.
                timestamp = parser.timestamp(time_token)
                series = (label_key, time_token)
            if series in seen:
                raise _Malformed(f"duplicate series {_series_text(name, labels)}")
            seen.add(series)
            if bound is not None:
                _check_bound(labels, bound, name)
            if value >= blank_floor and dcgm and is_dcgm_blank(name, value, integer=_is_integer_literal(value_token)):
                continue
            sample = new_tuple(Sample, (name, labels, value, timestamp))
            samples.append(sample)
            if families:
                family_samples.append(sample)
    except _Malformed as e:
        raise ExpositionError(e.reason, source=source, line_number=number, line=line) from None
    except (ValueError, IndexError, KeyError, TypeError, OverflowError) as e:  # pragma: no cover
        # A safety net: the checks above should leave nothing for it to catch.
        raise ExpositionError(f"malformed line ({e})", source=source, line_number=number, line=line) from e
    if om and not parser.eof:
        lines = text.split("\n")
        while len(lines) > 1 and not lines[-1].strip():
            lines.pop()
        raise ExpositionError(
            "missing '# EOF' at the end of OpenMetrics text", source=source, line_number=len(lines), line=lines[-1]
        )
    return samples, list(parser.families.values())


def parse_samples(text: str, *, source: str = "<text>", openmetrics: bool | None = None) -> list[Sample]:
    """All samples of an exposition in document order, DCGM blank sentinels dropped.

    ``openmetrics``: True/False force the format (e.g. from the Content-Type); None decides by the text.
    Raises ``ExpositionError`` (source, line number, line, reason) on malformed input.
    """
    return _parse(text, source, openmetrics, families=False)[0]


def parse_families(text: str, *, source: str = "<text>", openmetrics: bool | None = None) -> list[MetricFamily]:
    """Metric families in order of first appearance, each with its samples; see ``parse_samples``."""
    return _parse(text, source, openmetrics)[1]
