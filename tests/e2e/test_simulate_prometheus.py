"""Metric-history mode against a real Prometheus: 30 minutes of per-pod queue depth, backfilled with promtool,
read back with range queries built from the catalogue, and replayed through an HPA manifest."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time

import pytest

from tests.e2e.backends import Backends

pytestmark = pytest.mark.e2e

HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: llm-queue}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 1
  maxReplicas: 10
  metrics:
    - type: Pods
      pods:
        metric: {name: inference_queue_depth}
        target: {type: AverageValue, averageValue: "4"}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 0}
"""


async def test_history_from_prometheus(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is required (Debian package prometheus)"
    end = int(time.time()) - 600
    start = end - 1800
    # 3 pods; the first 15 minutes 8 waiting requests each (24 in all), then 1 each (3 in all)
    lines = ["# TYPE nv_inference_pending_request_count gauge"]
    for t in range(start, end + 1, 15):
        for pod in range(3):
            value = 8 if t < start + 900 else 1
            lines.append(f'nv_inference_pending_request_count{{namespace="ai",pod="llm-{pod}"}} {value} {t}')
    source = tmp_path / "history.om"
    source.write_text("\n".join(lines) + "\n# EOF\n")
    data = tmp_path / "backends" / "prometheus" / "data"
    data.mkdir(parents=True)
    made = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(data)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    manifest = tmp_path / "hpa.yaml"
    manifest.write_text(HPA)
    async with Backends(tmp_path / "backends") as backends:
        prom = await backends.prometheus([])
        await prom.wait_ready(targets=0, series="vector(1)")
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuscale.cli.main",
            "simulate",
            "--prometheus-url",
            prom.url,
            "--history-end",
            str(end),
            "--history-span",
            "30m",
            "--hpa",
            str(manifest),
            "--output",
            "json",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        bad = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "gpuscale.cli.main",
            "simulate",
            "--prometheus-url",
            prom.url,
            "--history-end",
            str(end),
            "--hpa",
            str(manifest),
            "--query",
            "inference_queue_depth=sum by (pod) (",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        _, bad_err = await asyncio.wait_for(bad.communicate(), 60)
    doc = json.loads(out)
    assert doc["mode"] == "history" and doc["history"]["metrics"] == ["inference_queue_depth"]
    [result] = doc["results"]
    # 24 waiting over a target of 4 → 6 replicas; once the queue is 3 in all the HPA goes down to 1
    assert [(e["from"], e["to"]) for e in result["events"]][:1] == [(3, 6)]
    assert result["timeline"][-1]["desired"] == 1 and result["max_replicas"] == 6
    assert bad.returncode == 2 and "range query for inference_queue_depth" in bad_err.decode()
