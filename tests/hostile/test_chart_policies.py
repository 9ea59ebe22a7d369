"""Hostile policy files given to the Helm chart as values (issue 34, item 5): refused when the chart renders, or at
the latest when the component reading the file starts, each time with one line naming the file.

The chart's templates/validate.yaml checks what a render can tell — YAML with keys at the top, a ConfigMap's 1 MiB,
the catalogue's `metrics:` list of named entries — and helm's YAML parser refuses bombs (its alias limit). What
renders is mounted as is, and every field is checked by gpuscale at start: for those, the rendered ConfigMap's
metrics.yaml is read the way the pod reads it (`--policies DIR`), by `gpuscale simulate` under
tests/hostile/limits.py's cap (exit 2, one line naming the file). helm's own time and peak RSS are bounded too.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helm import CHART, NAMESPACE, RELEASE
from tests.hostile.limits import assert_refused_cleanly, run_cli
from tests.hostile.test_simulate_inputs import TRACE, _block_nesting, _laughs, _merge_bomb, hpa

SHIPPED = (Path(__file__).resolve().parents[2] / "policies" / "metrics.yaml").read_text()
HELM_SECONDS = 20.0
HELM_PEAK_BYTES = 512 * 2**20
RENDER, START, OK = "refused by the render", "refused at start", "accepted"


@dataclass(frozen=True)
class Case:
    id: str
    wall: str  # RENDER, START or OK
    says: str  # what the one line says besides the file's name ("" for OK)
    policies: dict[str, str]


def _catalogue(case_id: str, wall: str, says: str, text: str) -> Case:
    return Case(case_id, wall, says, {"metrics.yaml": text})


def _entries(line: str, count: int) -> str:
    return "metrics:\n" + "".join(line.format(i=i) + "\n" for i in range(count))


CASES = [
    _catalogue("shipped catalogue", OK, "", SHIPPED),
    _catalogue("shipped catalogue with BOM", OK, "", "\ufeff" + SHIPPED),
    _catalogue("billion laughs", RENDER, "excessive aliasing", _laughs() + SHIPPED),
    _catalogue("merge-key bomb", RENDER, "excessive aliasing", _merge_bomb() + SHIPPED),
    _catalogue("recursive alias", RENDER, "not YAML with keys at the top", "a: &a [*a]\n" + SHIPPED),
    _catalogue(
        "nested 10,000 deep (flow)", RENDER, "not YAML with keys at the top", "a: " + "[" * 10_000 + "]" * 10_000
    ),
    _catalogue("nested 2,000 deep (block), 2 MB", RENDER, "holds at most 1 MiB", _block_nesting(2_000)),
    _catalogue("1.1 MB of comment", RENDER, "holds at most 1 MiB", "#" + "x" * 1_100_000 + "\n" + SHIPPED),
    _catalogue("a NUL byte", RENDER, "not YAML with keys at the top", SHIPPED + "\x00"),
    _catalogue("a tab indent", RENDER, "not YAML with keys at the top", "\tmetrics: []\n"),
    _catalogue("a list at the top", RENDER, "not YAML with keys at the top", "- name: x\n  series: [X]\n"),
    _catalogue("a bare string", RENDER, "not YAML with keys at the top", "gpu_utilization\n"),
    _catalogue("no metrics key", RENDER, "needs a `metrics:` list", "defaults: {max_age: 60s}\n"),
    _catalogue("metrics: null", RENDER, "needs a `metrics:` list", "metrics:\n"),
    _catalogue("49,000 bare names", RENDER, "metrics[0] is not a metric entry", _entries("  - m{i}", 49_000)),
    _catalogue("an entry with an empty name", RENDER, "metrics[0] is not a metric entry", "metrics: [{name: ''}]\n"),
    _catalogue("duplicate metrics key", RENDER, "needs a `metrics:` list", SHIPPED + "\nmetrics: []\n"),
    _catalogue("50,000 named entries (0.9 MB)", START, "nodes", _entries("  - name: m{i}", 50_000)),
    _catalogue("two documents", START, "one YAML document", SHIPPED + "\n---\n" + SHIPPED),
    _catalogue("an int of 5,000 digits", START, "invalid YAML", "x: " + "9" * 5000 + "\n" + SHIPPED),
    _catalogue("an entry without series", START, "series", "metrics:\n  - name: gpu_x\n    aggregate: mean\n"),
    _catalogue(
        "a duplicate metric name", START, "gpu_utilization", SHIPPED.replace("gpu_sm_active", "gpu_utilization")
    ),
    Case("health.yaml: billion laughs", RENDER, "policies.health.yaml", {"health.yaml": _laughs() + "xids: {}\n"}),
    Case("health.yaml: a list", RENDER, "policies.health.yaml", {"health.yaml": "- 79\n- 48\n"}),
    Case(
        "four files of 300 KB",
        RENDER,
        "holds at most 1 MiB",
        {f"{name}.yaml": "#" + "x" * 300_000 + "\nversion: 1\n" for name in ("health", "pools", "prices", "hints")},
    ),
]
FIGURES: dict[str, float] = {"inputs": 0, RENDER: 0, START: 0, OK: 0, "helm_seconds": 0, "helm_peak_bytes": 0}


# helm's own peak RSS. NB: not this process's wait4 on helm: Linux carries the forking process's high-water mark
# into a child's ru_maxrss at exec, so helm forked from a worker that had grown to 544 MiB "peaked" at 544 MiB. A
# small interpreter in between forks helm and reports the child's figure, which starts from its own few MiB.
_MEASURED = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.waitstatus_to_exitcode(status)} {usage.ru_maxrss * 1024}")
"""


