"""Run a gpuscale command line as a user would, under a memory cap and a time limit, and report how it ended.

The hostile-input suite (issue 32) drives every CLI with inputs an attacker or a broken exporter would give. A
command must end within ``seconds`` with exit 2 and one line naming what is wrong (or succeed), never with a
traceback, a hang or an out-of-memory kill. The cap is RLIMIT_AS on the child only, so a runaway allocation
ends that child with MemoryError (a traceback: the test fails) instead of taking the machine down.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import threading
import time
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


def run_cli(
    argv: list[str],
    *,
    seconds: float = 30.0,
    cap_bytes: int = DEFAULT_CAP_BYTES,
    stdin: bytes | None = None,
    cwd: Path | None = None,
) -> Outcome:
    """``python -m gpuscale *argv`` from this checkout, capped; the child's peak RSS from its rusage."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap_bytes, cap_bytes))

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscale", *argv],
        stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=cap,
        env=env,
        cwd=cwd,
    )
    # Output is drained by threads while this thread reaps the child with wait4, which gives this child's own
    # peak RSS (communicate() would reap it through waitpid and lose its rusage).
    chunks: dict[str, bytes] = {}

    def drain(name: str, stream) -> None:
        chunks[name] = stream.read()

    readers = [
        threading.Thread(target=drain, args=(n, s), daemon=True)
        for n, s in (("out", proc.stdout), ("err", proc.stderr))
    ]
    for r in readers:
        r.start()
    if stdin is not None:
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except BrokenPipeError:
            pass
    code: int | None = None
    peak = 0
    deadline = start + seconds
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            code = os.waitstatus_to_exitcode(status)
            peak = usage.ru_maxrss * 1024
            proc.returncode = code
            break
        if time.monotonic() > deadline:
            proc.kill()
            _, _, usage = os.wait4(proc.pid, 0)
            peak = usage.ru_maxrss * 1024
            proc.returncode = -9
            break
        time.sleep(0.02)  # polling a child's exit: no fixed wait for readiness
    for r in readers:
        r.join(timeout=5)
    elapsed = time.monotonic() - start
    out, err = chunks.get("out", b""), chunks.get("err", b"")
    return Outcome(code, out.decode(errors="replace"), err.decode(errors="replace"), elapsed, peak)


def assert_refused_cleanly(outcome: Outcome, *, says: str | None = None) -> None:
    """Exit 2, one line on stderr (naming ``says`` when given), no traceback, within the time limit."""
    assert not outcome.hung, f"hung past the limit; stderr: {outcome.stderr[-2000:]}"
    assert not outcome.traceback, outcome.stderr[-4000:]
    assert outcome.code == 2, (outcome.code, outcome.stderr[-2000:])
    lines = outcome.stderr.strip().splitlines()
    assert len(lines) == 1, outcome.stderr[-2000:]
    if says is not None:
        assert says in lines[0], lines[0]
