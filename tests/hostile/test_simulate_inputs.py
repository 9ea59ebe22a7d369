"""Hostile inputs to `gpuscale simulate` (issue 32 item 6): manifests kube-apiserver would refuse, traces and
@files with impossible numbers, grids past the budget, files that are not files.

Every case runs the real command line under tests/hostile/limits.py's memory cap and 30 s limit, and ends in
one of two ways: refused (exit 2, one line on stderr naming the file or flag) or a success whose ``--output
json`` parses with NaN and Infinity rejected. Never a traceback, a hang or an out-of-memory end.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.hostile.limits import Outcome, assert_refused_cleanly, run_cli

SECONDS = 30.0
HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata:
  name: {name}
spec:
  scaleTargetRef: {{apiVersion: apps/v1, kind: Deployment, name: llm}}
  minReplicas: {min}
  maxReplicas: {max}
  metrics:
    - type: Pods
      pods:
        metric: {{name: inference_queue_depth}}
        target: {{type: AverageValue, averageValue: {target}}}
  behavior:
    scaleUp:
      stabilizationWindowSeconds: {window}
      policies: [{{type: Pods, value: {value}, periodSeconds: {period}}}]
"""
FIELDS = {"name": "llm", "min": 1, "max": 4, "target": "4", "window": 0, "value": 2, "period": 60}
TRACE = "timestamp,input_tokens,output_tokens\n" + "".join(f"{t},500,100\n" for t in range(0, 60, 3))
OK = None  # the expectation of a case that must succeed


def hpa(**changes: object) -> str:
    return HPA.format(**{**FIELDS, **changes})


@dataclass(frozen=True)
class Case:
    id: str
    says: str | None  # the refusal's line names this; OK: the run succeeds with valid JSON
    args: tuple[str, ...] = ()
    manifest: str | None = None  # the HPA manifest's text (default: a valid one)
    trace: str | bytes | None = None  # the trace's content (default: a valid one)
    files: tuple[tuple[str, str | bytes], ...] = ()  # other files, by name in the case's directory


