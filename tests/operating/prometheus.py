"""A real Prometheus holding the test fleet (tests/operating/fleet.py) for the last two hours before ``end``.

The fleet is written as OpenMetrics and backfilled with `promtool tsdb create-blocks-from openmetrics`; the two info
rules the dashboards read (a node's pool, a pod's training job) are then backfilled from it with `promtool tsdb
create-blocks-from rules`, as an operator's Prometheus would have recorded them, and a second Prometheus serves
both. Used by test_dashboards.py and by pictures.py.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import aiohttp
import yaml

from tests.e2e.backends import Backend, Backends, require
from tests.operating.fleet import Series, fleet
from tests.report.fleet import openmetrics

ROOT = Path(__file__).resolve().parents[2]
RECORDING = ROOT / "deploy" / "alerts" / "gpuscale-recording.rules.yaml"
INFO_RULES = frozenset({"gpuscale:node_pool:info", "gpuscale:pod_training_job:info"})
HOURS = 2


async def api(session: aiohttp.ClientSession, url: str, path: str, **params: str) -> dict:
    async with session.post(url + path, data=params) as resp:
        body = await resp.json(content_type=None)
    if body.get("status") != "success":
        raise AssertionError(f"{body.get('errorType')}: {body.get('error')}")
    return body["data"]


def _run(*args: str) -> None:
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, f"{' '.join(args[:4])}: {done.stderr}"


async def load_fleet(
    backends: Backends, session: aiohttp.ClientSession, work: Path, *, end: int
) -> tuple[Backend, list[Series]]:
    """(the Prometheus serving the fleet and its info rules, the fleet's series)."""
    promtool = require(shutil.which("promtool"), "promtool")
    series = fleet(end=end, hours=HOURS)
    text = work / "fleet.om"
    with text.open("w") as f:
        f.writelines(openmetrics(series))
    raw = work / "raw"
    _run(promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(raw))
    doc = yaml.safe_load(RECORDING.read_text())
    doc["groups"] = [{**g, "rules": [r for r in g["rules"] if r.get("record") in INFO_RULES]} for g in doc["groups"]]
    rules = work / "info.rules.yaml"
    rules.write_text(yaml.safe_dump(doc))
    # Backends.start puts its n-th Prometheus in <workdir>/prometheus[-n]/data: the blocks go there first.
    shutil.copytree(raw, backends.workdir / "prometheus" / "data")
    first = await backends.prometheus([])
    at_end = {"query": "count(DCGM_FI_DEV_GPU_UTIL)", "time": str(end)}
    await first.wait_until(lambda: api(session, first.url, "/api/v1/query", **at_end), what="the raw blocks")
    final_data = backends.workdir / "prometheus-1" / "data"
    _run(
        promtool, "tsdb", "create-blocks-from", "rules", f"--start={end - HOURS * 3600}", f"--end={end}",
        f"--url={first.url}", f"--output-dir={final_data}", "--eval-interval=60s", str(rules),
    )  # fmt: skip
    shutil.copytree(raw, final_data, dirs_exist_ok=True)
    first.stop()
    prom = await backends.prometheus([])

    async def recorded() -> bool:
        query = {"query": "count(gpuscale:pod_training_job:info)", "time": str(end)}
        return bool((await api(session, prom.url, "/api/v1/query", **query))["result"])

    await prom.wait_until(recorded, what="the recorded info series")
    return prom, series
