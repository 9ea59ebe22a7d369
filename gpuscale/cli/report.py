"""`gpuscale report`: right-sizing and activity-based GPU cost from utilization history.

The composition root of the command::

    --prometheus-url ─▶ sources/history_fetch (range queries, chunked) ─┐
    --from FILE ─▶ sources/history_file ──────────────────────────┼─▶ History ─▶ report/build ─▶ Report
                                                                  │                 (pure)         │
    --export FILE ◀─ sources/history_file ◀───────────────────────┘        -o table|json|markdown|html
                                                                                  └─▶ stdout or --output-file

Errors are one line and exit 2 (``main`` prints GpuscaleError): the server down or refusing, a bad file.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import Field, model_validator

from gpuscale.cli.run_coroutine import run_coroutine
from gpuscale.config import Instant, Seconds
from gpuscale.errors import ConfigError
from gpuscale.model import format_duration
from gpuscale.policy_files import check_policies_dir
from gpuscale.settings import CommandSettings, KubeAccess, PolicyFiles, PrometheusConnection, add_arguments, group

__all__ = ["ReportSettings", "add_report_arguments", "run_report"]

# A year and a day: longer than any retention worth a right-sizing report, and the bound that keeps a typo
# (--window 100000d: 144 M steps) from sizing arrays before the memory budget is even asked.
MAX_WINDOW_SECONDS = 366 * 86400.0
# DCGM updates its fields about once a second at the fastest; a finer step only multiplies the grid.
MIN_STEP_SECONDS = 1.0
_LATEST_END = 1e10  # epoch seconds (year 2286): a later --end is a typo, and no date a report can print


class ReportSettings(CommandSettings):
    # NB: --timeout was this deadline's published name before the Prometheus flags became one group
    prometheus: PrometheusConnection = group(
        lambda: PrometheusConnection(timeout=60.0),
        url="Prometheus-compatible server holding the DCGM history",
        timeout="deadline of one query, its answer included (a timed-out query is retried: --retries)",
        old_flags={"timeout": "--timeout"},
    )
    from_file: str | None = Field(None, description="(--from) make the report from a file written by --export")
    export: str | None = Field(None, description="also write the fetched history to this file (.npz, documented)")
    mode: str = Field("raw", description="raw (fetch samples) or summary (the TSDB summarises per series and chunk)")
    chunk: Seconds | None = Field(
        None, gt=0, description="summary mode: the span one server-side summary covers (default: the whole window)"
    )
    window: Seconds = Field(7 * 86400.0, gt=0, description="how far back the history goes (at most 366d)")
    step: Seconds = Field(60.0, gt=0, description="sample spacing of the history (at least 1s)")
    scrape_interval: Seconds | None = Field(
        None, gt=0, description="the exporters' scrape interval, which hours count per sample (default: measured)"
    )
    end: Instant | None = Field(
        None, description="end of the window: Unix seconds, RFC 3339 (2026-12-01T08:00:00Z) or now-2h (default: now)"
    )
    output: str = Field("table", description="(-o) table, json, markdown or html")
    output_file: str | None = Field(None, description="write the report here instead of stdout")
    output_dir: str | None = Field(
        None,
        description="write report.md, report.json and report.html here, plus copies named by the window's end",
    )
    files: PolicyFiles = group(
        PolicyFiles,
        policies="directory whose rightsizing.yaml, gpus.yaml, prices.yaml, diagnosis.yaml override shipped",
    )
    kube: KubeAccess = group(
        KubeAccess, kubeconfig="owners of pods kube-state-metrics does not describe, from the Kubernetes API"
    )
    in_cluster: bool = Field(False, description="use the pod's service account for the Kubernetes API")
    configmap: str | None = Field(
        None, description="NAMESPACE/NAME: also write report.md and report.json into this (existing) ConfigMap"
    )
    retries: int = Field(3, ge=0, le=10, description="retries of a failed or timed-out query")
    series_batch: int = Field(50, ge=1, description="nodes per range query (halved when the server refuses)")
    max_points: int = Field(10_000, ge=10, le=11_000, description="steps per range query (Prometheus allows 11,000)")
    max_response_size: int = Field(
        128 * 1024 * 1024, ge=1024, description="bytes: a bigger answer to one query is refused, not decoded"
    )
    memory_budget: int = Field(
        1536 * 1024 * 1024,
        ge=64 * 1024 * 1024,
        description="bytes the history and the report may take (raw mode and --from; checked before fetching and "
        "as GPUs arrive); past it, one line suggesting --mode summary, a shorter --window or a coarser --step",
    )
    no_progress: bool = Field(False, description="no progress bar (shown by default when stderr is a terminal)")

    @model_validator(mode="after")
    def _check(self) -> ReportSettings:
        if bool(self.prometheus.url) == bool(self.from_file):
            raise ValueError("prometheus-url: give --prometheus-url URL or --from FILE (one of them)")
        if self.export and self.from_file:
            raise ValueError("export: --export writes a fetched history; with --from there is nothing to fetch")
        from gpuscale.report.formatters import FORMATTERS

        if self.output not in FORMATTERS:
            raise ValueError(f"output: unknown format {self.output!r}; valid: {', '.join(FORMATTERS)}")
        if self.mode not in ("raw", "summary"):
            raise ValueError(f"mode: {self.mode!r} is not raw or summary")
        if self.mode == "summary" and (self.export or self.from_file):
            raise ValueError("mode: --export and --from work on raw histories; summary mode keeps no samples")
        if self.configmap is not None and len(self.configmap.split("/")) != 2:
            raise ValueError(f"configmap: {self.configmap!r} is not NAMESPACE/NAME")
        if not self.window <= MAX_WINDOW_SECONDS:  # NB: also NaN and inf, which a duration parses to
            shown = format_duration(self.window) if math.isfinite(self.window) else str(self.window)
            raise ValueError(f"window: {shown} is longer than a report covers (at most 366d)")
        if self.step < MIN_STEP_SECONDS:
            raise ValueError(f"step: {self.step:g}s is finer than DCGM samples (at least 1s)")
        if self.step > self.window:
            raise ValueError("step: longer than --window")
        if self.end is not None and not 0 <= self.end <= _LATEST_END:
            raise ValueError(f"end: {self.end:g} is not a time between 1970 and 2286")
        return self


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, ReportSettings)
    parser.add_argument("-o", dest="output", help=argparse.SUPPRESS)
    parser.add_argument("--from", dest="from_file", help=argparse.SUPPRESS)


async def _fetch(settings: ReportSettings, *, now: float, policy: Any = None) -> Any:
    from gpuscale.sources.history_fetch import FetchOptions, fetch_history
    from gpuscale.sources.promapi import PrometheusClient

    options = FetchOptions(
        retries=settings.retries,
        series_batch=settings.series_batch,
        max_points=settings.max_points,
        max_response_bytes=settings.max_response_size,
        memory_budget_bytes=settings.memory_budget,
        scrape_interval=settings.scrape_interval,
    )
    end = settings.end if settings.end is not None else now
    # NB: credential files are read here, within files.py's limits: a FIFO, /dev/zero or 100 MB token is refused
    # naming the flag before any query; a token rotated during a long fetch is read again.
    client = PrometheusClient.connect(settings.prometheus, **options.client_limits())
    try:
        if settings.mode == "summary":
            from gpuscale.metrics.diagnosis import CLOCK_EVENT_BITS
            from gpuscale.report.usage import block_seconds
            from gpuscale.sources.summary_fetch import fetch_summaries

            idle = policy.diagnosis.diagnosis.idle
            abnormal = set(policy.diagnosis.diagnosis.clock_events.abnormal)
            return await fetch_summaries(
                client,
                start=end - settings.window,
                end=end,
                step=settings.step,
                chunk=settings.chunk,
                block=block_seconds(settings.window),
                options=options,
                idle_busy_percent=idle.busy_percent,
                idle_sm_active=idle.sm_active,
                throttle_bits=tuple(bit for bit, name in CLOCK_EVENT_BITS if name in abnormal),
                safety_percentile=policy.rightsizing.safety_percentile,
                progress=False if settings.no_progress else None,
            )
        return await fetch_history(
            client,
            start=end - settings.window,
            end=end,
            step=settings.step,
            options=options,
            progress=False if settings.no_progress else None,
        )
    finally:
        await client.close()


_CONFIGMAP_LIMIT = 1024 * 1024  # a ConfigMap holds at most 1 MiB


async def _kubernetes(settings: ReportSettings, history: Any, report_texts: dict[str, str] | None) -> None:
    """Owners from the Kubernetes API (before the report) or the ConfigMap write (after it)."""
    from gpuscale.sources.kubeconfig import load_api_client

    api = await load_api_client(settings.kube.kubeconfig)
    try:
        if report_texts is None:
            from gpuscale.sources.owners import owners_from_kubernetes

            unknown = [p for p in history.pods if p not in history.owners]
            found = await owners_from_kubernetes(api, unknown)
            history.owners.update(found)
            return
        from kubernetes_asyncio import client
        from kubernetes_asyncio.client.exceptions import ApiException

        namespace, name = (settings.configmap or "").split("/")
        size = sum(len(v.encode()) for v in report_texts.values())
        if size > _CONFIGMAP_LIMIT:
            raise ConfigError(f"--configmap {settings.configmap}: the report is {size} bytes, over a ConfigMap's 1 MiB")
        try:
            # NB: a patch of an existing ConfigMap: the CronJob's Role grants `patch` on this one name only.
            await client.CoreV1Api(api).patch_namespaced_config_map(name, namespace, {"data": report_texts})
        except ApiException as e:
            hint = " (create it first: deploy/report creates an empty one)" if e.status == 404 else ""
            raise ConfigError(f"--configmap {settings.configmap}: HTTP {e.status} {e.reason}{hint}") from e
    finally:
        await api.close()


def _write_dir(directory: Path, report: Any) -> None:
    from datetime import UTC, datetime

    from gpuscale.report.formatters import as_json, html, markdown

    stamp = datetime.fromtimestamp(report.window.end, UTC).strftime("%Y%m%dT%H%MZ")
    texts = {"md": markdown(report), "json": as_json(report), "html": html(report)}
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for ext, text in texts.items():
            for name in (f"report-{stamp}.{ext}", f"report.{ext}"):
                tmp = directory / f".{name}.tmp"
                tmp.write_text(text)
                tmp.replace(directory / name)  # NB: a reader never sees half a report
    except OSError as e:
        raise ConfigError(f"--output-dir {directory}: {e.strerror or e}") from e


def run_report(settings: ReportSettings) -> None:
    from gpuscale.report.build import build_report
    from gpuscale.report.formatters import formatter
    from gpuscale.report.policy import load_report_policy
    from gpuscale.sources.history_file import export_history, load_history

    if settings.files.policies:
        check_policies_dir(settings.files.policies)
    policy = load_report_policy(settings.files.policies)
    render = formatter(settings.output)
    now = time.time()
    if settings.kube.kubeconfig:
        from gpuscale.sources.kubeconfig import check_kubeconfig

        check_kubeconfig(settings.kube.kubeconfig)  # NB: refused now, not once the fetch is done
    if settings.from_file:
        history = load_history(settings.from_file, memory_budget_bytes=settings.memory_budget)
    else:
        history = run_coroutine(_fetch(settings, now=now, policy=policy))
        if settings.export:
            export_history(history, settings.export)
    if settings.kube.kubeconfig or settings.in_cluster:
        asyncio.run(_kubernetes(settings, history, None))
    if settings.mode == "summary":
        from gpuscale.report.summary import build_summary_report

        report = build_summary_report(history, policy=policy, generated_at=now)
    else:
        report = build_report(history, policy=policy, generated_at=now)
    text = render(report)
    if settings.configmap:
        from gpuscale.report.formatters import as_json, markdown

        asyncio.run(_kubernetes(settings, None, {"report.md": markdown(report), "report.json": as_json(report)}))
    if settings.output_dir:
        _write_dir(Path(settings.output_dir), report)
    elif settings.output_file:
        try:
            Path(settings.output_file).write_text(text)
        except OSError as e:
            raise ConfigError(f"--output-file {settings.output_file}: {e.strerror or e}") from e
    else:
        sys.stdout.write(text)
