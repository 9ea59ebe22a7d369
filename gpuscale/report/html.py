"""``-o html``: one self-contained HTML file with charts, which opens with no network.

Charts are drawn by matplotlib (the ``html`` extra: ``pip install 'gpuscale[html]'``) as inline SVG: no
script, no font or style sheet fetched, nothing to block. Three charts, each with the numbers in a table
beside it: the activity distribution per workload (share of GPU-time per 10 % band), idle cost (or idle
GPU-hours when no product has a price) per pool, and allocated vs active GPUs over the window.
"""

from __future__ import annotations

import html as htmllib
import io
from datetime import UTC, datetime

from gpuscale.errors import GpuscaleError
from gpuscale.report.formatters import (
    COST_COLUMNS,
    WORKLOAD_COLUMNS,
    cost_row,
    evidence_text,
    headline,
    money,
    when,
    workload_row,
)
from gpuscale.report.model import Report

# Colours the Chromium test looks for in the screenshot (one per chart), and a cool→hot ramp for the bands.
ACTIVE_COLOUR = "#1f77b4"
ALLOCATED_COLOUR = "#ff7f0e"
IDLE_COLOUR = "#d62728"
_BANDS = ["#440154", "#482878", "#3e4989", "#31688e", "#26828e", "#1f9e89", "#35b779", "#6ece58", "#b5de2b", "#fde725"]


class MissingExtra(GpuscaleError):
    """An optional dependency a format needs is not installed; the message names the pip command."""


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtra(
            "-o html needs matplotlib, which a plain install leaves out: pip install 'gpuscale[html]' "
            "(or use -o markdown / -o json)"
        ) from None
    plt.rcParams.update({"svg.fonttype": "path", "font.size": 9})  # NB: glyphs as paths: no font to fetch
    return plt


def _svg(fig) -> str:
    out = io.StringIO()
    fig.savefig(out, format="svg", bbox_inches="tight")
    text = out.getvalue()
    return text[text.index("<svg") :]


def _charts(report: Report) -> dict[str, str]:
    plt = _pyplot()
    charts: dict[str, str] = {}
    workloads = report.workloads[:30]
    if workloads:
        fig, ax = plt.subplots(figsize=(9, 0.35 * len(workloads) + 1.2))
        names = [f"{w.namespace}/{w.name}" for w in workloads]
        left = [0.0] * len(workloads)
        for band in range(10):
            shares = [w.activity_histogram[band] * 100 for w in workloads]
            ax.barh(names, shares, left=left, color=_BANDS[band], label=f"{band * 10}–{band * 10 + 10} %")
            left = [a + b for a, b in zip(left, shares, strict=True)]
        ax.set_xlabel("share of GPU-time (%) per activity band")
        ax.invert_yaxis()
        ax.legend(ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(workloads) < 4 else -0.1))
        charts["distribution"] = _svg(fig)
        plt.close(fig)
    if report.pools:
        priced = any(p.cost.idle_cost is not None for p in report.pools)
        fig, ax = plt.subplots(figsize=(9, 2.8))
        values = [(p.cost.idle_cost or 0.0) if priced else p.cost.idle_hours for p in report.pools]
        unalloc = [(p.cost.unallocated_cost or 0.0) if priced else p.cost.unallocated_hours for p in report.pools]
        names = [p.name for p in report.pools]
        ax.bar(names, values, color=IDLE_COLOUR, label="allocated but idle")
        ax.bar(names, unalloc, bottom=values, color="#9467bd", label="unallocated")
        ax.set_ylabel(f"idle cost ({report.currency})" if priced else "idle GPU-hours")
        ax.legend(fontsize=8)
        charts["pools"] = _svg(fig)
        plt.close(fig)
    if report.timeline:
        fig, ax = plt.subplots(figsize=(9, 2.8))
        times = [datetime.fromtimestamp(p.t, UTC) for p in report.timeline]
        ax.fill_between(times, [p.allocated_gpus for p in report.timeline], color=ALLOCATED_COLOUR)
        ax.fill_between(times, [p.active_gpus for p in report.timeline], color=ACTIVE_COLOUR)
        ax.plot([], [], color=ALLOCATED_COLOUR, label="allocated GPUs")
        ax.plot([], [], color=ACTIVE_COLOUR, label="active GPUs (activity-weighted)")
        ax.set_ylabel("GPUs (hourly mean)")
        ax.legend(fontsize=8, loc="upper right")
        fig.autofmt_xdate()
        charts["timeline"] = _svg(fig)
        plt.close(fig)
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
            parts.append(
                f"<li class='sev-{esc(r.severity)}'><b>{esc(r.severity)}</b> {esc(r.summary)}{saving}"
                f"<br><small>{esc(evidence_text(r.evidence))}</small></li>"
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
        parts.append(
            _table(
                ("Node", "Pool", "GPUs", "Allocated", "Active", "Idle GPU-h", "Idle cost"),
                [
                    [
                        n.node,
                        n.pool,
                        str(n.gpus),
                        f"{n.allocated_share:.0%}",
                        f"{n.active_share:.1%}",
                        f"{n.idle_hours:.1f}",
                        money(n.idle_cost, report.currency),
                    ]
                    for n in report.idle_nodes
                ],
            )
        )
    if report.incidents:
        parts.append("<h2>Health incidents</h2>")
        parts.append(
            _table(
                ("First seen (UTC)", "Kind", "Value", "Node", "GPU", "Pod", "Count", "Meaning"),
                [
                    [when(i.first_seen), i.kind, i.value, i.node, i.gpu, i.pod or "—", str(i.count), i.meaning]
                    for i in report.incidents
                ],
            )
        )
    parts.append("<h2>Exact and approximate figures</h2><ul>")
    parts += [f"<li>exact: {esc(e)}</li>" for e in report.exact]
    parts += [f"<li>approximate: {esc(a)}</li>" for a in report.approximate]
    parts.append("</ul></body></html>")
    return "\n".join(parts)
