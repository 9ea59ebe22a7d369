"""A self-contained HTML page of a simulate document: the summary table, the request rate, one chart of every
HPA's replicas side by side and, per HPA, a chart of replicas (desired and ready, drawn as the steps they
are), queue and GPU util over time, and its scaling events. Every y axis starts at 0; every axis's ticks are equal
steps of 1, 2 or 5 × 10^k (``ticks``), the right-hand queue axis on the left axis's gridlines; tick labels carry
enough digits not to repeat. The summary table has the columns of the text output (TTFT p95 included).

Charts are drawn by pygal (small, pure Python, SVG out) with its JavaScript left out, so the page is plain
HTML + inline SVG: it opens with no network, and prints. ``render_html`` is pure; ``write_html`` writes it.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import pygal
from pygal.style import Style

from gpuscale.replay.results import latency_column
from gpuscale.replay.ticks import nice_step_for, nice_ticks

_STYLE = Style(
    background="white",
    plot_background="white",
    foreground="#333",
    foreground_strong="#111",
    foreground_subtle="#ddd",
    colors=("#1f77b4", "#2ca02c", "#d62728", "#ff7f0e"),
    font_family="sans-serif",
)


def _tick(v: float) -> str:
    # NB: "{:.0f}" printed 0, 0, 1, 1 on a small range, "{:.3g}" 3.01e+03 on a large one
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _xy(
    title: str, y_title: str, *, minutes: list[float], top: float, integer: bool = False, **options: Any
) -> pygal.XY:
    """A chart over ``minutes`` whose y axis runs from 0 to at least ``top``, both on nice ticks."""
    return pygal.XY(
        style=_STYLE,
        width=1100,
        height=330,
        js=[],  # NB: no <script src=…>: the page must open offline
        show_dots=False,
        stroke_style={"width": 2},
        x_title="minutes",
        y_title=y_title,
        legend_at_bottom=True,
        truncate_legend=-1,
        title=title,
        value_formatter=_tick,
        include_x_axis=True,  # NB: pygal's name for "the y range includes 0"
        x_labels=nice_ticks(0.0, max(minutes, default=1.0)),
        y_labels=nice_ticks(0.0, max(top, 0.0), integer=integer),
        **options,
    )


def _steps(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """A replica count holds until the next sample changes it: draw it as steps, not slopes."""
    out: list[tuple[float, float]] = []
    for t, v in points:
        if out:
            out.append((t, out[-1][1]))
        out.append((t, v))
    return out


def _rate_chart(trace: dict[str, Any]) -> str:
    rate = trace.get("requests_per_s_by_minute")
    if not rate:
        return ""
    points = _steps([(float(m), float(v)) for m, v in enumerate(rate)])
    chart = _xy(
        f"{trace['name']}: request rate (mean over each minute)",
        "requests/s",
        minutes=[m for m, _ in points],
        top=max(v for _, v in points),
    )
    chart.add("requests/s", points)
    return chart.render(is_unicode=True)


def _comparison_chart(results: list[dict[str, Any]]) -> str:
    if len(results) < 2:
        return ""
    lines = {r["hpa"]: _steps([(round(s["t"] / 60.0, 2), s["desired"]) for s in r["timeline"]]) for r in results}
    points = [p for line in lines.values() for p in line]
    chart = _xy(
        "every HPA: desired replicas",
        "replicas",
        minutes=[m for m, _ in points],
        top=max((v for _, v in points), default=1),
        integer=True,
    )
    for name, line in lines.items():
        chart.add(name, line)
    return chart.render(is_unicode=True)


def _chart(result: dict[str, Any]) -> str:
    timeline = result["timeline"]
    minutes = [round(s["t"] / 60.0, 2) for s in timeline]

    def series(key: str) -> list[tuple[float, float]]:
        return list(zip(minutes, (s[key] for s in timeline), strict=True))

    top = max((max(s["desired"], s["ready"]) for s in timeline), default=1)
    left = nice_ticks(0.0, top + 1, integer=True)  # NB: one replica of headroom: the top line is not the frame
    # pygal puts the right axis's labels on the left axis's gridlines, at equal parts of the right range: a range
    # of (gridlines - 1) nice steps makes them nice too (not 44.4, 88.8 from a range ending at the queue's peak).
    queue_step = nice_step_for(max((s["queue"] for s in timeline), default=0), intervals=len(left) - 1, integer=True)
    replicas = _xy(
        f"{result['hpa']}: replicas and queue",
        "replicas",
        minutes=minutes,
        top=top + 1,
        integer=True,
        secondary_range=(0, queue_step * (len(left) - 1)),
    )
    replicas.add("desired replicas", _steps(series("desired")))
    replicas.add("ready replicas", _steps(series("ready")), stroke_style={"width": 2, "dasharray": "6, 3"})
    replicas.add("queued requests (right axis)", series("queue"), secondary=True)
    gpu = _xy(
        f"{result['hpa']}: what the GPUs report (mean over ready replicas)",
        "percent",
        minutes=minutes,
        top=100,
        range=(0, 100),
    )
    gpu.add("GPU util %", series("gpu_util"))
    gpu.add("SM active %", series("sm_active"))
    return replicas.render(is_unicode=True) + gpu.render(is_unicode=True)


_HEAD = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{title}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} .src {{ color: #777; margin-top: -0.8em; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>{title}</h1>
"""


