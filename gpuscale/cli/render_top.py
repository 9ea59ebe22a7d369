"""Rendering for ``gpuscale top``: the output document, sorting, and the table/wide/json/yaml formatters.

Everything here is pure: a ``GpuTopList`` (plus ``RenderOptions``) in, a ``Rendered`` text out. Only
``Rendered.rich_text`` touches rich, to colour a table on a terminal.

Formatters are registered by name (``@formatter("json")``, krr-style); an unknown ``-o`` value fails with
the list of valid names. Sort keys are a registry per view in the same way.

NB: the table is laid out here rather than with ``rich.table.Table``: rich measures and renders every cell
through its segment pipeline (≈0.8 ms a row: 6 s for the 7,500 pods of a 1,250-node cluster), while
every cell here is ASCII and one ``len()`` measures it (the 7,500-row table renders in well under 0.1 s;
``benchmarks/bench_top.py``). rich still does what it is good at: colours and ``--watch``'s live refresh.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from gpuscale.errors import ConfigError
from gpuscale.metrics.devices import GpuStatus, Timestamp
from gpuscale.metrics.diagnosis import DiagnosisPolicy, GpuSignals, Severity, Verdict, VerdictCode
from gpuscale.metrics.rollups import NodeStatus, PodStatus, verdict_rank

if TYPE_CHECKING:
    from rich.text import Text

__all__ = [
    "FORMATTERS",
    "SORT_KEYS",
    "GpuTopList",
    "RenderOptions",
    "Rendered",
    "Scope",
    "SourceStatus",
    "View",
    "WorkloadStatus",
    "render",
    "sort_items",
]

View = Literal["gpus", "pods", "nodes", "workloads"]
VIEWS: tuple[View, ...] = ("gpus", "pods", "nodes", "workloads")

# --- the document ----------------------------------------------------------------------------------


class _Doc(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceStatus(_Doc):
    """One target top read from (an exporter URL, a Prometheus server, the adapter API)."""

    target: str
    healthy: bool
    error: str | None = None
    last_success: Timestamp | None = None
    series: int = 0


class Scope(_Doc):
    """What was asked for: ``namespace`` None = every namespace (or a cluster-scoped view)."""

    namespace: str | None = None
    all_namespaces: bool = False
    selector: str | None = None


class WorkloadStatus(_Doc):
    """A Deployment or StatefulSet: its request rate now and forecast one start-up ahead, as the adapter serves
    them (docs/forecast.md). None = not served (yet): a forecast needs 10 minutes of history."""

    namespace: str
    kind: str  # Deployment | StatefulSet
    name: str
    requests_per_second: float | None = None  # now: the last 15 s step (workload_requests_per_second)
    forecast_requests_per_second: float | None = None  # mean, at the horizon
    forecast_p90_requests_per_second: float | None = None
    horizon_seconds: float | None = None  # the start-up the forecast looks ahead by
    forecast_replicas: float | None = None  # p90 ÷ capacity per replica (needs the capacity annotation)


class GpuTopList(_Doc):
    """The ``-o json`` / ``-o yaml`` document (docs/top.md documents every field). ``version`` changes only
    when a field changes meaning or disappears; new fields may be added within a version."""

    kind: Literal["GpuTopList"] = "GpuTopList"
    version: Literal[1] = 1
    view: View
    generated_at: Timestamp
    scope: Scope = Field(default_factory=Scope)
    sources: list[SourceStatus] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)
    items: list[GpuStatus] | list[PodStatus] | list[NodeStatus] | list[WorkloadStatus] = Field(default_factory=list)


# --- sorting ---------------------------------------------------------------------------------------

Item = GpuStatus | PodStatus | NodeStatus | WorkloadStatus
_I = TypeVar("_I", GpuStatus, PodStatus, NodeStatus, WorkloadStatus)
SortKey = Callable[[Any], Any]


def _desc(value: float | None) -> tuple[bool, float]:
    """Largest first, unknown last."""
    return (value is None, -(value or 0.0))


def _signal(name: str) -> SortKey:
    return lambda item: _desc(getattr(item.signals, name))


def _gpu_order(g: GpuStatus) -> tuple[Any, ...]:
    index = int(g.gpu) if g.gpu.isdigit() else 1 << 30
    instance = int(g.mig_instance) if g.mig_instance and g.mig_instance.isdigit() else -1
    return (g.node or "", index, g.gpu, instance)


_COMMON_KEYS: dict[str, SortKey] = {
    "util": _signal("gpu_util_percent"),
    "sm": _signal("sm_active"),
    "occupancy": _signal("sm_occupancy"),
    "tensor": _signal("tensor_active"),
    "dram": _signal("dram_active"),
    "memory": _signal("fb_used_mib"),
    "power": _signal("power_watts"),
    "temp": _signal("gpu_temp_c"),
}

SORT_KEYS: dict[View, dict[str, SortKey]] = {
    "gpus": {
        "name": _gpu_order,
        "node": _gpu_order,
        "pod": lambda g: (g.pod is None, g.namespace or "", g.pod or "", _gpu_order(g)),
        **_COMMON_KEYS,
        "verdict": lambda g: verdict_rank(g.verdict),
    },
    "pods": {
        "name": lambda p: (p.namespace, p.name),
        "node": lambda p: (p.node is None, p.node or "", p.namespace, p.name),
        "gpus": lambda p: _desc(p.gpus),
        **_COMMON_KEYS,
        "queue": lambda p: _desc(p.inference.queue_depth if p.inference else None),
        "ratio": lambda p: _desc(p.inference.queue_compute_ratio if p.inference else None),
        "rps": lambda p: _desc(p.inference.requests_per_second if p.inference else None),
        "batch": lambda p: _desc(p.inference.batch_size if p.inference else None),
        "kv": lambda p: _desc(p.inference.kv_cache_usage if p.inference else None),
        "ttft": lambda p: _desc(p.inference.ttft_p95_seconds if p.inference else None),
        "verdict": lambda p: verdict_rank(p.verdict),
    },
    "nodes": {
        "name": lambda n: n.name,
        "gpus": lambda n: _desc(n.gpus),
        "pods": lambda n: _desc(n.pods),
        **_COMMON_KEYS,
        "verdict": lambda n: verdict_rank(n.worst) if n.worst else (1, 0),
    },
    "workloads": {
        "name": lambda w: (w.namespace, w.name, w.kind),
        "rps": lambda w: _desc(w.requests_per_second),
        "forecast": lambda w: _desc(w.forecast_requests_per_second),
        "p90": lambda w: _desc(w.forecast_p90_requests_per_second),
        "replicas": lambda w: _desc(w.forecast_replicas),
    },
}


def sort_items(view: View, items: Sequence[_I], key: str | None) -> list[_I]:
    """Items sorted by a named key (default ``name``); numbers largest first, names A→Z; ties by name."""
    keys = SORT_KEYS[view]
    if key is None:
        return sorted(items, key=keys["name"])
    chosen = keys.get(key)
    if chosen is None:
        raise ConfigError(f"--sort-by {key!r}: not a sort key for {view}; valid: {', '.join(keys)}")
    by_name = keys["name"]
    return sorted(items, key=lambda i: (chosen(i), by_name(i)))


# --- cell formatting -------------------------------------------------------------------------------

NONE = "-"


def _ratio_pct(ratio: float | None) -> str:
    return NONE if ratio is None else f"{ratio * 100:.0f}%"


def _pct(percent: float | None) -> str:
    return NONE if percent is None else f"{percent:.0f}%"


def _mib(mib: float | None) -> str:
    if mib is None:
        return NONE
    if mib < 1024:
        return f"{mib:.0f}Mi"
    gib = mib / 1024
    return f"{gib:.1f}Gi" if gib < 10 else f"{gib:.0f}Gi"


def _watts(watts: float | None) -> str:
    if watts is None:
        return NONE
    return f"{watts:.0f}W" if watts < 10_000 else f"{watts / 1000:.1f}kW"


def _celsius(c: float | None) -> str:
    return NONE if c is None else f"{c:.0f}C"


def _number(value: float | None, digits: int = 0) -> str:
    return NONE if value is None else f"{value:.{digits}f}"


def _mem_share(s: GpuSignals) -> str:
    if s.fb_used_mib is None or s.fb_free_mib is None or s.fb_used_mib + s.fb_free_mib <= 0:
        return NONE
    return f"{100 * s.fb_used_mib / (s.fb_used_mib + s.fb_free_mib):.0f}%"


def _throttle(clock_events: list[str], policy: DiagnosisPolicy) -> str:
    shown = [n for n in clock_events if n not in policy.diagnosis.clock_events.idle]
    return ",".join(shown) or NONE


def _xids(s: GpuSignals) -> str:
    codes = sorted(s.xid_counts or {})
    if s.last_xid and s.last_xid not in codes:
        codes.insert(0, s.last_xid)
    return ",".join(str(c) for c in codes) or NONE


def _findings(v: Verdict) -> str:
    others = [f.code.value for f in v.findings if f.code.value != v.code.value]
    return ",".join(dict.fromkeys(others)) or NONE


SHORT_CODES: dict[VerdictCode, str] = {
    VerdictCode.UNHEALTHY: "UH",
    VerdictCode.THROTTLED: "TH",
    VerdictCode.IDLE: "ID",
    VerdictCode.IDLE_HOLDING_MEMORY: "IM",
    VerdictCode.UNDER_FILLED: "UF",
    VerdictCode.MEMORY_BOUND: "MB",
    VerdictCode.PRECISION: "PR",
    VerdictCode.LOW_OCCUPANCY: "LO",
    VerdictCode.COMPUTE_BOUND: "CB",
    VerdictCode.MODERATE: "MO",
    VerdictCode.UNKNOWN: "UK",
}

SEVERITY_STYLES: dict[Severity, str | None] = {
    Severity.CRITICAL: "bold red",
    Severity.WARNING: "yellow",
    Severity.INFO: None,
    Severity.OK: "green",
}


def _verdict_counts(n: NodeStatus) -> str:
    return " ".join(f"{SHORT_CODES[code]}{count}" for code, count in n.verdict_counts.items()) or NONE


# --- columns ---------------------------------------------------------------------------------------

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Column(Generic[_T]):
    """One table column. ``cut``: how a too-long cell is shortened ("end" keeps the start; "middle" keeps
    both ends, as for pod names whose unique part is the suffix; "host" drops a DNS name's domain first,
    ``ip-10-0-131-77.ec2.internal`` → ``ip-10-0-131-77``, then cuts the end); None = never cut.
    ``min_width`` is as far as a cut may go; ``shrink_first`` columns are cut before the others (node names
    repeat on every row, pod names do not). ``style`` colours the cell on a terminal."""

    header: str
    cell: Callable[[_T], str]
    right: bool = False
    cut: Literal["end", "middle", "host"] | None = None
    min_width: int = 12
    shrink_first: bool = False
    style: Callable[[_T], str | None] | None = None


def _verdict_style(v: Verdict) -> str | None:
    return SEVERITY_STYLES[v.severity]


def _activity_columns(o: RenderOptions) -> list[Column[Any]]:
    """SM, occupancy (wide), tensor, DRAM and memory: the deep signals every view shows the same way."""
    cols: list[Column[Any]] = [Column("SM", lambda x: _ratio_pct(x.signals.sm_active), right=True)]
    if o.wide:
        cols.append(Column("OCC", lambda x: _ratio_pct(x.signals.sm_occupancy), right=True))
    return [
        *cols,
        Column("TENSOR", lambda x: _ratio_pct(x.signals.tensor_active), right=True),
        Column("DRAM", lambda x: _ratio_pct(x.signals.dram_active), right=True),
        Column("MEM", lambda x: _mib(x.signals.fb_used_mib), right=True),
    ]


def _gpu_columns(o: RenderOptions) -> list[Column[GpuStatus]]:
    def pod(g: GpuStatus) -> str:
        if g.pod is None:
            return NONE
        return g.pod if o.scope.namespace and not o.scope.all_namespaces else f"{g.namespace}/{g.pod}"

    cols: list[Column[GpuStatus]] = [
        Column("NODE", lambda g: g.node or NONE, cut="host", min_width=14, shrink_first=True),
        Column("GPU", lambda g: g.device_id),
    ]
    if o.wide:
        cols += [
            Column("MODEL", lambda g: g.model or NONE, cut="end"),
            Column("PROFILE", lambda g: g.mig_profile or NONE),
        ]
    cols += [
        Column("POD", pod, cut="middle", min_width=18),
        Column("UTIL", lambda g: _pct(g.signals.gpu_util_percent), right=True),
    ]
    if o.wide:
        cols.append(Column("GR", lambda g: _ratio_pct(g.signals.gr_engine_active), right=True))
    cols += _activity_columns(o)
    if o.wide:
        cols.append(Column("MEM%", lambda g: _mem_share(g.signals), right=True))
    cols += [
        Column("POWER", lambda g: _watts(g.signals.power_watts), right=True),
        Column("TEMP", lambda g: _celsius(g.signals.gpu_temp_c), right=True),
    ]
    if o.wide:
        cols += [
            Column("CLOCK", lambda g: _number(g.signals.sm_clock_mhz), right=True),
            Column("THROTTLE", lambda g: _throttle(g.clock_events, o.policy)),
            Column("XID", lambda g: _xids(g.signals)),
        ]
    cols.append(Column("VERDICT", lambda g: g.verdict.code.value, style=lambda g: _verdict_style(g.verdict)))
    if o.wide:
        cols += [
            Column("SEVERITY", lambda g: g.verdict.severity.value),
            Column("FINDINGS", lambda g: _findings(g.verdict)),
            Column("UUID", lambda g: g.uuid or NONE),
        ]
    return cols


def _inference(p: PodStatus, name: str, digits: int) -> str:
    return _number(getattr(p.inference, name) if p.inference else None, digits)


def _serves_llm(pods: Sequence[PodStatus]) -> bool:
    """Whether any pod reports an LLM server's own signals (then the serving columns are shown)."""
    return any(p.inference is not None and p.inference.serves_llm for p in pods)


