"""`gpuscale simulate`: replay a request trace (or a metric history) through real HPA manifests, offline.

Trace mode: ``gpuscale simulate --trace TRACE --hpa A.yaml --hpa B.yaml`` runs the serving model with each
manifest's HPA in the loop and prints, per manifest, GPU-hours, queue time percentiles, minutes violating the
SLO and the scaling events (``--output json`` for the documented schema, ``--html FILE`` for a chart).
History mode: ``gpuscale simulate --history METRICS.csv --hpa A.yaml`` (or ``--prometheus-url``) replays what
a cluster really reported through the manifests' HPA algorithm.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from gpuscale.config import Seconds
from gpuscale.errors import ConfigError
from gpuscale.hpa import parse_manifests
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.replay.results import SCHEMA, Outcome
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.signals import check_metrics
from gpuscale.replay.simulate import ReplaySettings, replay
from gpuscale.replay.traces import read_trace

_PROFILE = ServingProfile()


class SimulateSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    hpa: list[str] = Field(default_factory=list, description="autoscaling/v2 HPA manifest (repeatable)")
    trace: str | None = Field(
        None, description="request trace: Azure LLM CSV, Mooncake JSONL, or CSV timestamp,input_tokens,output_tokens"
    )
    output: Literal["table", "json"] = Field("table", description="table or json (schema: gpuscale.simulate/v1)")
    html: str | None = Field(None, description="also write a self-contained HTML chart to this file")
    rate_scale: float = Field(
        1.0, gt=0, description="offer this many times the trace's requests (same arrival pattern)"
    )
    seed: int = Field(0, description="seed of --rate-scale's fractional repeats")
    start: Seconds = Field(0.0, ge=0, description="skip this much of the trace")
    duration: Seconds | None = Field(None, gt=0, description="replay only this much of the trace")
    startup: Seconds = Field(180.0, ge=0, description="model load: a new replica is ready this long after it starts")
    initial_replicas: int | None = Field(None, ge=1, description="replicas at the start (default: minReplicas)")
    slo_queue: Seconds = Field(2.0, gt=0, description="SLO: queue time a minute's requests may wait...")
    slo_quantile: float = Field(0.95, gt=0, lt=1, description="...at this quantile")
    refresh_interval: Seconds = Field(5.0, gt=0, description="the adapter's refresh interval (metric delay)")
    step: Seconds = Field(0.25, gt=0, le=1.0, description="simulation step")
    prefill_ms_per_token: float = Field(_PROFILE.prefill_s_per_token * 1e3, gt=0, description="prefill cost")
    decode_iteration_ms: float = Field(_PROFILE.decode_iteration_s * 1e3, gt=0, description="decode iteration cost")
    max_batch: int = Field(_PROFILE.max_batch, ge=1, description="running sequences per replica")
    kv_cache_tokens: int = Field(_PROFILE.kv_capacity_tokens, ge=1, description="KV cache per replica, tokens")
    gpus_per_replica: int = Field(_PROFILE.gpus_per_replica, ge=1, description="GPUs per replica (GPU-hours)")
    config: str | None = Field(None, description="metric catalogue YAML (default: the shipped one)")
    policies: str | None = Field(None, description="directory whose metrics.yaml overrides the shipped one")
    log_level: str = Field("warning", description="debug, info, warning or error")

    @model_validator(mode="after")
    def _check(self) -> SimulateSettings:
        if not self.hpa:
            raise ValueError("hpa: give at least one HPA manifest (--hpa FILE)")
        if not self.trace:
            raise ValueError("trace: give a request trace (--trace FILE)")
        return self

    def profile(self) -> ServingProfile:
        return ServingProfile(
            prefill_s_per_token=self.prefill_ms_per_token / 1e3,
            decode_iteration_s=self.decode_iteration_ms / 1e3,
            max_batch=self.max_batch,
            kv_capacity_tokens=self.kv_cache_tokens,
            gpus_per_replica=self.gpus_per_replica,
        )

    def replay_settings(self) -> ReplaySettings:
        return ReplaySettings(
            startup_s=self.startup,
            step_s=self.step,
            refresh_s=self.refresh_interval,
            initial_replicas=self.initial_replicas,
            slo_queue_s=self.slo_queue,
            slo_quantile=self.slo_quantile,
        )


def load_hpas(paths: list[str]) -> list[tuple[str, HorizontalPodAutoscaler]]:
    out = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as e:
            raise ConfigError(f"cannot read HPA manifest: {e.strerror}", path=path) from None
        out.extend((path, hpa) for hpa in parse_manifests(text, source=path))
    return out


def run_simulate(settings: SimulateSettings) -> dict:
    """The whole report as the JSON document (schema ``gpuscale.simulate/v1``)."""
    catalogue = load_catalogue(settings.config, policies=settings.policies)
    hpas = load_hpas(settings.hpa)
    check_metrics(hpas, catalogue)
    assert settings.trace is not None
    trace = read_trace(settings.trace).window(start_s=settings.start, duration_s=settings.duration)
    if not len(trace):
        raise ConfigError("no requests in the chosen window (--start/--duration)", path=settings.trace)
    trace = trace.scaled(settings.rate_scale, seed=settings.seed)
    profile, replay_settings = settings.profile(), settings.replay_settings()
    outcomes = [
        replay(trace, hpa, catalogue=catalogue, profile=profile, settings=replay_settings, source=source)
        for source, hpa in hpas
    ]
    return document(
        trace_name=trace.name,
        requests=len(trace),
        duration_s=trace.duration_s,
        profile=profile,
        settings=replay_settings,
        outcomes=outcomes,
        rate_scale=settings.rate_scale,
        seed=settings.seed,
    )


def document(*, trace_name, requests, duration_s, profile, settings, outcomes: list[Outcome], **extra) -> dict:
    from dataclasses import asdict

    return {
        "schema": SCHEMA,
        "trace": {"name": trace_name, "requests": requests, "duration_s": round(duration_s, 3), **extra},
        "profile": asdict(profile),
        "settings": asdict(settings),
        "results": [o.to_json() for o in outcomes],
    }


def render_table(doc: dict, console: Console) -> None:
    trace = doc["trace"]
    slo = doc["settings"]
    table = Table(
        title=f"{trace['name']}: {trace['requests']} requests over {trace['duration_s'] / 60:.1f} min "
        f"(SLO: p{slo['slo_quantile'] * 100:g} queue time ≤ {slo['slo_queue_s']:g} s per minute)",
        header_style="bold",
    )
    for col in ("HPA", "GPU-h", "queue p50 s", "p95 s", "p99 s", "TTFT p95 s", "SLO min", "max pods", "up/down"):
        table.add_column(col, justify="left" if col == "HPA" else "right")
    for r in doc["results"]:
        q = r["queue_time_s"]
        table.add_row(
            r["hpa"],
            f"{r['gpu_hours']:.2f}",
            f"{q['p50']:.2f}",
            f"{q['p95']:.2f}",
            f"{q['p99']:.2f}",
            f"{r['ttft_s']['p95']:.2f}",
            f"{r['slo']['violating_minutes']}/{r['slo']['minutes']}",
            str(r["max_replicas"]),
            f"{r['scale_ups']}/{r['scale_downs']}",
        )
    console.print(table)


def main_simulate(settings: SimulateSettings) -> None:
    doc = run_simulate(settings)
    if settings.html:
        from gpuscale.replay.chart import write_html

        write_html(doc, settings.html)
    if settings.output == "json":
        sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    else:
        console = Console(width=max(Console().width, 110))
        render_table(doc, console)
        if settings.html:
            console.print(f"chart written to {settings.html}")
