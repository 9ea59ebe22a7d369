"""`gpuscale report` end to end against a real Prometheus (history loaded with ``promtool tsdb
create-blocks-from openmetrics``) and a real VictoriaMetrics (``/api/v1/import``): the same fleet with known
answers (tests/report/fleet.py), the same report from both, and ``--export`` / ``--from`` reproducing it offline.
"""

from __future__ import annotations

import asyncio
import copy
import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

import aiohttp
import numpy as np
import pytest

from gpuscale.pricing import load_prices
from tests.e2e.backends import Backend, Backends, require
from tests.report.fleet import chat_activity, fleet, openmetrics, vm_import

pytestmark = [pytest.mark.e2e]

HOURS = 6
# Whole hours, an hour back: inside VictoriaMetrics' 1-day retention and clear of its 30 s latency offset.
END = (int(time.time()) // 3600 - 1) * 3600


def report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscale", "report", *args], capture_output=True, text=True, timeout=120, check=False
    )


def fetch_json(url: str, *extra: str) -> dict:
    # NB: --end as a user writes it (RFC 3339), not epoch seconds; the window must end exactly there
    end = datetime.fromtimestamp(END, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    done = report("--prometheus-url", url, "--end", end, "--window", f"{HOURS}h", "--step", "1m", "-o", "json", *extra)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["window"]["end"] == END, doc["window"]
    return doc


async def prometheus_with_blocks(backends: Backends, tmp_path, series=None) -> Backend:
    promtool = require(__import__("shutil").which("promtool"), "promtool")
    text = tmp_path / "history.om"
    with text.open("w") as f:
        f.writelines(openmetrics(series if series is not None else fleet(end=END, hours=HOURS)))
    data = backends.workdir / "prometheus" / "data"
    data.mkdir(parents=True)
    subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(text), str(data)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    prom = await backends.prometheus([])
    await prom.wait_until(lambda: _ready(prom, "/-/ready"), what="ready")
    return prom


async def victoria_metrics_imported(backends: Backends, series=None, gpus: int = 7) -> Backend:
    vm = await backends.victoria_metrics([])
    await vm.wait_until(lambda: _ready(vm, "/health"), what="healthy")
    body = "".join(vm_import(series if series is not None else fleet(end=END, hours=HOURS))).encode()
    async with aiohttp.ClientSession() as s:
        async with s.post(vm.url + "/api/v1/import", data=body) as resp:
            assert resp.status == 204, await resp.text()
        async with s.get(vm.url + "/internal/force_flush") as resp:
            assert resp.status == 200

    async def loaded() -> bool:
        # NB: the whole window, not its last hour: a pod of the production fleet may end hours before END, and
        # VictoriaMetrics finds series by day, so a last hour past midnight UTC missed it (134 of 135, from 00 UTC).
        window = f"start={END - HOURS * 3600}&end={END}"
        result = await vm.get_json(f"/api/v1/series?match[]=DCGM_FI_DEV_GPU_UTIL&{window}")
        return len(result.get("data", [])) == gpus  # the fleet: six GPUs + chat's

    await vm.wait_until(loaded, what="the imported series")
    return vm


async def _ready(backend: Backend, path: str) -> bool:
    session = await backend._http()
    async with session.get(backend.url + path) as resp:
        return resp.status == 200


def check_known_answers(r: dict) -> None:
    assert r["schema"] == "gpuscale.io/report/v2"
    by_name = {w["name"]: w for w in r["workloads"]}
    assert set(by_name) == {"trainer", "infer", "chat"}
    # the production case: p95 65 %, p99 93 %, 30 % most of the time — busy, nothing downsized
    chat = by_name["chat"]
    activity = np.array(chat_activity(HOURS * 60))
    assert np.quantile(activity, 0.99, method="higher") == pytest.approx(0.93)  # the independent computation
    assert chat["busy"] is True
    downsizing = {"fewer-gpus", "smaller-gpu", "mig-profile", "time-slicing", "scale-to-zero", "replicas"}
    assert not {x["kind"] for x in chat["recommendations"]} & downsizing, chat["recommendations"]
    (keep,) = [x for x in chat["recommendations"] if x["kind"] == "keep"]
    assert keep["evidence"]["activity_p99_percent"] == pytest.approx(93.0, abs=0.01)
    assert chat["cost"]["active_hours"] == pytest.approx(float(activity.mean()) * HOURS, abs=0.01)
    trainer, infer = by_name["trainer"], by_name["infer"]
    assert (trainer["kind"], trainer["gpus_requested_per_pod"], trainer["requests_source"]) == (
        "Deployment",
        4.0,
        "kube-state-metrics",
    )
    (fewer,) = [x for x in trainer["recommendations"] if x["kind"] == "fewer-gpus"]
    assert fewer["evidence"]["recommended"] == 1
    assert infer["kind"] == "StatefulSet"
    (mig,) = [x for x in infer["recommendations"] if x["kind"] == "mig-profile"]
    assert mig["evidence"]["resource"] == "nvidia.com/mig-1g.10gb"
    # usage-based cost per namespace and owner: allocated vs used GPU-hours and their money, by hand
    price = load_prices().per_gpu_hour("NVIDIA H100 80GB HBM3")
    namespaces = {g["name"]: g["cost"] for g in r["namespaces"]}
    for ns, allocated, active in (("ml", 4.0, 0.7), ("web", 1.0, 0.08)):
        cost = namespaces[ns]
        assert (cost["allocated_hours"], cost["active_hours"]) == pytest.approx((allocated * HOURS, active * HOURS))
        assert cost["allocated_cost"] == pytest.approx(allocated * HOURS * price, rel=1e-3)
        assert cost["idle_cost"] == pytest.approx((allocated - active) * HOURS * price, rel=1e-3)
    assert trainer["cost"]["allocated_hours"] == pytest.approx(4 * HOURS)
    pools = {p["name"]: p["cost"] for p in r["pools"]}
    assert pools["gpu-ondemand"]["allocated_hours"] == pytest.approx(4 * HOURS)
    assert pools["gpu-ondemand"]["active_hours"] == pytest.approx(0.7 * HOURS)
    assert pools["gpu-spot"]["unallocated_hours"] == pytest.approx(HOURS)
    chat_idle = (1 - float(np.mean(chat_activity(HOURS * 60)))) * HOURS
    assert r["total"]["idle_hours"] == pytest.approx((4 - 0.7) * HOURS + (1 - 0.08) * HOURS + chat_idle, abs=0.02)
    (xid,) = [i for i in r["incidents"] if i["kind"] == "xid"]
    assert (xid["value"], xid["node"], xid["first_seen"]) == ("79", "node-b", END - HOURS * 3600 + 3600)


def test_report_from_real_prometheus_and_victoria_metrics_and_from_an_export(tmp_path):
    async def start():
        backends = Backends(tmp_path / "backends")
        prom = await prometheus_with_blocks(backends, tmp_path)
        vm = await victoria_metrics_imported(backends)
        return backends, prom, vm

    backends, prom, vm = asyncio.run(start())
    try:
        exported = tmp_path / "history.npz"
        from_prom = fetch_json(prom.url, "--export", str(exported))
        check_known_answers(from_prom)
        from_vm = fetch_json(vm.url)
        check_known_answers(from_vm)
        for r in (from_prom, from_vm):
            r.pop("generated_at"), r.pop("source")
        assert from_vm == from_prom

        offline = report("--from", str(exported), "-o", "json")
        assert offline.returncode == 0, offline.stderr
        again = json.loads(offline.stdout)
        again.pop("generated_at"), again.pop("source")
        assert again == from_prom

        # Summary mode on the same data: what it calls exact is exactly raw mode's figures.
        for url in (prom.url, vm.url):
            summary = fetch_json(url, "--mode", "summary", "--chunk", "1h")
            assert summary["mode"] == "summary"
            check_known_answers(summary)
            assert summary["total"] == from_prom["total"]
            assert [p["cost"] for p in summary["pools"]] == [p["cost"] for p in from_prom["pools"]]
            for w in summary["workloads"]:
                (raw,) = [x for x in from_prom["workloads"] if x["name"] == w["name"]]
                assert w["cost"] == raw["cost"]
                assert {k: s["max"] for k, s in w["signals"].items()} == {
                    k: s["max"] for k, s in raw["signals"].items()
                }

        table = report("--from", str(exported))
        assert table.returncode == 0, table.stderr
        assert max(len(line) for line in table.stdout.splitlines()) <= 120
        assert "request 1 GPU per pod instead of 4" in table.stdout
    finally:
        asyncio.run(backends.stop())


def test_a_backend_that_is_down_is_one_clear_line(capsys):
    """The command's own main, in this process: only its error text is checked (a process costs ~1 s of imports)."""
    from gpuscale.cli.main import main
    from tests.e2e.backends import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", "--prometheus-url", url, "--window", "1h", "--retries", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gpuscale report: {url}: ") and "Traceback" not in err
    assert "failed after 1 attempts" in err and len(err.strip().splitlines()) == 1, err