def _seconds(value: float | None) -> str:
    return NONE if value is None else f"{value:.2f}s"


def _serving_columns() -> list[Column[PodStatus]]:
    return [
        Column("BATCH", lambda p: _inference(p, "batch_size", 0), right=True),
        Column("KV", lambda p: _pct(p.inference.kv_cache_usage if p.inference else None), right=True),
        Column("TTFT95", lambda p: _seconds(p.inference.ttft_p95_seconds if p.inference else None), right=True),
    ]


def _pod_columns(o: RenderOptions, *, serving: bool = False) -> list[Column[PodStatus]]:
    cols: list[Column[PodStatus]] = []
    if o.scope.namespace is None or o.scope.all_namespaces:
        cols.append(Column("NAMESPACE", lambda p: p.namespace, cut="end", min_width=10))
    cols += [
        Column("POD", lambda p: p.name, cut="middle", min_width=18),
        Column("GPUS", lambda p: _number(p.gpus), right=True),
    ]
    if o.wide:
        cols.append(Column("NODE", lambda p: p.node or NONE, cut="host", min_width=14, shrink_first=True))
    cols.append(Column("UTIL", lambda p: _pct(p.signals.gpu_util_percent), right=True))
    cols += _activity_columns(o)
    cols.append(Column("POWER", lambda p: _watts(p.signals.power_watts), right=True))
    if o.wide:
        cols += [
            Column("TEMP", lambda p: _celsius(p.signals.gpu_temp_c), right=True),
            Column("THROTTLE", lambda p: _throttle(p.clock_events, o.policy)),
            Column("XID", lambda p: _xids(p.signals)),
            Column("RPS", lambda p: _inference(p, "requests_per_second", 1), right=True),
        ]
    cols.append(Column("QUEUE", lambda p: _inference(p, "queue_depth", 0), right=True))
    if serving:
        cols += _serving_columns()
    cols += [
        Column("Q:C", lambda p: _inference(p, "queue_compute_ratio", 2), right=True),
        Column("VERDICT", lambda p: p.verdict.code.value, style=lambda p: _verdict_style(p.verdict)),
    ]
    if serving:
        cols.append(
            Column(
                "SERVING",
                lambda p: p.serving.code.value if p.serving else NONE,
                style=lambda p: SEVERITY_STYLES[p.serving.severity] if p.serving else None,
            )
        )
    if o.wide:
        cols += [
            Column("SEVERITY", lambda p: p.verdict.severity.value),
            Column("FINDINGS", lambda p: _findings(p.verdict)),
        ]
    return cols


