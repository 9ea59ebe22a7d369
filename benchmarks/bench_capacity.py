"""CPU cost of one reconcile of the controller's capacity planners on a large synthetic cluster.

The cluster: ``--nodes`` GPU nodes (8 GPUs each) in 8 pools, NVLink domains of 18 nodes, 8 running pods per
node, and ``--gangs`` pending gangs (half Volcano groups without pods, a quarter coscheduling groups with 4
pending pods each, a quarter Kueue Workloads with quota reserved), in the steady state where each already has its
ProvisioningRequest (so the planners plan nothing, the common case). Measured with ``time.process_time``:
``gangs_of``, the provisioning planner, the NVLink warnings, the expander (including ``pools_of``) — each the
median of the repeats — against a peer in the same run: decoding the same objects from JSON once (what one
relist of them costs the caches), so the figure says how a reconcile compares with just reading the cluster.

    .venv/bin/python benchmarks/bench_capacity.py [--nodes 2000] [--gangs 200] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from gpuscale.controller.cliques import plan_clique_warnings
from gpuscale.controller.expander import plan_expander
from gpuscale.controller.gangs import gangs_of
from gpuscale.controller.pools import load_pools_policy, pools_of
from gpuscale.controller.provisioning import plan_provisioning
from gpuscale.controller.writes import Create, Patch, StaticClusterView
from gpuscale.pricing import load_prices

PRODUCTS = ["NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L40S", "NVIDIA-GB200"]
NOW = 1_796_000_000.0


def _meta(name: str, namespace: str | None = None, **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "uid": str(uuid.uuid4()), "creationTimestamp": "2026-12-03T07:00:00Z"}
    if namespace:
        meta["namespace"] = namespace
    meta.update(extra)
    return meta


def _container(gpus: int) -> dict[str, Any]:
    return {"name": "w", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}


def cluster(nodes: int, gangs: int) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    for n in range(nodes):
        pool = n % 8
        labels = {
            "karpenter.sh/nodepool": f"pool-{pool}",
            "nvidia.com/gpu.product": PRODUCTS[pool % len(PRODUCTS)],
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.clique": f"clique-{pool}-{n // 8 // 18}",
        }
        items.append({"apiVersion": "v1", "kind": "Node", "metadata": _meta(f"node-{n}", labels=labels)})
        for p in range(8):
            items.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": _meta(f"run-{n}-{p}", "ml", labels={"app": "serve"}),
                    "spec": {"nodeName": f"node-{n}", "containers": [_container(1)]},
                    "status": {"phase": "Running"},
                }
            )
    pending = {"phase": "Pending", "conditions": [{"type": "Unschedulable", "status": "True"}]}
    for g in range(gangs):
        name = f"gang-{g}"
        if g % 4 < 2:
            spec = {"minMember": 4, "minResources": {"nvidia.com/gpu": "32"}}
            items.append(
                {
                    "apiVersion": "scheduling.volcano.sh/v1beta1",
                    "kind": "PodGroup",
                    "metadata": _meta(name, "ml"),
                    "spec": spec,
                    "status": pending,
                }
            )
        elif g % 4 == 2:
            items.append(
                {
                    "apiVersion": "scheduling.x-k8s.io/v1alpha1",
                    "kind": "PodGroup",
                    "metadata": _meta(name, "ml"),
                    "spec": {"minMember": 4},
                    "status": {"phase": "Pending"},
                }
            )
            for p in range(4):
                items.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Pod",
                        "metadata": _meta(f"{name}-{p}", "ml", labels={"scheduling.x-k8s.io/pod-group": name}),
                        "spec": {"containers": [_container(8)]},
                        "status": {"phase": "Pending"},
                    }
                )
        else:
            template = {"spec": {"containers": [_container(8)], "restartPolicy": "Never"}}
            items.append(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "Workload",
                    "metadata": _meta(name, "ml"),
                    "spec": {"podSets": [{"name": "workers", "count": 4, "template": template}]},
                    "status": {"conditions": [{"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"}]},
                }
            )
    return items


def steady_state(items: list[dict[str, Any]], policy: Any) -> list[dict[str, Any]]:
    """``items`` after the planner's first writes were applied (requests and templates made, pods annotated)."""
    writes = plan_provisioning(StaticClusterView(items), now=NOW, policy=policy)
    by_key = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in items}
    out = list(items)
    for write in writes:
        if isinstance(write, Create):
            obj = json.loads(json.dumps(write.obj))
            obj["metadata"]["uid"] = str(uuid.uuid4())
            out.append(obj)
        elif isinstance(write, Patch):
            pod = by_key[(write.key.kind, write.key.namespace, write.key.name)]
            pod["metadata"].setdefault("annotations", {}).update(write.patch["metadata"]["annotations"])
    return out


def cpu_ms(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.process_time()
        fn()
        times.append((time.process_time() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--gangs", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    policy, prices = load_pools_policy(), load_prices()
    items = steady_state(cluster(args.nodes, args.gangs), policy)
    view = StaticClusterView(items)
    text = json.dumps(items)
    gangs = gangs_of(view)
    activity = {f"pool-{p}": 0.1 * (p + 1) for p in range(8)}
    pending = [g for g in gangs if g.state == "pending"]
    assert plan_provisioning(view, now=NOW, policy=policy, gangs=gangs) == [], "not the steady state"

    def expander() -> None:
        pools = pools_of(view.objects("v1", "Node"), policy=policy, prices=prices)
        plan_expander(view, pools=pools, activity=activity, pending=pending, policy=policy)

    pools = pools_of(view.objects("v1", "Node"), policy=policy, prices=prices)
    figures = {
        "peer: json.loads of the objects": cpu_ms(lambda: json.loads(text), args.repeats),
        "gangs_of": cpu_ms(lambda: gangs_of(view), args.repeats),
        "plan_provisioning (steady)": cpu_ms(
            lambda: plan_provisioning(view, now=NOW, policy=policy, gangs=gangs), args.repeats
        ),
        "plan_clique_warnings": cpu_ms(lambda: plan_clique_warnings(view, gangs=gangs, pools=pools), args.repeats),
        "pools_of + plan_expander": cpu_ms(expander, args.repeats),
    }
    print(
        f"{args.nodes} GPU nodes, {sum(1 for i in items if i['kind'] == 'Pod')} pods, {len(gangs)} gangs "
        f"({len(pending)} pending), {len(items)} objects, {len(text) / 1e6:.1f} MB of JSON; "
        f"median CPU ms over {args.repeats} repeats"
    )
    peer = figures["peer: json.loads of the objects"]
    reconcile = sum(v for k, v in figures.items() if not k.startswith("peer"))
    for name, ms in figures.items():
        print(f"  {name:<36} {ms:8.1f} ms")
    print(f"  {'one reconcile (sum of the four)':<36} {reconcile:8.1f} ms = {reconcile / peer:.2f}× the peer")


if __name__ == "__main__":
    main()
