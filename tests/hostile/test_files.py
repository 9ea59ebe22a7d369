"""Hostile files where a command reads its catalogue and policies (issue 32 item 4): YAML bombs (billion laughs,
merge keys), 100 MB and 50,000-entry files, deep nesting, recursive aliases, duplicate keys, bad bytes, and
paths that are not files (FIFO, /dev/zero, a directory), as ``--config`` and in a ``--policies`` directory.

Each runs `gpuscale simulate` (the command that reads the catalogue offline) under tests/hostile/limits.py's
memory cap: refused with exit 2 and one line naming the file, well within the limit, or a clean success.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.limits import Outcome, assert_refused_cleanly, run_cli
from tests.hostile.test_simulate_inputs import TRACE, _block_nesting, _laughs, _merge_bomb, hpa

SECONDS = 30.0
SHIPPED = Path(__file__).resolve().parents[2] / "policies" / "metrics.yaml"
OK = None


@dataclass(frozen=True)
class Case:
    id: str
    says: str | None
    content: str | bytes | None  # the catalogue's content; None: a special path (``path``)
    path: str | None = None


def _cases() -> list[Case]:
    shipped = SHIPPED.read_text()
    return [
        Case("shipped catalogue", OK, shipped),
        Case("shipped catalogue with BOM", OK, "\ufeff" + shipped),
        Case("billion laughs", "nodes", _laughs() + shipped),
        Case("merge-key bomb", "nodes", _merge_bomb() + shipped),
        Case("recursive alias", "recursive alias", "a: &a [*a]\n" + shipped),
        Case("50,000 metric entries", "nodes", "metrics:\n" + "".join(f"  - name: m{i}\n" for i in range(50_000))),
        Case("50,000 bare entries", "metrics", "metrics:\n" + "".join(f"  - m{i}\n" for i in range(49_000))),
        Case("nested 10,000 deep (flow)", "nesting depth", "a: " + "[" * 10_000 + "]" * 10_000 + "\n"),
        Case("nested 2,000 deep (block)", "nested deeper", _block_nesting(2_000)),
        Case("duplicate key", "appears twice", shipped + "\nmetrics: []\n"),
        Case("not UTF-8", "not UTF-8", shipped.encode() + b"\n# \xc3\x28\n"),
        Case("two documents", "one YAML document", shipped + "\n---\n" + shipped),
        Case("int of 5,000 digits", "invalid YAML", "x: " + "9" * 5000 + "\n" + shipped),
        Case("100 MB file", "limit", None, "big"),
        Case("/dev/zero", "character device", None, "/dev/zero"),
        Case("FIFO", "FIFO", None, "fifo"),
        Case("directory", "a directory", None, "dir"),
    ]


def _prepare(where: Path, case: Case, name: str) -> Path:
    """The case's catalogue at ``where/name`` (or the special file it names); the manifest and trace beside."""
    (where / "h.yaml").write_text(hpa())
    (where / "t.csv").write_text(TRACE)
    target = where / name
    if case.content is not None:
        target.write_bytes(case.content.encode() if isinstance(case.content, str) else case.content)
    elif case.path == "big":
        with open(target, "wb") as f:
            f.truncate(100 * 1024 * 1024)  # NB: sparse
    elif case.path == "fifo":
        os.mkfifo(target)
    elif case.path == "dir":
        target.mkdir()
    else:
        return Path(case.path or "")
    return target


WORST: dict[str, float] = {"peak_rss_bytes": 0, "seconds": 0, "inputs": 0}


def _judge(case: Case, outcome: Outcome, *, names: str) -> None:
    WORST["inputs"] += 1
    WORST["peak_rss_bytes"] = max(WORST["peak_rss_bytes"], outcome.peak_rss_bytes)
    WORST["seconds"] = max(WORST["seconds"], outcome.seconds)
    if case.says is OK:
        assert outcome.code == 0 and not outcome.traceback, outcome.stderr[-3000:]
        json.loads(outcome.stdout, parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
        return
    assert_refused_cleanly(outcome, says=case.says)
    assert names in outcome.stderr, outcome.stderr


CASES = _cases()
SIMULATE = ["simulate", "--trace", "t.csv", "--hpa", "h.yaml", "--output", "json"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_config_flag(case: Case, tmp_path: Path) -> None:
    path = _prepare(tmp_path, case, "catalogue.yaml")
    outcome = run_cli([*SIMULATE, "--config", str(path)], seconds=SECONDS, cwd=tmp_path)
    _judge(case, outcome, names=str(path))


@pytest.mark.parametrize("case", [c for c in CASES if c.path != "/dev/zero"], ids=lambda c: c.id)
def test_policies_directory(case: Case, tmp_path: Path) -> None:
    """The same files as a --policies directory's metrics.yaml (a ConfigMap mount in a cluster)."""
    policies = tmp_path / "policies"
    policies.mkdir()
    path = _prepare(tmp_path, case, "policies/metrics.yaml")
    outcome = run_cli([*SIMULATE, "--policies", str(policies)], seconds=SECONDS, cwd=tmp_path)
    _judge(case, outcome, names=str(path))


def test_refusals_are_fast(tmp_path: Path) -> None:
    """A bomb is refused before it costs anything: the run takes about as long as a refused missing file."""
    bomb = _prepare(tmp_path, Case("bomb", "nodes", _laughs()), "bomb.yaml")
    outcome = run_cli([*SIMULATE, "--config", str(bomb)], seconds=SECONDS, cwd=tmp_path)
    missing = run_cli([*SIMULATE, "--config", str(tmp_path / "missing.yaml")], seconds=SECONDS, cwd=tmp_path)
    assert_refused_cleanly(outcome, says="nodes")
    assert outcome.seconds < missing.seconds + 1.0, (outcome.seconds, missing.seconds)
    assert outcome.peak_rss_bytes < missing.peak_rss_bytes + 50 * 2**20


def test_summary() -> None:
    """The worst of the cases above (run first, in file order; per worker under xdist): for the report."""
    print(
        f"\nhostile files: {WORST['inputs']:.0f} tried, worst peak RSS "
        f"{WORST['peak_rss_bytes'] / 2**20:.0f} MiB, slowest {WORST['seconds']:.1f} s"
    )
    assert WORST["peak_rss_bytes"] < 1.5 * 2**30