def _node_columns(o: RenderOptions) -> list[Column[NodeStatus]]:
    cols: list[Column[NodeStatus]] = [
        Column("NODE", lambda n: n.name, cut="host", min_width=14),
        Column("GPUS", lambda n: _number(n.gpus), right=True),
    ]
    if o.wide:
        cols.append(Column("DEVICES", lambda n: _number(n.devices), right=True))
    cols += [
        Column("PODS", lambda n: _number(n.pods), right=True),
        Column("UTIL", lambda n: _pct(n.signals.gpu_util_percent), right=True),
    ]
    cols += _activity_columns(o)
    if o.wide:
        cols.append(Column("MEM%", lambda n: _mem_share(n.signals), right=True))
    cols += [
        Column("POWER", lambda n: _watts(n.signals.power_watts), right=True),
        Column("TEMP", lambda n: _celsius(n.signals.gpu_temp_c), right=True),
    ]
    if o.wide:
        cols.append(Column("THROTTLE", lambda n: _throttle(n.clock_events, o.policy)))
    cols.append(
        Column(
            "VERDICTS",
            _verdict_counts,
            style=lambda n: SEVERITY_STYLES[n.worst.severity] if n.worst else None,
        )
    )
    if o.wide:
        cols.append(Column("WORST", lambda n: f"{n.worst.gpu}:{n.worst.code.value}" if n.worst else NONE))
    return cols


