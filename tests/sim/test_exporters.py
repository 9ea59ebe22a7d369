"""Simulated exporters: upstream text format, load → signal behaviour, queueing, placements, HTTP and faults.

Scope: ``gpuscale.sim.scenario`` and its parts (placements, names, Kubernetes objects), the load, signal
and queueing models (``sim.load``, ``sim.gpu_activity``, ``sim.device_gauges``, ``sim.serving_queue``) and
``gpuscale.sim.exporters`` (renderers, ``ClusterSim``, ``ExporterServer``, ``SimExporters``). The format tests compare against the fixtures in ``tests/fixtures`` through
``prometheus_client``'s parser, so they pin what a real scraper sees: family order, HELP, TYPE and the
order of label names. Time is a ``ManualClock`` everywhere; servers bind 127.0.0.1:0 and are stopped by
their fixtures.
"""

from __future__ import annotations

import asyncio
import math
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.sim.demo_cluster import demo_scenario
from gpuscale.sim.device_gauges import gpu_signals
from gpuscale.sim.exporters import (
    ClusterSim,
    ExporterServer,
    ManualClock,
    SimExporters,
    render_dcgm,
)
from gpuscale.sim.gpu_activity import A100_SXM4_80GB, H100_SXM
from gpuscale.sim.gpu_nodes import MIG_ALL_BALANCED, GpuSlot, SimNode
from gpuscale.sim.load import ConstantLoad, DiurnalLoad, PiecewiseLinearLoad, RepeatingLoad, StepLoad
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.serving_queue import TritonModel, advance_backlog, queue_wait_ratio, replica_queue, triton_rates
from gpuscale.sim.workloads import SimWorkload

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
H100_FIXTURE = (FIXTURES / "dcgm" / "dcgm-exporter-h100-8gpu.prom").read_text()
MIG_FIXTURE = (FIXTURES / "dcgm" / "dcgm-exporter-mig.prom").read_text()
TRITON_FIXTURE = (FIXTURES / "triton" / "triton.prom").read_text()

POD_LABELS = {"container", "namespace", "pod", "pod_uid"}
NODE = "ip-10-0-131-77.ec2.internal"
TRITON_MODELS = (
    TritonModel("resnet50_trt", "1", share=0.7, compute_infer_us=1560.0, max_batch_size=16),
    TritonModel("bert_qa_onnx", "2", share=0.3, compute_infer_us=10240.0),
)


def fixture_like_scenario(*, triton_load: float = 60.0, capacity: float = 100.0) -> Scenario:
    """One 8×H100 node shaped like the fixture: Triton, LLM, a 4-GPU trainer, a batch job, one idle GPU."""
    node = SimNode.build(NODE, seed=1, instance_type="p5.48xlarge")
    return Scenario(
        nodes=(node,),
        workloads=(
            SimWorkload(
                "inference",
                "triton-inference",
                container="triton-server",
                triton_models=TRITON_MODELS,
                capacity_rps=capacity,
                load=ConstantLoad(triton_load),
            ),
            SimWorkload(
                "nim",
                "llama3-8b-instruct",
                profile="llm-decode",
                container="nim-llm",
                capacity_rps=8,
                load=ConstantLoad(6),
            ),
            SimWorkload(
                "ml-training",
                "llm-finetune-worker",
                kind="StatefulSet",
                gpus_per_pod=4,
                profile="training",
                container="pytorch",
            ),
            SimWorkload(
                "ml-batch", "embeddings-batch", profile="batch-light", container="encoder", load=ConstantLoad(27)
            ),
        ),
        seed=1,
    )


def parse(text: str) -> list:
    return list(text_string_to_metric_families(text))


def samples(text: str) -> list:
    return [s for fam in parse(text) for s in fam.samples]


def by_gpu(text: str, family: str) -> dict[str, float]:
    return {s.labels["gpu"]: s.value for s in samples(text) if s.name == family}


def series_shapes(text: str) -> set[tuple[str, tuple[str, ...]]]:
    return {(s.name, tuple(s.labels)) for s in samples(text)}


