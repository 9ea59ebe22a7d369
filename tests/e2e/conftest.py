"""Fixtures shared by the end-to-end modules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def gpuscale_wheel(tmp_path_factory) -> Path:
    """The gpuscale wheel, built once per session the way the image build makes it (deploy/image/build-offline
    --wheel-only: from a clean copy of the work tree, SOURCE_DATE_EPOCH from the last commit). The image build
    makes its own; test_image compares the two byte for byte."""
    out = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [str(REPO / "deploy" / "image" / "build-offline"), "--wheel-only", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert build.returncode == 0, build.stderr
    wheel = Path(build.stdout.strip().splitlines()[-1])
    assert wheel.parent == out and wheel.name.startswith("gpuscale-"), build.stdout
    return wheel