def load_both(tmp_path, series, *, gpus: int) -> tuple[Backends, Backend, Backend]:
    """A real Prometheus (blocks) and a real VictoriaMetrics (import), both holding ``series``."""

    async def start() -> tuple[Backends, Backend, Backend]:
        backends = Backends(tmp_path / "backends")
        prom = await prometheus_with_blocks(backends, tmp_path, series)
        vm = await victoria_metrics_imported(backends, series, gpus=gpus)
        return backends, prom, vm

    return asyncio.run(start())


def test_a_gap_in_the_samples_is_not_allocated_time_in_prometheus_or_victoria_metrics(tmp_path):
    """One GPU held all window but sampled only in hours 0–2 and 4–6: 4 GPU-hours allocated, not 6 — the servers
    fill the gap (Prometheus for its 5-minute lookback, VictoriaMetrics for far longer); the report does not."""
    start = END - HOURS * 3600
    times = [start + i * 60 for i in range(HOURS * 60) if not (2 * 3600 <= i * 60 < 4 * 3600)]
    labels = {"Hostname": "node-g", "UUID": "GPU-node-g-0", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3",
              "pod": "etl-0", "namespace": "batch"}  # fmt: skip
    series = [
        (name, labels, [(t, value) for t in times])
        for name, value in (
            ("DCGM_FI_DEV_GPU_UTIL", 50.0),
            ("DCGM_FI_PROF_SM_ACTIVE", 0.4),
            ("DCGM_FI_DEV_FB_USED", 1000.0),
        )
    ]

    backends, prom, vm = load_both(tmp_path, series, gpus=1)
    try:
        hours = {}
        for name, url in (("prometheus", prom.url), ("victoria-metrics", vm.url)):
            r = fetch_json(url)
            (w,) = r["workloads"]
            # 240 samples a minute apart: 4 h, exactly — each sample counts one scrape interval, nothing more
            hours[name] = w["cost"]["allocated_hours"]
            assert hours[name] == pytest.approx(len(times) * 60 / 3600), (name, w["cost"])
            assert w["cost"]["active_hours"] == pytest.approx(0.4 * hours[name], rel=1e-2)
            assert w["coverage"] == pytest.approx(hours[name] / HOURS, abs=0.01)  # 4 h of 6 sampled
            if name == "prometheus":  # it fills 5 minutes of the gap from its lookback: those are taken out
                assert any("filled across gaps" in g for g in r["gaps"]), r["gaps"]
        assert hours["prometheus"] == hours["victoria-metrics"], hours
        # a 15 s step under a 1 min scrape: the interval is measured, so each sample still counts one minute
        fine = [
            fetch_json(url, "--step", "15s")["workloads"][0]["cost"]["allocated_hours"] for url in (prom.url, vm.url)
        ]
        assert fine[0] == fine[1] == pytest.approx(4.0), fine
    finally:
        asyncio.run(backends.stop())