# --- layout ----------------------------------------------------------------------------------------

GAP = "  "
ELLIPSIS = "…"
PROSE_WIDTH = 120  # the legend and notes when the table itself is not cut (piped output): they are read, not parsed


def _cut(text: str, width: int, how: str | None) -> str:
    if len(text) <= width:
        return text
    if width <= 1:
        return text[:width]
    if how == "host":
        short = text.partition(".")[0]
        return short if len(short) <= width else short[: width - 1] + ELLIPSIS
    if how == "middle":
        tail = (width - 1) * 2 // 5
        return text[: width - 1 - tail] + ELLIPSIS + (text[-tail:] if tail else "")
    return text[: width - 1] + ELLIPSIS


def _fit(natural: list[int], columns: Sequence[Column[Any]], width: int | None, mins: list[int]) -> list[int]:
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


@dataclass(slots=True)
class Rendered:
    """Text lines plus colour spans ``(line, start, end, rich style)`` for a terminal."""

    lines: list[str]
    spans: list[tuple[int, int, int, str]] = field(default_factory=list)

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
    widths = _fit(natural, columns, width, mins)
    out = Rendered([])
    rows: list[tuple[list[str], _T | None]] = [([c.header for c in columns], None)] if headers else []
    rows += list(zip(cells, items, strict=True))
    # NB: per column once, not per cell (a table of 5,000 pods has 60,000 cells).
    layout = [(w, c.cut, c.right, c.style) for w, c in zip(widths, columns, strict=True)]
    gap = len(GAP)
    for row, item in rows:
        parts: list[str] = []
        pos = 0
        for (w, cut, right, styler), text in zip(layout, row, strict=True):
            if len(text) > w:
                text = _cut(text, w, cut)
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


