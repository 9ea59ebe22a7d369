"""The adapter's own /metrics: what it exposes, and that `promtool check metrics` (the real one) accepts it."""

from __future__ import annotations

import asyncio
import shutil

from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.sources.base import TargetHealth

PROMTOOL = shutil.which("promtool")
if PROMTOOL is None:  # NB: installed by .ci/setup --test (Debian package prometheus)
    raise RuntimeError("promtool is required (run: bash .ci/setup --test)")


class FakeSource:
    name = "scrape"

    def health(self):
        return [
            TargetHealth(
                "http://10.0.0.1:9400/metrics", True, last_success=95.0, last_duration_seconds=0.01, series=120
            ),
            TargetHealth("http://10.0.0.2:8002/metrics", False, last_success=40.0, error="HTTP 500", failures_total=3),
        ]


async def promtool_check(text: bytes) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        PROMTOOL,
        "check",
        "metrics",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(text), 20)
    return proc.returncode, out.decode()


async def test_source_freshness_and_errors_are_exposed():
    from prometheus_client import generate_latest

    metrics = AdapterMetrics(lambda: [FakeSource()], clock=lambda: 100.0)
    text = generate_latest(metrics.registry).decode()
    assert 'gpuscale_source_target_up{source="scrape",target="http://10.0.0.2:8002/metrics"} 0.0' in text
    assert 'gpuscale_source_freshness_seconds{source="scrape",target="http://10.0.0.1:9400/metrics"} 5.0' in text
    assert 'gpuscale_source_freshness_seconds{source="scrape",target="http://10.0.0.2:8002/metrics"} 60.0' in text
    assert 'gpuscale_source_errors_total{source="scrape",target="http://10.0.0.2:8002/metrics"} 3.0' in text


async def test_promtool_accepts_the_adapter_metrics():
    from prometheus_client import generate_latest

    metrics = AdapterMetrics(lambda: [FakeSource()], clock=lambda: 100.0)
    metrics.requests.labels("custom.metrics.k8s.io", "pods", "200").inc()
    metrics.request_seconds.labels("custom.metrics.k8s.io").observe(0.002)
    metrics.refresh_seconds.observe(0.05)
    code, out = await promtool_check(generate_latest(metrics.registry))
    assert code == 0, out


async def test_promtool_rejects_what_it_should():
    # The check is real: a counter without the _total suffix is reported.
    code, out = await promtool_check(b"# HELP x_count a counter\n# TYPE x_count counter\nx_count 1\n")
    assert code != 0 and 'counter metrics should have "_total" suffix' in out


class TroubledSource:
    name = "scrape"

    def health(self):
        return [
            TargetHealth(
                "http://10.0.0.3:9400/metrics",
                False,
                last_success=40.0,
                error="line 3: bad value",
                error_kind="malformed",
                last_error='line 3: bad "value" \x1b[31m\n' + "x" * 300,
                last_error_kind="malformed",
                last_error_at=90.0,
            ),
            TargetHealth(
                "http://10.0.0.4:9400/metrics",
                True,
                last_success=95.0,
                degraded="exports 7 GPUs, 8 earlier: a GPU is missing from its exporter",
                error_kind="gpus_missing",
                last_error="exports 7 GPUs, 8 earlier: a GPU is missing from its exporter",
                last_error_kind="gpus_missing",
                last_error_at=95.0,
            ),
        ]


async def test_each_targets_last_problem_is_exposed_bounded_and_escaped():
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    metrics = AdapterMetrics(lambda: [TroubledSource()], clock=lambda: 100.0)
    text = generate_latest(metrics.registry)
    families = {f.name: f for f in text_string_to_metric_families(text.decode())}
    (bad, missing) = families["gpuscale_source_target_last_error_timestamp_seconds"].samples
    assert bad.labels["kind"] == "malformed" and bad.value == 90.0
    assert bad.labels["message"].startswith('line 3: bad "value"') and bad.labels["message"].isprintable()
    assert len(bad.labels["message"]) <= 120
    assert missing.labels["kind"] == "gpus_missing"
    degraded = {s.labels["target"]: s.value for s in families["gpuscale_source_target_degraded"].samples}
    assert degraded == {"http://10.0.0.3:9400/metrics": 0.0, "http://10.0.0.4:9400/metrics": 1.0}
    code, out = await promtool_check(text)
    assert code == 0, out


def test_request_counts_and_latencies_read_exactly_as_if_observed_one_by_one(monkeypatch):
    # The request path counts in plain dictionaries, added to the families when the registry is collected.
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from gpuscale.adapter import selfmetrics
    from gpuscale.adapter.selfmetrics import REQUEST_BUCKETS

    metrics = AdapterMetrics(lambda: [])
    registry = CollectorRegistry()
    reference = Histogram("reference", "observed one by one", ["group"], buckets=REQUEST_BUCKETS, registry=registry)
    group = "custom.metrics.k8s.io"
    for scrape in (1, 2):  # and again after a collection emptied what was pending
        for seconds in (0.0001, 0.0005, 0.00050001, 0.001, 0.3, 1.0, 7.0, 0.0):
            monkeypatch.setattr(selfmetrics.time, "perf_counter", lambda seconds=seconds: seconds)
            metrics.observe_request(group, "pods", 200 if seconds < 1 else 503, 0.0)
            reference.labels(group).observe(seconds)
            metrics.count_answer("prepared")
        text = generate_latest(metrics.registry).decode()
        for le in [str(b) for b in REQUEST_BUCKETS] + ["+Inf"]:
            ours = metrics.registry.get_sample_value(
                "gpuscale_adapter_request_duration_seconds_bucket", {"group": group, "le": le}
            )
            assert ours == registry.get_sample_value("reference_bucket", {"group": group, "le": le}), le
        for suffix in ("count", "sum"):
            ours = metrics.registry.get_sample_value(
                f"gpuscale_adapter_request_duration_seconds_{suffix}", {"group": group}
            )
            assert ours == registry.get_sample_value(f"reference_{suffix}", {"group": group})
        requests = f'gpuscale_adapter_requests_total{{code="%s",group="{group}",resource="pods"}}'
        assert f"{requests % 200} {6.0 * scrape}" in text and f"{requests % 503} {2.0 * scrape}" in text
        assert f'gpuscale_adapter_answers_total{{how="prepared"}} {8.0 * scrape}' in text