def _cases() -> list[Case]:
    cases = [Case("valid", OK)]
    # int32 edges and kube-apiserver's own rules, each ±1
    for field, good, bad, says in [
        ("max", 4, 0, "maxReplicas"),
        ("max", 2**31 - 1, 2**31, "maxReplicas"),
        ("min", 1, -1, "minReplicas"),
        ("min", 1, -(2**31) - 1, "minReplicas"),
        ("min", 4, 5, "maxReplicas"),
        ("min", 1, 0, "scaling to zero"),
        ("period", 1800, 1801, "periodSeconds"),
        ("period", 1, 0, "periodSeconds"),
        ("period", 60, 2**31, "periodSeconds"),
        ("window", 3600, 3601, "stabilizationWindowSeconds"),
        ("window", 0, -1, "stabilizationWindowSeconds"),
        ("value", 1, 0, "value"),
        ("value", 2**31 - 1, 2**31, "value"),
    ]:
        expect = "maxReplicas" if good == 2**31 - 1 and field == "max" else OK  # NB: valid, past the budget
        cases.append(Case(f"{field}={good}", expect, manifest=hpa(**{field: good})))
        cases.append(Case(f"{field}={bad}", says, manifest=hpa(**{field: bad})))
    # type confusions kube-apiserver's decoder refuses
    for value in ("true", '"10"', "10.0", "1.0e+30", "null", "[4]", "{a: 1}", "99999999999999999999"):
        cases.append(Case(f"maxReplicas: {value}", "maxReplicas", manifest=hpa(max=value)))
    for value in ("true", '"1e400"', "1.0e+400", '"abc"', '"-1"', "0", '"1e20"', ".nan", "[1]"):
        cases.append(Case(f"averageValue: {value}", "averageValue", manifest=hpa(target=value)))
    cases += [
        Case("averageValue: 1e3 (a quantity)", OK, manifest=hpa(target='"1e3"')),
        Case("duplicate maxReplicas", "appears twice", manifest=hpa() + "  maxReplicas: 9\n"),
        Case(
            "duplicate name key", "appears twice", manifest=hpa().replace("  name: llm\n", "  name: llm\n  name: x\n")
        ),
        Case("name not a DNS subdomain", "metadata.name", manifest=hpa(name="Bad_Name")),
        Case("scaleTargetRef name with /", "scaleTargetRef.name", manifest=hpa().replace("name: llm}", "name: a/b}")),
        Case("billion laughs HPA", "nodes", manifest=_laughs() + hpa()),
        Case("merge-key bomb HPA", "nodes", manifest=_merge_bomb()),
        Case("HPA nested 10,000 deep (flow)", "nesting depth", manifest="[" * 10_000 + "]" * 10_000),
        Case("HPA nested 2,000 deep (block)", "nested deeper", manifest=_block_nesting(2_000)),
        Case("HPA recursive alias", "recursive alias", manifest="a: &a [*a]\n"),
        Case("HPA not UTF-8", "not UTF-8", manifest=hpa().encode() + b"# \xff\xfe\n"),  # type: ignore[arg-type]
        Case("HPA with BOM", OK, manifest="\ufeff" + hpa()),
    ]
    # traces
    cases += [
        Case("trace spans 0..1e12", "steps", trace="timestamp,input_tokens,output_tokens\n0,1,1\n1e12,1,1\n"),
        Case("trace spans 0..1e300", "steps", trace="timestamp,input_tokens,output_tokens\n0,1,1\n1e300,1,1\n"),
        Case("trace timestamp 1e400", "finite", trace="timestamp,input_tokens,output_tokens\n0,1,1\n1e400,1,1\n"),
        Case("trace timestamp nan", "finite", trace="timestamp,input_tokens,output_tokens\n0,1,1\nnan,1,1\n"),
        Case("negative timestamps", OK, trace="timestamp,input_tokens,output_tokens\n-90,5,5\n-60,5,5\n-1,5,5\n"),
        Case("decreasing timestamps", "back in time", trace="timestamp,input_tokens,output_tokens\n9,1,1\n3,1,1\n"),
        Case("tokens 1e30", "input_tokens", trace="timestamp,input_tokens,output_tokens\n0,1e30,1\n"),
        Case("tokens 10**5000", "input_tokens", trace="timestamp,input_tokens,output_tokens\n0," + "9" * 5000 + ",1\n"),
        Case("BOM CSV", OK, trace="\ufeff" + TRACE),
        Case("trace not UTF-8", "not UTF-8", trace=TRACE.encode() + b"7,\xff,1\n"),
        Case("trace NUL bytes", "t.csv", trace=b"\x00" * 300_000),
        Case("one 1 MB CSV field", "not CSV", trace="timestamp,input_tokens,output_tokens\n" + "1" * 1_000_000),
        Case("JSONL nested 10,000 deep", "nested too deep", trace='{"timestamp": ' + "[" * 10_000 + "]" * 10_000),
        Case("JSONL timestamp 10**400", "timestamp", trace='{"timestamp": 1' + "0" * 400 + "}\n"),
        Case("JSONL int of 5,000 digits", "not JSON", trace='{"timestamp": 1' + "0" * 5000 + "}\n"),
        Case("service_time 1e400", "service_time", trace="timestamp,service_time\n0,1\n1,1e400\n"),
        Case("service times ok", OK, trace="timestamp,service_time\n0,1\n1,2.5\n"),
        Case("gzip bomb", "once decompressed", trace=_gzip_bomb()),
        Case("truncated gzip", "gzip", trace=gzip.compress(TRACE.encode())[:-12]),
        Case("gzip of a valid trace", OK, trace=gzip.compress(TRACE.encode())),
        Case("more rows than the limit", "rows", trace="timestamp,input_tokens,output_tokens\n" + "\n" * 5_000_002),
    ]
    # flags and @files: only finite numbers
    for flag in ("--slo-queue", "--refresh-interval", "--step", "--start", "--duration", "--initial-readiness-delay"):
        for value in ("1e400", "nan", "inf", "-inf"):
            cases.append(Case(f"{flag}={value}", flag, args=(f"{flag}={value}",)))
    for flag in ("--rate-scale", "--slo-quantile", "--cpu-request", "--prefill-ms-per-token", "--decode-iteration-ms"):
        for value in ("1e400", "nan", "-inf"):
            cases.append(Case(f"{flag}={value}", flag, args=(f"{flag}={value}",)))
    for flag in ("--max-batch", "--kv-cache-tokens", "--initial-replicas", "--seed"):
        cases.append(Case(f"{flag} 1e400", flag, args=(flag, "1e400")))
    cases += [
        Case("--rate-scale 1e300", "--rate-scale", args=("--rate-scale", "1e300")),
        Case("--step 1e-300", "steps", args=("--step", "1e-300")),
        Case("--prefill-ms-per-token 1e300", OK, args=("--prefill-ms-per-token", "1e300")),
        Case("--startup 1e400s", "--startup", args=("--startup", "1e400s")),
        Case("--startup exp:mean=1e400", "--startup", args=("--startup", "exp:mean=1e400")),
        Case("--startup lognormal huge", "--startup", args=("--startup", "lognormal:p50=1s,p95=1e300")),
        Case("--startup @f 1e400", "line 2", args=("--startup", "@f.csv"), files=(("f.csv", "10\n1e400\n"),)),
        Case("--startup @f nan", "line 2", args=("--startup", "@f.csv"), files=(("f.csv", "10\nnan\n"),)),
        Case("--startup @f 1e308 twice", "line 1", args=("--startup", "@f.csv"), files=(("f.csv", "1e308\n1e308\n"),)),
        Case("--startup @f with BOM", OK, args=("--startup", "@f.csv"), files=(("f.csv", "\ufeffseconds\n30\n60\n"),)),
        Case("--startup @/dev/zero", "regular file", args=("--startup", "@/dev/zero")),
        Case("--startup @directory", "a directory", args=("--startup", "@.")),
        Case("--service-time 1e400", "--service-time", args=("--service-time", "1e400")),
        Case("--external value 1e400", "finite", args=("--external", "q=@e.csv"), files=(("e.csv", _series("1e400")),)),
        Case("--external value nan", "finite", args=("--external", "q=@e.csv"), files=(("e.csv", _series("nan")),)),
        Case("--external /dev/zero", "regular file", args=("--external", "q=@/dev/zero")),
    ]
    # files that are not files, as each path flag
    for flag in ("--trace", "--hpa"):
        cases += [
            Case(f"{flag} /dev/zero", "character device", args=(flag, "/dev/zero")),
            Case(f"{flag} FIFO", "FIFO", args=(flag, "fifo")),
            Case(f"{flag} directory", "a directory", args=(flag, ".")),
            Case(f"{flag} 300 MB sparse file", "limit", args=(flag, "big")),
            Case(f"{flag} missing", "No such file", args=(flag, "missing")),
        ]
    return cases


