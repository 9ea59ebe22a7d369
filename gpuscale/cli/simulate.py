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
import time
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator
from rich.console import Console
from rich.table import Table

from gpuscale.cli.run_coroutine import run_coroutine
from gpuscale.config import Seconds, parse_instant
from gpuscale.errors import ConfigError, SourceUnavailable
from gpuscale.files import CONFIG_LIMIT_BYTES, DATA_LIMIT_BYTES, read_text
from gpuscale.hpa import SYNC_PERIOD_SECONDS, Readiness, parse_manifests
from gpuscale.hpa.replicas import CPU_INITIALIZATION_PERIOD_SECONDS, INITIAL_READINESS_DELAY_SECONDS
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.demand import DemandSettings
from gpuscale.metrics.forecast import MODELS
from gpuscale.policy_files import check_policies_dir
from gpuscale.replay.budget import check_grid
from gpuscale.replay.distributions import Distribution, parse_distribution
from gpuscale.replay.general import ServiceProfile
from gpuscale.replay.metric_history import (
    MetricHistory,
    Series,
    check_history,
    history_from_samples,
    parse_history_csv,
    parse_series_csv,
    promql_for,
    replay_history,
)
from gpuscale.replay.results import SCHEMA, Outcome, latency_column
from gpuscale.replay.served_forecast import FORECAST_COLUMNS, forecast_series
from gpuscale.replay.serving import ServingProfile
from gpuscale.replay.signals import CpuProfile, check_metrics
from gpuscale.replay.trace_replay import ReplaySettings, check_budget, replay
from gpuscale.replay.traces import MAX_ROWS, Trace, read_trace
from gpuscale.settings import CatalogueFiles, CommandSettings, Logging, PrometheusConnection, group
from gpuscale.sources.promapi import PrometheusClient, TooManySamples

_PROFILE = ServingProfile()
_CPU = CpuProfile()


