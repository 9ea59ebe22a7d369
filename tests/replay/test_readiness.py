"""The HPA controller's readiness flags in the replay: they gate the cpu Resource metric only.

A replica loading its model for 6 minutes burns its whole cpu request (the CPU profile's loading cores). With
kube-controller-manager's defaults its samples do not count while it is not Ready (the cpu initialization
period, then the initial readiness delay: it has never been ready), so the HPA scales on the serving replicas'
cpu; with both flags at 0 the loading replicas' cpu counts as load and the HPA scales up on start-up alone.
The same flags change nothing for a Pods metric. History mode refuses a Resource metric with the reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from gpuscale.cli.main import main
from gpuscale.hpa import Readiness, parse_manifests
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.trace_replay import ReplaySettings, replay
from gpuscale.replay.traces import Trace

CPU_HPA = """apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: cpu}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 2
  maxReplicas: 10
  metrics:
    - type: Resource
      resource: {name: cpu, target: {type: Utilization, averageUtilization: 40}}
"""
QUEUE_HPA = CPU_HPA.replace(
    "type: Resource\n      resource: {name: cpu, target: {type: Utilization, averageUtilization: 40}}",
    'type: Pods\n      pods: {metric: {name: inference_batch_size}, target: {type: AverageValue, averageValue: "1"}}',
)
NO_DELAYS = Readiness(cpu_initialization_period_s=0, initial_readiness_delay_s=0)


def _trace() -> Trace:
    """20 minutes: quiet, then a step at 5 min that needs a third replica (cpu 2 replicas × ~1.1 cores / 4)."""
    t = np.concatenate([np.arange(0, 300, 2.0), np.arange(300, 1200, 0.25)])
    return Trace("step", t, np.full(len(t), 400), np.full(len(t), 60))


def _replay(manifest: str, readiness: Readiness):
    hpa = parse_manifests(manifest, source="hpa.yaml")[0]
    settings = ReplaySettings(startup_s=360.0, readiness=readiness, max_tail_s=60.0)
    return replay(_trace(), hpa, catalogue=load_catalogue(None), profile=ServingProfile(), settings=settings)


def test_loading_replicas_cpu_counts_only_without_the_readiness_flags():
    default = _replay(CPU_HPA, Readiness())
    flags_off = _replay(CPU_HPA, NO_DELAYS)
    first_up = default.events[0]
    assert first_up.t >= 300, default.events  # scaled when the load came, not on the loading replica's cpu
    # with the flags at 0, each new replica's start-up cpu (4 of 4 cores) counts as load: one scale-up feeds the next
    assert flags_off.events[0].t == first_up.t
    assert len(flags_off.events) > len(default.events), (default.events, flags_off.events)
    assert max(s.desired for s in flags_off.timeline) > max(s.desired for s in default.timeline)


def test_the_flags_change_nothing_for_a_pods_metric():
    default = _replay(QUEUE_HPA, Readiness())
    flags_off = _replay(QUEUE_HPA, NO_DELAYS)
    assert [(e.t, e.to_replicas) for e in default.events] == [(e.t, e.to_replicas) for e in flags_off.events]
    assert default.events  # the step does scale it


def test_flags_in_the_cli_and_json(tmp_path, capsys):
    trace, manifest = tmp_path / "t.csv", tmp_path / "hpa.yaml"
    t = _trace()
    trace.write_text(
        "timestamp,input_tokens,output_tokens\n"
        + "".join(f"{a:.2f},{i},{o}\n" for a, i, o in zip(t.arrival_s, t.input_tokens, t.output_tokens, strict=True))
    )
    manifest.write_text(CPU_HPA)
    args = ["simulate", "--trace", str(trace), "--hpa", str(manifest), "--startup", "360s", "--output", "json"]
    assert (
        main([*args, "--initial-readiness-delay", "0", "--cpu-initialization-period", "0", "--cpu-request", "8"]) == 0
    )
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["readiness"] == {"cpu_initialization_period_s": 0.0, "initial_readiness_delay_s": 0.0}
    assert doc["settings"]["cpu"]["request_cores"] == 8.0
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["settings"]["readiness"] == {"cpu_initialization_period_s": 300.0, "initial_readiness_delay_s": 30.0}


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--initial-readiness-delay=-1s"], "initial-readiness-delay"),
        (["--cpu-request", "0"], "cpu-request"),
    ],
)
def test_bad_flags_are_one_line_errors(tmp_path, capsys, flags, said):
    manifest = tmp_path / "hpa.yaml"
    manifest.write_text(CPU_HPA)
    assert main(["simulate", "--trace", "x.csv", "--hpa", str(manifest), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err


def test_history_mode_refuses_a_resource_metric(tmp_path, capsys):
    history, manifest = tmp_path / "h.csv", tmp_path / "hpa.yaml"
    history.write_text("timestamp,pod,metric,value\n0,p0,inference_queue_depth,1\n")
    manifest.write_text(CPU_HPA)
    assert main(["simulate", "--history", str(history), "--hpa", str(manifest)]) == 2
    err = capsys.readouterr().err
    assert "spec.metrics[0].resource" in err and "replay it with --trace" in err


def test_event_reasons_name_a_utilization_in_percent_and_survive_no_proposals():
    from gpuscale.hpa import Decision
    from gpuscale.hpa.autoscaler import Proposal
    from gpuscale.replay.trace_replay import _why

    hpa = parse_manifests(CPU_HPA, source="hpa.yaml")[0]
    assert _why(Decision(0.0, 2, 4, (Proposal("cpu", 4, 80),), "ReadyForNewScale"), hpa) == "cpu=80%→4"
    # out of [min, max] the controller clamps without asking the metrics: no proposals to explain
    assert _why(Decision(0.0, 12, 10, (), "Current number of replicas above Spec.MaxReplicas"), hpa) == ""