def _series(value: str) -> str:
    return f"timestamp,value\n0,1\n30,{value}\n"


def _laughs(levels: int = 9) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _merge_bomb(levels: int = 9) -> str:
    lines = ["m0: &m0 {" + ", ".join(f"k{i}: {i}" for i in range(10)) + "}"]
    lines += [f"m{i}: &m{i} {{<<: [{', '.join([f'*m{i - 1}'] * 10)}]}}" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _block_nesting(depth: int) -> str:
    return "".join(" " * i + "k:\n" for i in range(depth))


def _gzip_bomb() -> bytes:
    """~300 KB of gzip that inflates to 300 MiB of zeros, past the 256 MiB limit."""
    compressor = gzip.compress(b"\0" * (1 << 20), compresslevel=9)
    member = compressor  # NB: concatenated gzip members are one valid gzip stream
    return member * 300


def _materialize(case: Case, where: Path) -> list[str]:
    (where / "h.yaml").write_bytes(_bytes(case.manifest if case.manifest is not None else hpa()))
    (where / "t.csv").write_bytes(_bytes(case.trace if case.trace is not None else TRACE))
    for name, content in case.files:
        (where / name).write_bytes(_bytes(content))
    os.mkfifo(where / "fifo")
    with open(where / "big", "wb") as f:
        f.truncate(300 * 1024 * 1024)  # NB: sparse: costs no disk
    args = list(case.args)
    given = {a for a in args if a.startswith("--")}
    base = [] if "--trace" in given else ["--trace", "t.csv"]
    base += [] if "--hpa" in given else ["--hpa", "h.yaml"]
    return ["simulate", *base, *args, "--output", "json"]


def _bytes(content: str | bytes) -> bytes:
    return content.encode() if isinstance(content, str) else content


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} in the JSON")


WORST: dict[str, float] = {"peak_rss_bytes": 0, "seconds": 0, "inputs": 0}


def _judge(case: Case, outcome: Outcome) -> None:
    WORST["inputs"] += 1
    WORST["peak_rss_bytes"] = max(WORST["peak_rss_bytes"], outcome.peak_rss_bytes)
    WORST["seconds"] = max(WORST["seconds"], outcome.seconds)
    if case.says is OK:
        assert not outcome.hung and not outcome.traceback, outcome.stderr[-3000:]
        assert outcome.code == 0, outcome.stderr[-3000:]
        json.loads(outcome.stdout, parse_constant=_reject_constant)
    else:
        assert_refused_cleanly(outcome, says=case.says)


CASES = _cases()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_simulate_refuses_cleanly_or_succeeds(case: Case, tmp_path: Path) -> None:
    argv = _materialize(case, tmp_path)
    _judge(case, run_cli(argv, seconds=SECONDS, cwd=tmp_path))


def test_summary(capsys: pytest.CaptureFixture[str]) -> None:
    """The worst of the cases above (run first, in file order): printed for the report."""
    with capsys.disabled():
        print(
            f"\nhostile simulate inputs: {WORST['inputs']:.0f} tried, worst peak RSS "
            f"{WORST['peak_rss_bytes'] / 2**20:.0f} MiB, slowest {WORST['seconds']:.1f} s"
        )
    assert WORST["peak_rss_bytes"] < 1.5 * 2**30
