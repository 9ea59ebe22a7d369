"""The demo autoscales: a real trace slice drives the simulated Triton Deployment, the HPA loop (gpuscale.hpa over
HTTP) changes its replicas through the scale subresource, the terminal shows it, and an HTML summary is written."""

from __future__ import annotations

import asyncio
import itertools
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e


async def test_demo_scales_the_deployment_and_writes_a_summary():
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "demo",
        "--port",
        "0",
        "--duration",
        "15s",
        "--no-keep-running",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        out = (await asyncio.wait_for(proc.stdout.read(), 90)).decode()
        assert await asyncio.wait_for(proc.wait(), 30) == 0, out[-3000:]
    finally:
        if proc.returncode is None:
            proc.terminate()
            await proc.wait()
    assert "Autoscaling inference/triton-bert with the HPA triton-bert" in out, out[-3000:]
    # A normal run logs no warning (stderr is in ``out``): a scrape of a pod the HPA removed used to fail (404).
    assert " WARNING " not in out and "Traceback" not in out, out[-3000:]
    changes = re.findall(r"replicas (\d+) → (\d+)\s+\(ready \d+\)", out)
    assert changes, out[-3000:]
    # the printed changes form one history: each starts where the previous one ended
    for (_, to), (frm, _) in itertools.pairwise(changes):
        assert to == frm, changes
    assert "What the HPA sees" in out.split("Autoscaling", 1)[1]  # the table again, after the replay
    page = Path(re.search(r"HTML summary of the autoscaling replay written to (\S+)", out).group(1))
    html = page.read_text()
    assert html.count("<svg") == 2 and "triton-bert" in html
    assert re.search(r"<td>triton-bert</td><td>[0-9.]+</td>", html)
    # The pods' start-up is what was measured (a scale-up until its pods were counted ready), never a made-up 0 s.
    said = re.search(r"New pods were counted ready (\d+) s after a scale-up", out)  # plain units
    assert said and int(said.group(1)) > 0, out[-3000:]
    assert f"new replicas ready after {said.group(1)} s." in html