def queue_compute_ratio(before: str, after: str) -> float:
    """rate(queue_duration_us) / rate(compute_infer_duration_us), summed per pod first (gpu-metrics.md §2)."""

    def totals(text: str) -> tuple[float, float]:
        q = c = 0.0
        for s in samples(text):
            if s.name == "nv_inference_queue_duration_us_total":
                q += s.value
            elif s.name == "nv_inference_compute_infer_duration_us_total":
                c += s.value
        return q, c

    (q0, c0), (q1, c1) = totals(before), totals(after)
    return (q1 - q0) / max(c1 - c0, 1.0)


# --- DCGM format -------------------------------------------------------------------------------------


@pytest.fixture
def fixture_like_text() -> str:
    sim = ClusterSim(fixture_like_scenario(), start=0.0)
    # GPU 5 as the fixture's faulty GPU, so the xid-labelled and multi-event shapes appear too.
    sim.override_gpu(NODE, 5, last_xid=63, xid_window=((94, 1), (63, 1)), clock_event_mask=0x2C)
    return sim.render_dcgm(NODE, now=30.0)


def test_dcgm_families_help_and_types_match_the_fixture_in_order(fixture_like_text: str) -> None:
    ours = [(f.name, f.documentation, f.type) for f in parse(fixture_like_text)]
    upstream = [(f.name, f.documentation, f.type) for f in parse(H100_FIXTURE)]
    assert ours == upstream
    meta = [line for line in fixture_like_text.splitlines() if line.startswith("#")]
    assert meta == [line for line in H100_FIXTURE.splitlines() if line.startswith("#")]


def test_dcgm_label_names_come_in_upstream_order(fixture_like_text: str) -> None:
    assert series_shapes(fixture_like_text) == series_shapes(H100_FIXTURE)


def test_dcgm_number_formatting_follows_field_types(fixture_like_text: str) -> None:
    def formats(text: str) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for line in text.splitlines():
            if not line.startswith("#"):
                name, value = line.split("{", 1)[0], line.rsplit(" ", 1)[1]
                out.setdefault(name, set()).add("%f" if re.fullmatch(r"-?\d+\.\d{6}", value) else "%d")
        return out

    assert formats(fixture_like_text) == formats(H100_FIXTURE)


def test_idle_gpus_carry_no_pod_labels_and_busy_ones_carry_empty_pod_uid(fixture_like_text: str) -> None:
    for s in samples(fixture_like_text):
        if s.labels["gpu"] == "7":  # nothing placed there
            assert not POD_LABELS & set(s.labels), s
        else:
            assert s.labels["pod_uid"] == "" and s.labels["pod"], s
    pods = {s.labels["gpu"]: s.labels.get("pod") for s in samples(fixture_like_text)}
    assert pods["5"] == "llm-finetune-worker-0"
    assert re.fullmatch(r"triton-inference-[4-9bcdf]{9,10}-[bcdfghjklmnpqrstvwxz2456789]{5}", pods["0"])


