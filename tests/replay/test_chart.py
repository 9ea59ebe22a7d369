"""The HTML chart as a person sees it: a self-contained page that headless Chromium renders, with no network,
into a screenshot that shows the charts' lines (not a blank page)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuscale.cli.simulate import document
from gpuscale.hpa import parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.chart import render_html
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.simulate import ReplaySettings, replay
from gpuscale.replay.traces import read_trace
from tests.browser import screenshot

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
MANIFEST = (Path(__file__).parents[2] / "deploy" / "examples" / "triton-hpa.yaml").read_text()


def simulated_document() -> dict:
    trace = read_trace(TRACES / "AzureLLMInferenceTrace_conv.csv.gz").window(duration_s=900).scaled(4)
    settings = ReplaySettings()
    hpa = parse_manifests(MANIFEST, source="triton-hpa.yaml")[0]
    out = replay(trace, hpa, catalogue=load_catalogue(), profile=ServingProfile(), settings=settings, source="x")
    return document(
        trace_name=trace.name,
        requests=len(trace),
        duration_s=trace.duration_s,
        profile=ServingProfile(),
        settings=settings,
        outcomes=[out],
    )


def test_the_page_is_self_contained():
    page = render_html(simulated_document())
    assert "<script src" not in page and "<link" not in page and "@import" not in page
    assert "default-src 'none'" in page
    assert page.count("<svg") == 2 and "triton: replicas and queue" in page


@pytest.mark.e2e
def test_chromium_renders_the_charts(tmp_path):
    page = tmp_path / "sim.html"
    page.write_text(render_html(simulated_document()))
    png = screenshot(page, width=1200, height=900, timeout=60).astype(int)
    r, g, b = png[:, :, 0], png[:, :, 1], png[:, :, 2]
    # the lines are drawn (blue: desired replicas, GPU util; green: ready replicas, SM active), not a blank page
    assert ((b > r + 60) & (b > g + 30)).sum() > 500
    assert ((g > r + 40) & (g > b + 40)).sum() > 500
    assert len(np.unique(png.reshape(-1, 3), axis=0)) > 50
