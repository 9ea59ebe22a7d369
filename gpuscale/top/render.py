"""Rendering for ``gpuscale top``: a ``GpuTopList`` (plus ``RenderOptions``) in, a ``Rendered`` text out —
the table with its legend and notes, or the document as JSON or YAML.

Formatters are registered by name (``@formatter("json")``, krr-style); an unknown ``-o`` value fails with
the list of valid names. Only ``Rendered.rich_text`` touches rich, to colour a table on a terminal.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

import yaml

from gpuscale.errors import ConfigError
from gpuscale.metrics.devices import GpuStatus
from gpuscale.metrics.diagnosis import DiagnosisPolicy, VerdictCode
from gpuscale.metrics.rollups import NodeStatus, PodStatus
from gpuscale.top.cells import SHORT_CODES
from gpuscale.top.columns import RenderOptions, columns
from gpuscale.top.document import GpuTopList, Item, View
from gpuscale.top.table import Rendered, cut, table

__all__ = ["FORMATTERS", "legend", "render", "verdict_meanings"]

PROSE_WIDTH = 120  # the legend and notes when the table itself is not cut (piped output): they are read, not parsed

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
            lines.append(cut(line, width, "end") if width else line)
    return lines


Formatter = Callable[[GpuTopList, RenderOptions], Rendered]
FORMATTERS: dict[str, Formatter] = {}


def formatter(name: str) -> Callable[[Formatter], Formatter]:
    def register(fn: Formatter) -> Formatter:
        FORMATTERS[name] = fn
        return fn

    return register


def _table(doc: GpuTopList, options: RenderOptions) -> Rendered:
    out = table(columns(doc.view, options, doc.items), doc.items, width=options.width, headers=options.headers)
    if not options.headers:
        return out
    failing = [s for s in doc.sources if not s.healthy]
    prose = options.width or PROSE_WIDTH
    extra = legend(doc.view, doc.items, options.policy, width=prose, sources_failed=bool(failing))
    notes = [f"! {s.target}: {s.error or 'failed'}" for s in failing] + [f"! {n}" for n in doc.notes]
    if out.left_out:
        notes.append(
            f"! {', '.join(out.left_out)}: left out to fit {options.width} columns; widen the terminal, or pipe "
            "the output (| less -S) for every column"
        )
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