def test_dcgm_signals_encode_the_workload_profiles(fixture_like_text: str) -> None:
    util = by_gpu(fixture_like_text, "DCGM_FI_DEV_GPU_UTIL")
    sm = by_gpu(fixture_like_text, "DCGM_FI_PROF_SM_ACTIVE")
    dram = by_gpu(fixture_like_text, "DCGM_FI_PROF_DRAM_ACTIVE")
    mask = by_gpu(fixture_like_text, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    power = by_gpu(fixture_like_text, "DCGM_FI_DEV_POWER_USAGE")
    used = by_gpu(fixture_like_text, "DCGM_FI_DEV_FB_USED")
    free = by_gpu(fixture_like_text, "DCGM_FI_DEV_FB_FREE")
    reserved = by_gpu(fixture_like_text, "DCGM_FI_DEV_FB_RESERVED")
    # LLM decode: the utilisation trap.
    assert util["1"] >= 90 and sm["1"] < 0.5 and dram["1"] > 0.6
    # Training: SM busy, power-capped just under the 700 W limit.
    assert sm["2"] > 0.85 and mask["2"] == 0x4 and 690 <= power["2"] < 700
    # Inference at 60 % of capacity: util tracks load, SM below util.
    assert 55 <= util["0"] <= 65 and sm["0"] < util["0"] / 100
    # Idle GPU: clocks down, gpu_idle event, nothing in memory.
    assert util["7"] == 0 and mask["7"] == 0x1 and used["7"] == 0
    for gpu in util:
        assert used[gpu] + free[gpu] + reserved[gpu] == H100_SXM.fb_total_mib


@pytest.mark.parametrize(
    ("options", "present", "absent"),
    [
        ({"version": "4.5.3"}, {"UUID", "pod", "Hostname"}, {"pod_uid"}),
        ({"label_style": "pod_name"}, {"uuid", "pod_name", "pod_namespace", "container_name", "pod_uid"}, {"UUID"}),
        ({"hostname_label": "hostname"}, {"hostname"}, {"Hostname"}),
        ({"hostname_label": None}, {"UUID"}, {"Hostname", "hostname"}),
    ],
)
def test_dcgm_output_variants(options: dict, present: set[str], absent: set[str]) -> None:
    sim = ClusterSim(fixture_like_scenario(), start=0.0)
    text = sim.render_dcgm(NODE, now=1.0, **options)
    busy = [s for s in samples(text) if s.name == "DCGM_FI_DEV_SM_CLOCK" and s.labels["gpu"] == "0"]
    names = set(busy[0].labels)
    assert present <= names and not absent & names
    if options.get("label_style") == "pod_name":
        order = [n for n in busy[0].labels if n in {"container_name", "pod_name", "pod_namespace", "pod_uid"}]
        assert order == sorted(order)


def test_mig_instances_repeat_device_values_and_report_their_own_engines() -> None:
    node = SimNode.build("mig-node", hardware=A100_SXM4_80GB, gpu_count=2, mig={0: MIG_ALL_BALANCED})
    scenario = Scenario(
        nodes=(node,),
        workloads=(
            SimWorkload("inference", "asr", mig_profile="2g.20gb", capacity_rps=10, load=ConstantLoad(5)),
            SimWorkload("ml-dev", "notebook", mig_profile="1g.10gb", profile="idle", container="notebook"),
        ),
    )
    sim = ClusterSim(scenario, start=0.0)
    text = sim.render_dcgm("mig-node", now=10.0)
    power = [s for s in samples(text) if s.name == "DCGM_FI_DEV_POWER_USAGE" and s.labels["gpu"] == "0"]
    assert [s.labels["GPU_I_ID"] for s in power] == ["2", "3", "9", "10"]
    assert len({s.value for s in power}) == 1  # the parent's power on every instance series
    assert not [s for s in samples(text) if s.name == "DCGM_FI_DEV_GPU_UTIL" and "GPU_I_ID" in s.labels]
    engines = {
        s.labels["GPU_I_ID"]: s.value
        for s in samples(text)
        if s.name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE" and "GPU_I_ID" in s.labels
    }
    assert engines["3"] > 0.3 and engines["2"] == engines["9"] == engines["10"] == 0
    instance_pods = {s.labels["GPU_I_ID"]: s.labels.get("pod") for s in power}
    assert instance_pods["2"] is None and instance_pods["3"].startswith("asr-")
    assert instance_pods["9"].startswith("notebook-") and instance_pods["10"] is None
    # Instance series have the MIG fixture's label-name order in every family the fixture has.
    upstream = {shape for shape in series_shapes(MIG_FIXTURE) if "GPU_I_ID" in shape[1]}
    ours = {shape for shape in series_shapes(text) if "GPU_I_ID" in shape[1]}
    assert {shape for shape in ours if shape[0] in {name for name, _ in upstream}} == upstream


# --- load models and signals -------------------------------------------------------------------------


def test_load_models_are_deterministic_and_shaped_as_documented() -> None:
    assert ConstantLoad(12.5).rate_at(1e9) == 12.5
    step = StepLoad(((60.0, 500.0),), initial_rps=50.0)
    assert [step.rate_at(t) for t in (0, 59.9, 60, 600)] == [50, 50, 500, 500]
    trace = PiecewiseLinearLoad(((0, 0), (10, 100)))
    assert trace.rate_at(5) == pytest.approx(50) and trace.rate_at(99) == 100

    def diurnal_rates(seed: int) -> list[float]:
        load = DiurnalLoad(mean_rps=100, period_s=600, burst_every_s=100, burst_duration_s=20, seed=seed)
        return [load.rate_at(t) for t in range(0, 600, 2)]

    diurnal = DiurnalLoad(mean_rps=100, period_s=600, burst_every_s=100, burst_duration_s=20, seed=3)
    rates = diurnal_rates(3)
    assert rates == diurnal_rates(3) != diurnal_rates(4)
    assert min(rates) >= 0 and max(rates) > 140 and min(rates) < 70
    assert any(diurnal.burst_at(t) > 0 for t in range(0, 600, 2))
    with pytest.raises(ValueError, match="ascending"):
        StepLoad(((10, 1), (5, 2)))


def test_repeating_load_plays_its_period_again_and_again() -> None:
    ramp = PiecewiseLinearLoad(((100, 10), (130, 40), (160, 10)))
    looped = RepeatingLoad(ramp, start_s=100, period_s=60)
    assert looped.rate_at(50) == ramp.rate_at(50) == 10  # before the start: the inner load itself
    for t in (100, 115, 130, 159.5):
        for n in (1, 2, 7):
            assert looped.rate_at(t + n * 60) == pytest.approx(ramp.rate_at(t)), (t, n)
    assert looped.rate_at(190 + 60) == pytest.approx(40)  # the peak of the third pass
    with pytest.raises(ValueError, match="period_s"):
        RepeatingLoad(ramp, start_s=0, period_s=0)


def test_gpu_signals_follow_load_for_inference_but_not_for_the_util_trap() -> None:
    light = gpu_signals("inference", offered_rps=20, replicas=2, capacity_rps=100)
    heavy = gpu_signals("inference", offered_rps=180, replicas=2, capacity_rps=100)
    assert light.gpu_util_pct == 10 and heavy.gpu_util_pct == 90
    assert light.power_w < heavy.power_w and light.sm_active < heavy.sm_active
    decode = gpu_signals("llm-decode", offered_rps=1, replicas=1, capacity_rps=8)
    assert decode.gpu_util_pct == 100 and decode.sm_active < 0.5
    for s in (light, heavy, decode):
        assert 0 <= s.sm_active <= 1 and 0 <= s.dram_active <= 0.8 and 0 <= s.tensor_active <= 1


def test_queue_ratio_stays_below_one_under_capacity_and_grows_in_overload() -> None:
    assert queue_wait_ratio(0.3) < 0.05 and queue_wait_ratio(0.9) < 1 and queue_wait_ratio(1.0) == 1
    light = replica_queue(30, capacity_rps=100)
    rates = triton_rates(TRITON_MODELS, light)
    assert sum(r.queue_duration_us for r in rates.values()) < sum(r.compute_infer_duration_us for r in rates.values())
    queue = replica_queue(150, capacity_rps=100, timeout_s=2.0)
    backlogs = []
    for _ in range(5):
        backlogs.append(queue.backlog)
        queue = replica_queue(150, capacity_rps=100, backlog=advance_backlog(queue, 0.5), timeout_s=2.0)
    assert backlogs == sorted(backlogs) and backlogs[-1] > 0
    assert queue.served_rps == 100 and queue.rejected_rps == 0
    rates = triton_rates(TRITON_MODELS, queue)
    assert sum(r.queue_duration_us for r in rates.values()) > sum(r.compute_infer_duration_us for r in rates.values())
    full = replica_queue(150, capacity_rps=100, backlog=200, timeout_s=2.0)
    assert full.rejected_rps == pytest.approx(50)


# --- Triton format and counters ----------------------------------------------------------------------


def test_triton_text_has_upstream_families_and_both_label_shapes() -> None:
    sim = ClusterSim(fixture_like_scenario(), start=0.0)
    (pod,) = sim.triton_pods()
    text = sim.render_triton(pod.key, now=60.0)
    assert [(f.name, f.documentation, f.type) for f in parse(text)] == [
        (f.name, f.documentation, f.type) for f in parse(TRITON_FIXTURE)
    ]
    assert series_shapes(text) == series_shapes(TRITON_FIXTURE)
    gpu0 = sim.scenario.node(NODE).gpu(0).uuid
    success = {tuple(sorted(s.labels.items())): s.value for s in samples(text) if s.name.endswith("success_total")}
    assert success[(("gpu_uuid", gpu0), ("model", "resnet50_trt"), ("version", "1"))] > 0
    assert success[(("model", "resnet50_trt"), ("version", "1"))] == 0  # model-level shape


def test_triton_counters_increase_monotonically_as_the_clock_advances() -> None:
    sim = ClusterSim(fixture_like_scenario(triton_load=60.0), start=0.0)
    (pod,) = sim.triton_pods()
    previous: dict[tuple, float] = {}
    for now in (5.0, 5.0, 20.0, 21.5, 80.0, 79.0):  # repeats and a step backwards must not decrease anything
        current = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in parse(sim.render_triton(pod.key, now=now))
            if fam.type == "counter"
            for s in fam.samples
        }
        for key, value in previous.items():
            assert current[key] >= value, key
        previous = current
    total = sum(v for (name, labels), v in previous.items() if name == "nv_inference_request_success_total")
    assert total == pytest.approx(60.0 * 80.0, rel=0.01)


