"""`gpuscale controller`: one reconcile over a simulated 1,250-node × 8-GPU cluster — CPU time and API calls.

The cluster: dcgm-exporter text per node from the simulator's renderers (``sim.exporters.render_dcgm``, signals
from ``sim.load``), one Pod per GPU holder (a quarter of the nodes run 8-GPU training gangs labelled
``scheduling.x-k8s.io/pod-group``, the rest one-GPU inference/batch pods, some idle), 100 pending coscheduling
gangs (PodGroup, minMember 4) of 4 pods, 10 nodes reporting a fatal Xid; the batch-scheduling CRDs installed. The
simulated Kubernetes API runs in a separate process (so the figures are the controller's CPU alone) and counts the
requests it serves by verb.

The controller side is exactly what `gpuscale controller` runs per reconcile, minus the HTTP scrapes (the bodies
are parsed and ingested into the same ``ScrapeSource`` first, untimed): telemetry (read_devices → history), the
planners, the actuator over HTTP to the simulated API. Timed with ``time.process_time``:

    sync        the watch caches' first list of every kind the planners read (paged, over HTTP)
    reconcile1  telemetry + plan + apply: the 10 bad nodes remediated, hints written, 100 gangs provisioned
    reconcile2  the same again after the caches relist: must plan and write nothing
    peer        `gpuscale top nodes`' per-GPU work on the same source (read_devices + diagnose every GPU)

Planners: health, hints, gangs (ProvisioningRequests for the 100 pending coscheduling PodGroups) and the
priority expander, with the watch caches the CLI builds (``watch_specs``: the batch-scheduling CRDs installed).

    .venv/bin/python benchmarks/bench_controller.py [--nodes 1250] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from kubernetes_asyncio.config import new_client_from_config

from gpuscale.cli.controller import pool_activity, watch_specs
from gpuscale.controller.actuator import KubeActuator
from gpuscale.controller.capacity import ExpanderPlanner, GangCapacityPlanner
from gpuscale.controller.health import HealthActions, HealthPlanner
from gpuscale.controller.hints import HintActions, HintsPlanner, load_hints_policy
from gpuscale.controller.loop import Controller
from gpuscale.controller.metrics import ControllerMetrics
from gpuscale.controller.observe import TelemetryFeed
from gpuscale.controller.pools import load_pools_policy
from gpuscale.controller.remediation_policy import load_remediation_policy
from gpuscale.controller.telemetry import TELEMETRY_SERIES, ClusterTelemetry, TelemetryHistory
from gpuscale.metrics.attribution import Attributor
from gpuscale.metrics.devices import gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.metrics.exposition import parse_samples
from gpuscale.pipeline import cyclic_gc_paused
from gpuscale.pricing import load_prices
from gpuscale.settings import ControllerSettings
from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from gpuscale.sim.device_gauges import device_signals
from gpuscale.sim.exporters import render_dcgm
from gpuscale.sim.gpu_activity import H100_SXM, activity
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode
from gpuscale.sim.load import unit_hash
from gpuscale.sources.kuberest import KubeRest
from gpuscale.sources.objects import ObjectCache
from gpuscale.sources.scrape import ScrapeSource
from gpuscale.sources.targets import target_resolver

NOW = 1_790_000_000.0
NAMESPACES = tuple(f"team-{i:02d}" for i in range(12))
BAD_NODES = 10
PENDING_GANGS = 100


def node_name(n: int) -> str:
    return f"gpu-{n:04d}"


def cluster(nodes: int, seed: int = 11) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """dcgm-exporter text per URL and the Kubernetes objects (Nodes, Pods)."""
    texts: dict[str, str] = {}
    objects: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in (*NAMESPACES, "gpuscale")
    ]
    for n in range(nodes):
        name = node_name(n)
        pool = f"p5-{n % 4}"
        node = SimNode.build(
            name,
            hardware=H100_SXM,
            seed=seed,
            labels={"karpenter.sh/nodepool": pool} if n % 2 else {"eks.amazonaws.com/nodegroup": pool},
        )
        objects.append({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": dict(node.labels)}})
        training = n % 4 == 0
        signals: dict[int, Any] = {}
        holders: dict[GpuSlot, tuple[str, str, str]] = {}
        ns = NAMESPACES[n % len(NAMESPACES)]
        for gpu in node.gpus:
            v = 2 * unit_hash(seed, gpu.uuid) - 1
            roll = unit_hash(seed, gpu.uuid, "mix")
            if training:
                profile, pod = "training", f"train-{n:04d}-{gpu.index // 4}"
            elif roll < 0.4:
                profile, pod = "inference", f"serve-{n:04d}-{gpu.index}"
            elif roll < 0.6:
                profile, pod = "idle", f"notebook-{n:04d}-{gpu.index}"
            else:
                profile, pod = None, ""
            s = device_signals(H100_SXM, activity(profile, unit_hash(seed, gpu.uuid, "load"), variation=v), variation=v)
            if n < BAD_NODES and gpu.index == 3:
                s = dataclasses.replace(s, last_xid=79, xid_window=((79, 1),))
            signals[gpu.index] = s
            if profile:
                holders[GpuSlot(gpu.index)] = (ns, pod, "main")
        texts[f"http://10.{n // 250}.{n % 250}.1:9400/metrics"] = render_dcgm(node, signals, pods_by_gpu=holders)
        for pod in sorted({h[1] for h in holders.values()}):
            labels = {"app": pod.rsplit("-", 2)[0]}
            if pod.startswith("train-"):
                labels["scheduling.x-k8s.io/pod-group"] = f"train-{n:04d}"
            if pod.startswith("serve-"):
                labels["gpuscale.io/scrape"] = "triton"
            objects.append(_pod(ns, pod, name, labels, running=True))
    objects.extend(BATCH_SCHEDULING_CRDS)
    for g in range(PENDING_GANGS):
        objects.append(
            {
                "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                "kind": "PodGroup",
                "metadata": {"name": f"pending-{g:03d}", "namespace": NAMESPACES[g % len(NAMESPACES)]},
                "spec": {"minMember": 4},
            }
        )
        for i in range(4):
            labels = {"scheduling.x-k8s.io/pod-group": f"pending-{g:03d}"}
            objects.append(_pod(NAMESPACES[g % len(NAMESPACES)], f"pending-{g:03d}-{i}", None, labels, running=False))
    return texts, objects


def _pod(ns: str, name: str, node: str | None, labels: dict[str, str], *, running: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }
    if node:
        spec["nodeName"] = node
    status = (
        {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]} if running else {"phase": "Pending"}
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": spec,
        "status": status,
    }


# --- the simulated API in its own process ---------------------------------------------------------------


def _serve_api(conn: Any, objects: list[dict[str, Any]]) -> None:
    from gpuscale.sim.kubeapi import SimKubeApi

    async def main() -> None:
        api = SimKubeApi(history_limit=100_000)
        for obj in objects:
            api.create(obj)
        await api.start()
        conn.send(api.url)
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message == "stop":
                break
            conn.send(_count(api.requests, since=message))
        await api.stop()

    asyncio.run(main())


def _count(requests: Any, *, since: int) -> tuple[int, dict[str, int]]:
    counts: Counter[str] = Counter()
    items = list(requests)
    for r in items[since:]:
        path, _, query = r.path_qs.partition("?")
        parts = [p for p in path.split("/") if p]
        rest = parts[2:] if parts[0] == "api" else parts[3:]
        if not rest:
            counts["discovery"] += 1
            continue
        if rest[0] == "namespaces" and len(rest) > 2:
            rest = rest[2:]
        resource = "/".join([rest[0], *rest[2:3]])
        verb = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}.get(r.method)
        if verb is None:
            verb = "get" if len(rest) > 1 else ("watch" if "watch=" in query else "list")
        counts[f"{verb} {resource}"] += 1
    return len(items), dict(sorted(counts.items()))


class IngestedFeed(TelemetryFeed):
    """The feed without the scrape: the bodies were ingested beforehand (HTTP is not what is measured)."""

    async def refresh(self, *, now: float) -> ClusterTelemetry:
        self.attributor.begin_refresh()
        readings = read_devices(self.read, self.attributor, series=TELEMETRY_SERIES)
        return self.history.observe(readings, now=now, max_age_seconds=60.0)


async def run(nodes: int, repeats: int) -> int:
    texts, objects = cluster(nodes)
    pods = sum(1 for o in objects if o["kind"] == "Pod")
    print(f"cluster: {nodes} nodes × 8 GPUs, {pods} pods ({PENDING_GANGS} pending gangs × 4), {BAD_NODES} bad nodes")
    parsed = {url: parse_samples(text, source=url) for url, text in texts.items()}
    results: dict[str, list[float]] = {k: [] for k in ("sync", "reconcile1", "reconcile2", "peer")}
    calls: list[tuple[dict[str, int], dict[str, int]]] = []
    writes: list[tuple[int, int]] = []
    for _ in range(repeats):
        parent, child = multiprocessing.Pipe()
        server = multiprocessing.get_context("fork").Process(target=_serve_api, args=(child, objects), daemon=True)
        server.start()
        url = parent.recv()
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(
                f"apiVersion: v1\nkind: Config\nclusters: [{{name: s, cluster: {{server: '{url}'}}}}]\n"
                "users: [{name: s, user: {token: t}}]\ncontexts: [{name: s, context: {cluster: s, user: s}}]\n"
                "current-context: s\n"
            )
            client = await new_client_from_config(config_file=str(kubeconfig))
        rest = KubeRest(client)
        settings = ControllerSettings(prometheus_url="http://unused", namespace="gpuscale")
        pools = load_pools_policy()
        cache = ObjectCache(rest, watch_specs(settings, pools))
        source = ScrapeSource(list(texts), series=set(TELEMETRY_SERIES), clock=lambda: NOW)
        for u, samples in parsed.items():
            source.ingest(u, samples, timestamp=NOW)
        attributor = Attributor(target_resolver(dict.fromkeys(texts), None))
        history = TelemetryHistory(window_seconds=600, idle_below=0.05)
        feed = IngestedFeed([source], attributor, history)
        health = HealthPlanner(load_remediation_policy(), load_policy(), HealthActions(), state_namespace="gpuscale")
        controller = Controller(
            view=cache,
            telemetry=feed,
            planners=[
                health,
                HintsPlanner(load_hints_policy(), HintActions(), being_replaced=health.remediates),
                GangCapacityPlanner(pools, prices=load_prices()),
                ExpanderPlanner(pools, prices=load_prices(), activity=pool_activity(pools)),
            ],
            actuator=KubeActuator(rest),
            metrics=ControllerMetrics(),
            clock=lambda: NOW,
        )
        gc.collect()
        mark, _ = _ask(parent, 0)
        with cyclic_gc_paused():
            t = time.process_time()
            await cache.refresh_once()
            results["sync"].append(time.process_time() - t)
            mark, sync_calls = _ask(parent, mark)
            t = time.process_time()
            first = await controller.reconcile_once()
            results["reconcile1"].append(time.process_time() - t)
            mark, first_calls = _ask(parent, mark)
            await cache.refresh_once()
            mark, _ = _ask(parent, mark)
            t = time.process_time()
            second = await controller.reconcile_once()
            results["reconcile2"].append(time.process_time() - t)
            mark, second_calls = _ask(parent, mark)
            t = time.process_time()
            attributor.begin_refresh()
            statuses = gpu_statuses(read_devices(source.read, attributor), load_policy())
            results["peer"].append(time.process_time() - t)
        calls.append((first_calls, second_calls))
        for name, planned in second.planned.items():
            for write in planned[:5]:
                print(f"  reconcile 2 still plans ({name}): {write.why[:150]}")
        writes.append((len(first.writes), len(second.writes)))
        assert len(statuses) == nodes * 8
        await client.close()
        parent.send("stop")
        server.join(10)
    print(f"sync calls: {sync_calls}")
    for label, key in (
        ("watch caches' first list (every kind the planners read)", "sync"),
        ("reconcile 1: telemetry + plan + apply", "reconcile1"),
        ("reconcile 2: nothing changed", "reconcile2"),
        ("peer: top's per-GPU diagnosis, same source", "peer"),
    ):
        values = [v * 1000 for v in results[key]]
        runs = ", ".join(f"{v:.0f}" for v in values)
        print(f"{label:55s} CPU ms median {statistics.median(values):7.0f}  (runs: {runs})")
    first_calls, second_calls = calls[-1]
    print(f"reconcile 1: {writes[-1][0]} writes planned; API calls by verb: {first_calls}")
    print(f"reconcile 2: {writes[-1][1]} writes planned; API calls by verb: {second_calls or 'none'}")
    ok = all(w2 == 0 for _, w2 in writes) and all(not c2 for _, c2 in calls)
    print("second reconcile writes nothing:", "yes" if ok else "NO")
    return 0 if ok else 1


def _ask(conn: Any, since: int) -> tuple[int, dict[str, int]]:
    conn.send(since)
    return conn.recv()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    return asyncio.run(run(args.nodes, args.repeats))


if __name__ == "__main__":
    sys.exit(main())
