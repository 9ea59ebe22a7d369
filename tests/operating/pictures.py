"""Pictures of the dashboards for docs/operating.md: each dashboard's key panels, drawn from their own queries.

Grafana is not installed here, so the panels' PromQL (from the committed JSON, variables at "All") runs against the
real Prometheus of tests/operating/prometheus.py holding the test fleet, each panel is drawn with the project's
charting (pygal, as `gpuscale simulate --html`), one HTML page per dashboard, and headless Chromium takes the
screenshot that lands in docs/operating/<dashboard>.png:

    .venv/bin/python -m tests.operating.pictures          # writes docs/operating/*.png (~1 minute)
"""

from __future__ import annotations

import asyncio
import html
import json
import math
import re
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import pygal
from PIL import Image
from pygal.style import CleanStyle

from tests.browser import screenshot
from tests.e2e.backends import Backends
from tests.operating.prometheus import HOURS, api, load_fleet
from tests.operating.test_dashboards import DASHBOARDS, substitute

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "operating"
KEY_PANELS = {
    "fleet": ("Allocated vs active GPUs", "SM activity by pool"),
    "gpu-hardware": ("GPU_UTIL vs SM, tensor and DRAM activity", "Util trap: GPU_UTIL minus SM activity"),
    "gpu-health": ("Clock-event reasons mask", "Remapped rows"),
    "inference": ("Requests per second", "Queue time vs compute time (Triton)"),
    "training": ("SM activity per rank", "Straggler: each rank vs its job's median"),
    "cost": ("Idle allocated GPUs by namespace", "Allocated vs active GPUs@fleet"),
    "gpuscale": ("Serving latency (p99)", "Source freshness"),
}
MAX_SERIES = 10
UNITS = {"percentunit": "share (0–1)", "Bps": "bytes/s", "s": "seconds", "reqps": "requests/s", "short": "",
         "bytes": "bytes", "watt": "W", "celsius": "°C", "h": "hours", "µs": "µs per s"}  # fmt: skip
STYLE = CleanStyle(legend_font_size=11, font_family="sans-serif")


def legend(template: str, labels: dict[str, str]) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), template or "") or str(labels)


async def chart(session: aiohttp.ClientSession, url: str, panel: dict, end: int) -> str:
    c = pygal.XY(
        style=STYLE, width=1100, height=360, js=[], show_dots=False, stroke_style={"width": 2},
        x_title="minutes before the end of the test fleet", y_title=UNITS.get(panel["fieldConfig"]["defaults"].get("unit", ""), ""),
        legend_at_bottom=True, legend_at_bottom_columns=3, truncate_legend=48, margin_bottom=40, include_x_axis=True, title=panel["title"],
    )  # fmt: skip
    shown = 0
    for target in panel["targets"]:
        data = await api(
            session, url, "/api/v1/query_range", query=substitute(target["expr"]),
            start=str(end - HOURS * 3600), end=str(end), step="60",
        )  # fmt: skip
        for result in data["result"]:
            if shown == MAX_SERIES:
                break
            points = [((float(t) - end) / 60, float(v)) for t, v in result["values"] if math.isfinite(float(v))]
            c.add(legend(target.get("legendFormat", ""), result["metric"]), points)
            shown += 1
    return c.render(is_unicode=True)


async def main() -> int:
    end = (int(time.time()) // 60) * 60 - 600
    OUT.mkdir(parents=True, exist_ok=True)
    boards = {p.stem: json.loads(p.read_text()) for p in DASHBOARDS}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        async with Backends(work / "backends") as backends, aiohttp.ClientSession() as session:
            prom, _ = await load_fleet(backends, session, work, end=end)
            for name, titles in KEY_PANELS.items():
                parts = [f"<h1>{html.escape(boards[name]['title'])}</h1>"]
                for title in titles:
                    title, _, other = title.partition("@")
                    board = boards[other or name]
                    (panel,) = [p for p in board["panels"] if p.get("title") == title]
                    parts.append(
                        f"<p>{html.escape(panel['description'])}</p>{await chart(session, prom.url, panel, end)}"
                    )
                page = work / f"{name}.html"
                page.write_text(
                    "<!doctype html><html><head><meta charset=utf-8><style>body{font-family:sans-serif;margin:16px;"
                    "width:1100px} h1{font-size:20px} p{font-size:13px;color:#444}</style></head><body>"
                    + "".join(parts) + "</body></html>"
                )  # fmt: skip
                pixels = screenshot(page, width=1140, height=980)
                Image.fromarray(pixels).save(OUT / f"{name}.png", optimize=True)
                print(f"wrote {(OUT / f'{name}.png').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