def test_overload_pushes_queue_compute_ratio_above_one_and_light_load_keeps_it_below() -> None:
    scenario = fixture_like_scenario(capacity=100.0).with_load(
        "inference/triton-inference", StepLoad(((60.0, 180.0),), initial_rps=30.0)
    )
    sim = ClusterSim(scenario, start=0.0)
    (pod,) = sim.triton_pods()
    t0, t1 = sim.render_triton(pod.key, now=10.0), sim.render_triton(pod.key, now=60.0)
    t2 = sim.render_triton(pod.key, now=120.0)
    assert queue_compute_ratio(t0, t1) < 1.0
    assert queue_compute_ratio(t1, t2) > 1.0
    pending = sum(s.value for s in samples(t2) if s.name == "nv_inference_pending_request_count")
    assert pending > 10


# --- placements and Kubernetes objects ---------------------------------------------------------------


def test_demo_scenario_places_pods_deterministically_and_spreads_replicas() -> None:
    scenario = demo_scenario()
    placements = scenario.placements()
    assert placements == demo_scenario().placements()
    bert = [p for p in placements if p.workload == "triton-bert"]
    assert len({p.node for p in bert}) == 3
    (trainer,) = [p for p in placements if p.workload == "llm-finetune-worker"]
    assert trainer.pod == "llm-finetune-worker-0" and len(trainer.gpu_indices) == 4
    assert all(p.scheduled for p in placements)
    mig = [p for p in placements if p.slots and p.slots[0].instance is not None]
    assert {p.workload for p in mig} == {"whisper-asr", "notebook"}
    used = sum(len(p.slots) for p in placements if p.slots[0].instance is None)
    assert used == 10  # 3 bert + 2 llama + 4 training + 1 batch; 14 of 24 H100s idle


