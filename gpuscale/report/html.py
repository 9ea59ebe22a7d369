"""``-o html``: one self-contained HTML file with charts, which opens with no network.

Charts are drawn by pygal (a core dependency, which ``gpuscale simulate`` draws with too) as inline SVG with
its JavaScript left out: no script, no font or style sheet fetched, nothing to block — and the image (core
dependencies only) can write it. Three charts, each beside the numbers in a table: the activity distribution
per workload (share of GPU-time per 10 % band), idle cost (or idle GPU-hours when no product has a price) per
pool, and allocated vs active GPUs over the window.
"""

from __future__ import annotations

import html as htmllib
import re
from typing import Any

import pygal
from pygal.style import Style

from gpuscale.report.formatters import (
    COST_COLUMNS,
    IDLE_NODE_COLUMNS,
    INCIDENT_COLUMNS,
    WORKLOAD_COLUMNS,
    cost_row,
    evidence_text,
    headline,
    idle_node_row,
    incident_row,
    money,
    role_label,
    when,
    workload_row,
)
from gpuscale.report.schema import Report

# Colours the Chromium test looks for in the screenshot (one per chart), and a cool→hot ramp for the bands.
ACTIVE_COLOUR = "#1f77b4"
ALLOCATED_COLOUR = "#ff7f0e"
IDLE_COLOUR = "#d62728"
UNALLOCATED_COLOUR = "#9467bd"
BANDS = ("#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725")


def _style(*colors: str) -> Style:
    # NB: opaque fills, so a chart's colours are exactly the ones named above
    return Style(
        background="white",
        plot_background="white",
        foreground="#333",
        foreground_strong="#111",
        foreground_subtle="#ddd",
        colors=colors,
        opacity="1",
        opacity_hover="1",
        font_family="sans-serif",
    )


def _options(**extra: Any) -> dict[str, Any]:
    return {
        "width": 1100,
        "js": [],  # NB: no <script src=…>: the page must open offline
        "legend_at_bottom": True,
        "truncate_legend": -1,
        "truncate_label": -1,
        **extra,
    }


_SCRIPT = re.compile(r"<script[^>]*>.*?</script>", re.DOTALL)


def _svg(chart: Any) -> str:
    """The chart's SVG without pygal's inline config script (its tooltips' JavaScript is left out anyway)."""
    return _SCRIPT.sub("", chart.render(is_unicode=True))


def _charts(report: Report) -> dict[str, str]:
    charts: dict[str, str] = {}
    workloads = report.workloads[:30]
    if workloads:
        chart = pygal.HorizontalStackedBar(
            style=_style(*BANDS),
            **_options(height=200 + 40 * len(workloads), x_title="share of GPU-time (%) per activity band"),
        )
        chart.x_labels = [f"{w.namespace}/{w.name}" for w in workloads]
        for band in range(10):
            chart.add(
                f"{band * 10}–{band * 10 + 10} %", [round(w.activity_histogram[band] * 100, 2) for w in workloads]
            )
        charts["distribution"] = _svg(chart)
    if report.pools:
        priced = any(p.cost.idle_cost is not None for p in report.pools)
        chart = pygal.StackedBar(
            style=_style(IDLE_COLOUR, UNALLOCATED_COLOUR),
            **_options(height=330, y_title=f"idle cost ({report.currency})" if priced else "idle GPU-hours"),
        )
        chart.x_labels = [p.name for p in report.pools]
        idle = [(p.cost.idle_cost or 0.0) if priced else p.cost.idle_hours for p in report.pools]
        unalloc = [(p.cost.unallocated_cost or 0.0) if priced else p.cost.unallocated_hours for p in report.pools]
        chart.add("allocated but idle", idle)
        chart.add("unallocated", unalloc)
        charts["pools"] = _svg(chart)
    if report.timeline:
        start = report.window.start
        chart = pygal.XY(
            style=_style(ALLOCATED_COLOUR, ACTIVE_COLOUR),
            **_options(
                height=330,
                fill=True,
                show_dots=False,
                include_x_axis=True,  # NB: GPU counts start at 0; a y axis from 30 would make 35 look like 3×
                x_title=f"hours since {when(start)} UTC (each point: the mean GPUs over its interval)",
                y_title="GPUs",  # NB: pygal wraps a rotated title longer than ~14 characters
            ),
        )
        hours = [round((p.t - start) / 3600.0, 3) for p in report.timeline]
        chart.add("allocated GPUs", list(zip(hours, [p.allocated_gpus for p in report.timeline], strict=True)))
        chart.add(
            "active GPUs (activity-weighted)", list(zip(hours, [p.active_gpus for p in report.timeline], strict=True))
        )
        charts["timeline"] = _svg(chart)
    return charts


