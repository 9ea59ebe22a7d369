"""`gpuscale backtest`: the adapter's served forecast on your own traffic, against what followed (issue 38).

The traffic is a request trace (any format ``simulate --trace`` reads), a recorded request rate (CSV
``timestamp,value``, requests/s, e.g. a Grafana export) or a Prometheus range query of the rate. It is walked
through the adapter's own DemandBook (replay/served_forecast.py): a trace's rate is read every 5 s over the last
60 s as the adapter reads ``inference_requests_per_second``; a recorded rate is read as recorded, one sample per
refresh. At each horizon it prints the served p90's pinball loss beside naive's (the last value with its own
empirical p90) on the same steps, the ratio (below 1: the forecast is better), each one's coverage (0.9 is
calibrated) and the share of steps the configured model served (the rest: the last value, chosen).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Literal

import numpy as np
from pydantic import ConfigDict, Field, model_validator

from gpuscale.cli.run_coroutine import run_coroutine
from gpuscale.config import Seconds, parse_instant
from gpuscale.errors import ConfigError, SourceUnavailable
from gpuscale.files import DATA_LIMIT_BYTES, read_text
from gpuscale.metrics.demand import DemandSettings
from gpuscale.metrics.forecast import MODELS
from gpuscale.model import parse_duration
from gpuscale.replay.metric_history import parse_series_csv
from gpuscale.replay.served_forecast import ServedScore, score, trace_readings
from gpuscale.replay.traces import read_trace
from gpuscale.settings import CommandSettings, Logging, PrometheusConnection, group
from gpuscale.sources.promapi import PrometheusClient, TooManySamples

SCHEMA = "gpuscale.backtest/v1"


class BacktestSettings(CommandSettings):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    trace: str | None = Field(
        None, description="request trace: Azure LLM CSV, Mooncake JSONL, CSV timestamp,input_tokens,output_tokens"
    )
    rate: str | None = Field(None, description="recorded request rate instead: CSV timestamp,value (requests/s)")
    prometheus: PrometheusConnection = group(
        lambda: PrometheusConnection(timeout=60.0),
        url="read the request rate from this Prometheus",
        timeout="deadline of the range query, its answer included",
    )
    query: str | None = Field(
        None, description="with --prometheus-url: PromQL of one workload's request rate, e.g. sum(rate(x[1m]))"
    )
    history_end: str | None = Field(None, description="end of the Prometheus history: Unix seconds, RFC 3339, now-2h")
    history_span: Seconds = Field(6 * 3600.0, gt=0, description="length of the Prometheus history")
    history_step: Seconds = Field(15.0, gt=0, description="resolution of the Prometheus range query")
    horizon: list[str] = Field(
        default_factory=list,
        description="forecast horizon, repeatable (default 60s and 180s; the adapter's is the workload's start-up)",
    )
    model: str = Field("holt", description="forecast model: naive, seasonal_naive, ses, holt, seasonal_holt")
    min_history: Seconds = Field(600.0, gt=0, description="request-rate history before a forecast is served")
    output: Literal["table", "json"] = Field("table", description=f"table or json (schema {SCHEMA})")
    logging: Logging = group(lambda: Logging(log_level="warning"))

    @model_validator(mode="after")
    def _check(self) -> BacktestSettings:
        if len([v for v in (self.trace, self.rate, self.prometheus.url) if v]) != 1:
            raise ValueError("trace: give one of --trace FILE, --rate FILE or --prometheus-url URL --query PROMQL")
        if self.prometheus.url and not self.query:
            raise ValueError("query: --prometheus-url needs --query (PromQL of one workload's request rate)")
        if self.query and not self.prometheus.url:
            raise ValueError("query: only with --prometheus-url")
        if self.model not in MODELS:
            raise ValueError(f"model: unknown model {self.model!r}; valid: {', '.join(MODELS)}")
        for h in self.horizon:
            try:
                seconds = parse_duration(h)
            except ValueError as e:
                raise ValueError(f"horizon: {e}") from None
            if not 0 < seconds <= 86_400:
                raise ValueError(f"horizon: {h!r} is not a duration from 1ms to 24h")
        return self

    def horizons_s(self) -> list[float]:
        return [parse_duration(h) for h in self.horizon] or [60.0, 180.0]


def readings(settings: BacktestSettings) -> tuple[str, np.ndarray, np.ndarray]:
    """(what was read, reading times in seconds, requests/s at each)."""
    if settings.trace:
        arrivals = read_trace(settings.trace).arrival_s
        if len(arrivals) < 2:
            raise ConfigError("a backtest needs more than one request", path=settings.trace)
        times, rates = trace_readings(arrivals)
        return settings.trace, times, rates
    if settings.rate:
        text = read_text(settings.rate, limit_bytes=DATA_LIMIT_BYTES, what="request rate")
        times, rates = parse_series_csv(text, source=settings.rate)
        return settings.rate, times, rates
    return run_coroutine(_prometheus_rate(settings))


async def _prometheus_rate(settings: BacktestSettings) -> tuple[str, np.ndarray, np.ndarray]:
    assert settings.query is not None
    try:
        end = parse_instant(settings.history_end) if settings.history_end else time.time()
    except ValueError as e:
        raise ConfigError(f"--history-end: {e}") from None
    client = PrometheusClient.connect(settings.prometheus)
    try:
        result = await client.query_range(
            settings.query, start=end - settings.history_span, end=end, step=settings.history_step
        )
    except (SourceUnavailable, TooManySamples) as e:
        reason = e.reason if isinstance(e, SourceUnavailable) else str(e)
        raise SourceUnavailable(client.display_url, f"range query failed: {reason}") from None
    finally:
        await client.close()
    if len(result) != 1 or not isinstance(result[0], dict):
        raise SourceUnavailable(
            client.display_url,
            f"--query must give one series (one workload's rate; wrap it in sum(...)), got {len(result)}",
        )
    try:
        points = [(float(t), float(v)) for t, v in result[0].get("values") or []]
    except (TypeError, ValueError):
        raise SourceUnavailable(client.display_url, "range query: values are not [time, value] pairs") from None
    points = [(t, v) for t, v in points if np.isfinite(v)]
    if not points:
        raise SourceUnavailable(client.display_url, "the range query gave no finite values")
    times = np.array([t for t, _ in points])
    return client.display_url, times, np.array([v for _, v in points])


def run_backtest(settings: BacktestSettings) -> dict:
    source, times, rates = readings(settings)
    if np.any(rates < 0):
        raise ConfigError("a request rate cannot be negative", path=source)
    demand = DemandSettings(model=settings.model, min_history_s=settings.min_history)
    scores = [score(times, rates, horizon_s=h, settings=demand) for h in settings.horizons_s()]
    return {
        "schema": SCHEMA,
        "source": source,
        "duration_s": round(float(times[-1] - times[0]), 3) if len(times) else 0.0,
        "model": settings.model,
        "step_s": demand.step_s,
        "quantile": demand.quantile,
        "results": [_result(s) for s in scores],
    }


def _result(s: ServedScore) -> dict:
    def num(x: float, digits: int = 4) -> float | None:
        return round(x, digits) if np.isfinite(x) else None

    return {
        "horizon_s": s.horizon_s,
        "points": s.points,
        "p90_loss": num(s.loss),
        "naive_p90_loss": num(s.naive_loss),
        "loss_ratio": num(s.ratio, 3),
        "coverage": num(s.coverage, 3),
        "naive_coverage": num(s.naive_coverage, 3),
        "model_share": num(s.model_share, 3),
    }


def main_backtest(settings: BacktestSettings) -> None:
    doc = run_backtest(settings)
    if settings.output == "json":
        sys.stdout.write(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"{doc['source']}: {doc['duration_s'] / 60:.1f} min, the served {doc['model']} forecast vs the last "
        f"value (p{doc['quantile'] * 100:.0f}, {doc['step_s']:g} s steps)",
        header_style="bold",
    )
    for column in ("horizon", "points", "p90 loss", "naive p90 loss", "ratio", "coverage", "naive coverage"):
        table.add_column(column, justify="right")
    table.add_column(f"{doc['model']} served", justify="right")

    def cell(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    for r in doc["results"]:
        table.add_row(
            f"{r['horizon_s']:g} s",
            str(r["points"]),
            cell(r["p90_loss"], ".4f"),
            cell(r["naive_p90_loss"], ".4f"),
            cell(r["loss_ratio"], ".3f"),
            cell(r["coverage"], ".2f"),
            cell(r["naive_coverage"], ".2f"),
            cell(r["model_share"], ".0%"),
        )
    console = Console(width=max(Console().width, 110))
    console.print(table)
    if not any(r["points"] for r in doc["results"]):
        console.print(
            f"no forecast was served: the history is shorter than --min-history ({settings.min_history:g} s) plus "
            "the checks a forecast needs"
        )