def _render(values: dict[str, Any], directory: Path, helm: str) -> tuple[int, str, str]:
    """`helm template` of the chart: its exit status, stdout and stderr; its time and peak RSS (wait4) bounded."""
    path = directory / "values.json"
    path.write_text(json.dumps(values))
    home = str(directory / "helm-home")
    env = {**os.environ, "HELM_CACHE_HOME": home, "HELM_CONFIG_HOME": home, "HELM_DATA_HOME": home}
    out, err, rusage = directory / "helm.out", directory / "helm.err", directory / "helm.rusage"
    start = time.monotonic()
    with open(out, "w") as stdout, open(err, "w") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-S", "-c", _MEASURED, str(rusage), helm, "template", RELEASE, str(CHART),
             "--namespace", NAMESPACE, "--values", str(path)],
            stdout=stdout,
            stderr=stderr,
            env={**env, "KUBECONFIG": "/dev/null"},
            start_new_session=True,
        )  # fmt: skip
    timer = threading.Timer(HELM_SECONDS, lambda: os.killpg(proc.pid, signal.SIGKILL))
    timer.start()
    proc.wait()
    timer.cancel()
    code, peak = (int(x) for x in rusage.read_text().split()) if rusage.exists() else (-9, 0)
    seconds = time.monotonic() - start
    assert code >= 0, f"helm template killed after {seconds:.1f} s (limit {HELM_SECONDS} s)"
    assert peak < HELM_PEAK_BYTES, f"helm template peaked at {peak / 2**20:.0f} MiB"
    FIGURES["helm_seconds"] = max(FIGURES["helm_seconds"], seconds)
    FIGURES["helm_peak_bytes"] = max(FIGURES["helm_peak_bytes"], peak)
    return code, out.read_text(), err.read_text()


def _rendered_catalogue(manifest: str) -> str:
    (configmap,) = [o for o in yaml.safe_load_all(manifest) if o and o["metadata"]["name"] == "gpuscale-metrics"]
    return configmap["data"]["metrics.yaml"]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_policy_file_is_refused_by_the_render_or_at_start_naming_it(case: Case, helm, tmp_path: Path) -> None:
    FIGURES["inputs"] += 1
    code, manifest, stderr = _render({"policies": case.policies}, tmp_path, helm)
    if case.wall == RENDER:
        errors = [line for line in stderr.splitlines() if line.startswith("Error:")]
        assert code != 0 and len(errors) == 1, stderr[-2000:]
        named = f"policies.{next(iter(case.policies))}:" if len(case.policies) == 1 else "policies:"
        assert named in errors[0] and case.says in errors[0], errors[0]
        FIGURES[RENDER] += 1
        return
    assert code == 0, f"refused by the render, expected {case.wall}:\n{stderr[-2000:]}"
    # What the pod mounts is what was given, and gpuscale reads it as the pod would (--policies DIR).
    assert _rendered_catalogue(manifest) == case.policies["metrics.yaml"]
    policies = tmp_path / "policies"
    policies.mkdir()
    (policies / "metrics.yaml").write_text(_rendered_catalogue(manifest))
    (tmp_path / "h.yaml").write_text(hpa())
    (tmp_path / "t.csv").write_text(TRACE)
    argv = ["simulate", "--trace", "t.csv", "--hpa", "h.yaml", "--output", "json", "--policies", str(policies)]
    outcome = run_cli(argv, seconds=30.0, cwd=tmp_path)
    if case.wall == OK:
        assert outcome.code == 0 and not outcome.traceback, outcome.stderr[-2000:]
        json.loads(outcome.stdout)
    else:
        assert_refused_cleanly(outcome, says=case.says)
        assert str(policies / "metrics.yaml") in outcome.stderr, outcome.stderr
    FIGURES[case.wall] += 1


def test_summary() -> None:
    """The cases above (run first, in file order; per worker under xdist): for the report."""
    print(
        f"\nchart policy files: {FIGURES['inputs']:.0f} tried: {FIGURES[RENDER]:.0f} {RENDER}, "
        f"{FIGURES[START]:.0f} {START}, {FIGURES[OK]:.0f} {OK}; slowest helm render {FIGURES['helm_seconds']:.2f} s, "
        f"helm peak RSS {FIGURES['helm_peak_bytes'] / 2**20:.0f} MiB"
    )
    assert FIGURES["inputs"] == 0 or FIGURES[RENDER] + FIGURES[START] + FIGURES[OK] == FIGURES["inputs"]