def _render_history(doc: dict[str, Any]) -> str:
    esc = html.escape
    h = doc["history"]
    title = esc(f"gpuscale simulate: metric history from {h['source']}")
    rows = "".join(
        f"<tr><td>{esc(r['hpa'])}</td><td>{r['observed_replica_hours']:.2f}</td><td>{r['hpa_replica_hours']:.2f}</td>"
        f"<td>{r['max_replicas']}</td><td>{r['scale_ups']}/{r['scale_downs']}</td></tr>"
        for r in doc["results"]
    )
    charts = []
    for r in doc["results"]:
        minutes = [round(s["t"] / 60.0, 2) for s in r["timeline"]]
        top = max((max(s["observed"], s["desired"]) for s in r["timeline"]), default=1)
        chart = _xy(f"{r['hpa']}: replicas observed and decided", "replicas", minutes=minutes, top=top, integer=True)
        chart.add("observed pods", list(zip(minutes, (s["observed"] for s in r["timeline"]), strict=True)))
        chart.add("HPA's replicas", list(zip(minutes, (s["desired"] for s in r["timeline"]), strict=True)))
        charts.append(f"<h2>{esc(r['hpa'])}</h2><p class=src>{esc(r['source'])}</p>{chart.render(is_unicode=True)}")
    return (
        _HEAD.format(title=title)
        + f"<p>{h['duration_s'] / 60:.1f} min of {esc(', '.join(h['metrics']))}; load conserved across replicas: "
        f"{'yes' if h['conserve_load'] else 'no'}.</p>"
        "<table><tr><th>HPA</th><th>observed replica-h</th><th>HPA replica-h</th><th>max replicas</th>"
        f"<th>scale up/down</th></tr>{rows}</table>{''.join(charts)}</body></html>\n"
    )


def render_html(doc: dict[str, Any]) -> str:
    if doc.get("mode") == "history":
        return _render_history(doc)
    trace, settings = doc["trace"], doc["settings"]
    esc = html.escape
    rows = []
    for r in doc["results"]:
        q = r["queue_time_s"]
        rows.append(
            "<tr>"
            + "".join(
                f"<td>{esc(str(v))}</td>"
                for v in (
                    r["hpa"],
                    f"{r['gpu_hours']:.2f}",
                    f"{q['p50']:.2f}",
                    f"{q['p95']:.2f}",
                    f"{q['p99']:.2f}",
                    # NB: the demo's live replay measures queue time only; its summary has no TTFT
                    f"{r['ttft_s']['p95']:.2f}" if "ttft_s" in r else "–",
                    f"{r['slo']['violating_minutes']}/{r['slo']['minutes']}",
                    r["max_replicas"],
                    f"{r['scale_ups']}/{r['scale_downs']}",
                )
            )
            + "</tr>"
        )
    sections = []
    for r in doc["results"]:
        events = "".join(
            f"<li>{e['t'] / 60:.1f} min: {e['from']} → {e['to']} ({esc(e['reason'])}; {esc(e['why'])})</li>"
            for e in r["events"][:200]
        )
        more = f"<li>… {len(r['events']) - 200} more</li>" if len(r["events"]) > 200 else ""
        sections.append(
            f"<h2>{esc(r['hpa'])}</h2><p class=src>{esc(r['source'])}</p>{_chart(r)}"
            f"<details><summary>{len(r['events'])} scaling events</summary><ul>{events}{more}</ul></details>"
        )
    title = f"gpuscale simulate: {trace['name']}"
    latency = esc(latency_column(doc))
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'">
<title>{esc(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; color: #222; }}
table {{ border-collapse: collapse; }} td, th {{ border: 1px solid #ccc; padding: 4px 10px; text-align: right; }}
td:first-child, th:first-child {{ text-align: left; }} .src {{ color: #777; margin-top: -0.8em; }}
svg {{ max-width: 100%; height: auto; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>{trace["requests"]} requests over {trace["duration_s"] / 60:.1f} min; SLO: p{settings["slo_quantile"] * 100:g} queue
time ≤ {settings["slo_queue_s"]:g} s per minute; new replicas ready after {settings["startup_s"]:g} s.</p>
<table><tr><th>HPA</th><th>GPU-h</th><th>queue p50 s</th><th>p95 s</th><th>p99 s</th><th>{latency}</th>
<th>SLO-violating min</th><th>max pods</th><th>scale up/down</th></tr>
{"".join(rows)}
</table>
{_rate_chart(trace)}{_comparison_chart(doc["results"])}
{"".join(sections)}
</body></html>
"""


def write_html(doc: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(render_html(doc), encoding="utf-8")
    return path
