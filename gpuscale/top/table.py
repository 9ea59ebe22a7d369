"""The table layout of ``gpuscale top``: columns of text aligned in a given width, names cut so they stay
recognisable, colour spans for a terminal. Pure: cells in, ``Rendered`` lines out.

NB: the table is laid out here rather than with ``rich.table.Table``: rich measures and renders every cell
through its segment pipeline (≈0.8 ms a row: 6 s for the 7,500 pods of a 1,250-node cluster), while
every cell here is ASCII and one ``len()`` measures it (the 7,500-row table renders in well under 0.1 s;
``benchmarks/bench_top.py``). rich still does what it is good at: colours and ``--watch``'s live refresh.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import accumulate
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["ELLIPSIS", "GAP", "Column", "Rendered", "cut", "table"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Column(Generic[_T]):
    """One table column. ``cut``: how a too-long cell is shortened ("end" keeps the start; "middle" keeps
    both ends, as for pod names whose unique part is the suffix; "host" drops a DNS name's domain first,
    ``ip-10-0-131-77.ec2.internal`` → ``ip-10-0-131-77``, then cuts the end); None = never cut.
    ``min_width`` is as far as a cut may go; ``shrink_first`` columns are cut before the others (node names
    repeat on every row, pod names do not). ``keep``: never left out when the row is still too wide (what
    a row is, and its verdict); the other columns then go from the right. ``style`` colours the cell on a
    terminal."""

    header: str
    cell: Callable[[_T], str]
    right: bool = False
    cut: Literal["end", "middle", "host"] | None = None
    min_width: int = 12
    shrink_first: bool = False
    keep: bool = False
    style: Callable[[_T], str | None] | None = None


GAP = "  "
ELLIPSIS = "…"


# A name's segments ("triton", "-inference", "-7d9f8b6c5", "-x2k4q"): cuts fall only between them, never
# inside a word (a legend line's words are segments too).
_SEGMENTS = re.compile(r"[-_./:, ]*[^-_./:, ]+|[-_./:, ]+$")


@lru_cache(maxsize=1 << 14)  # NB: ~10 µs a name; with --watch the same names come back every frame
def cut(text: str, width: int, how: str | None) -> str:
    """``text`` in at most ``width`` characters, "…" where some was left out, whole segments either side of it
    (``triton-inference-7d9f8b6c5-x2k4q`` in 18 → ``triton…-x2k4q``); a segment is cut inside only when it
    alone is wider than the room. ``how`` as in ``Column.cut``; "middle" keeps the last segment (what tells a
    pod from its siblings) and, of the ways to keep up to half the room at the end, the one that keeps the
    most of the name (on a tie, the longer end)."""
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if how == "host":
        text = text.partition(".")[0]
        if len(text) <= width:
            return text
    pieces = _SEGMENTS.findall(text)
    starts = list(accumulate((len(p) for p in pieces), initial=0))  # starts[i]: where piece i begins
    room = width - 1
    head, tail = bisect_right(starts, room) - 1, 0  # NB: the most leading pieces that fit, no tail
    if how == "middle":
        best = -1
        for t in range(1, len(pieces)):
            tail_length = len(text) - starts[len(pieces) - t]
            if tail_length > (room + 1) // 2:  # NB: the end may take half the room, the start the rest
                break
            h = min(bisect_right(starts, room - tail_length) - 1, len(pieces) - t)
            if h > 0 and starts[h] + tail_length >= best:
                best, head, tail = starts[h] + tail_length, h, t
    if head == 0:
        return text[:room] + ELLIPSIS  # NB: one segment wider than the room: nothing whole to keep
    return text[: starts[head]] + ELLIPSIS + (text[starts[len(pieces) - tail] :] if tail else "")


def fit(natural: list[int], columns: Sequence[Column[Any]], width: int | None, mins: list[int]) -> list[int]:
    """Column widths that fit ``width``: cut ``shrink_first`` columns, then the widest, never below ``mins``."""
    widths = list(natural)
    if width is None:
        return widths
    excess = sum(widths) + len(GAP) * (len(widths) - 1) - width
    while excess > 0:
        candidates = [i for i, c in enumerate(columns) if c.cut and widths[i] > mins[i]]
        if not candidates:
            break  # NB: nothing left to cut: the table is wider than asked rather than unreadable
        first = [i for i in candidates if columns[i].shrink_first]
        candidates = first or candidates
        widest = max(candidates, key=lambda i: widths[i])
        runner_up = max((widths[i] for i in candidates if i != widest), default=0)
        target = max(mins[widest], runner_up, widths[widest] - excess)
        target = min(target, widths[widest] - 1)
        if columns[widest].cut == "host":
            target = min(target, mins[widest])  # NB: all of the domain or none of it; half a domain is noise
        excess -= widths[widest] - target
        widths[widest] = target
    return widths


def _shown(columns: Sequence[Column[Any]], widths: list[int], width: int | None) -> list[int]:
    """The columns shown: all that fit; when the names are cut as far as they go and the row is still too
    wide, columns not marked ``keep`` are left out from the right (a row is one line: wrapped, or cut at the
    terminal's edge, its cells would break mid-word)."""
    shown = list(range(len(columns)))
    if width is None:
        return shown
    for i in reversed(range(len(columns))):
        if sum(widths[j] for j in shown) + len(GAP) * (len(shown) - 1) <= width:
            break
        if not columns[i].keep:
            shown.remove(i)
    return shown


@dataclass(slots=True)
class Rendered:
    """Text lines plus colour spans ``(line, start, end, rich style)`` for a terminal, and the headers of the
    columns left out to fit the width."""

    lines: list[str]
    spans: list[tuple[int, int, int, str]] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)

    def plain(self) -> str:
        return "\n".join(self.lines) + "\n" if self.lines else ""

    def rich_text(self) -> Text:
        from rich.text import Text

        text = Text("\n".join(self.lines), no_wrap=True, overflow="ellipsis", end="\n")
        offsets = [0]
        for line in self.lines:
            offsets.append(offsets[-1] + len(line) + 1)
        for row, start, end, style in self.spans:
            text.stylize(style, offsets[row] + start, offsets[row] + end)
        return text