# --- legend ----------------------------------------------------------------------------------------


def verdict_meanings(policy: DiagnosisPolicy) -> dict[VerdictCode, str]:
    """One line per verdict saying when it applies, with the thresholds of the loaded policy."""
    d = policy.diagnosis

    def pct(ratio: float) -> str:
        return f"{ratio * 100:g}%"

    return {
        VerdictCode.UNHEALTHY: "a fatal health signal: fatal Xid, volatile ECC double-bit errors or row-remap failure",
        VerdictCode.THROTTLED: f"clocks held down by {', '.join(d.clock_events.abnormal)} (power_cap alone is normal)",
        VerdictCode.IDLE: f"busy ≤ {d.idle.busy_percent:g}% and SM active ≤ {pct(d.idle.sm_active)}: nothing runs",
        VerdictCode.IDLE_HOLDING_MEMORY: f"idle, but ≥ {d.memory_held.fb_used_mib:g} MiB of GPU memory held",
        VerdictCode.UNDER_FILLED: f"GPU util ≥ {d.busy.gpu_util_percent:g}% but SM active "
        f"< {pct(d.sm_active.ineffective)}: kernels resident, SMs mostly empty",
        VerdictCode.MEMORY_BOUND: f"DRAM active ≥ {pct(d.dram_active.bandwidth_bound)}: memory bandwidth is the limit",
        VerdictCode.PRECISION: f"SM active ≥ {pct(d.sm_active.effective)} but tensor active "
        f"< {pct(d.tensor_active.low)}: CUDA cores, not tensor cores",
        VerdictCode.LOW_OCCUPANCY: f"SMs active but occupancy < {pct(d.sm_occupancy.low)}: few warps per SM",
        VerdictCode.COMPUTE_BOUND: f"SM active ≥ {pct(d.sm_active.effective)}: the SMs do real work",
        VerdictCode.MODERATE: f"SM active < {pct(d.sm_active.effective)}: partly loaded, headroom left",
        VerdictCode.UNKNOWN: "a signal the verdict needs is not reported (often SM_ACTIVE, off by default)",
    }


