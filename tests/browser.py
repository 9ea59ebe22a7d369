"""Headless Chromium for tests that check HTML output as a person sees it: one page → one screenshot as pixels.

Chromium is started as the machine allows it here (no sandbox as root, no GPU, no background networking — the
machine's network is closed), with a fresh profile per call, and must finish by itself within ``timeout``.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
from PIL import Image

CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)


def screenshot(page: Path, *, width: int, height: int, timeout: float = 120) -> np.ndarray:
    """Render ``page`` (an HTML file) at ``width``×``height`` and return its RGB pixels (H×W×3, uint8)."""
    chromium = shutil.which("chromium")
    assert chromium, "chromium is required (bash .ci/setup --test)"
    shot = page.with_suffix(".screenshot.png")
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={page.parent / (page.stem + '-chromium-profile')}",
            f"--screenshot={shot}",
            f"--window-size={width},{height}",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=timeout,
    )
    with Image.open(shot) as image:
        return np.asarray(image.convert("RGB"), dtype=np.uint8)