def pooled_deployment() -> tuple[list, np.ndarray]:
    """40 one-GPU pods of Deployment serve/llm (8 of them only in the second half), each busy in rare bursts: the
    series and the GPU-equivalents busy per minute."""
    start = END - HOURS * 3600
    steps = HOURS * 60
    times = [start + i * 60 for i in range(steps)]
    rng = np.random.default_rng(5)
    demand = np.zeros(steps)
    series = []
    for i in range(40):
        activity = np.round(np.where(rng.random(steps) < 0.1, rng.uniform(0.6, 1.0, steps), 0.02), 4)
        alive = np.arange(steps) >= (steps // 2 if i >= 32 else 0)
        demand += np.where(alive, activity, 0.0)
        pod = f"llm-6b9d-{i:05d}"
        labels = {"Hostname": f"node-p{i // 8}", "UUID": f"GPU-p-{i}", "gpu": str(i % 8),
                  "modelName": "NVIDIA H100 80GB HBM3", "pod": pod, "namespace": "serve"}  # fmt: skip
        series += gpu_series(labels, times, activity, alive)
        owner = {"namespace": "serve", "pod": pod, "owner_kind": "ReplicaSet", "owner_name": "llm-6b9d"}
        kept = [t for t, a in zip(times, alive, strict=True) if a]
        series.append(("kube_pod_owner", owner, [(t, 1.0) for t in kept]))
        requests = {
            "namespace": "serve",
            "pod": pod,
            "container": "main",
            "resource": "nvidia_com_gpu",
            "unit": "integer",
        }
        series.append(("kube_pod_container_resource_requests", requests, [(t, 1.0) for t in kept]))
    rs = {"namespace": "serve", "replicaset": "llm-6b9d", "owner_kind": "Deployment", "owner_name": "llm"}
    series.append(("kube_replicaset_owner", rs, [(t, 1.0) for t in times]))
    return series, demand


def gpu_series(labels: dict[str, str], times: list[float], activity: np.ndarray, alive: np.ndarray) -> list:
    """One GPU's util, SM activity and memory at the minutes it was ``alive``."""
    kept = [(t, float(a)) for t, a, on in zip(times, activity, alive, strict=True) if on]
    return [
        ("DCGM_FI_DEV_GPU_UTIL", labels, [(t, 100.0 if a > 0.01 else 0.0) for t, a in kept]),
        ("DCGM_FI_PROF_SM_ACTIVE", labels, kept),
        ("DCGM_FI_DEV_FB_USED", labels, [(t, 9000.0) for t, _ in kept]),
    ]


# Pods kube_pod_owner does not name, beside the pooled Deployment: (cluster, namespace, pod, shape, alive from the
# step); the API owner the simulated Kubernetes API gives them (None: a bare pod there too; absent: not there).
UNOWNED = [
    (None, "serve", "notebook-0", "moderate", 0),  # a bare pod among owned ones
    (None, "serve", "debug-0", "idle", 0),  # bare in kube-state-metrics' words: owner_kind="<none>"
    *((None, "batch", f"etl-5f7c-{i:05d}", "bursty", 60 * i) for i in range(4)),  # the API knows their Deployment
    *(("edge", "serve", f"edge-llm-7c9d-{i:05d}", "bursty", 90 * i) for i in range(3)),  # a cluster without KSM
]
API_OWNERS = {("batch", "etl-5f7c"): ("Deployment", "etl"), ("serve", "notebook-0"): None}


def unowned_pods() -> list:
    """The series of UNOWNED's pods, each on its own GPU and node."""
    start = END - HOURS * 3600
    steps = HOURS * 60
    times = [start + i * 60 for i in range(steps)]
    rng = np.random.default_rng(8)
    series = []
    for k, (cluster, namespace, pod, shape, first) in enumerate(UNOWNED):
        if shape == "bursty":
            activity = np.where(rng.random(steps) < 0.1, rng.uniform(0.6, 1.0, steps), 0.02)
        else:
            activity = rng.uniform(0.15, 0.35, steps) if shape == "moderate" else np.full(steps, 0.005)
        labels = {"Hostname": f"node-u{k}", "UUID": f"GPU-u-{k}", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3",
                  "pod": pod, "namespace": namespace} | ({"cluster": cluster} if cluster else {})  # fmt: skip
        series += gpu_series(labels, times, np.round(activity, 4), np.arange(steps) >= first)
        if pod == "debug-0":
            owner = {"namespace": namespace, "pod": pod, "owner_kind": "<none>", "owner_name": "<none>"}
            series.append(("kube_pod_owner", owner, [(t, 1.0) for t in times]))
    return series


@dataclass
class Pooled:
    """Prometheus and VictoriaMetrics holding the pooled Deployment and the UNOWNED pods, the Deployment's demand,
    and the reports already fetched from them (each asked once a run: a report is seconds of CPU)."""

    prom: Backend
    vm: Backend
    demand: np.ndarray
    reports: dict[tuple[str, ...], dict] = field(default_factory=dict)

    def report(self, url: str, *extra: str) -> dict:
        if (url, *extra) not in self.reports:
            self.reports[(url, *extra)] = fetch_json(url, *extra)
        return copy.deepcopy(self.reports[(url, *extra)])


@pytest.fixture(scope="module")
def pooled(tmp_path_factory):
    series, demand = pooled_deployment()
    backends, prom, vm = load_both(tmp_path_factory.mktemp("pooled"), series + unowned_pods(), gpus=40 + len(UNOWNED))
    yield Pooled(prom, vm, demand)
    asyncio.run(backends.stop())


def test_a_pooled_deployment_gets_its_replica_count_from_the_real_tsdbs(pooled):
    """40 one-GPU pods of one Deployment (8 of them only in the second half), each busy in rare bursts, loaded into
    Prometheus and VictoriaMetrics: the replica advice equals the numpy computation over the raw samples."""
    demand = pooled.demand
    p99 = float(np.quantile(demand[demand > 0], 0.99, method="higher"))  # the independent computation
    expected = int(np.ceil(p99 * 1.15 / 0.6))
    for url in (pooled.prom.url, pooled.vm.url):
        r = pooled.report(url)
        (w,) = [w for w in r["workloads"] if w["name"] == "llm"]
        (rec,) = [x for x in w["recommendations"] if x["kind"] == "replicas"]
        assert rec["evidence"]["demand_p99_gpus"] == pytest.approx(p99, abs=1e-3), (url, rec)
        assert rec["evidence"]["recommended"] == expected, (url, rec)
        assert rec["evidence"]["current_pods_mean"] == pytest.approx(36.0, abs=0.1)
        assert rec["evidence"]["current_pods_peak"] == 40


def story(r: dict) -> dict[tuple[str, str, str], tuple]:
    """What a person acts on, per workload: its owner and pods, hours, history, idle stretch, verdicts, busy flag and
    recommendations (with the replica count for a pooled owner)."""
    return {
        (w["namespace"], w["kind"], w["name"]): (
            w["owner_source"],
            w["pods"],
            w["status"],
            round(w["cost"]["allocated_hours"], 3),
            round(w["cost"]["active_hours"], 3),
            w["history_seconds"],
            w["samples"],
            w["longest_idle_seconds"],
            [(v["code"], v["hours"]) for v in w["verdicts"]],
            w["busy"],
            sorted((x["kind"], x["evidence"].get("recommended")) for x in w["recommendations"]),
        )
        for w in r["workloads"]
    }


def bare_line(r: dict) -> str:
    (line,) = [g for g in r["gaps"] if "without a known owner, reported as bare pods" in g]
    return line


def kubernetes_objects() -> list[dict]:
    """The simulated Kubernetes API's view: API_OWNERS' pods with their ownerReferences (controller)."""

    def meta(name: str, ns: str, owner: tuple[str, str] | None) -> dict:
        refs = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": f"u-{owner[1]}",
                 "controller": True}] if owner else []  # fmt: skip
        return {"name": name, "namespace": ns, "ownerReferences": refs}

    spec = {"containers": [{"name": "main", "image": "x"}]}
    out: list[dict] = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}} for ns in ("batch", "serve")]
    for (ns, name), owner in API_OWNERS.items():
        if owner is None:
            out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta(name, ns, None), "spec": spec})
            continue
        rs_spec = {"selector": {"matchLabels": {"app": name}},
                   "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}  # fmt: skip
        out.append({"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": meta(name, ns, owner), "spec": rs_spec})
        for _, pod_ns, pod, _, _ in (u for u in UNOWNED if u[0] is None):
            if pod_ns == ns and pod.startswith(f"{name}-"):
                out.append({"apiVersion": "v1", "kind": "Pod", "metadata": meta(pod, ns, ("ReplicaSet", name)),
                            "spec": spec})  # fmt: skip
    return out


def test_pods_kube_pod_owner_does_not_name_are_the_same_workloads_in_summary_and_raw_mode(pooled, tmp_path):
    """A bare pod among owned ones, a pod kube-state-metrics calls bare (``<none>``), pods of a Deployment only the
    Kubernetes API knows, and a whole cluster without kube-state-metrics: summary mode (the TSDB's sums per pod where
    kube_pod_owner names no owner) gives each the workload, hours, history, verdicts and advice raw mode gives, on
    Prometheus and VictoriaMetrics, without and with owners from the (simulated) Kubernetes API, and the same gap
    line naming the pods reported bare."""
    from gpuscale.sim.kubeapi import SimKubeApi

    prom, vm = pooled.prom, pooled.vm
    unowned = {(f"{c}/{ns}" if c else ns, pod) for c, ns, pod, _, _ in UNOWNED if pod != "debug-0"}
    for url in (prom.url, vm.url):
        raw, summary = pooled.report(url), pooled.report(url, "--mode", "summary")
        assert story(summary) == story(raw), url
        mine = story(summary)
        for ns, pod in unowned:  # each a bare pod with its own per-step history, not "not enough data"
            assert mine[(ns, "Pod", pod)][:3] == ("none", 1, "ok"), (url, pod)
        assert mine[("serve", "Pod", "debug-0")][0] == "kube-state-metrics"
        assert (
            bare_line(summary)
            == bare_line(raw)
            == (
                f"{len(unowned)} pod(s) without a known owner, reported as bare pods: "
                + ", ".join(sorted(f"{ns}/{pod}" for ns, pod in unowned)[:5])
                + f" and {len(unowned) - 5} more"
            )
        )
        assert not [g for g in summary["gaps"] if "without kube_pod_owner per step" in g], summary["gaps"]

    async def with_the_api() -> tuple[dict, dict]:
        sim = SimKubeApi()
        await sim.start()
        try:
            for obj in kubernetes_objects():
                sim.create(obj)
            kubeconfig = str(sim.write_kubeconfig(tmp_path / "kubeconfig"))
            end = datetime.fromtimestamp(END, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            out = []
            for mode in ("raw", "summary"):
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "gpuscale", "report", "--prometheus-url", prom.url, "--end", end,
                    "--window", f"{HOURS}h", "--step", "1m", "-o", "json", "--mode", mode, "--kubeconfig", kubeconfig,
                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                )  # fmt: skip
                stdout, stderr = await asyncio.wait_for(proc.communicate(), 120)
                assert proc.returncode == 0, stderr.decode()
                out.append(json.loads(stdout))
            return out[0], out[1]
        finally:
            await sim.stop()

    raw, summary = asyncio.run(with_the_api())
    assert story(summary) == story(raw)
    mine = story(summary)
    etl = mine[("batch", "Deployment", "etl")]
    assert etl[:3] == ("kubernetes", 4, "ok"), etl
    assert mine[("serve", "Pod", "notebook-0")][0] == "kubernetes"
    edge = ", ".join(sorted(f"edge/serve/{pod}" for c, _, pod, _, _ in UNOWNED if c == "edge"))
    assert bare_line(summary) == bare_line(raw) == f"3 pod(s) without a known owner, reported as bare pods: {edge}"


def test_scale_to_zero_weighs_the_cold_start_kube_state_metrics_measured(tmp_path):
    """One pod busy 10 minutes at the start and 3 hours later: one wake-up in a quarter day, 4 a day. With the
    policy's 45 s cold start that fits the 5-minute budget; the pod's own start → Ready (90 s, from
    kube-state-metrics) does not: keep one replica warm."""
    start = END - HOURS * 3600
    times = [start + i * 60 for i in range(HOURS * 60)]
    busy = [(t - start) % (3 * 3600) < 600 for t in times]
    labels = {"Hostname": "node-s", "UUID": "GPU-s-0", "gpu": "0", "modelName": "NVIDIA H100 80GB HBM3",
              "pod": "imagegen-7f-abcde", "namespace": "art"}  # fmt: skip
    pod = {"namespace": "art", "pod": "imagegen-7f-abcde", "uid": "u-1"}
    started = start - 600.0
    series = [
        ("DCGM_FI_DEV_GPU_UTIL", labels, [(t, 95.0 if b else 0.0) for t, b in zip(times, busy, strict=True)]),
        ("DCGM_FI_PROF_SM_ACTIVE", labels, [(t, 0.8 if b else 0.0) for t, b in zip(times, busy, strict=True)]),
        ("DCGM_FI_DEV_FB_USED", labels, [(t, 9000.0) for t in times]),
        ("kube_pod_owner", {**pod, "owner_kind": "ReplicaSet", "owner_name": "imagegen-7f"}, [(t, 1.0) for t in times]),
        (
            "kube_replicaset_owner",
            {"namespace": "art", "replicaset": "imagegen-7f", "owner_kind": "Deployment", "owner_name": "imagegen"},
            [(t, 1.0) for t in times],
        ),
        ("kube_pod_start_time", pod, [(t, started) for t in times]),
        ("kube_pod_status_ready_time", pod, [(t, started + 90.0) for t in times]),
    ]
    backends, prom, vm = load_both(tmp_path, series, gpus=1)
    try:
        for url in (prom.url, vm.url):
            r = fetch_json(url)
            (w,) = r["workloads"]
            assert "scale-to-zero" not in {x["kind"] for x in w["recommendations"]}, (url, w["recommendations"])
            (warm,) = [x for x in w["recommendations"] if x["short"] == "keep 1 warm"]
            e = warm["evidence"]
            assert (e["cold_start_seconds"], e["cold_start_source"]) == (90.0, "measured (p95 of 1 pods)"), e
            assert e["wakeups_per_day"] == pytest.approx(4.0) and e["added_latency_seconds_per_day"] == pytest.approx(
                360.0
            )
    finally:
        asyncio.run(backends.stop())


PER_GPU_DOWNSIZING = {"fewer-gpus", "smaller-gpu", "mig-profile", "time-slicing", "scale-to-zero"}


def test_a_production_shaped_fleet_gets_honest_hours_exact_percentiles_and_no_unsafe_advice(tmp_path):
    """135 pods shaped like the production trace that fooled an earlier report (tests/report/production.py), in
    Prometheus and VictoriaMetrics: every workload's hours, coverage and p99 equal numpy's over the raw samples,
    both servers tell the same story, and no busy workload is told to shrink."""
    from tests.report.production import production_fleet

    fleet_ = production_fleet(end=END, hours=HOURS)
    backends, prom, vm = load_both(tmp_path, fleet_.series, gpus=fleet_.gpus)
    try:
        stories, raws = {}, {}
        for url in (prom.url, vm.url):
            r = raws[url] = fetch_json(url)
            by_name = {w["name"]: w for w in r["workloads"]}
            assert set(by_name) == set(fleet_.raw), url
            for name, pods in fleet_.raw.items():
                w, samples = by_name[name], np.concatenate(pods)
                hours = samples.size / 60  # one GPU per pod, one sample a minute
                assert w["cost"]["allocated_hours"] == pytest.approx(hours, abs=1e-3), (url, name)
                p99 = float(np.quantile(samples, 0.99, method="higher"))  # the independent computation
                if p99 >= 0.5:
                    assert w["busy"], (url, name, p99)
                if w["busy"]:
                    kinds = {x["kind"] for x in w["recommendations"]}
                    assert not kinds & PER_GPU_DOWNSIZING, (url, name, fleet_.shapes[name], w["recommendations"])
                for rec in w["recommendations"]:
                    key = "activity_p99_percent"
                    if key in rec["evidence"] and rec["evidence"][key] is not None:
                        assert rec["evidence"][key] == pytest.approx(p99 * 100, abs=0.01), (url, name, rec)
                wake = {x["short"]: x["evidence"] for x in w["recommendations"] if "wakeups_per_day" in x["evidence"]}
                if fleet_.shapes[name] in ("wakeups", "rare-wakeup") and not w["busy"] and pods[0].size == HOURS * 60:
                    # 3 wake-ups in 6 h: 12 a day × 45 s over the 5-min budget; 1: 4 a day × 45 s within it
                    (short, e), three = next(iter(wake.items())), fleet_.shapes[name] == "wakeups"
                    assert e["wakeups_per_day"] == pytest.approx(12.0 if three else 4.0), (url, name, e)
                    assert short == "keep 1 warm" if three else short.startswith("scale-to-zero"), (url, name, short)
                if len(pods) == 1:
                    sampled = len(pods[0])
                    span = w["history_seconds"] / 60
                    assert w["coverage"] == pytest.approx(sampled / span, abs=2e-3), (url, name, w["coverage"])
            (gen_rec,) = [x for x in by_name["gen"]["recommendations"] if x["kind"] == "replicas"]
            demand = fleet_.demand["gen"]
            p99_demand = float(np.quantile(demand[demand > 0], 0.99, method="higher"))
            assert gen_rec["evidence"]["recommended"] == int(np.ceil(p99_demand * 1.15 / 0.6)), gen_rec
            assert gen_rec["evidence"]["current_pods_peak"] <= 100
            stories[url] = {
                name: (w["cost"]["allocated_hours"], w["busy"], sorted(x["kind"] for x in w["recommendations"]))
                for name, w in by_name.items()
            }
        assert stories[prom.url] == stories[vm.url]
        for name, (hours, is_busy, kinds) in sorted(stories[prom.url].items()):
            print(f"{name:8} {fleet_.shapes[name]:15} {hours:8.3f} h  busy={is_busy!s:5} {','.join(kinds)}")
        for name, url in (("prometheus", prom.url), ("victoria-metrics", vm.url)):
            raw = {w["name"]: w for w in raws[url]["workloads"]}
            started = time.monotonic()
            summary = fetch_json(url, "--mode", "summary")
            print(f"summary mode on {name}: {time.monotonic() - started:.1f} s")
            check_summary_against_samples(name, summary, raw, fleet_)
    finally:
        asyncio.run(backends.stop())


def exact_signals(activity: np.ndarray) -> dict[str, np.ndarray]:
    """The signals the production fleet exports for an activity (tests/report/production.py), in report units."""
    return {
        "activity_percent": activity * 100,
        "sm_active_percent": activity * 100,
        "gpu_util_percent": np.where(activity > 0.01, 100.0, 0.0),
    }


def check_summary_against_samples(
    server: str, summary: dict, raw: dict[str, dict], fleet_, *, namespace: str = "serve"
) -> dict[str, float]:
    """The done-when of issue 37 for one server: summary mode's hours within 5 % of the samples for at least 95 % of
    the workloads and 15 % for all, every shown percentile within 2 points of numpy's exact one (and never below
    it), the same busy flags and recommendation kinds as raw mode, and a replica count for the pooled owner.
    Prints the figures and returns them."""
    assert summary["mode"] == "summary"
    by_name = {w["name"]: w for w in summary["workloads"] if w["namespace"] == namespace}
    assert set(by_name) == set(fleet_.raw), server
    hour_errors, pct_errors, below, disagree = [], [], [], []
    for name, pods in fleet_.raw.items():
        w, samples = by_name[name], np.concatenate(pods)
        hours = samples.size / 60  # one sample a minute, one GPU per pod
        hour_errors.append(abs(w["cost"]["allocated_hours"] - hours) / hours)
        for signal, values in exact_signals(samples).items():
            for key, q in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99)):
                exact, shown = float(np.quantile(values, q)), w["signals"][signal][key]
                pct_errors.append(abs(shown - exact))
                if shown < exact - 0.0051:  # NB: the report rounds to 0.01
                    below.append((name, signal, key, shown, exact))
        r = raw[name]
        mine = (w["busy"], sorted({x["kind"] for x in w["recommendations"]}))
        theirs = (r["busy"], sorted({x["kind"] for x in r["recommendations"]}))
        if mine != theirs:
            disagree.append((name, mine, theirs))
    errors = np.array(hour_errors)
    figures = {
        "workloads": len(errors),
        "hours_within_5pct": float((errors <= 0.05).mean()),
        "hours_worst_error": float(errors.max()),
        "percentiles": len(pct_errors),
        "percentile_worst_points": float(max(pct_errors)),
        "percentiles_over_2_points": int(sum(e > 2.0 for e in pct_errors)),
        "verdicts_disagreeing": len(disagree),
    }
    print(f"issue 37 done-when, {server}: {figures}")
    assert not disagree, (server, disagree)
    assert not below, (server, below)
    assert figures["hours_within_5pct"] >= 0.95 and figures["hours_worst_error"] <= 0.15, (server, figures)
    assert figures["percentiles_over_2_points"] == 0, (server, figures)
    (replicas,) = [x for x in by_name["gen"]["recommendations"] if x["kind"] == "replicas"]
    assert 1 <= replicas["evidence"]["recommended"] < 100, replicas
    return figures