def _table(header, rows) -> str:
    esc = htmllib.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


_STYLE = """
body{font-family:sans-serif;margin:24px;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:8px 0 20px;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;text-align:left;vertical-align:top}
th{background:#f2f2f2} .sev-critical{color:#b00} .sev-warning{color:#a60} .gap{color:#a60}
.chart svg{max-width:100%;height:auto} small{color:#555}
"""


def render_html(report: Report) -> str:
    esc = htmllib.escape
    charts = _charts(report)
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; style-src 'unsafe-inline'; "
        'img-src data:">',
        f"<title>GPU report {esc(when(report.window.start))} – {esc(when(report.window.end))}</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>GPU right-sizing report</h1>",
        *(f"<p>{esc(line)}</p>" for line in headline(report)),
    ]
    if report.gaps:
        parts.append("<h2>Gaps in the data</h2><ul>")
        parts += [f"<li class='gap'>{esc(g)}</li>" for g in report.gaps]
        parts.append("</ul>")
    parts.append("<h2>Utilization distribution per workload</h2>")
    parts.append(
        f"<div class='chart' id='chart-distribution'>{charts.get('distribution', '<p>no workloads</p>')}</div>"
    )
    parts.append(_table(WORKLOAD_COLUMNS, [workload_row(w, report.currency) for w in report.workloads]))
    parts.append("<h2>Recommendations</h2>")
    for w in report.workloads:
        parts.append(f"<h3>{esc(w.namespace)}/{esc(w.kind)}/{esc(w.name)}</h3><ul>")
        for r in w.recommendations:
            saving = f" — saves ~{esc(money(r.monthly_saving, report.currency))}/month" if r.monthly_saving else ""
            rule = f"<br><small>chosen as {esc(w.rule)}</small>" if r.role == "recommended" and w.rule else ""
            parts.append(
                f"<li class='sev-{esc(r.severity)} role-{esc(r.role)}'><b>{esc(role_label(r))}</b> "
                f"<b>{esc(r.severity)}</b> {esc(r.summary)}{saving}"
                f"<br><small>{esc(evidence_text(r.evidence))}</small>{rule}</li>"
            )
        parts.append("</ul>")
    parts.append("<h2>Idle cost per pool</h2>")
    parts.append(f"<div class='chart' id='chart-pools'>{charts.get('pools', '<p>no pools</p>')}</div>")
    for title, groups in (("Pools", report.pools), ("Namespaces", report.namespaces)):
        parts.append(f"<h3>{title}</h3>")
        parts.append(_table((title[:-1], *COST_COLUMNS), [cost_row(g.name, g.cost, report.currency) for g in groups]))
    parts.append("<h2>Timeline</h2>")
    parts.append(f"<div class='chart' id='chart-timeline'>{charts.get('timeline', '<p>no data</p>')}</div>")
    if report.idle_nodes:
        parts.append("<h2>Requested but idle nodes</h2>")
        parts.append(_table(IDLE_NODE_COLUMNS, [idle_node_row(n, report.currency) for n in report.idle_nodes]))
    if report.incidents:
        parts.append("<h2>Health incidents</h2>")
        parts.append(_table(INCIDENT_COLUMNS, [incident_row(i) for i in report.incidents]))
    parts.append("<h2>Exact and approximate figures</h2><ul>")
    parts += [f"<li>exact: {esc(e)}</li>" for e in report.exact]
    parts += [f"<li>approximate: {esc(a)}</li>" for a in report.approximate]
    parts.append("</ul></body></html>")
    return "\n".join(parts)