def test_scaling_keeps_running_pods_in_place_and_never_reuses_deployment_pod_names() -> None:
    scenario = demo_scenario()
    before = scenario.placements()
    bigger = scenario.with_replicas("inference/triton-bert", 6)
    after = bigger.placements(keep=before)
    kept = {p.key: p for p in after}
    for p in before:
        assert kept[p.key].node == p.node and kept[p.key].slots == p.slots
    smaller = bigger.with_replicas("triton-bert", 2)
    down = smaller.placements(keep=after)
    bert_down = [p.ordinal for p in down if p.workload == "triton-bert"]
    assert bert_down == [0, 1]  # the newest pods go first
    removed = {p.key for p in after} - {p.key for p in down}
    again = smaller.with_replicas("triton-bert", 3).placements(keep=down, retired=removed)
    assert not {p.key for p in again} & removed
    pending = scenario.with_replicas("llm-finetune-worker", 4).placements(keep=before)
    assert any(not p.scheduled for p in pending if p.workload == "llm-finetune-worker")


def test_kube_objects_agree_with_dcgm_pod_labels_and_exporter_ports() -> None:
    scenario = demo_scenario()
    sim = ClusterSim(scenario, start=0.0)
    triton_ports = {p.key: 31000 + i for i, p in enumerate(sim.triton_pods())}
    exporter_ports = {n.name: 32000 + i for i, n in enumerate(scenario.nodes)}
    objects = sim.kube_objects(triton_ports=triton_ports, exporter_ports=exporter_ports)
    pods = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects if o["kind"] == "Pod"}
    uids = {o["metadata"]["uid"]: o for o in objects if o["kind"] in ("ReplicaSet", "StatefulSet", "DaemonSet")}
    seen = 0
    for node in scenario.nodes:
        for s in samples(sim.render_dcgm(node.name, now=1.0)):
            if "pod" not in s.labels:
                continue
            pod = pods[(s.labels["namespace"], s.labels["pod"])]
            assert pod["spec"]["nodeName"] == s.labels["Hostname"] == node.name
            assert pod["spec"]["containers"][0]["name"] == s.labels["container"]
            assert pod["status"]["phase"] == "Running" and pod["status"]["podIP"] == "127.0.0.1"
            owner = pod["metadata"]["ownerReferences"][0]
            assert owner["controller"] is True and uids[owner["uid"]]["metadata"]["name"] == owner["name"]
            assert pod["metadata"]["labels"]["app"] in s.labels["pod"]
            seen += 1
    assert seen > 100
    for key, port in triton_ports.items():
        ports = {p["name"]: p["containerPort"] for p in pods[key]["spec"]["containers"][0]["ports"]}
        assert ports["metrics"] == port
        assert pods[key]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    exporters = [o for o in objects if o["kind"] == "Pod" and o["metadata"]["namespace"] == "gpu-operator"]
    assert {o["spec"]["nodeName"] for o in exporters} == set(exporter_ports)
    for o in exporters:
        assert o["spec"]["hostNetwork"] is True
        assert o["spec"]["containers"][0]["ports"][0]["containerPort"] == exporter_ports[o["spec"]["nodeName"]]
    nodes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Node"}
    assert nodes[NODE]["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert nodes["ip-10-1-22-14.ec2.internal"]["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "4"
    deployment = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == "triton-bert")
    assert deployment["spec"]["selector"]["matchLabels"] == {"app": "triton-bert"}
    assert deployment["status"]["readyReplicas"] == 3


