"""The fleet on the real API (issue 35 item 6): gpuscale's adapter and controller against kube-apiserver holding
1,000 GPU nodes × 8 GPUs, thousands of GPU pods, a few gangs and 300 HPAs — RSS, CPU per refresh and per
reconcile, and each one's API requests per minute, at steady state and after 10 % of the nodes churned.

The world, all real except the kubelets and the GPUs:
- the control plane of tests/cluster (etcd, kube-apiserver, kube-controller-manager with the deployment,
  replicaset, disruption, garbage-collector and namespace controllers; not the HPA controller: the HPA's own
  queries to the adapter are issue 36's benchmark, here only the objects it watches matter), with an audit log
  that records every request of the two gpuscale ServiceAccounts (the count per client the API server's own
  metrics cannot give);
- deploy/base's and deploy/controller's RBAC, ServiceAccounts and admission policies, applied as a user does
  (their Deployments and APIServices left out: the two run here as processes under those ServiceAccounts);
- ``--nodes`` Nodes with 8 ``nvidia.com/gpu`` and GPU Feature Discovery labels; ``--deployments`` Deployments of
  ``--replicas`` one-GPU pods each (their pods made by the real ReplicaSet controller, bound and reported
  Running here as a scheduler and kubelet would), one HPA per Deployment on two gpuscale metrics; ``--gangs``
  running Volcano gangs of 4 × 8-GPU pods and 5 pending ones; a dcgm-exporter pod per node;
- each node's dcgm-exporter text (gpuscale.sim's renderer, every GPU labelled with its pod) served on the node's
  exporter pod IP (127.3.x.y:9400) by a child process, scraped every 15 s by the real Prometheus (Debian's),
  which both gpuscale processes read (``--prometheus-url``, as deploy/overlays/prometheus and the controller's
  Deployment ship).

The adapter runs with deploy/base's metrics.yaml and refresh interval; the controller with its Deployment's
arguments and ``--no-dry-run`` (components/act), so a write it would make is a write counted. Measured over each
window: requests per minute by verb and resource from the audit log (writes apart, Lease renewals apart), CPU
seconds of each process per refresh / per reconcile (``/proc``), RSS and peak RSS.

Churn: ``--churn`` of the nodes that run Deployment pods are deleted with their pods, as many new nodes join; the
ReplicaSets replace the pods, which are bound to the new nodes; Prometheus picks up the new exporters.

    .venv/bin/python benchmarks/bench_fleet_real.py [--nodes 1000] [--window 180]

Needs the cached control plane (bash tests/cluster/build) and Debian's prometheus.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing as mp
import os
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from gpuscale.sim.device_gauges import device_signals  # noqa: E402
from gpuscale.sim.exporters import render_dcgm  # noqa: E402
from gpuscale.sim.gpu_activity import H100_SXM, activity  # noqa: E402
from gpuscale.sim.gpu_nodes import GpuSlot, SimNode  # noqa: E402
from gpuscale.sim.load import unit_hash  # noqa: E402
from tests.cluster.controlplane import ControlPlane, cached_binaries, start_control_plane  # noqa: E402
from tests.cluster.kubelet import running_status  # noqa: E402
from tests.e2e.backends import start_backend  # noqa: E402
from tests.ports import free_port  # noqa: E402

GPUS = 8
GANG_PODS = 4
PENDING_GANGS = 5
NAMESPACES = tuple(f"team-{i:02d}" for i in range(12))
USERS = {
    "system:serviceaccount:gpuscale:gpuscale-adapter": "adapter",
    "system:serviceaccount:gpuscale:gpuscale-controller": "controller",
}
WRITES = {"create", "update", "patch", "delete", "deletecollection"}
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata", "users": sorted(USERS)}, {"level": "None"}],
}
CONTROLLERS = ("deployment", "replicaset", "disruption", "namespace", "serviceaccount", "garbagecollector")
VOLCANO = "/apis/scheduling.volcano.sh/v1beta1"


def exporter_ip(n: int) -> str:
    return f"127.3.{n // 250}.{n % 250 + 1}"


def node_name(n: int) -> str:
    return f"gpu-{n:04d}"


# --- the API, as fast as the benchmark's own setup needs (keep-alive, concurrent) -----------------------------


class Api:
    def __init__(self, plane: ControlPlane, concurrency: int = 24) -> None:
        context = ssl.create_default_context(cafile=str(plane.pki.ca))
        cert = plane.pki.dir / "user-admin.crt", plane.pki.dir / "user-admin.key"
        context.load_cert_chain(str(cert[0]), str(cert[1]))
        self.server = plane.server
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context, limit=concurrency))
        self._gate = asyncio.Semaphore(concurrency)

    async def close(self) -> None:
        await self._session.close()

    async def call(
        self, method: str, path: str, body: Any = None, *, ok: tuple[int, ...] = (200, 201), patch: str = ""
    ) -> Any:
        headers = {"Content-Type": patch or "application/json"}
        for attempt in range(20):
            async with (
                self._gate,
                self._session.request(
                    method, self.server + path, data=None if body is None else json.dumps(body), headers=headers
                ) as resp,
            ):
                answer = await resp.json(content_type=None)
                if resp.status == 429 or (resp.status == 409 and 409 not in ok and attempt < 3 and method == "PUT"):
                    await asyncio.sleep(0.5)
                    continue
                if resp.status not in ok:
                    raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {str(answer)[:300]}")
                return answer
        raise RuntimeError(f"{method} {path}: still throttled")

    async def many(self, calls: list[Any]) -> list[Any]:
        return list(await asyncio.gather(*calls))


# --- the fleet --------------------------------------------------------------------------------------------------


@dataclass
class Fleet:
    nodes: list[int] = field(default_factory=list)
    """Node numbers present."""
    holders: dict[int, dict[int, tuple[str, str, str]]] = field(default_factory=dict)
    """node → GPU index → (namespace, pod, profile)."""
    next_node: int = 0


def node_body(n: int) -> dict:
    sim = SimNode.build(node_name(n), hardware=H100_SXM, seed=7, instance_type="p5.48xlarge", zone=f"z{n % 3}")
    labels = dict(sim.labels) | {"karpenter.sh/nodepool": f"h100-{n % 2}"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": node_name(n), "labels": labels}}


async def add_node(api: Api, n: int) -> None:
    created = await api.call("POST", "/api/v1/nodes", node_body(n), ok=(201, 409))
    resources = {"cpu": "192", "memory": "2048Gi", "pods": "110", "nvidia.com/gpu": str(GPUS)}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "addresses": [{"type": "InternalIP", "address": exporter_ip(n)}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now,
                 "lastTransitionTime": now}
            ],
        }
    }  # fmt: skip
    await api.call("PATCH", f"/api/v1/nodes/{node_name(n)}/status", status, patch=PATCH_SMP)
    taints = (created.get("spec") or {}).get("taints") or []
    kept = [t for t in taints if t["key"] != "node.kubernetes.io/not-ready"]
    if kept != taints:
        guarded = [{"op": "test", "path": "/spec/taints", "value": taints},
                   {"op": "replace", "path": "/spec/taints", "value": kept}]  # fmt: skip
        await api.call("PATCH", f"/api/v1/nodes/{node_name(n)}", guarded, patch=PATCH_JSON)
    await add_pod(
        api,
        "gpu-operator",
        f"dcgm-exporter-{n:04d}",
        {"app": "nvidia-dcgm-exporter"},
        node=node_name(n),
        gpus=0,
        ip=exporter_ip(n),
    )


PATCH_SMP = "application/strategic-merge-patch+json"
PATCH_JSON = "application/json-patch+json"


# NB: what a kubelet reports for a started pod, as the tests' kubelet writes it
MAIN_ONLY = {"spec": {"containers": [{"name": "main"}]}}


async def add_pod(
    api: Api,
    ns: str,
    name: str,
    labels: dict,
    *,
    node: str,
    gpus: int,
    ip: str,
    annotations: dict | None = None,
) -> None:
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": annotations or {}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]},
    }
    await api.call("POST", f"/api/v1/namespaces/{ns}/pods", body, ok=(201, 409))
    status = running_status(MAIN_ONLY, ip)
    await api.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", status, patch=PATCH_SMP)


def deployment(ns: str, name: str, replicas: int) -> dict:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name, "gpuscale.io/scrape": "triton"}},
                "spec": {
                    "containers": [{"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                    "terminationGracePeriodSeconds": 0,
                },
            },
        },
    }


def hpa(ns: str, name: str, replicas: int) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
            "minReplicas": 1,
            "maxReplicas": replicas * 2,
            "metrics": [
                {"type": "Pods", "pods": {"metric": {"name": "gpu_tensor_active"},
                                          "target": {"type": "AverageValue", "averageValue": "40"}}},
                {"type": "Pods", "pods": {"metric": {"name": "gpu_sm_active"},
                                          "target": {"type": "AverageValue", "averageValue": "60"}}},
            ],
        },
    }  # fmt: skip


def gang_group(ns: str, name: str, *, pending: bool) -> dict:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"minMember": GANG_PODS, "minResources": {"nvidia.com/gpu": str(GANG_PODS * GPUS)}},
        "status": {
            "phase": "Pending" if pending else "Running",
            **({"conditions": [{"type": "Unschedulable", "status": "True", "reason": "NotEnoughResources",
                                "lastTransitionTime": now}]} if pending else {"running": GANG_PODS}),
        },
    }  # fmt: skip


async def pending_pods(api: Api, ns: str) -> list[dict]:
    answer = await api.call("GET", f"/api/v1/namespaces/{ns}/pods?fieldSelector=spec.nodeName%3D")
    return [p for p in answer["items"] if not p["metadata"].get("deletionTimestamp")]


async def bind(api: Api, fleet: Fleet, pods: list[dict], free: list[tuple[int, int]]) -> int:
    """Bind each pending Deployment pod to a free GPU slot (node, GPU index), then report it Running."""

    async def one(pod: dict, slot: tuple[int, int]) -> None:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        n, g = slot
        binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name, "namespace": ns},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": node_name(n)}}  # fmt: skip
        await api.call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/binding", binding, ok=(201, 409, 404))
        ip = f"127.4.{(n * GPUS + g) // 250 % 250}.{(n * GPUS + g) % 250 + 1}"
        await api.call(
            "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", running_status(MAIN_ONLY, ip), patch=PATCH_SMP,
            ok=(200, 404),
        )  # fmt: skip
        fleet.holders.setdefault(n, {})[g] = (ns, name, "inference")

    await api.many([one(p, s) for p, s in zip(pods, free, strict=False)])
    return min(len(pods), len(free))


def free_slots(fleet: Fleet) -> list[tuple[int, int]]:
    return [(n, g) for n in fleet.nodes for g in range(GPUS) if g not in fleet.holders.get(n, {})]


async def wait_pods(api: Api, want: int) -> list[dict]:
    """Every namespace's pending Deployment pods, once the ReplicaSets have made ``want`` of them."""
    deadline = time.monotonic() + 600
    while True:
        pods = [p for ns in NAMESPACES for p in await pending_pods(api, ns)]
        if len(pods) >= want or time.monotonic() > deadline:
            return pods
        await asyncio.sleep(2)