class SimulateSettings(CommandSettings):
    # NB: no NaN or ±Infinity in any number: one would reach the results and make `-o json` print invalid JSON
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    hpa: list[str] = Field(default_factory=list, description="autoscaling/v2 HPA manifest (repeatable)")
    trace: str | None = Field(
        None, description="request trace: Azure LLM CSV, Mooncake JSONL, or CSV timestamp,input_tokens,output_tokens"
    )
    history: str | None = Field(None, description="metric history instead of a trace: CSV timestamp,pod,metric,value")
    prometheus: PrometheusConnection = group(
        lambda: PrometheusConnection(timeout=60.0),
        url="metric history from this Prometheus (range queries)",
        timeout="deadline of one metric's range query, its answer included",
    )
    history_end: str | None = Field(
        None, description="end of the Prometheus history: Unix seconds, RFC 3339 or now-2h (default: now)"
    )
    history_span: Seconds = Field(3600.0, gt=0, description="length of the Prometheus history")
    history_step: Seconds = Field(15.0, gt=0, description="resolution of the Prometheus range queries")
    query: list[str] = Field(
        default_factory=list, description="METRIC=PROMQL giving per-pod values (default: from the catalogue)"
    )
    conserve_load: bool = Field(
        True, description="history: spread the observed load over the replicas the HPA decides (else replay as seen)"
    )
    output: Literal["table", "json"] = Field("table", description="table or json (schema: gpuscale.simulate/v2)")
    html: str | None = Field(None, description="also write a self-contained HTML chart to this file")
    rate_scale: float = Field(
        1.0, gt=0, description="offer this many times the trace's requests (same arrival pattern)"
    )
    seed: int = Field(0, description="seed of --rate-scale's fractional repeats")
    start: Seconds = Field(0.0, ge=0, description="skip this much of the trace")
    duration: Seconds | None = Field(None, gt=0, description="replay only this much of the trace")
    startup: str = Field(
        "180s",
        description="model load before a new replica is ready: 180s, exp:mean=60s, lognormal:p50=23s,p95=45s, @f.csv",
    )
    service_time: str | None = Field(
        None,
        description="general service model: each request's service time (same syntax as --startup); "
        "default: the trace's service_time column, else the LLM token model",
    )
    concurrency: int = Field(1, ge=1, description="general service model: requests one replica serves at once")
    swap_time: str | None = Field(
        None, description="general service model: loading a model (trace column 'model') a replica has not loaded"
    )
    models_per_replica: int = Field(1, ge=1, description="general service model: models a replica keeps loaded (LRU)")
    external: list[str] = Field(
        default_factory=list, description="NAME=@file.csv (timestamp,value): an External metric fed to the HPAs"
    )
    forecast_capacity: float | None = Field(
        None,
        gt=0,
        description="requests/s one replica serves (the capacity annotation): for an HPA naming "
        "forecast_desired_replicas, computed from the trace as the adapter would serve it",
    )
    forecast_horizon: Seconds | None = Field(
        None, gt=0, description="the forecast's horizon (default: the median --startup, as the adapter measures it)"
    )
    forecast_model: str = Field("holt", description="forecast model: naive, seasonal_naive, ses, holt, seasonal_holt")
    initial_replicas: int | None = Field(None, ge=1, description="replicas at the start (default: minReplicas)")
    slo_queue: Seconds = Field(2.0, gt=0, description="SLO: queue time a minute's requests may wait...")
    slo_quantile: float = Field(0.95, gt=0, lt=1, description="...at this quantile")
    refresh_interval: Seconds = Field(5.0, gt=0, description="the adapter's refresh interval (metric delay)")
    step: Seconds = Field(0.25, gt=0, le=1.0, description="simulation step")
    prefill_ms_per_token: float = Field(_PROFILE.prefill_s_per_token * 1e3, ge=0, description="prefill cost")
    decode_iteration_ms: float = Field(_PROFILE.decode_iteration_s * 1e3, ge=0, description="decode iteration cost")
    max_batch: int = Field(_PROFILE.max_batch, ge=1, description="running sequences per replica")
    kv_cache_tokens: int = Field(_PROFILE.kv_capacity_tokens, ge=1, description="KV cache per replica, tokens")
    gpus_per_replica: int = Field(_PROFILE.gpus_per_replica, ge=1, description="GPUs per replica (GPU-hours)")
    initial_readiness_delay: Seconds = Field(
        INITIAL_READINESS_DELAY_SECONDS,
        ge=0,
        description="the HPA controller's --horizontal-pod-autoscaler-initial-readiness-delay (cpu metrics only)",
    )
    cpu_initialization_period: Seconds = Field(
        CPU_INITIALIZATION_PERIOD_SECONDS,
        ge=0,
        description="the HPA controller's --horizontal-pod-autoscaler-cpu-initialization-period (cpu metrics only)",
    )
    cpu_request: float = Field(_CPU.request_cores, gt=0, description="cpu Resource metric: a replica's request, cores")
    cpu_loading: float = Field(_CPU.loading_cores, ge=0, description="cpu a replica uses while loading its model")
    cpu_idle: float = Field(_CPU.idle_cores, ge=0, description="cpu a ready replica uses with its GPU idle")
    cpu_busy: float = Field(_CPU.busy_cores, ge=0, description="cpu a ready replica uses with its GPU busy")
    files: CatalogueFiles = group(
        CatalogueFiles,
        config="metric catalogue YAML (default: the shipped one)",
        policies="directory whose metrics.yaml overrides the shipped one",
    )
    logging: Logging = group(lambda: Logging(log_level="warning"))

    @model_validator(mode="after")
    def _check(self) -> SimulateSettings:
        if not self.hpa:
            raise ValueError("hpa: give at least one HPA manifest (--hpa FILE)")
        sources = {"trace": self.trace, "history": self.history, "prometheus_url": self.prometheus.url}
        given = [f for f, value in sources.items() if value]
        if not given:
            raise ValueError(
                "trace: give a request trace (--trace FILE) or a metric history (--history, --prometheus-url)"
            )
        if len(given) > 1:
            raise ValueError(f"{given[1].replace('_', '-')}: give one of --trace, --history or --prometheus-url")
        for q in self.query:
            if "=" not in q:
                raise ValueError(f"query: expected METRIC=PROMQL (got {q!r})")
        if self.forecast_model not in MODELS:
            raise ValueError(f"forecast-model: unknown model {self.forecast_model!r}; valid: {', '.join(MODELS)}")
        for e in self.external:
            if "=@" not in e:
                raise ValueError(f"external: expected NAME=@file.csv (got {e!r})")
        if self.trace is None:
            general = ("service_time", "swap_time")
            for name in general:
                if getattr(self, name) is not None:
                    raise ValueError(f"{name}: only with --trace (a metric history has no requests to serve)")
        return self

    def profile(self, trace: Trace) -> ServingProfile | ServiceProfile:
        """The general service model when there are service times (column or --service-time), else the LLM one."""
        if trace.service_s is not None or self.service_time is not None:
            return ServiceProfile(
                concurrency=self.concurrency,
                gpus_per_replica=self.gpus_per_replica,
                models_per_replica=self.models_per_replica,
            )
        return ServingProfile(
            prefill_s_per_token=self.prefill_ms_per_token / 1e3,
            decode_iteration_s=self.decode_iteration_ms / 1e3,
            max_batch=self.max_batch,
            kv_capacity_tokens=self.kv_cache_tokens,
            gpus_per_replica=self.gpus_per_replica,
        )

    def replay_settings(self) -> ReplaySettings:
        startup = parse_distribution(self.startup, flag="--startup")
        return ReplaySettings(
            startup_s=startup.mean,
            startup=startup,
            service_time=parse_distribution(self.service_time, flag="--service-time") if self.service_time else None,
            swap_time=parse_distribution(self.swap_time, flag="--swap-time") if self.swap_time else None,
            seed=self.seed,
            step_s=self.step,
            refresh_s=self.refresh_interval,
            initial_replicas=self.initial_replicas,
            slo_queue_s=self.slo_queue,
            slo_quantile=self.slo_quantile,
            readiness=Readiness(
                cpu_initialization_period_s=self.cpu_initialization_period,
                initial_readiness_delay_s=self.initial_readiness_delay,
            ),
            cpu=CpuProfile(
                request_cores=self.cpu_request,
                loading_cores=self.cpu_loading,
                idle_cores=self.cpu_idle,
                busy_cores=self.cpu_busy,
            ),
        )


