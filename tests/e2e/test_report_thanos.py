"""`gpuscale report` through a distributed TSDB: two Prometheus shards, each holding one cluster's history (loaded
with ``promtool tsdb create-blocks-from openmetrics``) under its own ``cluster`` external label, a Thanos sidecar
beside each and ``thanos query`` over both (Thanos v0.42.5, tests/cluster/build-part thanos). The report through
Thanos must equal the report from one Prometheus holding both clusters' series (labelled ``cluster``), keep the two
clusters' same-named namespaces and workloads apart, and meet issue 37's done-when in summary mode.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from pathlib import Path

import aiohttp
import pytest

from tests.e2e.backends import Backends, _die_with_parent, require
from tests.e2e.test_report_backends import END, HOURS, check_summary_against_samples, fetch_json
from tests.ports import free_port
from tests.report.fleet import openmetrics
from tests.report.production import production_fleet

pytestmark = [pytest.mark.e2e]

BUILD_PART = Path(__file__).resolve().parents[1] / "cluster" / "build-part"
CLUSTERS = {"east": 7, "west": 11}  # cluster → the seed of its production-shaped fleet
# The pooled Deployment at a fifth of its size: what goes through Thanos is the same (one series batch, every shape,
# a pool with pods that come and go); its full 100 pods are checked on Prometheus and VictoriaMetrics
# (test_report_backends.py). Three reports and three block builds of the full fleets were ~50 s of CPU.
POOLED = 20


def thanos_binary() -> str:
    """The cached Thanos build; without one the test skips locally and fails under CI (as the control plane's)."""
    done = subprocess.run(["bash", str(BUILD_PART), "thanos", "--cached"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        reason = f"thanos is not built ({done.stderr.strip()}): run tests/cluster/build-part thanos"
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    return str(Path(done.stdout.strip().splitlines()[-1]) / "thanos")


def of_cluster(series, cluster: str, *, labelled: bool):
    """A fleet's series as one cluster's: GPU UUIDs made unique across clusters, and (in the one Prometheus
    holding both) the ``cluster`` label a shard's external label gives through Thanos."""
    out = []
    for name, labels, points in series:
        labels = dict(labels)
        if "UUID" in labels:
            labels["UUID"] = f"{labels['UUID']}-{cluster}"
        if labelled:
            labels["cluster"] = cluster
        out.append((name, labels, points))
    return out


def blocks(series, data: Path, tmp: Path) -> None:
    promtool = require(__import__("shutil").which("promtool"), "promtool")
    text = tmp / f"{data.parent.name}.om"
    with text.open("w") as f:
        f.writelines(openmetrics(series))
    data.mkdir(parents=True)
    subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)], check=True,
                   capture_output=True, timeout=120)  # fmt: skip


async def until(check, what: str, *, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if await check():
                return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:g} s")
        await asyncio.sleep(0.2)


async def get(url: str) -> tuple[int, dict | str]:
    async with aiohttp.ClientSession() as s, s.get(url) as resp:
        return resp.status, (await resp.json() if resp.content_type == "application/json" else await resp.text())


def test_a_report_through_thanos_equals_one_prometheus_holding_both_clusters(tmp_path):
    thanos = thanos_binary()
    fleets = {c: production_fleet(end=END, hours=HOURS, seed=seed, pooled=POOLED) for c, seed in CLUSTERS.items()}
    backends = Backends(tmp_path / "backends")
    processes: list[subprocess.Popen[bytes]] = []

    def spawn(name: str, *args: str) -> None:
        log = (tmp_path / f"{name}.log").open("wb")
        processes.append(subprocess.Popen([thanos, *args], stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))  # fmt: skip

    async def start() -> tuple[str, str]:
        # one Prometheus holding both clusters' series, each labelled with its cluster
        both = [s for c, f in fleets.items() for s in of_cluster(f.series, c, labelled=True)]
        blocks(both, backends.workdir / "prometheus" / "data", tmp_path)
        single = await backends.prometheus([])
        grpc = []
        for i, (cluster, fleet_) in enumerate(fleets.items()):
            data = backends.workdir / f"prometheus-{i + 1}" / "data"
            blocks(of_cluster(fleet_.series, cluster, labelled=False), data, tmp_path)
            shard = await backends.prometheus([], external_labels={"cluster": cluster})
            await until(lambda shard=shard: _ready(shard.url + "/-/ready"), "a shard ready")
            port, http = free_port(), free_port()
            spawn(f"sidecar-{cluster}", "sidecar", f"--tsdb.path={data}", f"--prometheus.url={shard.url}",
                  f"--grpc-address=127.0.0.1:{port}", f"--http-address=127.0.0.1:{http}")  # fmt: skip
            await until(lambda http=http: _ready(f"http://127.0.0.1:{http}/-/ready"), f"the {cluster} sidecar ready")
            grpc.append(f"127.0.0.1:{port}")
        query = free_port()
        spawn("query", "query", f"--http-address=127.0.0.1:{query}", f"--grpc-address=127.0.0.1:{free_port()}",
              *(f"--endpoint={g}" for g in grpc))  # fmt: skip
        url = f"http://127.0.0.1:{query}"

        async def both_clusters() -> bool:
            status, body = await get(f"{url}/api/v1/label/cluster/values")
            return status == 200 and isinstance(body, dict) and sorted(body.get("data") or []) == sorted(CLUSTERS)

        await until(both_clusters, "thanos query seeing both sidecars")
        await until(lambda: _ready(single.url + "/-/ready"), "the single Prometheus ready")
        return url, single.url

    try:
        thanos_url, single_url = asyncio.run(start())
        started = time.monotonic()
        through_thanos = fetch_json(thanos_url, "--mode", "summary")
        print(f"summary mode through thanos: {time.monotonic() - started:.1f} s")
        from_one = fetch_json(single_url, "--mode", "summary")
        # the two clusters' same-named namespaces and workloads are kept apart
        namespaces = {w["namespace"] for w in through_thanos["workloads"]}
        assert namespaces == {f"{c}/serve" for c in CLUSTERS}, namespaces
        assert len(through_thanos["workloads"]) == sum(len(f.raw) for f in fleets.values())
        for r in (through_thanos, from_one):
            r.pop("generated_at"), r.pop("source")
        assert through_thanos == from_one
        raw = fetch_json(thanos_url)
        for cluster, fleet_ in fleets.items():
            ns = f"{cluster}/serve"
            raw_of = {w["name"]: w for w in raw["workloads"] if w["namespace"] == ns}
            check_summary_against_samples(f"thanos ({cluster})", through_thanos, raw_of, fleet_, namespace=ns)
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)
        asyncio.run(backends.stop())


async def _ready(url: str) -> bool:
    status, _ = await get(url)
    return status == 200
