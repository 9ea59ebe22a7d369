"""README command one: `gpuscale demo` starts, prints commands that work as printed, shows live values."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import signal
import sys
import time
from importlib.resources import files

import pytest
import yaml

from gpuscale.model import parse_quantity
from tests.e2e.test_kubectl import KUBECTL, run
from tests.helpers import reaped

pytestmark = pytest.mark.e2e


def _printed(lines: list[str]) -> list[str]:
    return [line.strip() for line in lines if line.strip().startswith("kubectl ")]


async def _until(proc: asyncio.subprocess.Process, text: str, *, timeout: float) -> str:
    """The demo's output up to and including the line holding ``text``."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while not any(text in line for line in seen):
        line = (await asyncio.wait_for(proc.stdout.readline(), max(0.1, deadline - time.monotonic()))).decode()
        assert line, "demo exited early:\n" + "".join(seen)
        seen.append(line)
    return "".join(seen)


async def _lines(proc: asyncio.subprocess.Process, into: list[str]) -> None:
    """Read the demo's output into ``into`` until it ends (so its pipe never fills)."""
    while line := await proc.stdout.readline():
        into.append(line.decode())


async def test_demo_prints_working_kubectl_commands_and_live_values():
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "demo",
        "--port",
        "0",
        "--duration",
        "12s",
        "--refresh-interval",
        "1s",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []
    commands: list[str] = []
    tops: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, "demo exited early:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("kubectl --server=") and "get --raw" in line:
                commands.append(line.strip())
            if " top pods " in line and not line.strip().startswith("#"):
                tops.append(line.strip())
            if "What the HPA sees" in line:
                break
        assert len(commands) >= 5, "".join(lines)
        for command in commands:
            args = shlex.split(command)
            assert args[0] == "kubectl"
            code, out, err = await run(KUBECTL, *args[1:])
            assert code == 0, (command, err)
            assert (
                '"kind":"MetricValueList"' in out
                or '"kind":"ExternalMetricValueList"' in out
                or ('"kind":"APIResourceList"' in out)
            ), out[:200]
        # The util trap is shown side by side: the LLM pods' GPU util and SM active, then what the NIM server itself
        # reports (its KV-cache usage, scraped from its own /metrics), then top with all of them.
        nim = [c for c in commands if "/namespaces/nim/pods/*/" in c]
        metrics = [c.rsplit("/", 1)[1].rstrip("'") for c in nim]
        assert metrics == ["gpu_utilization", "gpu_sm_active", "inference_kv_cache_usage"], nim
        code, out, err = await run(KUBECTL, *shlex.split(nim[-1])[1:])
        kv = {i["describedObject"]["name"]: parse_quantity(i["value"]) for i in json.loads(out)["items"]}
        assert len(kv) == 2 and all(0 < v < 100 for v in kv.values()), out  # percent, from the NIM gauge
        assert any(" -n nim " in t for t in tops), tops
        for command in tops:
            code, out, err = await run(*shlex.split(command))
            assert code == 0, (command, err)
            header = out.splitlines()[0].split()
            assert {"UTIL", "SM", "VERDICT", "QUEUE", "BATCH", "KV", "TTFT95", "SERVING"} <= set(header), out[:300]
            nim_rows = [line.split() for line in out.splitlines() if "llama3-8b-" in line]
            assert len(nim_rows) == 2, out
            for row in nim_rows:
                # NIM pods near the demo's diurnal peak: requests wait at a capped batch while SMs idle.
                cells = dict(zip(header[-len(row) :], row, strict=True))
                assert cells["VERDICT"] == "under-filled" and cells["SERVING"] == "batch-limited", out
                assert int(cells["QUEUE"]) >= 1 and int(cells["BATCH"]) > 0, out
                assert cells["KV"].endswith("%") and cells["TTFT95"].endswith("s"), out
        rest = await _until(proc, "Still serving", timeout=60)
        table = "".join(lines[-3:]) + rest
        # The util trap is on screen: the LLM pods at 100 % GPU util, with the queue their NIM server reports.
        nim_rows = re.findall(r"nim/llama3-8b-\S+\s+│\s+100\.0\s+│.*", table)
        assert len(nim_rows) >= 2, table[-2000:]  # the first table and, after the replay, the last
        assert all(float(row.split("│")[7]) >= 1 for row in nim_rows), nim_rows
        # The replay is over and the demo is still up: the printed commands still work (README command one is
        # something to explore, not 60 seconds to copy from)...
        code, out, err = await run(KUBECTL, *shlex.split(commands[-1])[1:])
        assert code == 0 and "MetricValueList" in out, (code, err)
        # ...and the simulated API serves the demo's HPA with the status its loop wrote, as kubectl prints it.
        (get_hpa,) = [c for c in _printed(lines) if c.endswith("get hpa -n inference")]
        code, out, err = await run(*shlex.split(get_hpa))
        assert code == 0, err
        # NB: columns are at least two spaces apart; TARGETS is "current/target, current/target" (two metrics)
        header, row = (re.split(r"\s{2,}", line.strip()) for line in out.splitlines()[:2])
        assert header == ["NAME", "REFERENCE", "TARGETS", "MINPODS", "MAXPODS", "REPLICAS", "AGE"], out
        assert row[:2] == ["triton-bert", "Deployment/triton-bert"], out
        manifest = yaml.safe_load((files("gpuscale.replay") / "data" / "demo-hpa.yaml").read_text(encoding="utf-8"))
        targets = [str(m["pods"]["target"]["averageValue"]) for m in manifest["spec"]["metrics"]]
        pairs = [pair.split("/") for pair in row[2].split(", ")]
        assert [target for _, target in pairs] == targets, out
        assert all(current != "<unknown>" and parse_quantity(current) >= 0 for current, _ in pairs), out
        assert row[3:5] == ["1", "10"] and int(row[5]) >= 1, out
        # The simulated pods are as old as the demo (kubectl's AGE, from creationTimestamp), not 335d.
        (get_pods,) = [c for c in _printed(lines) if c.endswith("get pods -A -o wide")]
        code, out, err = await run(*shlex.split(get_pods))
        assert code == 0, err
        header = out.splitlines()[0].split()
        ages = [line.split()[header.index("AGE")] for line in out.splitlines()[1:]]
        assert ages and all(re.fullmatch(r"\d+s|[1-9]m\d*s?", a) for a in ages), out  # under 10 minutes
        # The HPA loop keeps running after the first pass: the slice plays again, and the HPA object kubectl reads
        # keeps following the load (it froze when the replay ended: 7 replicas at 7m/1, never scaling down).
        replicas = get_hpa.replace("get hpa -n inference", "get hpa -n inference triton-bert")
        seen: set[str] = set()
        more: list[str] = []
        reader = asyncio.create_task(_lines(proc, more))
        deadline = time.monotonic() + 40  # NB: > two passes of 12 s
        while time.monotonic() < deadline and len(seen) < 2:
            code, out, err = await run(*shlex.split(replicas), "-o", "jsonpath={.status.currentReplicas}")
            assert code == 0, err
            seen.add(out)
            await asyncio.sleep(0.3)
        reader.cancel()
        assert len(seen) >= 2, (seen, "".join(more))
        assert any("pass 2:" in line for line in more), "".join(more)
        # A normal run logs no warning (a scrape failing, a timeout): stderr is in this output too.
        everything = "".join(lines) + rest + "".join(more)
        assert " WARNING " not in everything and "Traceback" not in everything, everything[-3000:]
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()


async def test_ctrl_c_while_the_demo_starts_ends_it_at_once():
    """Ctrl-C during the start (the adapter's second refresh, the printed paths being served; each wait checks for
    it) ends the demo within seconds, exit 0, no traceback."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gpuscale.cli.main", "demo", "--port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    # NB: inside the start: the adapter is listening (its first line), the simulated cluster is up and the printed
    # paths are not yet served. A fixed 2 s sleep sent the signal, on a loaded machine, while Python was still
    # importing, before the demo had any handler (exit 130).
    try:
        first = await asyncio.wait_for(proc.stdout.readline(), 60)
    except BaseException:
        await reaped(proc, proc.wait(), 0)  # NB: killed and reaped on this loop
        raise
    assert b"serving the metrics APIs" in first, first
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    rest, _ = await reaped(proc, proc.communicate(), 30)
    out = first + rest
    assert proc.returncode == 0 and time.monotonic() - started < 15, out.decode()[-2000:]
    assert "Traceback" not in out.decode(), out.decode()[-2000:]