async def build_fleet(api: Api, args: argparse.Namespace, fleet: Fleet, plane: ControlPlane) -> None:
    for ns in (*NAMESPACES, "gang-ml", "gpu-operator"):
        await api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                       "metadata": {"name": ns}}, ok=(201, 409))  # fmt: skip
    for ns in (*NAMESPACES, "gang-ml", "gpu-operator"):  # pods are admitted once their default account exists
        for _ in range(60):
            with contextlib.suppress(RuntimeError):
                await api.call("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
                break
            await asyncio.sleep(0.5)
    for crd in sorted((REPO / "tests/cluster/crds").glob("*.yaml")):
        done = plane.kubectl("apply", "--server-side", "-f", str(crd))
        assert done.returncode == 0, done.stderr
    done = plane.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/podgroups.scheduling.volcano.sh")
    assert done.returncode == 0, done.stderr
    started = time.monotonic()
    fleet.nodes = list(range(args.nodes))
    fleet.next_node = args.nodes
    await api.many([add_node(api, n) for n in fleet.nodes])
    print(f"  {args.nodes} nodes and their exporter pods in {time.monotonic() - started:.0f} s", flush=True)
    # Running gangs on the first nodes, one 8-GPU pod per node; then the pending ones.
    for gang in range(args.gangs + PENDING_GANGS):
        name, pending = f"train-{gang:02d}", gang >= args.gangs
        for attempt in range(30):
            try:
                await api.call("POST", f"{VOLCANO}/namespaces/gang-ml/podgroups", gang_group("gang-ml", name,
                               pending=pending))  # fmt: skip
                break
            except RuntimeError:
                if attempt == 29:
                    raise
                await asyncio.sleep(1)
        if pending:
            continue
        for i in range(GANG_PODS):
            n = gang * GANG_PODS + i
            pod = f"{name}-{i}"
            await add_pod(api, "gang-ml", pod, {"app": name}, node=node_name(n), gpus=GPUS,
                          ip=f"127.5.{n // 250}.{n % 250 + 1}",
                          annotations={"scheduling.k8s.io/group-name": name})  # fmt: skip
            fleet.holders[n] = {g: ("gang-ml", pod, "training") for g in range(GPUS)}
    started = time.monotonic()
    names = [(NAMESPACES[d % len(NAMESPACES)], f"serve-{d:03d}") for d in range(args.deployments)]
    await api.many([api.call("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", deployment(ns, name,
                             args.replicas)) for ns, name in names])  # fmt: skip
    await api.many([api.call("POST", f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
                             hpa(ns, name, args.replicas)) for ns, name in names])  # fmt: skip
    want = args.deployments * args.replicas
    pods = await wait_pods(api, want)
    bound = await bind(api, fleet, pods, free_slots(fleet))
    print(f"  {args.deployments} Deployments × {args.replicas} pods ({bound} bound, {len(pods)} made by the "
          f"ReplicaSets), {args.deployments} HPAs in {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip


async def churn(api: Api, args: argparse.Namespace, fleet: Fleet) -> tuple[list[int], list[int]]:
    """Delete ``--churn`` of the Deployment nodes with their pods; as many new nodes join; rebind."""
    serving = [n for n in fleet.nodes if n >= args.gangs * GANG_PODS and fleet.holders.get(n)]
    count = int(len(fleet.nodes) * args.churn)
    gone = serving[:: max(1, len(serving) // count)][:count]
    pods = [(ns, pod) for n in gone for ns, pod, _ in fleet.holders.get(n, {}).values()]
    zero = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0}
    await api.many([api.call("DELETE", f"/api/v1/namespaces/{ns}/pods/{pod}", zero, ok=(200, 404))
                    for ns, pod in pods])  # fmt: skip
    await api.many([api.call("DELETE", f"/api/v1/namespaces/gpu-operator/pods/dcgm-exporter-{n:04d}", zero,
                             ok=(200, 404)) for n in gone])  # fmt: skip
    await api.many([api.call("DELETE", f"/api/v1/nodes/{node_name(n)}", ok=(200, 404)) for n in gone])
    for n in gone:
        fleet.holders.pop(n, None)
    fleet.nodes = [n for n in fleet.nodes if n not in set(gone)]
    joined = list(range(fleet.next_node, fleet.next_node + count))
    fleet.next_node += count
    await api.many([add_node(api, n) for n in joined])
    fleet.nodes += joined
    pending = await wait_pods(api, len(pods))
    # NB: the new nodes first, as a scheduler spreading onto empty capacity would
    slots = [s for s in free_slots(fleet) if s[0] in set(joined)] + [
        s for s in free_slots(fleet) if s[0] not in set(joined)
    ]
    await bind(api, fleet, pending, slots)
    return gone, joined


# --- the exporters: one child process, a listener per node's exporter pod IP ---------------------------------


def exporter_text(n: int, holders: dict[int, tuple[str, str, str]]) -> str:
    node = SimNode.build(node_name(n), hardware=H100_SXM, seed=7)
    signals, pods = {}, {}
    for gpu in node.gpus:
        ns, pod, profile = holders.get(gpu.index, ("", "", None))
        v = 2 * unit_hash(7, gpu.uuid) - 1
        load = 0.3 + 0.6 * unit_hash(7, gpu.uuid, "load")
        signals[gpu.index] = device_signals(H100_SXM, activity(profile, load, variation=v), variation=v)
        if profile:
            pods[GpuSlot(gpu.index)] = (ns, pod, "main")
    return render_dcgm(node, signals, pods_by_gpu=pods)


def _serve_exporters(conn: Any) -> None:  # the child process
    from aiohttp import web

    async def main() -> None:
        texts: dict[str, bytes] = {}
        runners: dict[str, web.AppRunner] = {}

        async def metrics(request: web.Request) -> web.Response:
            body = texts.get(request.transport.get_extra_info("sockname")[0])
            if body is None:
                return web.Response(status=404)
            return web.Response(body=body, content_type="text/plain")

        app = web.Application()
        app.router.add_get("/metrics", metrics)
        loop = asyncio.get_running_loop()
        while True:
            message = await loop.run_in_executor(None, conn.recv)
            if message == "stop":
                break
            for n, holders in message.get("set", {}).items():
                ip = exporter_ip(n)
                texts[ip] = exporter_text(n, holders).encode()
                if ip not in runners:
                    runner = web.AppRunner(app, access_log=None)
                    await runner.setup()
                    await web.TCPSite(runner, ip, 9400).start()
                    runners[ip] = runner
            for n in message.get("remove", []):
                ip = exporter_ip(n)
                texts.pop(ip, None)
                if ip in runners:
                    await runners.pop(ip).cleanup()
            conn.send("ok")
        for runner in runners.values():
            await runner.cleanup()

    asyncio.run(main())


class Exporters:
    def __init__(self) -> None:
        self._conn, child = mp.Pipe()
        self.process = mp.get_context("fork").Process(target=_serve_exporters, args=(child,), daemon=True)
        self.process.start()

    def update(self, fleet: Fleet, nodes: list[int], removed: list[int] = ()) -> None:
        self._conn.send({"set": {n: fleet.holders.get(n, {}) for n in nodes}, "remove": list(removed)})
        assert self._conn.recv() == "ok"

    def stop(self) -> None:
        self._conn.send("stop")
        self.process.join(10)


def write_targets(path: Path, fleet: Fleet) -> None:
    groups = [{"targets": [f"{exporter_ip(n)}:9400"], "labels": {"node": node_name(n)}} for n in fleet.nodes]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # NB: Prometheus' file discovery must never read a half-written file


# --- measuring --------------------------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss(pid: int) -> tuple[float, float]:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    return int(status["VmRSS"].split()[0]) / 1024, int(status["VmHWM"].split()[0]) / 1024


def counter_total(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name))


def audit_counts(log: Path, start: float, end: float) -> dict[str, Counter]:
    """Requests of each gpuscale client received in [start, end): client → 'verb resource' → count."""
    seen: set[str] = set()
    counts: dict[str, Counter] = {who: Counter() for who in USERS.values()}
    for line in log.read_text().splitlines():
        event = json.loads(line)
        if event["auditID"] in seen:
            continue
        who = USERS.get(event["user"]["username"])
        received = event["requestReceivedTimestamp"]
        at = time.mktime(time.strptime(received[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
        at += float("0." + received[20:-1]) if "." in received else 0.0
        if who is None or not start <= at < end:
            continue
        seen.add(event["auditID"])
        ref = event.get("objectRef") or {}
        resource = ref.get("resource", "-") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        counts[who][f"{event['verb']} {resource}"] += 1
    return counts


@dataclass
class Process:
    name: str
    popen: subprocess.Popen
    metrics_url: str
    count_metric: str

    def sample(self) -> tuple[float, float]:
        return proc_cpu(self.popen.pid), counter_total(self.metrics_url, self.count_metric)


def protected(plane: ControlPlane) -> str:
    """How many nodes carry each of the controller's hints, and on which kind of node."""
    nodes = plane.rest().get("/api/v1/nodes").expect(200)["items"]
    marks = Counter()
    for node in nodes:
        annotations = node["metadata"].get("annotations") or {}
        for key in ("karpenter.sh/do-not-disrupt", "cluster-autoscaler.kubernetes.io/scale-down-disabled",
                    "gpuscale.io/idle-gpu-pods"):  # fmt: skip
            if key in annotations:
                marks[key] += 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(marks.items())) or "no hints on any node"


def window(
    label: str,
    log: Path,
    procs: list[Process],
    seconds: float,
    *,
    since: float | None = None,
    before: dict[str, tuple[float, float]] | None = None,
) -> None:
    """Sleep ``seconds`` and print what each process did meanwhile; ``since``: report [since, now) instead,
    without sleeping, CPU and cycles counted from ``before`` (default: each process' start)."""
    start = time.time() if since is None else since
    if before is None:
        before = {p.name: (0.0, 0.0) if since is not None else p.sample() for p in procs}
    load_before = os.getloadavg()[0]
    time.sleep(seconds if since is None else 0)
    end = time.time()
    after = {p.name: p.sample() for p in procs}
    counts = audit_counts(log, start, end)
    minutes = (end - start) / 60
    print(f"\n{label}: {end - start:.0f} s, load average {load_before:.1f} → {os.getloadavg()[0]:.1f}")
    for p in procs:
        cpu = after[p.name][0] - before[p.name][0]
        cycles = after[p.name][1] - before[p.name][1]
        rss, peak = proc_rss(p.popen.pid)
        per = f"{cpu / cycles:.3f} s CPU per {'refresh' if p.name == 'adapter' else 'reconcile'}" if cycles else "-"
        c = counts[p.name]
        total = sum(c.values())
        writes = sum(v for k, v in c.items() if k.split()[0] in WRITES and "leases" not in k)
        leases = sum(v for k, v in c.items() if "leases" in k)
        print(f"  {p.name}: {cycles:.0f} cycles, {cpu:.1f} s CPU ({per}), RSS {rss:.0f} MB (peak {peak:.0f} MB); "
              f"{total / minutes:.1f} API requests/min, writes {writes} (lease {leases})")  # fmt: skip
        for key, value in sorted(c.items(), key=lambda kv: -kv[1])[:8]:
            print(f"      {value:5d}  {key}")
        if p.name == "controller":
            text = urllib.request.urlopen(p.metrics_url, timeout=10).read().decode()
            shown = ("gpuscale_controller_source_up", "gpuscale_controller_idle_gpus ", "gpuscale_controller_pools ")
            for line in text.splitlines():
                # NB: every source that is down, and the Prometheus one either way
                if line.startswith(shown) and ("prometheus" in line or not line.endswith(" 1.0")):
                    print(f"      {line}")


# --- main -------------------------------------------------------------------------------------------------------


def install(plane: ControlPlane, work: Path) -> Path:
    """deploy/base and deploy/controller without their Deployments and APIServices; the adapter's metrics.yaml."""
    docs = []
    for kustomization in ("deploy/base", "deploy/controller"):
        built = subprocess.run([plane.kubectl_binary, "kustomize", str(REPO / kustomization)], capture_output=True,
                               text=True, check=True)  # fmt: skip
        docs += [d for d in yaml.safe_load_all(built.stdout) if d and d["kind"] not in ("Deployment", "APIService")]
    done = plane.kubectl("apply", "--server-side", "--field-manager=bench", "-f", "-", input=yaml.safe_dump_all(docs))
    assert done.returncode == 0, done.stderr
    config = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].startswith("gpuscale-metrics"))
    path = work / "metrics.yaml"
    path.write_text(config["data"]["metrics.yaml"])
    return path


def start(name: str, args: list[str], work: Path) -> subprocess.Popen:
    log = open(work / f"{name}.log", "w")  # noqa: SIM115 - kept open for the child's lifetime
    # NB: this checkout's gpuscale, whichever one the interpreter's environment has installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen(
        [sys.executable, "-m", "gpuscale.cli.main", *args], stdout=log, stderr=log, cwd=work, env=env
    )


def wait_until(what: str, check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(1)
    raise SystemExit(f"bench_fleet_real: timed out waiting for {what}")


async def amain(args: argparse.Namespace, exporters: Exporters) -> None:
    work = Path(tempfile.mkdtemp(prefix="gpuscale-fleet-"))
    policy = work / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    log = work / "audit.log"
    print(f"fleet on the real API: {args.nodes} nodes × {GPUS} GPUs, {args.deployments} Deployments × "
          f"{args.replicas} pods + HPAs, {args.gangs} running and {PENDING_GANGS} pending gangs; {work}")  # fmt: skip
    started = time.monotonic()
    plane = start_control_plane(
        cached_binaries(),
        work / "plane",
        apiserver_args=(f"--audit-policy-file={policy}", f"--audit-log-path={log}", "--audit-log-format=json",
                        "--audit-log-maxsize=0"),
        controllers=CONTROLLERS,
    )  # fmt: skip
    procs: list[Process] = []
    prometheus = None
    api = Api(plane)
    try:
        metrics_yaml = install(plane, work)
        fleet = Fleet()
        await build_fleet(api, args, fleet, plane)
        exporters.update(fleet, fleet.nodes)
        targets = work / "targets.json"
        write_targets(targets, fleet)
        job = {"job_name": "dcgm-exporter", "scrape_interval": "15s", "scrape_timeout": "10s",
               "file_sd_configs": [{"files": [str(targets)], "refresh_interval": "5s"}]}  # fmt: skip
        prometheus = start_backend("prometheus", [job], workdir=work / "prometheus", scrape_interval="15s")
        await prometheus.wait_ready(targets=len(fleet.nodes), series="DCGM_FI_DEV_GPU_UTIL", timeout=120)
        print(f"  set up in {time.monotonic() - started:.0f} s; Prometheus scrapes {len(fleet.nodes)} exporters")
        adapter_port, controller_port = free_port(), free_port()
        launched = time.time()
        adapter_kc = plane.service_account_kubeconfig("gpuscale", "gpuscale-adapter")
        controller_kc = plane.service_account_kubeconfig("gpuscale", "gpuscale-controller")
        adapter = start("adapter", [
            "adapter", "--kubeconfig", str(adapter_kc), "--prometheus-url", prometheus.url,
            "--config", str(metrics_yaml), "--refresh-interval", "5s", "--insecure-port", str(adapter_port),
            "--insecure-bind-address", "127.0.0.1", "--log-level", "warning",
        ], work)  # fmt: skip
        controller = start("controller", [
            "controller", "--kubeconfig", str(controller_kc), "--prometheus-url", prometheus.url,
            "--namespace", "gpuscale", "--interval", f"{args.interval:g}s", "--port", str(controller_port),
            *(["--prometheus-timeout", f"{args.prometheus_timeout:g}s"] if args.prometheus_timeout else []),
            "--bind-address", "127.0.0.1", "--log-level", "warning", "--no-dry-run", "--identity", "bench",
        ], work)  # fmt: skip
        procs = [
            Process("adapter", adapter, f"http://127.0.0.1:{adapter_port}/metrics",
                    "gpuscale_refresh_duration_seconds_count"),
            Process("controller", controller, f"http://127.0.0.1:{controller_port}/metrics",
                    "gpuscale_controller_reconcile_duration_seconds_count"),
        ]  # fmt: skip
        for p in procs:
            wait_until(f"{p.name} reporting cycles", lambda p=p: p.popen.poll() is None and p.sample()[1] >= 2, 300)
        print(f"  adapter and controller running ({time.monotonic() - started:.0f} s since start); warming up "
              f"{args.warmup} s")  # fmt: skip
        await asyncio.to_thread(time.sleep, args.warmup)
        window("start-up (first list of every cache, first reconciles, warm-up)", log, procs, 0, since=launched)
        print(f"  nodes marked: {protected(plane)}")
        await asyncio.to_thread(window, "steady state", log, procs, args.window)
        print(f"  nodes marked: {protected(plane)}")
        t, churned, samples = time.monotonic(), time.time(), {p.name: p.sample() for p in procs}
        gone, joined = await churn(api, args, fleet)
        exporters.update(fleet, joined + [n for n in fleet.nodes if n in fleet.holders], removed=gone)
        write_targets(targets, fleet)
        print(f"\nchurn: {len(gone)} nodes deleted with their pods, {len(joined)} joined, pods rebound, in "
              f"{time.monotonic() - t:.0f} s")  # fmt: skip
        window("during the churn", log, procs, 0, since=churned, before=samples)
        await asyncio.to_thread(window, "after churn (first window)", log, procs, args.window)
        await asyncio.to_thread(window, "after churn (settled)", log, procs, args.window)
        print(f"  nodes marked: {protected(plane)}")
        for p in procs:
            assert p.popen.poll() is None, (work / f"{p.name}.log").read_text()[-2000:]
    finally:
        await api.close()
        for p in procs:
            p.popen.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(10)
        if prometheus is not None:
            await prometheus.close_session()
            prometheus.stop()
        plane.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--deployments", type=int, default=300)
    parser.add_argument("--replicas", type=int, default=20)
    parser.add_argument("--gangs", type=int, default=10, help="running gangs (4 × 8-GPU pods each)")
    parser.add_argument("--churn", type=float, default=0.1)
    parser.add_argument("--warmup", type=float, default=60)
    parser.add_argument("--window", type=float, default=180, help="seconds per measured window")
    parser.add_argument("--interval", type=float, default=15, help="the controller's --interval (shipped: 15)")
    parser.add_argument("--prometheus-timeout", type=float, default=None, help="the controller's --prometheus-timeout")
    args = parser.parse_args()
    exporters = Exporters()  # NB: forked before any event loop exists in this process
    try:
        asyncio.run(amain(args, exporters))
    finally:
        exporters.stop()


if __name__ == "__main__":
    main()
