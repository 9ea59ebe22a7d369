"""tests/conftest.py's own behaviour, where it is not seen in any one test's outcome."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A worker still busy 5 s after the controller's exit order (here: collecting garbage for 7.5 s at unconfigure, as
# pytest's unraisable-exception cleanup does with a big heap on a loaded machine) gets execnet's SIGINT. NB: 7.5 s
# sits between that SIGINT (5 s) and the controller's kill of a worker that has not exited (10 s). One worker is
# enough to draw it.
SLOW_EXIT = """
import gc, os, time
{hooks}
junk = []
def pytest_unconfigure(config):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        junk.extend([[i] for i in range(100_000)])
        start = time.monotonic()
        time.sleep(3.0)  # NB: idle until shortly before the SIGINT: only the moment it lands must be in gc
        while time.monotonic() < start + 7.5:
            gc.collect()
"""
TESTS = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_a_property(x):
    assert x == x

def test_plain():
    pass
"""


def _run(directory: Path, hooks: str) -> str:
    directory.mkdir()
    (directory / "conftest.py").write_text(SLOW_EXIT.format(hooks=hooks))
    (directory / "test_it.py").write_text(TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "1", "-q", "-p", "no:cacheprovider", str(directory)],
        capture_output=True,
        text=True,
        cwd=directory,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and "2 passed" in done.stdout, done.stdout + done.stderr
    return done.stdout + done.stderr


def test_a_green_parallel_run_ends_without_a_keyboardinterrupt_traceback(tmp_path):
    """issue 34: the suite's green runs ended with "KeyboardInterrupt" in hypothesis' gc callback after [100%]."""
    without = _run(tmp_path / "without", "")
    assert "KeyboardInterrupt" in without, f"the slow exit no longer draws execnet's SIGINT:\n{without}"
    output = _run(tmp_path / "with", "from tests.conftest import pytest_sessionfinish  # noqa: F401")
    assert "KeyboardInterrupt" not in output and "Traceback" not in output, output
