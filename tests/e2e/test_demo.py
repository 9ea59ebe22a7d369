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
        "6s",
        "--refresh-interval",
        "1s",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []
    commands: list[str] = []
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
            assert line, "demo exited early:\n" + "".join(lines)
            lines.append(line)
            if line.strip().startswith("kubectl --server=") and "get --raw" in line:
                commands.append(line.strip())
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
        rest = (await asyncio.wait_for(proc.stdout.read(), 40)).decode()
        table = "".join(lines[-3:]) + rest
        # The util trap is on screen: the LLM pods at 100 % GPU util.
        assert re.search(r"nim/llama3-8b-\S+\s+│\s+100\.0", table), table[-2000:]
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