def test_render_dcgm_accepts_plain_gpu_index_keys() -> None:
    node = SimNode.build("n", gpu_count=2)
    signals = {i: gpu_signals("inference", offered_rps=50, replicas=1, capacity_rps=100) for i in (0, 1)}
    text = render_dcgm(node, signals, pods_by_gpu={1: ("ns", "pod-a", "c"), GpuSlot(0): ("ns", "pod-b", "c")})
    assert {s.labels["gpu"]: s.labels["pod"] for s in samples(text) if s.name == "DCGM_FI_DEV_GPU_UTIL"} == {
        "0": "pod-b",
        "1": "pod-a",
    }


# --- HTTP servers and faults -------------------------------------------------------------------------


@pytest.fixture
async def exporters() -> AsyncIterator[tuple[SimExporters, ManualClock]]:
    clock = ManualClock(1_000.0)
    sim = SimExporters()
    await sim.start(demo_scenario(), clock=clock)
    try:
        yield sim, clock
    finally:
        await sim.stop()


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
        yield session


async def get(session: aiohttp.ClientSession, url: str, **kwargs) -> tuple[int, str]:
    async with session.get(url, **kwargs) as response:
        return response.status, await response.text()


async def test_every_exporter_answers_on_loopback_with_parseable_text(
    exporters: tuple[SimExporters, ManualClock], http: aiohttp.ClientSession
) -> None:
    sim, clock = exporters
    assert len(sim.dcgm_urls) == 4 and len(sim.triton_urls) == 3
    assert len(set(sim.ports.values())) == 7
    for url in [*sim.dcgm_urls.values(), *sim.triton_urls.values()]:
        assert url.startswith("http://127.0.0.1:")
        status, text = await get(http, url)
        assert status == 200 and parse(text)
    key = next(iter(sim.triton_urls))
    first = samples((await get(http, sim.triton_urls[key]))[1])
    clock.advance(30)
    second = samples((await get(http, sim.triton_urls[key]))[1])
    success = [
        (a.value, b.value)
        for a, b in zip(first, second, strict=True)
        if a.name == "nv_inference_request_success_total" and "gpu_uuid" in a.labels
    ]
    assert all(b > a for a, b in success)
    status, _ = await get(http, sim.dcgm_urls[NODE].replace("/metrics", "/other"))
    assert status == 404


