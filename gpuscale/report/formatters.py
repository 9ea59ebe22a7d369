"""Report formats, one function each, registered by name: ``table`` (a terminal, 120 columns), ``json`` (the
versioned schema of ``report/schema.py``), ``markdown``, ``html`` (one self-contained file with charts). An
unknown name fails with the list of valid ones."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from datetime import UTC, datetime

from gpuscale.errors import ConfigError
from gpuscale.report.schema import CostFigures, IdleNode, Incident, Recommendation, Report, Workload

Formatter = Callable[[Report], str]
FORMATTERS: dict[str, Formatter] = {}
TABLE_WIDTH = 120


def register(name: str) -> Callable[[Formatter], Formatter]:
    def add(f: Formatter) -> Formatter:
        FORMATTERS[name] = f
        return f

    return add


def formatter(name: str) -> Formatter:
    try:
        return FORMATTERS[name]
    except KeyError:
        raise ConfigError(f"unknown report format {name!r}; valid: {', '.join(FORMATTERS)}") from None


def when(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def money(value: float | None, currency: str) -> str:
    return "—" if value is None else f"{value:,.0f} {currency}" if value >= 100 else f"{value:,.2f} {currency}"


def hours(value: float) -> str:
    return f"{value:,.1f}"


def _pct(w: Workload, signal: str, q: str) -> str:
    s = w.signals.get(signal)
    return "—" if s is None else f"{getattr(s, q):.0f}"


def _gib(w: Workload) -> str:
    s = w.signals.get("fb_used_mib")
    return "—" if s is None else f"{s.max / 1024:.1f}"


_SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2, "ok": 3}


def top_recommendation(w: Workload) -> str:
    """The recommended action in a few words, and how many alternatives and notes follow it."""
    chosen = [r for r in w.recommendations if r.role == "recommended"]
    if not chosen:  # NB: a report made before one action was chosen: worst first
        chosen = sorted(w.recommendations, key=lambda r: _SEVERITY_ORDER[r.severity])[:1]
    others = sum(r.role == "alternative" for r in w.recommendations)
    notes = sum(r.role == "note" for r in w.recommendations)
    more = [f"+{others} alt" if others else "", f"+{notes} note" if notes else ""]
    return "; ".join([*(r.short for r in chosen), *(m for m in more if m)])


def role_label(r: Recommendation) -> str:
    return {"recommended": "RECOMMENDED", "alternative": "alternative", "note": "note"}[r.role]


def headline(report: Report) -> list[str]:
    w = report.window
    t = report.total
    return [
        f"GPU report {when(w.start)} – {when(w.end)} UTC, step {w.step_seconds:g}s, {report.mode} mode, "
        f"from {report.source or 'a file'}",
        f"{t.gpus} GPUs: {hours(t.allocated_hours)} GPU-h allocated ({money(t.allocated_cost, report.currency)}), "
        f"{hours(t.active_hours)} active, {hours(t.idle_hours)} idle ({money(t.idle_cost, report.currency)}), "
        f"{hours(t.unallocated_hours)} unallocated ({money(t.unallocated_cost, report.currency)})",
    ]


WORKLOAD_COLUMNS = (
    "Workload",
    "GPUs req/used",
    "Act p50/p95 %",
    "FB max GiB",
    "Conf",
    "Idle GPU-h",
    "Idle cost",
    "Recommendations",
)


def workload_row(w: Workload, currency: str) -> list[str]:
    used = w.signals.get("gpus_busy")
    req = f"{w.gpus_requested_per_pod:g}" if w.gpus_requested_per_pod else "?"
    return [
        f"{w.namespace}/{w.kind}/{w.name}",
        f"{req}/{used.max:g}" if used else f"{req}/—",
        f"{_pct(w, 'activity_percent', 'p50')}/{_pct(w, 'activity_percent', 'p95')}",
        _gib(w),
        f"{w.confidence:.2f}",
        hours(w.cost.idle_hours),
        money(w.cost.idle_cost, currency),
        top_recommendation(w),
    ]


COST_COLUMNS = ("GPUs", "Allocated GPU-h", "Active", "Idle", "Idle cost", "Unallocated", "Unalloc. cost")


def cost_row(name: str, c: CostFigures, currency: str) -> list[str]:
    return [
        name,
        str(c.gpus),
        hours(c.allocated_hours),
        hours(c.active_hours),
        hours(c.idle_hours),
        money(c.idle_cost, currency),
        hours(c.unallocated_hours),
        money(c.unallocated_cost, currency),
    ]


IDLE_NODE_COLUMNS = ("Node", "Pool", "GPUs", "Allocated", "Active", "Idle GPU-h", "Idle cost")


def idle_node_row(n: IdleNode, currency: str) -> list[str]:
    return [
        n.node,
        n.pool,
        str(n.gpus),
        f"{n.allocated_share:.0%}",
        f"{n.active_share:.1%}",
        hours(n.idle_hours),
        money(n.idle_cost, currency),
    ]


INCIDENT_COLUMNS = ("First seen (UTC)", "Kind", "Value", "Node", "GPU", "Pod", "Count", "Meaning")


def incident_row(i: Incident) -> list[str]:
    return [when(i.first_seen), i.kind, i.value, i.node, i.gpu, i.pod or "—", str(i.count), i.meaning]


def evidence_text(evidence: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in evidence.items() if v is not None and k != "example")


@register("table")
def table(report: Report) -> str:
    from rich.console import Console
    from rich.table import Table

    out = io.StringIO()
    console = Console(file=out, width=TABLE_WIDTH, force_terminal=False, color_system=None, soft_wrap=False)
    for line in headline(report):
        console.print(line, highlight=False)
    for gap in report.gaps:
        console.print(f"gap: {gap}", highlight=False)
    t = Table(title="Workloads", box=None, pad_edge=False, expand=False)
    for col in WORKLOAD_COLUMNS:
        t.add_column(col, overflow="fold", max_width=44 if col == "Recommendations" else 32)
    for w in report.workloads:
        t.add_row(*workload_row(w, report.currency))
    console.print(t)
    for w in report.workloads:
        if all(r.kind == "keep" for r in w.recommendations):
            continue
        for r in w.recommendations:
            saving = f" (saves ~{money(r.monthly_saving, report.currency)}/month)" if r.monthly_saving else ""
            indent = "" if r.role == "recommended" else "  "
            console.print(
                f"{indent}{w.namespace}/{w.name}: {role_label(r)} [{r.severity}] {r.summary}{saving}",
                highlight=False,
                markup=False,
            )
            if r.evidence:
                console.print(f"{indent}    because {evidence_text(r.evidence)}", highlight=False, markup=False)
            if r.role == "recommended" and w.rule:
                console.print(f"    chosen as {w.rule}", highlight=False, markup=False)
    for title, groups in (("Pools", report.pools), ("Namespaces", report.namespaces)):
        g = Table(title=title, box=None, pad_edge=False)
        for col in (title[:-1], *COST_COLUMNS):
            g.add_column(col)
        for grp in groups:
            g.add_row(*cost_row(grp.name, grp.cost, report.currency))
        console.print(g)
    if report.idle_nodes:
        console.print("Requested but idle nodes:", highlight=False)
        for n in report.idle_nodes:
            console.print(
                f"  {n.node} (pool {n.pool}, {n.gpus} GPUs): {n.allocated_share:.0%} allocated, "
                f"{n.active_share:.1%} active, {hours(n.idle_hours)} GPU-h idle "
                f"({money(n.idle_cost, report.currency)})",
                highlight=False,
            )
    if report.incidents:
        console.print("Health incidents:", highlight=False)
        for i in report.incidents:
            console.print(
                f"  {when(i.first_seen)} {i.kind} {i.value} on {i.node} {i.gpu} ({i.pod or 'no pod'}), "
                f"×{i.count}: {i.meaning}",
                highlight=False,
                markup=False,
            )
    return out.getvalue()


@register("json")
def as_json(report: Report) -> str:
    return json.dumps(report.model_dump(mode="json", by_alias=True), indent=2) + "\n"


def _md_table(header: list[str] | tuple[str, ...], rows: list[list[str]]) -> list[str]:
    def esc(cell: str) -> str:
        return cell.replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(esc(c) for c in row) + " |" for row in rows]
    return out


@register("markdown")
def markdown(report: Report) -> str:
    lines = ["# GPU right-sizing report", ""]
    lines += [f"{line}  " for line in headline(report)]
    if report.gaps:
        lines += ["", "## Gaps in the data", ""] + [f"- {g}" for g in report.gaps]
    lines += ["", "## Workloads", ""]
    lines += _md_table(WORKLOAD_COLUMNS, [workload_row(w, report.currency) for w in report.workloads])
    lines += ["", "## Recommendations", ""]
    for w in report.workloads:
        lines.append(f"### {w.namespace}/{w.kind}/{w.name}")
        lines.append("")
        lines.append(
            f"{w.pods} pod(s), {w.product or 'unknown product'}, history {w.history_seconds / 3600:.1f} h, "
            f"confidence {w.confidence:.2f}, activity from {w.activity_signal}."
        )
        lines.append("")
        for r in w.recommendations:
            saving = f" — saves ~{money(r.monthly_saving, report.currency)}/month" if r.monthly_saving else ""
            indent = "" if r.role == "recommended" else "  "
            lines.append(f"{indent}- {role_label(r)} **{r.severity}** {r.kind}: {r.summary}{saving}")
            if r.evidence:
                lines.append(f"{indent}  - evidence: {evidence_text(r.evidence)}")
            if r.role == "recommended" and w.rule:
                lines.append(f"  - chosen as {w.rule}")
        if w.verdicts:
            shares = ", ".join(f"{v.code} {v.share:.0%}" for v in w.verdicts)
            lines.append(f"- verdicts over time: {shares}")
        lines.append("")
    for title, groups in (("Pools", report.pools), ("Namespaces", report.namespaces)):
        lines += [f"## {title}", ""]
        lines += _md_table((title[:-1], *COST_COLUMNS), [cost_row(g.name, g.cost, report.currency) for g in groups])
        lines.append("")
    if report.idle_nodes:
        lines += ["## Requested but idle nodes", ""]
        lines += _md_table(IDLE_NODE_COLUMNS, [idle_node_row(n, report.currency) for n in report.idle_nodes])
        lines.append("")
    if report.incidents:
        lines += ["## Health incidents", ""]
        lines += _md_table(INCIDENT_COLUMNS, [incident_row(i) for i in report.incidents])
        lines.append("")
    lines += ["## Exact and approximate figures", ""]
    lines += [f"- exact: {e}" for e in report.exact] + [f"- approximate: {a}" for a in report.approximate]
    return "\n".join(lines) + "\n"


@register("html")
def html(report: Report) -> str:
    from gpuscale.report.html import render_html

    return render_html(report)