def _codes_shown(view: View, items: Sequence[Item]) -> set[VerdictCode]:
    if view == "nodes":
        return {code for n in items if isinstance(n, NodeStatus) for code in n.verdict_counts}
    return {i.verdict.code for i in items if isinstance(i, GpuStatus | PodStatus)}


def legend(
    view: View, items: Sequence[Item], policy: DiagnosisPolicy, *, width: int | None, sources_failed: bool = False
) -> list[str]:
    shown = _codes_shown(view, items)
    if not shown:
        return []
    meanings = verdict_meanings(policy)
    if sources_failed:
        # NB: with failed queries or scrapes, a missing signal says nothing about the GPU: name the failure.
        meanings[VerdictCode.UNKNOWN] = "a signal the verdict needs is missing: a source failed (below), not the GPU"
    lines = ["Verdicts (in priority order; explanations and next steps: -o yaml):"]
    for code in VerdictCode:
        if code in shown:
            line = f"  {SHORT_CODES[code]}  {code.value:<19}  {meanings[code]}"
            lines.append(_cut(line, width, "end") if width else line)
    return lines


# --- formatters ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RenderOptions:
    """How to render: ``width`` None = unlimited; ``headers`` False drops the header row, legend and notes."""

    policy: DiagnosisPolicy
    scope: Scope = field(default_factory=Scope)
    width: int | None = 120
    headers: bool = True
    wide: bool = False


Formatter = Callable[[GpuTopList, RenderOptions], Rendered]
FORMATTERS: dict[str, Formatter] = {}


