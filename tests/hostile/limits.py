"""Run a gpuscale command line as a user would, under a memory cap and a time limit, and report how it ended.

The hostile-input suite (issue 32) drives every CLI with inputs an attacker or a broken exporter would give. A
command must end within ``seconds`` with exit 2 and one line naming what is wrong (or succeed), never with a
traceback, a hang or an out-of-memory kill. The cap is RLIMIT_AS on the child only, so a runaway allocation
ends that child with MemoryError (a traceback: the test fails) instead of taking the machine down.
"""

from __future__ import annotations

import atexit
import base64
import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# numpy, aiohttp, pydantic and the kubernetes client map ~1 GB of address space before doing anything; the cap
# is on address space, so it must leave room for that and still stop a runaway grid far below the machine's RAM.
DEFAULT_CAP_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class Outcome:
    code: int | None  # None: killed at the time limit
    stdout: str
    stderr: str
    seconds: float
    peak_rss_bytes: int

    @property
    def hung(self) -> bool:
        return self.code is None

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr


class _Zygote:
    """The fork server (tests/hostile/zygote.py) of this test process, started on first use and ended with it."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()

    def _start(self) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.hostile.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            # NB: one BLAS thread, so that no thread of numpy's is running when the server forks.
            env={**os.environ, "PYTHONPATH": str(REPO), "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"},
            cwd=REPO,
            text=True,
        )
        ready = proc.stdout.readline()
        if not ready:
            raise RuntimeError("the hostile suite's fork server did not start")
        atexit.register(proc.kill)
        return proc

    def run(self, request: dict) -> dict:
        with self.lock:
            if self.proc is None or self.proc.poll() is not None:
                self.proc = self._start()
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        if not reply:
            raise RuntimeError("the hostile suite's fork server ended")
        return json.loads(reply)


_ZYGOTE = _Zygote()


def run_cli(
    argv: list[str],
    *,
    seconds: float = 30.0,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    stdin: bytes | None = None,
    cwd: Path | None = None,
) -> Outcome:
    """``gpuscale *argv`` from this checkout in a process of its own, capped; its own peak RSS (wait4).

    The process is forked from a server that has gpuscale imported already (tests/hostile/zygote.py), so a
    case costs its own work, not an interpreter's start-up."""
    reply = _ZYGOTE.run(
        {
            "argv": list(argv),
            "seconds": seconds,
            "cap": cap_bytes,
            "stdin": base64.b64encode(stdin).decode() if stdin is not None else None,
            "cwd": str(cwd) if cwd is not None else None,
            "env": {**os.environ, "PYTHONPATH": str(REPO)},
        }
    )
    return Outcome(reply["code"], reply["out"], reply["err"], reply["seconds"], reply["peak"])


def assert_refused_cleanly(outcome: Outcome, *, says: str | None = None) -> None:
    """Exit 2, one line on stderr (naming ``says`` when given), no traceback, within the time limit."""
    assert not outcome.hung, f"hung past the limit; stderr: {outcome.stderr[-2000:]}"
    assert not outcome.traceback, outcome.stderr[-4000:]
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:])
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1, outcome.stderr[-2000:]
    if says is not None:
        assert says in lines[0], lines[0]