def load_hpas(paths: list[str]) -> list[tuple[str, HorizontalPodAutoscaler]]:
    out = []
    for path in paths:
        text = read_text(path, limit_bytes=CONFIG_LIMIT_BYTES, what="HPA manifest")
        out.extend((path, hpa) for hpa in parse_manifests(text, source=path))
    return out


def run_simulate(settings: SimulateSettings) -> dict:
    """The whole report as the JSON document (schema ``gpuscale.simulate/v2``)."""
    files = settings.files
    if files.policies:
        check_policies_dir(files.policies)
    catalogue = load_catalogue(files.config, policies=files.policies)
    hpas = load_hpas(settings.hpa)
    if settings.trace is None:
        return run_history(settings, hpas, catalogue)
    externals = read_externals(settings.external)
    trace = read_trace(settings.trace).window(start_s=settings.start, duration_s=settings.duration)
    if not len(trace):
        raise ConfigError("no requests in the chosen window (--start/--duration)", path=settings.trace)
    if len(trace) * settings.rate_scale > MAX_ROWS:
        raise ConfigError(
            f"--rate-scale {settings.rate_scale:g}: {len(trace):,} requests × {settings.rate_scale:g} is more than "
            f"the {MAX_ROWS:,} requests a replay may take"
        )
    trace = trace.scaled(settings.rate_scale, seed=settings.seed)
    profile, replay_settings = settings.profile(trace), settings.replay_settings()
    externals.update(served_forecasts(settings, hpas, trace, replay_settings, given=frozenset(externals)))
    check_metrics(hpas, catalogue, external=frozenset(externals))
    if settings.swap_time and trace.model is None:
        raise ConfigError("--swap-time needs a trace with a 'model' column", path=settings.trace)
    for source, hpa in hpas:
        check_budget(trace, hpa, profile=profile, settings=replay_settings, trace_source=settings.trace, source=source)
    outcomes = [
        replay(
            trace,
            hpa,
            catalogue=catalogue,
            profile=profile,
            settings=replay_settings,
            source=source,
            externals=externals,
        )
        for source, hpa in hpas
    ]
    per_minute = np.bincount((trace.arrival_s // 60).astype(np.int64)) / 60.0
    return document(
        trace_name=trace.name,
        requests_per_s_by_minute=[round(float(v), 4) for v in per_minute],
        requests=len(trace),
        duration_s=trace.duration_s,
        profile=profile,
        settings=replay_settings,
        outcomes=outcomes,
        rate_scale=settings.rate_scale,
        seed=settings.seed,
    )


def document(*, trace_name, requests, duration_s, profile, settings, outcomes: list[Outcome], **extra) -> dict:
    from dataclasses import asdict, fields, is_dataclass

    # NB: distributions are written as the user wrote them (a file's samples would not belong in the JSON)
    described = {f.name: getattr(settings, f.name) for f in fields(settings)}
    described = {
        k: v.text if isinstance(v, Distribution) else asdict(v) if is_dataclass(v) else v for k, v in described.items()
    }
    return {
        "schema": SCHEMA,
        "trace": {"name": trace_name, "requests": requests, "duration_s": round(duration_s, 3), **extra},
        "model": "general" if isinstance(profile, ServiceProfile) else "llm",
        "profile": asdict(profile),
        "settings": described,
        "results": [o.to_json() for o in outcomes],
    }


def served_forecasts(
    settings: SimulateSettings,
    hpas: list[tuple[str, HorizontalPodAutoscaler]],
    trace: Trace,
    replay_settings: ReplaySettings,
    *,
    given: frozenset[str],
) -> dict[str, Series]:
    """The adapter's forecast metrics the HPAs name (Object or External; not given by --external), computed from
    the trace as the adapter's DemandBook would serve them (replay/served_forecast.py): horizon the median
    start-up, the capacity --forecast-capacity."""
    named = [
        (source, i, spec.metric_name)
        for source, hpa in hpas
        for i, spec in enumerate(hpa.spec.metrics)
        if spec.type in ("Object", "External") and spec.metric_name in FORECAST_COLUMNS
    ]
    wanted = sorted({name for *_, name in named} - given)
    if not wanted:
        return {}
    if "forecast_desired_replicas" in wanted and settings.forecast_capacity is None:
        source, i, _ = next(n for n in named if n[2] == "forecast_desired_replicas")
        raise ConfigError(
            f"spec.metrics[{i}] names forecast_desired_replicas (the p90 forecast ÷ capacity per replica): give "
            "--forecast-capacity REQUESTS_PER_SECOND (what one replica serves at your latency target)",
            path=source,
        )
    horizon = settings.forecast_horizon or replay_settings.startup.median
    return forecast_series(
        trace.arrival_s,
        wanted,
        horizon_s=horizon,
        capacity=settings.forecast_capacity,
        origin=trace.origin,
        settings=DemandSettings(model=settings.forecast_model),
    )


def read_externals(specs: list[str]) -> dict[str, Series]:
    """``--external NAME=@file.csv`` → name → (times, values), times as the trace's (seconds, or ISO 8601)."""
    out = {}
    for spec in specs:
        name, _, path = spec.partition("=@")
        try:
            text = read_text(path, limit_bytes=DATA_LIMIT_BYTES, what="series")
        except ConfigError as e:
            raise ConfigError(f"--external {name}: {str(e).removeprefix(f'{e.path}: ')}", path=e.path) from None
        out[name.strip()] = parse_series_csv(text, source=path)
    return out


def run_history(settings: SimulateSettings, hpas: list[tuple[str, HorizontalPodAutoscaler]], catalogue) -> dict:
    externals = read_externals(settings.external)
    for source, hpa in hpas:
        for i, spec in enumerate(hpa.spec.metrics):
            if spec.type == "External" and spec.metric_name in externals:
                continue
            if spec.type == "Resource":
                raise ConfigError(
                    f"spec.metrics[{i}].resource: a metric history replays Pods, Object and External metrics; "
                    "a Resource metric's samples count by the pods' start and readiness times, which a history "
                    "does not have (replay it with --trace)",
                    path=source,
                )
            if catalogue.get(spec.metric_name) is None:
                kind = spec.type.lower()
                raise ConfigError(
                    f"spec.metrics[{i}].{kind}.metric.name: {spec.metric_name!r} is not in the metric catalogue",
                    path=source,
                )
    if settings.history:
        text = read_text(settings.history, limit_bytes=DATA_LIMIT_BYTES, what="metric history")
        history, name = parse_history_csv(text, source=settings.history), settings.history
    else:
        history = run_coroutine(_prometheus_history(settings, hpas, catalogue, skip=frozenset(externals)))
        name = settings.prometheus.url
    history = history.with_external(externals)
    check_history(history, hpas, source=name)
    for source, hpa in hpas:
        check_grid(
            span_s=history.end - history.start,
            step_s=SYNC_PERIOD_SECONDS,
            max_replicas=hpa.spec.max_replicas,
            trace=name,
            hpa=source,
        )
    outcomes = [
        replay_history(
            history, hpa, source=source, conserve=settings.conserve_load, initial_replicas=settings.initial_replicas
        )
        for source, hpa in hpas
    ]
    return {
        "schema": SCHEMA,
        "mode": "history",
        "history": {
            "source": name,
            "start": history.start,
            "duration_s": round(history.end - history.start, 3),
            "metrics": sorted(history.series),
            "conserve_load": settings.conserve_load,
        },
        "results": [o.to_json() for o in outcomes],
    }


async def _prometheus_history(settings: SimulateSettings, hpas, catalogue, *, skip: frozenset[str]) -> MetricHistory:
    overrides = dict(q.split("=", 1) for q in settings.query)
    names = sorted({spec.metric_name for _, hpa in hpas for spec in hpa.spec.metrics} - skip)
    end = _instant(settings.history_end) if settings.history_end else time.time()
    start = end - settings.history_span
    samples: dict[str, dict[str, list[tuple[float, float]]]] = {}
    # NB: the same client, TLS and authentication as the adapter's (--prometheus-*), its answers capped in size
    client = PrometheusClient.connect(settings.prometheus)
    try:
        for name in names:
            definition = catalogue.get(name)
            promql = overrides.get(name) or promql_for(definition, window_s=catalogue.window(definition))
            try:
                result = await client.query_range(promql, start=start, end=end, step=settings.history_step)
            except (SourceUnavailable, TooManySamples) as e:
                reason = e.reason if isinstance(e, SourceUnavailable) else str(e)
                raise SourceUnavailable(client.display_url, f"range query for {name} failed: {reason}") from None
            for series in result:
                labels = series.get("metric") if isinstance(series, dict) else None
                pod = labels.get("pod") if isinstance(labels, dict) else None
                if isinstance(pod, str) and pod:
                    samples.setdefault(name, {})[pod] = _points(series.get("values"), client.display_url, name)
    finally:
        await client.close()
    if not samples:
        raise SourceUnavailable(
            client.display_url, f"no per-pod series of {', '.join(names)} between {start:.0f} and {end:.0f}"
        )
    return history_from_samples(samples)


def _points(values: object, url: str, name: str) -> list[tuple[float, float]]:
    """A range answer's ``[[t, "v"], …]`` as floats; SourceUnavailable for anything else (a hostile server)."""
    try:
        return [(float(t), float(v)) for t, v in values]  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise SourceUnavailable(url, f"range query for {name}: values are not [time, value] pairs") from None


def _instant(text: str) -> float:
    try:
        return parse_instant(text)
    except ValueError as e:
        raise ConfigError(f"--history-end: {e}") from None


def render_table(doc: dict, console: Console) -> None:
    if doc.get("mode") == "history":
        h = doc["history"]
        table = Table(
            title=f"{h['source']}: {h['duration_s'] / 60:.1f} min of {', '.join(h['metrics'])}", header_style="bold"
        )
        for col in ("HPA", "observed replica-h", "HPA replica-h", "max replicas", "up/down"):
            table.add_column(col, justify="left" if col == "HPA" else "right")
        for r in doc["results"]:
            table.add_row(
                r["hpa"],
                f"{r['observed_replica_hours']:.2f}",
                f"{r['hpa_replica_hours']:.2f}",
                str(r["max_replicas"]),
                f"{r['scale_ups']}/{r['scale_downs']}",
            )
        console.print(table)
        return
    trace = doc["trace"]
    slo = doc["settings"]
    table = Table(
        title=f"{trace['name']}: {trace['requests']} requests over {trace['duration_s'] / 60:.1f} min "
        f"(SLO: p{slo['slo_quantile'] * 100:g} queue time ≤ {slo['slo_queue_s']:g} s per minute)",
        header_style="bold",
    )
    latency = latency_column(doc)
    for col in ("HPA", "GPU-h", "queue p50 s", "p95 s", "p99 s", latency, "SLO min", "max pods", "up/down"):
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
    render_events(doc, console)


def render_events(doc: dict, console: Console, *, limit: int = 12) -> None:
    """Each manifest's first scaling events: when, from → to, why (the rest are in --output json / --html)."""
    for r in doc["results"]:
        events = r["events"]
        if not events:
            console.print(f"{r['hpa']}: no scaling events")
            continue
        table = Table(title=f"{r['hpa']}: scaling events", header_style="bold", title_justify="left")
        for col in ("min", "replicas", "reason", "metric value → proposal"):
            table.add_column(col, justify="right" if col in ("min", "replicas") else "left")
        for e in events[:limit]:
            table.add_row(f"{e['t'] / 60:.2f}", f"{e['from']} → {e['to']}", e["reason"], e["why"])
        if len(events) > limit:
            table.add_row("…", "", f"{len(events) - limit} more (--output json, --html)", "")
        console.print(table)


def main_simulate(settings: SimulateSettings) -> None:
    doc = run_simulate(settings)
    if settings.html:
        from gpuscale.replay.chart import write_html

        try:
            write_html(doc, settings.html)
        except OSError as e:
            raise ConfigError(f"--html {settings.html}: {e.strerror or e}") from e
    if settings.output == "json":
        try:
            text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
        except ValueError as e:  # NB: a NaN or Infinity would be invalid JSON: never printed, and a bug to fix
            raise ConfigError(f"the result holds a number JSON cannot carry ({e}); please report this command") from e
        sys.stdout.write(text + "\n")
    else:
        console = Console(width=max(Console().width, 110))
        render_table(doc, console)
        if settings.html:
            console.print(f"chart written to {settings.html}")
