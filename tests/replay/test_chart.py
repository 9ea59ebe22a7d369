"""The HTML chart as a person sees it: a self-contained page that headless Chromium renders, with no network,
into a screenshot that shows the charts' lines (not a blank page)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zlib
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

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]
MANIFEST = (Path(__file__).parents[2] / "deploy" / "examples" / "triton-hpa.yaml").read_text()


def read_png(data: bytes) -> np.ndarray:
    """A Chromium screenshot (8-bit RGB/RGBA, not interlaced) → H×W×C uint8; PNG's five row filters."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, chunks, header = 8, [], None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    channels = 3 if colour == 2 else 4
    raw = np.frombuffer(zlib.decompress(b"".join(chunks)), dtype=np.uint8).reshape(height, 1 + width * channels)
    out = np.zeros((height, width * channels), dtype=np.int32)
    for y in range(height):
        f, line = raw[y, 0], raw[y, 1:].astype(np.int32)
        prev = out[y - 1] if y else np.zeros_like(line)
        if f == 0:
            out[y] = line
        elif f == 2:
            out[y] = (line + prev) & 0xFF
        else:
            row = np.zeros_like(line)
            for x in range(len(line)):
                a = row[x - channels] if x >= channels else 0
                b = prev[x]
                c = prev[x - channels] if x >= channels else 0
                if f == 1:
                    pred = a
                elif f == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                row[x] = (line[x] + pred) & 0xFF
            out[y] = row
    return out.reshape(height, width, channels).astype(np.uint8)


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
    chromium = shutil.which("chromium")
    assert chromium, "chromium is required (bash .ci/setup --test)"
    page = tmp_path / "sim.html"
    page.write_text(render_html(simulated_document()))
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--screenshot={shot}",
            "--window-size=1200,900",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    png = read_png(shot.read_bytes())[:, :, :3].astype(int)
    r, g, b = png[:, :, 0], png[:, :, 1], png[:, :, 2]
    # the lines are drawn (blue: desired replicas, GPU util; green: ready replicas, SM active), not a blank page
    assert ((b > r + 60) & (b > g + 30)).sum() > 500
    assert ((g > r + 40) & (g > b + 40)).sum() > 500
    assert len(np.unique(png.reshape(-1, 3), axis=0)) > 50
