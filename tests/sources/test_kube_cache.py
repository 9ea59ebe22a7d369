"""The list+watch cache reflects the cluster, answers lookups from memory, and recovers from lost watches.

KubeCache runs against the simulated API server over real HTTP (kubernetes-asyncio). Changes are awaited by
polling a predicate with a deadline, never by sleeping a fixed time. StaticClusterObjects, the in-memory
implementation for unit tests, is held to the same lookup behaviour.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.config import new_client_from_config

from gpuscale.errors import ConfigError, SourceUnavailable
from gpuscale.selectors import LabelSelector
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources import reflector
from gpuscale.sources.cluster_index import ClusterObjects, PodInfo, StaticClusterObjects, WorkloadInfo
from gpuscale.sources.kube import KubeCache
from gpuscale.sources.kubeconfig import load_api_client


async def eventually(predicate: Callable[[], bool], *, timeout: float = 5.0, what: str = "condition") -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def pod(
    name: str,
    namespace: str = "ml",
    *,
    labels: dict[str, str] | None = None,
    ip: str | None = None,
    ports: tuple[int, ...] = (),
    node: str | None = "gpu-1",
    phase: str = "Running",
    owner: tuple[str, str] | None = None,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "u-1", "controller": True},
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "not-the-controller", "uid": "u-2"},
        ]
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "i", "ports": [{"containerPort": p} for p in ports]}]
    }
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if ip:
        status["podIP"] = ip
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def workload(kind: str, name: str, namespace: str = "ml", *, app: str) -> dict[str, Any]:
    labels = {"app": app}
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": {"team": "inference"}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": "i"}]}},
        },
    }


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


def seed(sim: SimKubeApi) -> None:
    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    sim.create(node("gpu-1", **{"nvidia.com/gpu.product": "H100"}))
    sim.create(node("cpu-1"))
    sim.create(workload("Deployment", "triton", app="triton"))
    sim.create(workload("StatefulSet", "finetune", app="finetune"))
    sim.create(
        pod(
            "triton-a",
            labels={"app": "triton"},
            ip="10.0.0.5",
            ports=(8000, 8002),
            owner=("ReplicaSet", "triton-7d9f8b6c5"),
        )
    )
    sim.create(pod("triton-b", labels={"app": "triton"}, ip="10.0.0.6", ports=(8002,)))
    sim.create(pod("finetune-0", labels={"app": "finetune"}, ip="10.0.0.7", owner=("StatefulSet", "finetune")))
    sim.create(pod("dcgm-exporter-x", "kube-system", labels={"app": "dcgm-exporter"}, ip="10.1.0.1", ports=(9400,)))


@pytest.fixture
async def sim():
    api = SimKubeApi()
    await api.start()
    seed(api)
    yield api
    await api.stop()


@pytest.fixture
async def api_client(sim, tmp_path):
    api = await new_client_from_config(config_file=sim.write_kubeconfig(tmp_path / "kubeconfig"), persist_config=False)
    yield api
    await api.close()


@pytest.fixture
async def cache(api_client):
    c = KubeCache(api_client, watch_timeout_seconds=1, backoff_max_seconds=0.2)
    yield c
    await c.stop()


# --- lookups after one list -------------------------------------------------------------------------


async def test_refresh_once_fills_every_index(cache, sim):
    assert not cache.synced
    await cache.refresh_once()
    assert cache.synced
    assert isinstance(cache, ClusterObjects)
    assert cache.namespaces() == {"default", "kube-system", "kube-public", "kube-node-lease", "ml"}
    assert cache.nodes() == {"gpu-1", "cpu-1"}
    assert cache.node_labels("gpu-1") == {"nvidia.com/gpu.product": "H100"}
    assert cache.select_nodes(LabelSelector.parse("nvidia.com/gpu.product")) == ["gpu-1"]
    assert [p.name for p in cache.pods("ml")] == ["finetune-0", "triton-a", "triton-b"]
    assert len(cache.pods()) == 4

    triton = cache.pod("ml", "triton-a")
    assert triton == PodInfo(
        namespace="ml",
        name="triton-a",
        labels={"app": "triton"},
        node_name="gpu-1",
        pod_ip="10.0.0.5",
        container_ports=(8000, 8002),
        phase="Running",
        owner=("ReplicaSet", "triton-7d9f8b6c5"),
    )
    assert cache.pod("ml", "nope") is None


async def test_selection_and_workloads(cache):
    await cache.refresh_once()
    selected = cache.select_pods("ml", LabelSelector.parse("app in (triton)"))
    assert [p.name for p in selected] == ["triton-a", "triton-b"]
    assert cache.select_pods("ml", LabelSelector.parse("app!=triton")) == [cache.pod("ml", "finetune-0")]
    assert cache.select_pods("other", LabelSelector.parse("")) == []

    deploy = cache.workload("Deployment", "ml", "triton")
    assert deploy == WorkloadInfo(
        "Deployment", "ml", "triton", LabelSelector.parse("app=triton"), {"team": "inference"}
    )
    assert [p.name for p in cache.pods_of(deploy)] == ["triton-a", "triton-b"]
    sts = cache.workload("StatefulSet", "ml", "finetune")
    assert [p.name for p in cache.pods_of(sts)] == ["finetune-0"]
    assert cache.workload("Deployment", "ml", "finetune") is None
    assert [w.name for w in cache.workloads("Deployment", "ml")] == ["triton"]


async def test_pod_at_attributes_endpoints(cache):
    await cache.refresh_once()
    assert cache.pod_at("10.0.0.5", 8002).name == "triton-a"
    assert cache.pod_at("10.0.0.5", 8000).name == "triton-a"
    assert cache.pod_at("10.0.0.6", 8002).name == "triton-b"
    assert cache.pod_at("10.1.0.1", 9400).namespace == "kube-system"
    assert cache.pod_at("10.0.0.5", 9999) is None
    assert cache.pod_at("10.0.0.7", 8002) is None  # the pod has no such port


async def test_lookups_never_call_the_api(cache, sim):
    await cache.refresh_once()
    before = sim.request_count
    for _ in range(100):
        cache.pods_of(cache.workload("Deployment", "ml", "triton"))
        cache.pod_at("10.0.0.5", 8002)
        cache.select_pods("ml", LabelSelector.parse("app=triton"))
        cache.namespaces()
    assert sim.request_count == before


async def test_lists_are_paged(cache, sim, monkeypatch):
    monkeypatch.setattr(reflector, "_LIST_PAGE_SIZE", 2)
    await cache.refresh_once()
    assert len(cache.pods()) == 4
    pod_lists = [r.path_qs for r in sim.requests if r.path_qs.startswith("/api/v1/pods?")]
    assert len(pod_lists) == 2 and "continue=" in pod_lists[1]


# --- the watch loop ---------------------------------------------------------------------------------


async def test_watch_reflects_added_modified_deleted(cache, sim):
    await cache.start()
    await cache.wait_synced(5)
    sim.create(pod("triton-c", labels={"app": "triton"}, ip="10.0.0.8", ports=(8002,)))
    await eventually(lambda: cache.pod("ml", "triton-c") is not None, what="ADDED pod")
    assert cache.pod_at("10.0.0.8", 8002).name == "triton-c"

    sim.patch("v1", "Pod", "triton-c", {"metadata": {"labels": {"app": "other"}}}, namespace="ml")
    await eventually(lambda: cache.pod("ml", "triton-c").labels == {"app": "other"}, what="MODIFIED labels")
    assert "triton-c" not in [p.name for p in cache.pods_of(cache.workload("Deployment", "ml", "triton"))]

    sim.delete("v1", "Pod", "triton-c", namespace="ml")
    await eventually(lambda: cache.pod("ml", "triton-c") is None, what="DELETED pod")
    assert cache.pod_at("10.0.0.8", 8002) is None

    sim.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "new"}})
    sim.create(node("gpu-2"))
    sim.create(workload("Deployment", "llm", app="llm"))
    await eventually(lambda: "new" in cache.namespaces() and "gpu-2" in cache.nodes(), what="namespace and node")
    await eventually(lambda: cache.workload("Deployment", "ml", "llm") is not None, what="deployment")
    sim.delete("v1", "Node", "cpu-1")
    sim.delete("apps/v1", "StatefulSet", "finetune", namespace="ml")
    await eventually(lambda: "cpu-1" not in cache.nodes(), what="node deletion")
    await eventually(lambda: cache.workload("StatefulSet", "ml", "finetune") is None, what="workload deletion")


async def test_status_changes_update_attribution(cache, sim):
    await cache.start()
    await cache.wait_synced(5)
    sim.create(pod("late", labels={"app": "triton"}, ports=(8002,), node=None, phase="Pending"))
    await eventually(lambda: cache.pod("ml", "late") is not None)
    assert cache.pod("ml", "late").pod_ip is None
    sim.patch(
        "v1", "Pod", "late", {"status": {"phase": "Running", "podIP": "10.0.0.9"}}, namespace="ml", subresource="status"
    )
    await eventually(lambda: cache.pod_at("10.0.0.9", 8002) is not None, what="podIP from a status update")
    assert cache.pod("ml", "late").phase == "Running"


async def test_watch_resumes_after_its_timeout(cache, sim):
    await cache.start()
    await cache.wait_synced(5)

    def pod_watches() -> int:
        return sum(1 for r in sim.requests if r.path_qs.startswith("/api/v1/pods?") and "watch=" in r.path_qs)

    await eventually(lambda: pod_watches() >= 2, timeout=10, what="the watch to reconnect after timeoutSeconds")
    lists = sum(1 for r in sim.requests if r.path_qs.startswith("/api/v1/pods?") and "watch=" not in r.path_qs)
    sim.create(pod("after-reconnect"))
    await eventually(lambda: cache.pod("ml", "after-reconnect") is not None)
    # resuming from the last resourceVersion (bookmarks keep it fresh) needs no relist
    assert lists == 1


async def test_relist_after_410_never_loses_a_delete(cache, sim, caplog):
    caplog.set_level("INFO", logger="gpuscale.sources.reflector")
    await cache.start()
    await cache.wait_synced(5)
    port = int(sim.url.rsplit(":", 1)[1])
    lists_before = sum(1 for r in sim.requests if "watch=" not in r.path_qs and r.path_qs.startswith("/api/v1/pods"))

    # The API server goes away; while it is down a pod is deleted and another created, and the history is
    # compacted, so the cache's resourceVersion is too old when it reconnects.
    await sim.stop()
    sim.delete("v1", "Pod", "triton-b", namespace="ml")
    sim.create(pod("born-while-away"))
    sim.compact()
    await sim.start(port=port)

    await eventually(lambda: cache.pod("ml", "triton-b") is None, timeout=10, what="the missed DELETED")
    await eventually(lambda: cache.pod("ml", "born-while-away") is not None, timeout=10)
    lists_after = sum(1 for r in sim.requests if "watch=" not in r.path_qs and r.path_qs.startswith("/api/v1/pods"))
    assert lists_after > lists_before  # it relisted
    assert any("watch expired" in r.getMessage() for r in caplog.records)  # because of the 410
    assert cache.pod_at("10.0.0.6", 8002) is None


async def test_errors_are_recorded_and_the_loop_recovers(cache, sim):
    port = int(sim.url.rsplit(":", 1)[1])
    await sim.stop()
    await cache.start()
    with pytest.raises(SourceUnavailable) as info:
        await cache.wait_synced(0.3)
    assert "not listed yet" in str(info.value) and "pods" in str(info.value)
    await eventually(lambda: "pods" in cache.last_errors, what="a recorded error")
    await sim.start(port=port)
    await cache.wait_synced(5)
    assert cache.last_errors == {}


async def test_refresh_once_raises_source_unavailable(tmp_path):
    api = SimKubeApi(tokens={"right"})
    await api.start()
    try:
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig", token="wrong")
        client = await load_api_client(kubeconfig)
        try:
            with pytest.raises(SourceUnavailable, match="HTTP 401"):
                await KubeCache(client).refresh_once()
        finally:
            await client.close()
    finally:
        await api.stop()


async def test_stop_leaves_no_tasks(cache):
    await cache.start()
    await cache.wait_synced(5)
    await cache.stop()
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert not any(n.startswith("kube-watch-") for n in names)


# --- load_api_client --------------------------------------------------------------------------------


async def test_load_api_client(sim, tmp_path, monkeypatch):
    client = await load_api_client(sim.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        assert client.configuration.host == sim.url
    finally:
        await client.close()
    with pytest.raises(SourceUnavailable, match="does not exist"):
        await load_api_client(tmp_path / "missing")
    (tmp_path / "broken").write_text("apiVersion: v1\nkind: Config\nclusters: []\n")
    with pytest.raises(SourceUnavailable, match="cannot load kubeconfig"):
        await load_api_client(tmp_path / "broken")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(SourceUnavailable, match="not running in a cluster"):
        await load_api_client(None)


async def test_load_api_client_reads_the_kubeconfig_and_its_files_within_limits(sim, tmp_path):
    """The kubeconfig is read as a config file (bounded YAML), and the files its current context names are read
    by gpuscale within files.py's limits and handed inline: relative to the kubeconfig's directory, as kubectl."""
    import os

    import yaml

    (tmp_path / "creds").mkdir()
    (tmp_path / "creds" / "token").write_text("sim-token\n")
    data = yaml.safe_load(Path(sim.write_kubeconfig(tmp_path / "kubeconfig")).read_text())
    data["users"][0]["user"] = {"tokenFile": "creds/token"}
    data["clusters"].append({"name": "other", "cluster": {"server": "https://x", "certificate-authority": "gone"}})
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump(data))
    api = await load_api_client(tmp_path / "kubeconfig")
    try:
        assert api.configuration.api_key["BearerToken"] == "Bearer sim-token"  # trimmed, as client-go does
        await KubeCache(api).refresh_once()  # the token is the one the server accepts
    finally:
        await api.close()
    os.mkfifo(tmp_path / "fifo")
    hostile = [  # (user, cluster, what the refusal says): a FIFO as tokenFile, /dev/zero as certificate, a dir as CA
        ({"tokenFile": str(tmp_path / "fifo")}, None, "tokenFile of user 'sim'"),
        ({"client-certificate": "/dev/zero", "token": "t"}, None, "client-certificate of user 'sim'.*device"),
        ({"token": "t"}, {"certificate-authority": "creds"}, "certificate-authority of cluster 'sim'.*a directory"),
    ]
    for user, cluster, says in hostile:
        data["users"][0]["user"] = user
        data["clusters"][0]["cluster"] = {"server": "https://127.0.0.1:1", **(cluster or {})}
        (tmp_path / "kubeconfig").write_text(yaml.safe_dump(data))
        with pytest.raises(ConfigError, match=says):
            await load_api_client(tmp_path / "kubeconfig")
    (tmp_path / "bomb").write_text(
        'a: &a ["x","x","x","x","x","x","x","x","x"]\n'
        + "".join(f"a{i}: &a{i} [{','.join(['*a' if i == 1 else f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    )
    with pytest.raises(ConfigError, match="nodes once its aliases are expanded"):
        await load_api_client(tmp_path / "bomb")


# --- the in-memory implementation -------------------------------------------------------------------


def info(
    name: str,
    *,
    ip: str = "10.0.0.1",
    ports: tuple[int, ...] = (8002,),
    phase: str = "Running",
    namespace: str = "ml",
    labels: dict[str, str] | None = None,
) -> PodInfo:
    return PodInfo(
        namespace=namespace,
        name=name,
        labels=labels or {},
        node_name="n",
        pod_ip=ip,
        container_ports=ports,
        phase=phase,
        owner=None,
    )


def test_static_cluster_objects():
    objects = StaticClusterObjects(
        pods=[info("b", labels={"app": "x"}), info("a", ip="10.0.0.2", labels={"app": "x"}), info("c", namespace="o")],
        workloads=[WorkloadInfo("Deployment", "ml", "x", LabelSelector.parse("app=x"), {})],
        nodes={"n": {"gpu": "h100"}, "m": {}},
    )
    assert objects.synced and isinstance(objects, ClusterObjects)
    assert objects.namespaces() == {"ml", "o"}
    assert objects.nodes() == {"n", "m"} and objects.select_nodes(LabelSelector.parse("gpu=h100")) == ["n"]
    assert [p.name for p in objects.pods_of(objects.workload("Deployment", "ml", "x"))] == ["a", "b"]
    assert objects.pod_at("10.0.0.2", 8002).name == "a"
    assert StaticClusterObjects(nodes=["x"]).nodes() == {"x"}


def test_pod_at_prefers_a_running_pod_when_an_ip_was_reused():
    objects = StaticClusterObjects(pods=[info("old", phase="Succeeded"), info("new", phase="Running")])
    assert objects.pod_at("10.0.0.1", 8002).name == "new"
    objects = StaticClusterObjects(pods=[info("old", phase="Failed"), info("pending", phase="Pending")])
    assert objects.pod_at("10.0.0.1", 8002).name == "pending"


def test_pod_info_from_object_reads_sidecar_ports_and_the_controller():
    obj = pod("p", ports=(8000,), ip="10.0.0.3", owner=("ReplicaSet", "rs-1"))
    obj["spec"]["initContainers"] = [
        {"name": "sidecar", "image": "i", "restartPolicy": "Always", "ports": [{"containerPort": 9090}]},
        {"name": "init", "image": "i", "ports": [{"containerPort": 7777}]},
    ]
    parsed = PodInfo.from_object(obj)
    assert parsed.container_ports == (8000, 9090)
    assert parsed.owner == ("ReplicaSet", "rs-1")
    assert PodInfo.from_object({"metadata": {"name": "x", "namespace": "y"}}).phase == "Unknown"


def test_pod_start_and_ready_times_and_workload_annotations_are_kept():
    """The forecast's measured start-up is Ready − status.startTime; a pod not Ready has no ready time."""
    obj = {
        "metadata": {"name": "p", "namespace": "n"},
        "status": {
            "startTime": "2026-12-04T05:00:00Z",
            "conditions": [
                {"type": "Initialized", "status": "True", "lastTransitionTime": "2026-12-04T05:00:01Z"},
                {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-04T05:01:30Z"},
            ],
        },
    }
    pod = PodInfo.from_object(obj)
    assert pod.ready_at is not None and pod.started_at is not None and pod.ready_at - pod.started_at == 90.0
    obj["status"]["conditions"][1]["status"] = "False"
    obj["status"]["startTime"] = "not a time"
    pod = PodInfo.from_object(obj)
    assert pod.ready_at is None and pod.started_at is None
    workload = WorkloadInfo.from_object(
        "Deployment",
        {"metadata": {"name": "d", "namespace": "n", "annotations": {"gpuscale.io/startup-seconds": "60"}}},
    )
    assert workload.annotations == {"gpuscale.io/startup-seconds": "60"}


def test_select_pods_through_the_label_index_equals_a_scan_as_pods_come_go_and_change():
    """The label index answers exactly what checking every pod of the namespace does, through any changes."""
    import random

    from gpuscale.sources.cluster_index import StaticClusterObjects

    rng = random.Random(21)
    cluster = StaticClusterObjects(pods=[], namespaces=["a", "b"])
    index = cluster._index
    values = ["x", "y", "z"]
    selectors = [
        LabelSelector.parse(text)
        for text in [
            "", "app=x", "app==y", "app in (x,z)", "app=x,tier=y", "app=x,tier!=y", "app in (x,y),tier in (y)",
            "app", "!tier", "app notin (x)", "app=x,app=y", "tier=z,app",
        ]
    ]  # fmt: skip
    for step in range(400):
        namespace, name = rng.choice("ab"), f"p{rng.randrange(30)}"
        if rng.random() < 0.25:
            index.remove_pod(namespace, name)
        else:
            labels = {k: rng.choice(values) for k in ("app", "tier") if rng.random() < 0.7}
            index.put_pod(PodInfo(namespace, name, labels, None, None, (), "Running", None))
        for selector in selectors:
            for ns in "ab":
                scan = [p for p in cluster.pods(ns) if selector.matches(p.labels)]
                assert cluster.select_pods(ns, selector) == scan, (step, str(selector), ns)
