"""The further parts of the cluster in a box (tests/cluster/build-part): where a built part is, building nothing.

A test that needs a part skips with the reason when it is not built, and fails instead under CI (CI=true), as the
control plane's tests do (tests/cluster/controlplane.py), so a green CI always means they ran.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.cluster.controlplane import ControlPlaneUnavailable

__all__ = ["BUILD_PART", "PartUnavailable", "part_dir", "part_for_tests"]

BUILD_PART = Path(__file__).parent / "build-part"


class PartUnavailable(ControlPlaneUnavailable):
    """The part is not built on this machine (or cannot be: no Go toolchain); a kind of the control plane's
    unavailability, so whatever starts a part beside it skips or fails the same way."""


def part_dir(part: str) -> Path:
    """The directory holding the part's binaries (and copied files, e.g. CRDs), built by `build-part <part>`."""
    answer = subprocess.run(["bash", str(BUILD_PART), part, "--cached"], capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise PartUnavailable(
            f"{part} is not built (run: bash tests/cluster/build-part {part}): {answer.stderr.strip()}"
        )
    return Path(answer.stdout.strip().splitlines()[-1])


def part_for_tests(part: str) -> Path:
    """``part_dir``, or the test skips with the reason; under CI it fails."""
    import pytest

    try:
        return part_dir(part)
    except PartUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"{e} (under CI every part is built by .ci/setup --test)")
        pytest.skip(str(e))