def table(columns: Sequence[Column[_T]], items: Sequence[_T], *, width: int | None, headers: bool) -> Rendered:
    """Aligned columns separated by two spaces; right-aligned numbers; no trailing blanks."""
    cells = [[c.cell(item) for c in columns] for item in items]
    natural = [max([len(c.header) if headers else 0, *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    # NB: a host name is never cut inside its first label (ip-10-0-152-203 must stay whole), up to 32 chars.
    mins = [
        max(c.min_width, min(32, max((len(row[i].partition(".")[0]) for row in cells), default=0)))
        if c.cut == "host"
        else c.min_width
        for i, c in enumerate(columns)
    ]
    widths = fit(natural, columns, width, mins)
    shown = _shown(columns, widths, width)
    out = Rendered([], left_out=[c.header for i, c in enumerate(columns) if i not in shown])
    if out.left_out:  # NB: fitted again: the room of the columns left out goes back to the names
        columns, cells = [columns[i] for i in shown], [[row[i] for i in shown] for row in cells]
        widths = fit([natural[i] for i in shown], columns, width, [mins[i] for i in shown])
    rows: list[tuple[list[str], _T | None]] = [([c.header for c in columns], None)] if headers else []
    rows += list(zip(cells, items, strict=True))
    # NB: per column once, not per cell (a table of 5,000 pods has 60,000 cells).
    layout = [(w, c.cut, c.right, c.style) for w, c in zip(widths, columns, strict=True)]
    gap = len(GAP)
    for row, item in rows:
        parts: list[str] = []
        pos = 0
        for (w, how, right, styler), text in zip(layout, row, strict=True):
            if len(text) > w:
                text = cut(text, w, how)
            parts.append(text.rjust(w) if right else text.ljust(w))
            if styler is not None and item is not None:
                style = styler(item)
                if style:
                    start = pos + (w - len(text) if right else 0)
                    out.spans.append((len(out.lines), start, start + len(text), style))
            pos += w + gap
        out.lines.append(GAP.join(parts).rstrip())
        if item is None:
            out.spans.append((len(out.lines) - 1, 0, len(out.lines[-1]), "bold"))
    return out
