"""Fixtures shared by the end-to-end modules."""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def gpuscale_wheel(tmp_path_factory) -> Path:
    """The gpuscale wheel, built once per run the way the image build makes it (deploy/image/build-offline
    --wheel-only: from a clean copy of the work tree, SOURCE_DATE_EPOCH from the last commit). The image build
    makes its own; test_image compares the two byte for byte.

    NB: once per run, not per pytest-xdist worker (a build is 10-30 s of CPU): the workers share the run's base
    directory, and the first to take the lock builds while the others wait for its wheel."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    out = base / "gpuscale-wheel"
    with open(base / "gpuscale-wheel.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = sorted(out.glob("gpuscale-*.whl"))
        if built:
            return built[0]
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
