"""README command one: `gpuscale demo` starts, prints commands that work as printed, shows live values."""

from __future__ import annotations

import asyncio
import re
import shlex
import sys
import time

import pytest

from tests.e2e.test_kubectl import KUBECTL, run

pytestmark = pytest.mark.e2e


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
        # The util trap is shown side by side: the LLM pods' GPU util and SM active, then top with both columns.
        nim = [c for c in commands if "/namespaces/nim/pods/*/" in c]
        assert [c.rsplit("/", 1)[1].rstrip("'") for c in nim] == ["gpu_utilization", "gpu_sm_active"], nim
        assert any(" -n nim " in t for t in tops), tops
        for command in tops:
            code, out, err = await run(*shlex.split(command))
            assert code == 0, (command, err)
            header = out.splitlines()[0].split()
            assert {"UTIL", "SM", "VERDICT"} <= set(header), out[:300]
            assert "under-filled" in out, out
        rest = (await asyncio.wait_for(proc.stdout.read(), 40)).decode()
        table = "".join(lines[-3:]) + rest
        # The util trap is on screen: the LLM pods at 100 % GPU util.
        assert re.search(r"nim/llama3-8b-\S+\s+│\s+100\.0", table), table[-2000:]
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
