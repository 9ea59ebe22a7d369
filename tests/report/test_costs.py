"""GPU-hours and cost per pool and namespace, idle nodes and incidents, against hand counts."""

from __future__ import annotations

import numpy as np
import pytest

from gpuscale.metrics.history import clean
from gpuscale.report.build import build_report
from gpuscale.report.formatters import formatter
from gpuscale.report.policy import load_report_policy
from gpuscale.report.summary import build_summary_report
from tests.report.histories import H100, add_pod, constant, history
from tests.report.test_summary_mode import summarise


@pytest.fixture(scope="module")
def policy():
    return load_report_policy()


def group(groups, name):
    (g,) = [g for g in groups if g.name == name]
    return g.cost


def test_idle_gpu_hours_equal_a_hand_count(policy):
    # 10 hours at 1-minute steps. Node a: a pod holds 2 GPUs for 10 h at SM 25 % → 20 GPU-h allocated,
    # 5 active, 15 idle. Node b (pool "spot"): another namespace holds 1 GPU for the first 4 h at SM 0 %,
    # then the GPU is free for 6 h → 4 h allocated, 0 active, 4 idle, 6 unallocated.
    h = history(hours=10)
    h.node_pools = {"node-a": "ondemand", "node-b": "spot"}
    add_pod(h, namespace="ml", pod="a", requests=2, gpus=2, values=constant(sm_active=0.25, gpu_util_percent=80))
    add_pod(h, namespace="web", pod="b", node="node-b", held=slice(0, 240), values=constant(sm_active=0.0))
    gpu_b = h.gpus[-1]
    gpu_b.values["sm_active"][240:] = 0.0  # sampled, but no pod holds it
    report = build_report(h, policy=policy, generated_at=0)
    price = policy.prices.per_gpu_hour(H100)

    ml, web = group(report.namespaces, "ml"), group(report.namespaces, "web")
    assert (ml.allocated_hours, ml.active_hours, ml.idle_hours) == (20.0, 5.0, 15.0)
    assert (web.allocated_hours, web.active_hours, web.idle_hours) == (4.0, 0.0, 4.0)
    spot = group(report.pools, "spot")
    assert (spot.allocated_hours, spot.unallocated_hours) == (4.0, 6.0)
    assert spot.idle_cost == pytest.approx(4 * price) and spot.unallocated_cost == pytest.approx(6 * price)
    assert report.total.idle_hours == 19.0
    assert report.total.idle_cost == pytest.approx(19 * price)
    # node-b: allocated 40 % of its time (< 50 %): not a requested-but-idle node; node-a is busy
    assert report.idle_nodes == []
    assert report.timeline[0].allocated_gpus == 3.0 and report.timeline[-1].allocated_gpus == 2.0
    assert report.timeline[0].active_gpus == pytest.approx(0.5)


def test_a_node_requested_but_idle_is_listed_with_its_idle_cost(policy):
    h = history(hours=10)
    add_pod(
        h, pod="held", gpus=8, node="node-z", values=constant(gpu_util_percent=0, sm_active=0.0, fb_used_mib=40_000)
    )
    report = build_report(h, policy=policy, generated_at=0)
    (node,) = report.idle_nodes
    assert (node.node, node.gpus, node.allocated_share, node.active_share) == ("node-z", 8, 1.0, 0.0)
    assert node.idle_hours == 80.0 and node.idle_cost == pytest.approx(80 * policy.prices.per_gpu_hour(H100))
    (w,) = report.workloads
    assert any(v.code == "idle-holding-memory" and v.share == 1.0 for v in w.verdicts)
    # summary mode applies the same rule to the same exact figures
    idle = policy.diagnosis.diagnosis.idle
    summary = build_summary_report(
        summarise(h, idle_busy_percent=idle.busy_percent, idle_sm_active=idle.sm_active), policy=policy, generated_at=0
    )
    assert summary.idle_nodes == report.idle_nodes


def test_an_unpriced_product_shows_hours_and_no_cost(policy):
    h = history(hours=4)
    add_pod(h, pod="p", product="Some Future GPU", values=constant(sm_active=0.5))
    report = build_report(h, policy=policy, generated_at=0)
    assert report.total.allocated_hours == 4.0
    assert report.total.allocated_cost is None and report.total.unpriced_hours == 4.0


def test_gaps_nan_and_dcgm_blanks_are_unknown_time_not_idle_time(policy):
    h = history(hours=10)
    values = np.full(h.steps, 0.5)
    values[:300] = np.nan  # a 5 h gap
    values[300:360] = 9.223372036854775e18  # DCGM int64 blank
    values[360:420] = np.inf
    add_pod(h, pod="p", values=lambda g, t: {"sm_active": clean(values)})
    report = build_report(h, policy=policy, generated_at=0)
    assert report.total.allocated_hours == 3.0 and report.total.active_hours == 1.5
    assert any("samples in 30% of the window" in g for g in report.gaps)


def test_xid_ecc_and_throttling_become_incidents_and_a_counter_reset_does_not(policy):
    h = history(hours=2)
    xid = np.zeros(h.steps)
    xid[30:] = 79  # fell off the bus at minute 30 (the gauge keeps the last Xid)
    ecc = np.zeros(h.steps)
    ecc[40:] = 2
    ecc[50:] = 0  # driver reload: the counter resets, which is not -2 errors
    ecc[60:] = 1
    reasons = np.zeros(h.steps)
    reasons[10:20] = 0x40  # hw_thermal for 10 minutes
    reasons[20:40] = 0x4  # power_cap alone is normal
    add_pod(
        h,
        pod="p",
        values=lambda g, t: {
            "sm_active": np.full(t.shape, 0.5),
            "last_xid": xid,
            "ecc_dbe_volatile": ecc,
            "clock_event_reasons": reasons,
        },
    )
    report = build_report(h, policy=policy, generated_at=0)
    by_kind = {i.kind: i for i in report.incidents}
    assert set(by_kind) == {"xid", "ecc-dbe", "throttle"}
    assert by_kind["xid"].value == "79" and by_kind["xid"].count == 1 and by_kind["xid"].pod == "ml/p"
    assert by_kind["xid"].first_seen == h.start + 30 * 60
    assert by_kind["ecc-dbe"].count == 3  # +2, then +1 after the reset
    assert by_kind["throttle"].count == 10 and by_kind["throttle"].value == "hw_thermal"


def test_markdown_and_html_show_the_same_idle_nodes_table(policy):
    h = history(hours=10)
    add_pod(h, pod="held", gpus=8, node="node-z", values=constant(gpu_util_percent=0, sm_active=0.0))
    report = build_report(h, policy=policy, generated_at=0)
    (node,) = report.idle_nodes
    # past a thousand GPU-hours both say it with a thousands separator (html once printed 1234.5)
    report = report.model_copy(update={"idle_nodes": [node.model_copy(update={"idle_hours": 1234.5})]})
    cells = ["node-z", node.pool, "8", "100%", "0.0%", "1,234.5"]
    markdown = formatter("markdown")(report)
    page = formatter("html")(report)
    assert "| Node | Pool | GPUs | Allocated | Active | Idle GPU-h | Idle cost |" in markdown
    assert "| " + " | ".join(cells) + " | " in markdown
    assert "<th>Node</th><th>Pool</th><th>GPUs</th><th>Allocated</th><th>Active</th><th>Idle GPU-h</th>" in page
    assert "".join(f"<td>{c}</td>" for c in cells) in page