async def test_fault_knobs(exporters: tuple[SimExporters, ManualClock], http: aiohttp.ClientSession) -> None:
    sim, _ = exporters
    url = sim.dcgm_urls[NODE]

    sim.set_faults(NODE, hang=True)
    with pytest.raises(asyncio.TimeoutError):
        await get(http, url, timeout=aiohttp.ClientTimeout(total=0.3))

    sim.set_faults(NODE, status=500)
    assert (await get(http, url))[0] == 500

    sim.set_faults(NODE, body="DCGM_FI_DEV_GPU_UTIL{gpu=0 oops\n")
    assert (await get(http, url)) == (200, "DCGM_FI_DEV_GPU_UTIL{gpu=0 oops\n")

    sim.set_faults(NODE, nan=True)
    _, text = await get(http, url)
    assert all(math.isnan(s.value) for s in samples(text))
    triton = next(iter(sim.triton_urls))
    sim.set_faults(triton, nan=True)
    _, text = await get(http, sim.triton_urls[triton])
    assert " Nan\n" in text and all(math.isnan(s.value) for s in samples(text))

    sim.set_faults(NODE, stream_bytes=3 * 1024 * 1024)
    async with http.get(url) as response:
        body = await response.read()
    assert len(body) == 3 * 1024 * 1024 and parse(body.decode()) == []

    sim.set_faults(NODE)
    assert (await get(http, url))[0] == 200
    assert sim.requests(NODE) == 6


async def test_set_replicas_starts_and_stops_triton_endpoints(
    exporters: tuple[SimExporters, ManualClock], http: aiohttp.ClientSession
) -> None:
    sim, clock = exporters
    seen: list[list[dict]] = []
    sim.add_listener(seen.append)
    before = dict(sim.triton_urls)
    clock.advance(10)
    await sim.set_replicas("inference/triton-bert", 5)
    assert len(sim.triton_urls) == 5 and set(before) < set(sim.triton_urls)
    new_key = next(k for k in sim.triton_urls if k not in before)
    assert (await get(http, sim.triton_urls[new_key]))[0] == 200
    pods = {o["metadata"]["name"] for o in seen[-1] if o["kind"] == "Pod"}
    assert new_key[1] in pods

    clock.advance(10)
    await sim.set_replicas("inference/triton-bert", 1)
    assert len(sim.triton_urls) == 1
    gone = before[next(k for k in before if k not in sim.triton_urls)]
    with pytest.raises(aiohttp.ClientConnectionError):
        await get(http, gone)

    sim.set_load("inference/triton-bert", ConstantLoad(1000.0))
    clock.advance(30)
    (url,) = sim.triton_urls.values()
    _, text = await get(http, url)
    pending = sum(s.value for s in samples(text) if s.name == "nv_inference_pending_request_count")
    assert pending > 0


async def test_a_retired_endpoint_serves_its_last_body_through_its_grace_then_closes() -> None:
    bodies = iter(["# first\nx 1\n", "# second\nx 2\n"])
    async with ExporterServer() as server, aiohttp.ClientSession() as session:
        await server.add("pod", lambda: next(bodies))
        url = server.url("pod")
        assert await get(session, url) == (200, "# first\nx 1\n")
        await server.retire("pod", after_s=0.5)
        assert "pod" not in server.names
        await server.add("pod", lambda: "# a new pod of the same name\n")  # the name is free at once
        # a scraper that listed the old URL before the pod went still gets an answer: the last body, not a 404
        assert await get(session, url) == (200, "# first\nx 1\n")
        await asyncio.sleep(0.8)
        with pytest.raises(aiohttp.ClientError):
            async with aiohttp.ClientSession() as fresh:  # NB: a new connection: the port is closed
                await get(fresh, url)


async def test_exporter_server_stops_promptly_with_hung_requests_and_frees_its_ports() -> None:
    server = ExporterServer()
    await server.start()
    port = await server.add("a", lambda: "# nothing\n")
    server.set_faults("a", hang=True)
    async with aiohttp.ClientSession() as session:
        hung = asyncio.ensure_future(session.get(server.url("a")))
        await asyncio.sleep(0.05)
        await asyncio.wait_for(server.stop(), timeout=3)
        response = await asyncio.wait_for(hung, timeout=3)
        assert response.status == 503
        response.release()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", port)) != 0