def formatter(name: str) -> Callable[[Formatter], Formatter]:
    def register(fn: Formatter) -> Formatter:
        FORMATTERS[name] = fn
        return fn

    return register


def _workload_columns() -> list[Column[WorkloadStatus]]:
    return [
        Column("NAMESPACE", lambda w: w.namespace, cut="end"),
        Column("WORKLOAD", lambda w: f"{w.kind.lower()}/{w.name}", cut="middle", min_width=16),
        Column("REQ/S NOW", lambda w: _number(w.requests_per_second, 2), right=True),
        Column("FORECAST", lambda w: _number(w.forecast_requests_per_second, 2), right=True),
        Column("P90", lambda w: _number(w.forecast_p90_requests_per_second, 2), right=True),
        Column("AHEAD", lambda w: NONE if w.horizon_seconds is None else f"{w.horizon_seconds:.0f}s", right=True),
        Column("REPLICAS", lambda w: _number(w.forecast_replicas, 1), right=True),
    ]


def _columns(view: View, options: RenderOptions, items: Sequence[Any] = ()) -> list[Column[Any]]:
    if view == "gpus":
        return _gpu_columns(options)
    if view == "pods":
        return _pod_columns(options, serving=_serves_llm(items))
    if view == "workloads":
        return _workload_columns()
    return _node_columns(options)


def _table(doc: GpuTopList, options: RenderOptions) -> Rendered:
    out = table(_columns(doc.view, options, doc.items), doc.items, width=options.width, headers=options.headers)
    if not options.headers:
        return out
    failing = [s for s in doc.sources if not s.healthy]
    prose = options.width or PROSE_WIDTH
    extra = legend(doc.view, doc.items, options.policy, width=prose, sources_failed=bool(failing))
    notes = [f"! {s.target}: {s.error or 'failed'}" for s in failing] + [f"! {n}" for n in doc.notes]
    if failing:
        notes.insert(0, f"! {len(failing)} of {len(doc.sources)} sources failed:")
    if extra:
        out.lines += ["", *extra]
    if notes:
        out.lines.append("")
        start = len(out.lines)
        for note in notes:  # NB: notes wrap (they explain), legend lines are cut (they repeat the docs)
            out.lines += textwrap.wrap(note, prose, subsequent_indent="  ")
        out.spans += [(i, 0, len(out.lines[i]), "yellow") for i in range(start, len(out.lines))]
    return out


@formatter("table")
def table_formatter(doc: GpuTopList, options: RenderOptions) -> Rendered:
    return _table(doc, options)


@formatter("wide")
def wide_formatter(doc: GpuTopList, options: RenderOptions) -> Rendered:
    return _table(doc, RenderOptions(options.policy, options.scope, options.width, options.headers, wide=True))


def to_data(doc: GpuTopList) -> dict[str, Any]:
    """The document as plain JSON-compatible data (timestamps as RFC 3339 strings)."""
    return doc.model_dump(mode="json")


@formatter("json")
def json_formatter(doc: GpuTopList, options: RenderOptions) -> Rendered:
    return Rendered([json.dumps(to_data(doc), indent=2, ensure_ascii=False)])


_YamlDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # NB: libyaml is ~10× faster when present


@formatter("yaml")
def yaml_formatter(doc: GpuTopList, options: RenderOptions) -> Rendered:
    text = yaml.dump(to_data(doc), Dumper=_YamlDumper, sort_keys=False, allow_unicode=True, width=1 << 16)
    return Rendered(text.rstrip("\n").split("\n"))


def render(doc: GpuTopList, output: str, options: RenderOptions) -> Rendered:
    """Render with the formatter named ``output``; an unknown name fails with the valid names."""
    fn = FORMATTERS.get(output)
    if fn is None:
        raise ConfigError(f"-o {output!r}: unknown output format; valid: {', '.join(FORMATTERS)}")
    return fn(doc, options)
