"""`-o html` as a person sees it: one self-contained file, rendered by headless Chromium with no network, whose
screenshot shows the three charts."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.report.build import build_report
from gpuscale.report.html import ACTIVE_COLOUR, ALLOCATED_COLOUR, IDLE_COLOUR
from gpuscale.report.policy import load_report_policy
from tests.browser import screenshot
from tests.report.histories import add_pod, constant, history


def sample_history():
    h = history(hours=24)
    h.node_pools = {"node-a": "ondemand", "node-b": "spot"}

    def daily(g, t):  # busy by day, idle by night
        sm = np.where((t // 3600) % 24 < 12, 0.6, 0.02)
        return {"sm_active": sm, "gpu_util_percent": sm * 150, "fb_used_mib": np.full(t.shape, 20_000.0)}

    add_pod(h, pod="trainer-0", owner=("Job", "trainer"), requests=4, gpus=4, values=daily)
    add_pod(h, pod="infer-0", node="node-b", requests=1, values=constant(sm_active=0.05, fb_used_mib=7000))
    return h


def colour_pixels(png, hex_colour: str, tolerance: float = 0.04) -> int:
    rgb = np.array([int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(png[:, :, :3] - rgb).max(axis=2) < tolerance).sum())


@pytest.mark.e2e
def test_the_html_report_renders_its_charts_in_headless_chromium(tmp_path):
    from gpuscale.report.formatters import formatter

    report = build_report(sample_history(), policy=load_report_policy(), generated_at=0)
    page = tmp_path / "report.html"
    page.write_text(formatter("html")(report))
    text = page.read_text()
    assert "<script" not in text and " src=" not in text and "<link" not in text  # nothing to fetch
    assert 'xlink:href="http' not in text and "@import" not in text
    assert text.count("<svg") == 3

    png = screenshot(page, width=1280, height=4000).astype(np.float32) / 255
    assert png.shape[0] >= 4000 and png.shape[1] >= 1280
    # each chart is drawn: the timeline's active and allocated areas, the pools' idle bars, the bands
    assert colour_pixels(png, ACTIVE_COLOUR) > 2000
    assert colour_pixels(png, ALLOCATED_COLOUR) > 2000
    assert colour_pixels(png, IDLE_COLOUR) > 2000
    assert colour_pixels(png, "#440154") > 1000  # the 0–10 % band of the distribution
    blank = (png[:, :, :3] > 0.97).all(axis=2).mean()
    assert blank < 0.97, f"{blank:.1%} of the page is white"


def test_the_timeline_starts_at_zero_gpus_and_its_axis_title_is_one_line():
    """A fleet that never drops below 4 allocated GPUs: the y axis still starts at 0, and "GPUs" is not wrapped."""
    import re

    from gpuscale.report.html import _charts

    h = history(hours=24)
    add_pod(h, pod="trainer-0", owner=("Job", "trainer"), requests=4, gpus=4, values=constant(sm_active=0.6))
    svg = _charts(build_report(h, policy=load_report_policy(), generated_at=0))["timeline"]
    y_axis = re.search(r'<g class="axis y[^"]*">(.*?)<g class="axis x', svg, re.S) or re.search(
        r'<g class="axis y[^"]*">(.*)', svg, re.S
    )
    ticks = [float(v) for v in re.findall(r"<text[^>]*>(-?[0-9.]+)</text>", y_axis.group(1))]
    assert ticks and min(ticks) == 0, ticks
    titles = re.findall(r'<text[^>]*class="title"[^>]*>(.*?)</text>', svg)
    assert "GPUs" in titles and not [t for t in titles if t.startswith("GPUs") and t != "GPUs"], titles
    assert len(titles) == 2 and titles[0].startswith("hours since "), titles  # each title one line
