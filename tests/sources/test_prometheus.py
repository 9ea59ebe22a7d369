"""The Prometheus source against a fake Prometheus HTTP API on loopback (plain HTTP and TLS).

Scope: the PromQL each term becomes (a fixed set per refresh, nothing per pod), how answers become
series values (names, labels, timestamps, targets, NaN, DCGM blanks), that the pipeline folds them into
the same values as the embedded scrape source, and that every fault of the server — down, slow, HTTP
errors, error bodies, malformed or partial answers, unreadable credentials — leaves a specific reason
in health(), keeps the previous values with their old timestamps, and never raises out of refresh().
The real Prometheus and VictoriaMetrics are driven in tests/e2e/test_prometheus_backends.py.
"""

from __future__ import annotations

import asyncio
import math
import os
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web

from gpuscale.errors import ConfigError
from gpuscale.metrics.aggregation import build_snapshot, queries
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.store import MetricsStore
from gpuscale.model import pod
from gpuscale.sources.base import TermQuery
from gpuscale.sources.prometheus import PrometheusSource, plan
from tests.helpers import H100, H100_NODE, T0, TRITON, TRITON_POD, TRITON_T0, fixture_store

GAUGE = TermQuery(series=("DCGM_FI_DEV_GPU_UTIL",))
FB = TermQuery(series=("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"))
RATE = TermQuery(series=("nv_inference_request_success",), input="rate", window_seconds=60)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass
class Seen:
    method: str
    path: str
    form: dict[str, str]
    headers: dict[str, str]


@dataclass
class FakePrometheus:
    """Answers POST /api/v1/query from a table PromQL → [(metric labels, value string)].

    ``faults`` maps a PromQL text (or ``"*"`` for every query) to a handler that answers instead;
    ``extra`` is merged into every successful body (``warnings``, ``isPartial``).
    """

    sample_time: float = T0
    answers: dict[str, list[tuple[dict[str, str], str]]] = field(default_factory=dict)
    faults: dict[str, Handler] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    url: str = ""
    runner: web.AppRunner | None = None

    async def start(self, *, ssl_context: ssl.SSLContext | None = None, prefix: str = "") -> FakePrometheus:
        app = web.Application()
        app.router.add_route("*", prefix + "/api/v1/query", self.handle)
        self.runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0, ssl_context=ssl_context)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = (
            f"{'https' if ssl_context else 'http'}://{'localhost' if ssl_context else '127.0.0.1'}:{port}{prefix}"
        )
        return self

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        form = {k: str(v) for k, v in (await request.post()).items()}
        self.seen.append(Seen(request.method, request.path, form, dict(request.headers)))
        query = form.get("query", "")
        fault = self.faults.get(query) or self.faults.get("*")
        if fault is not None:
            return await fault(request)
        result = [{"metric": m, "value": [self.sample_time, v]} for m, v in self.answers.get(query, [])]
        body = {"status": "success", "data": {"resultType": "vector", "result": result}, **self.extra}
        return web.json_response(body)

    def queries(self) -> list[str]:
        return [s.form["query"] for s in self.seen]


def answer(status: int = 200, body: Any = None, *, text: str | None = None, delay: float = 0.0) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        if delay:
            await asyncio.sleep(delay)
        if text is not None:
            return web.Response(status=status, text=text, content_type="text/html")
        return web.json_response(body, status=status)

    return handler


@pytest.fixture
async def prom():
    fake = await FakePrometheus().start()
    yield fake
    await fake.stop()


_DECODE_IN = ["thread"]


@pytest.fixture(autouse=True, params=["thread", "process"])
def decode_in(request):
    """Every test of a source built by source_for runs with answers decoded in a worker thread (top, controller)
    and as the adapter runs it (decoder process, queries on a loop of their own): the same values, faults and
    reasons either way."""
    _DECODE_IN[0] = request.param
    yield request.param
    _DECODE_IN[0] = "thread"


def source_for(url: str, *terms: TermQuery, clock: list[float] | None = None, **kw: Any) -> PrometheusSource:
    clock = clock if clock is not None else [T0]
    kw.setdefault("decode_in", _DECODE_IN[0])
    if "session" not in kw:
        kw.setdefault("off_loop", _DECODE_IN[0] == "process")  # NB: the adapter's way: both, or neither
    return PrometheusSource(url, queries=terms or (GAUGE,), clock=lambda: clock[0], **kw)


def dcgm(gpu: str, **labels: str) -> dict[str, str]:
    return {
        "__name__": "DCGM_FI_DEV_GPU_UTIL",
        "gpu": gpu,
        "UUID": f"GPU-{gpu}",
        "Hostname": "node-1",
        "instance": "10.0.0.7:9400",
        "job": "dcgm",
        **labels,
    }


# --- PromQL -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("term", "promql"),
    [
        (GAUGE, ["DCGM_FI_DEV_GPU_UTIL"]),
        (FB, ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"]),  # one query per series name, never a regex
        (
            TermQuery(series=("nv_inference_pending_request_count",), match=(("model", "bert"), ("version", "2"))),
            ['nv_inference_pending_request_count{model="bert",version="2"}'],
        ),
        (
            TermQuery(series=("A", "B"), match=(("model", 'we"ird\\'),)),
            ['A{model="we\\"ird\\\\"}', 'B{model="we\\"ird\\\\"}'],
        ),
        (RATE, ["rate(nv_inference_request_success[60s])"]),
        (
            TermQuery(series=("nv_inference_queue_duration_us",), input="increase", window_seconds=90),
            ["increase(nv_inference_queue_duration_us[90s])"],
        ),
        (
            TermQuery(series=("a_us", "b_us"), input="rate", window_seconds=1.5, match=(("model", "m"),)),
            ['rate(a_us{model="m"}[1500ms])', 'rate(b_us{model="m"}[1500ms])'],
        ),
        (
            TermQuery(series=("x",), input="rate", window_seconds=30, promql="sum by (pod) (rate(x[{window}]))"),
            ["sum by (pod) (rate(x[30s]))"],
        ),
    ],
)
def test_promql_per_term(term, promql):
    assert [p.promql for p in plan(term)] == promql


def test_builtin_catalogue_is_fixed_queries_without_any_pod_name(catalogue):
    source = PrometheusSource("http://prometheus:9090", queries=queries(catalogue))
    dcgm_and_triton = [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_FB_USED",  # NB: also the memory ratio's numerator: fetched once for both terms
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "nv_inference_pending_request_count",
        "rate(nv_inference_request_success[60s])",
        "increase(nv_inference_queue_duration_us[60s])",
        "increase(nv_inference_request_success[60s])",
        "increase(nv_inference_compute_infer_duration_us[60s])",
    ]
    assert [q for q in source.promql if "DCGM" in q or "nv_" in q] == dcgm_and_triton
    # One query per series of each LLM server's names (vLLM, SGLang, TGI, NIM): 37 more, fixed by the catalogue.
    assert len(source.promql) == 50 and len(set(source.promql)) == 50
    assert "histogram_quantile(0.95, rate(vllm:time_to_first_token_seconds_bucket[60s]))" in source.promql
    assert "vllm:num_requests_waiting" in source.promql and "rate(tgi_request_input_length_sum[60s])" in source.promql


async def test_queries_do_not_grow_with_pods(prom, catalogue):
    """1000 pods' series: still one request per catalogue series, each under 100 bytes; the answer grows."""
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [
        (dcgm(str(i % 8), Hostname=f"node-{i // 8}", pod=f"worker-{i}", namespace="ml"), "50") for i in range(1000)
    ]
    source = source_for(prom.url, *queries(catalogue))
    await source.refresh(now=T0)
    assert len(prom.seen) == len(source.promql) == 50 and max(len(q) for q in prom.queries()) < 100
    assert len(source.read(queries(catalogue)[0])) == 1000
    await source.close()


async def test_requests_are_form_posts_with_timeout_and_nocache_under_a_path_prefix():
    fake = await FakePrometheus().start(prefix="/prometheus")
    try:
        source = source_for(fake.url + "/", GAUGE, RATE, timeout_seconds=2.5)
        await source.refresh(now=T0)
        assert {(s.method, s.path) for s in fake.seen} == {("POST", "/prometheus/api/v1/query")}
        assert sorted(fake.queries()) == ["DCGM_FI_DEV_GPU_UTIL", "rate(nv_inference_request_success[60s])"]
        # One evaluation instant for every query of the refresh: the source's clock at its start.
        assert {(s.form["time"], s.form["timeout"], s.form["nocache"]) for s in fake.seen} == {
            (f"{T0:.3f}", "2500ms", "1")
        }
        assert fake.seen[0].headers["Content-Type"].startswith("application/x-www-form-urlencoded")
        assert "Authorization" not in fake.seen[0].headers
        await source.close()
    finally:
        await fake.stop()


async def test_a_query_shared_by_two_terms_is_sent_once(prom, catalogue):
    used = TermQuery(series=("DCGM_FI_DEV_FB_USED",))
    source = source_for(prom.url, used, TermQuery(series=("DCGM_FI_DEV_FB_USED",), window_seconds=30))
    await source.refresh(now=T0)
    assert prom.queries() == ["DCGM_FI_DEV_FB_USED"]
    await source.close()


async def test_a_series_named_by_several_terms_is_fetched_and_decoded_once(prom):
    """FB_USED is a term of its own and the memory ratio's numerator: one query, one answer serves both."""
    used = TermQuery(series=("DCGM_FI_DEV_FB_USED",))
    prom.answers["DCGM_FI_DEV_FB_USED"] = [(dcgm("0", __name__="DCGM_FI_DEV_FB_USED"), "1024")]
    prom.answers["DCGM_FI_DEV_FB_FREE"] = [(dcgm("0", __name__="DCGM_FI_DEV_FB_FREE"), "80000")]
    source = source_for(prom.url, used, FB)
    await source.refresh(now=T0)
    assert sorted(prom.queries()) == ["DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED"]
    (alone,) = source.read(used)
    in_ratio = source.read(FB)
    assert [(v.name, v.value) for v in in_ratio] == [("DCGM_FI_DEV_FB_USED", 1024), ("DCGM_FI_DEV_FB_FREE", 8e4)]
    assert in_ratio[0] is alone  # the same decoded value, not a second copy
    # One label set, one dict, even across the two answers (what attribution recognises by identity).
    assert in_ratio[0].labels is in_ratio[1].labels
    assert source.health()[0].series == 2
    await source.close()


# --- reading answers ----------------------------------------------------------------------------------------


async def test_vector_answers_become_series_values(prom):
    prom.sample_time = T0 + 0.25
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [
        (dcgm("0", pod="trainer-0", namespace="ml", GPU_I_ID="3"), "97"),
        ({"__name__": "DCGM_FI_DEV_GPU_UTIL", "gpu": "1", "UUID": "GPU-1"}, "12.5"),  # no instance label
    ]
    prom.answers["rate(nv_inference_request_success[60s])"] = [
        ({"model": "bert", "version": "2", "instance": "10.0.0.9:8002", "exported_pod": "p"}, "41.5"),
    ]
    prom.answers["DCGM_FI_DEV_FB_USED"] = [({"__name__": "DCGM_FI_DEV_FB_USED", "UUID": "GPU-0"}, "1024")]
    prom.answers["DCGM_FI_DEV_FB_FREE"] = [({"__name__": "DCGM_FI_DEV_FB_FREE", "UUID": "GPU-0"}, "80000")]
    source = source_for(prom.url, GAUGE, RATE, FB)
    await source.refresh(now=T0)
    first, second = source.read(GAUGE)
    assert first.name == "DCGM_FI_DEV_GPU_UTIL" and "__name__" not in first.labels
    assert first.labels["GPU_I_ID"] == "3" and first.labels["pod"] == "trainer-0"
    assert (first.value, first.timestamp, first.window_seconds) == (97.0, T0 + 0.25, None)
    assert first.target == "http://10.0.0.7:9400/metrics"
    assert second.target == prom.url  # no instance: the server itself
    (rate,) = source.read(RATE)
    assert (rate.name, rate.value, rate.window_seconds) == ("nv_inference_request_success", 41.5, 60.0)
    assert rate.labels == {"model": "bert", "version": "2", "instance": "10.0.0.9:8002", "exported_pod": "p"}
    assert [(v.name, v.value) for v in source.read(FB)] == [("DCGM_FI_DEV_FB_USED", 1024), ("DCGM_FI_DEV_FB_FREE", 8e4)]
    (health,) = source.health()
    assert health.healthy and health.error is None and health.series == 5
    assert health.last_success == T0 and health.extra["queries"] == "4"  # the two-series term: two queries
    await source.close()


@pytest.mark.parametrize(("text", "check"), [("NaN", math.isnan), ("+Inf", math.isinf), ("-Inf", math.isinf)])
async def test_nan_and_inf_parse_as_floats(prom, text, check):
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), text)]
    source = source_for(prom.url, GAUGE)
    await source.refresh(now=T0)
    (value,) = source.read(GAUGE)
    assert check(value.value)
    await source.close()


@pytest.mark.parametrize(
    ("name", "value", "kept"),
    [
        ("DCGM_FI_DEV_MEMORY_TEMP", "9223372036854775808", False),  # INT64 blank+2 as Prometheus prints it
        ("DCGM_FI_DEV_MEMORY_TEMP", "9.223372036854775807e+18", False),
        ("DCGM_FI_PROF_SM_ACTIVE", "140737488355328", False),  # DCGM_FP64_BLANK = 2**47
        ("DCGM_FI_PROF_SM_ACTIVE", "140737488355330", False),  # FP64 NOT_SUPPORTED
        ("DCGM_FI_PROF_SM_ACTIVE", "140737488355400.5", False),  # non-integral: the fp64 rule
        ("DCGM_FI_DEV_POWER_VIOLATION", "290452137000000", True),  # ≈ 2.9e14 ns: a real counter value
        ("DCGM_FI_DEV_POWER_VIOLATION", "140737488355332", True),  # integral, not one of the fp64 codes
        ("DCGM_FI_DEV_GPU_UTIL", "100", True),
        ("nv_inference_request_success", "9223372036854775808", True),  # only DCGM_ series carry sentinels
    ],
)
async def test_dcgm_blank_sentinels_are_dropped_but_large_real_values_kept(prom, name, value, kept):
    term = TermQuery(series=(name,))
    prom.answers[name] = [({"__name__": name, "UUID": "GPU-0"}, value)]
    source = source_for(prom.url, term)
    await source.refresh(now=T0)
    assert len(source.read(term)) == (1 if kept else 0)
    await source.close()


async def test_blank_rule_does_not_apply_to_rates(prom):
    term = TermQuery(series=("DCGM_FI_DEV_POWER_VIOLATION",), input="increase", window_seconds=60)
    prom.answers["increase(DCGM_FI_DEV_POWER_VIOLATION[60s])"] = [({"UUID": "GPU-0"}, "9223372036854775808")]
    source = source_for(prom.url, term)
    await source.refresh(now=T0)
    assert [v.name for v in source.read(term)] == ["DCGM_FI_DEV_POWER_VIOLATION"]
    await source.close()


async def test_override_results_are_read_the_same_way_and_match_applies(prom):
    term = TermQuery(
        series=("nv_inference_request_success",),
        input="rate",
        window_seconds=30,
        match=(("model", "bert"),),
        promql='sum without (gpu_uuid) (rate(nv_inference_request_success{job="triton"}[{window}]))',
    )
    query = 'sum without (gpu_uuid) (rate(nv_inference_request_success{job="triton"}[30s]))'
    prom.answers[query] = [
        ({"model": "bert", "instance": "10.0.0.9:8002"}, "4"),
        ({"model": "resnet", "instance": "10.0.0.9:8002"}, "9"),
    ]
    source = source_for(prom.url, term)
    await source.refresh(now=T0)
    (value,) = source.read(term)
    assert (value.name, value.value, value.window_seconds) == ("nv_inference_request_success", 4.0, 30.0)
    await source.close()


async def test_scalar_answer_is_one_unlabelled_value(prom):
    term = TermQuery(series=("x",), promql="scalar(sum(x))")
    prom.faults["scalar(sum(x))"] = answer(
        body={"status": "success", "data": {"resultType": "scalar", "result": [T0, "3"]}}
    )
    source = source_for(prom.url, term)
    await source.refresh(now=T0)
    assert [(v.name, v.labels, v.value, v.target) for v in source.read(term)] == [("x", {}, 3.0, prom.url)]
    await source.close()


async def test_read_of_a_term_the_source_was_not_built_for_is_empty(prom):
    source = source_for(prom.url, GAUGE)
    assert source.read(RATE) == []
    (health,) = source.health()
    assert not health.healthy and health.error == "not queried yet"


# --- the pipeline sees the same values as from the scrape source ----------------------------------------------


def _answers_from_scrapes(catalogue, scrapes: dict[str, tuple[Path, Path | None]]) -> dict[str, list]:
    """What Prometheus would answer for each catalogue query, given per-instance scrapes 60 s apart."""
    table: dict[str, list] = {}
    for term in queries(catalogue):
        for planned in plan(term):
            if planned.promql in table:
                continue  # a series several terms name is one query (FB_USED: its own term and the ratio's)
            rows = table[planned.promql] = []
            for instance, (now_path, before_path) in scrapes.items():
                now = [s for s in parse_samples(now_path.read_text()) if s.name == planned.name]
                extra = {"instance": instance, "job": "gpu"}
                if term.input == "gauge":
                    rows += [({"__name__": s.name, **s.labels, **extra}, repr(s.value)) for s in now]
                    continue
                if before_path is None:
                    continue
                before = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value for s in parse_samples(before_path.read_text())
                }
                for s in now:
                    delta = s.value - before[(s.name, tuple(sorted(s.labels.items())))]
                    rows.append(({**s.labels, **extra}, repr(delta / 60 if term.input == "rate" else delta)))
    return table


async def test_pipeline_values_equal_the_scrape_source(prom, catalogue):
    dcgm_url, triton_url = "http://10.0.0.7:9400/metrics", "http://10.0.0.9:8002/metrics"
    targets = {dcgm_url: Target(dcgm_url, None, H100_NODE), triton_url: Target(triton_url, TRITON_POD, H100_NODE)}
    expected = fixture_store(
        [(dcgm_url, H100, T0 + 60), (triton_url, TRITON_T0, T0), (triton_url, TRITON, T0 + 60)], targets=targets
    ).snapshot
    prom.answers = _answers_from_scrapes(
        catalogue, {"10.0.0.7:9400": (H100, None), "10.0.0.9:8002": (TRITON, TRITON_T0)}
    )
    prom.sample_time = T0 + 60
    source = source_for(prom.url, *queries(catalogue))
    await source.refresh(now=T0 + 60)
    attributor = Attributor(lambda url: targets.get(url, Target(url)))
    store = MetricsStore()
    store.update(build_snapshot(catalogue, source.read, attributor, now=T0 + 60))
    got = store.snapshot
    assert expected is not None and got is not None
    for metric in catalogue.by_name:
        assert got.values[metric].keys() == expected.values[metric].keys(), metric
        for obj, point in expected.values[metric].items():
            assert got.values[metric][obj].value == pytest.approx(point.value, rel=1e-12), (metric, obj)
    assert got.values["gpu_utilization"][pod("ml-training", "llm-finetune-worker-0")].value == pytest.approx(
        expected.values["gpu_utilization"][pod("ml-training", "llm-finetune-worker-0")].value
    )
    assert got.device_count == expected.device_count
    await source.close()


# --- faults ----------------------------------------------------------------------------------------------------


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# NB: only "slow" tests the deadline, so only it has a short one (SLOW_TIMEOUT). A 0.3 s deadline on every case
# made them flaky on a loaded machine: the fault's own answer (or the healthy first refresh) came after 0.3 s,
# and "error body" said "timed out" instead of "bad_data: parse error".
SLOW_TIMEOUT = 1.0
FAULTS = [
    ("slow", answer(body={}, delay=30), f"timed out after {SLOW_TIMEOUT:g}s"),
    (
        "http 503",
        answer(503, {"status": "error", "errorType": "unavailable", "error": "TSDB not ready"}),
        "HTTP 503: unavailable: TSDB not ready",
    ),
    (
        "http 422",
        answer(422, {"status": "error", "errorType": "execution", "error": "query too big"}),
        "HTTP 422: execution: query too big",
    ),
    ("http 502 html", answer(502, text="<html>Bad Gateway</html>"), "HTTP 502: <html>Bad Gateway</html>"),
    (
        "error body",
        answer(200, {"status": "error", "errorType": "bad_data", "error": "parse error"}),
        "bad_data: parse error",
    ),
    ("malformed json", answer(200, text='{"status": "succ'), "malformed JSON response (text/html"),
    ("login page", answer(200, text="<html>Sign in</html>"), "malformed JSON response"),
    ("not an object", answer(200, ["success"]), "malformed response: a JSON list"),
    ("no data", answer(200, {"status": "success"}), "malformed response: no 'data' object"),
    (
        "bad sample",
        answer(
            200, {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "x"]}]}}
        ),
        "malformed response: result[0].value",
    ),
    (
        "matrix",
        answer(200, {"status": "success", "data": {"resultType": "matrix", "result": []}}),
        "unexpected resultType 'matrix'",
    ),
]


@pytest.mark.parametrize(("fault", "handler", "reason"), FAULTS, ids=[f[0] for f in FAULTS])
async def test_faults_keep_old_values_and_say_why(prom, fault, handler, reason):
    clock = [T0]
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), "97"), (dcgm("1"), "3")]
    timeout = SLOW_TIMEOUT if fault == "slow" else 30.0
    for _ in range(5):  # NB: a healthy first refresh is the premise, not what is tested: wait for one
        source = source_for(prom.url, GAUGE, clock=clock, timeout_seconds=timeout)
        await source.refresh(now=clock[0])
        if source.health()[0].healthy:
            break
        await source.close()
    assert source.health()[0].healthy, source.health()[0].error
    prom.faults["*"] = handler
    prom.sample_time = clock[0] = T0 + 10
    started = time.monotonic()
    await source.refresh(now=clock[0])
    assert time.monotonic() - started < (SLOW_TIMEOUT + 5 if fault == "slow" else 30)
    (health,) = source.health()
    assert not health.healthy and reason in health.error, health.error
    assert (health.failures_total, health.last_success, health.last_attempt) == (1, T0, T0 + 10)
    assert health.extra["failed_queries"] == "1" and health.series == 2
    assert [(v.value, v.timestamp) for v in source.read(GAUGE)] == [(97.0, T0), (3.0, T0)]
    await source.close()


async def test_server_down_is_a_clear_error():
    source = source_for(f"http://127.0.0.1:{_closed_port()}", GAUGE, RATE, timeout_seconds=2)
    await source.refresh(now=T0)
    (health,) = source.health()
    assert not health.healthy and health.error.startswith("cannot connect: "), health.error
    assert "Connect call failed" in health.error or "refused" in health.error.lower()
    assert source.read(GAUGE) == []
    await source.close()


async def test_body_over_the_cap_is_refused(prom):
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm(str(i)), "1") for i in range(2000)]
    source = source_for(prom.url, GAUGE, max_body_bytes=64 * 1024)
    await source.refresh(now=T0)
    (health,) = source.health()
    assert "answer larger than 64 KiB: refused unread, last values kept" in health.error, health.error
    assert health.error_kind == "too_large"
    await source.close()


async def test_one_failing_query_keeps_its_values_while_others_update(prom):
    clock = [T0]
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), "97")]
    prom.answers["rate(nv_inference_request_success[60s])"] = [({"model": "bert"}, "41")]
    source = source_for(prom.url, GAUGE, RATE, clock=clock)
    await source.refresh(now=T0)
    prom.faults["rate(nv_inference_request_success[60s])"] = answer(
        422, {"status": "error", "errorType": "execution", "error": "boom"}
    )
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), "55")]
    prom.sample_time = clock[0] = T0 + 5
    await source.refresh(now=clock[0])
    assert [(v.value, v.timestamp) for v in source.read(GAUGE)] == [(55.0, T0 + 5)]
    assert [(v.value, v.timestamp) for v in source.read(RATE)] == [(41.0, T0)]
    (health,) = source.health()
    assert health.error == "1 of 2 queries failed: HTTP 422: execution: boom (rate(nv_inference_request_success[60s]))"
    # Healed: everything is fresh again and the health says so.
    del prom.faults["rate(nv_inference_request_success[60s])"]
    prom.sample_time = clock[0] = T0 + 10
    await source.refresh(now=clock[0])
    assert [v.timestamp for v in source.read(RATE)] == [T0 + 10]
    (health,) = source.health()
    assert health.healthy and health.error is None and health.last_success == T0 + 10 and health.failures_total == 1
    await source.close()


@pytest.mark.parametrize(
    ("extra", "reason"),
    [
        (
            {"warnings": ["remote read: store eu-1 unreachable"]},
            "partial response: remote read: store eu-1 unreachable",
        ),
        ({"isPartial": True}, "partial response: the server marked the response partial"),
    ],
)
async def test_partial_answers_update_what_they_have_and_keep_the_rest(prom, extra, reason):
    clock = [T0]
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), "97"), (dcgm("1"), "3")]
    source = source_for(prom.url, GAUGE, clock=clock)
    await source.refresh(now=T0)
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("1"), "4")]
    prom.extra = extra
    prom.sample_time = clock[0] = T0 + 5
    await source.refresh(now=clock[0])
    got = {v.labels["gpu"]: (v.value, v.timestamp) for v in source.read(GAUGE)}
    assert got == {"1": (4.0, T0 + 5), "0": (97.0, T0)}
    (health,) = source.health()
    assert not health.healthy and health.error == reason  # one query: its reason, said plainly
    assert health.extra["partial_queries"] == "1"
    await source.close()


async def test_every_query_runs_concurrently_under_one_deadline(prom, catalogue):
    prom.faults["*"] = answer(body={"status": "success", "data": {"resultType": "vector", "result": []}}, delay=1.0)
    source = source_for(prom.url, *queries(catalogue), timeout_seconds=6)
    started = time.monotonic()
    await source.refresh(now=T0)
    # NB: 13 × 1 s one after the other would be 13 s; the margin is wide so a loaded CI machine cannot fail it
    assert time.monotonic() - started < 5
    assert source.health()[0].healthy
    await source.close()
    prom.faults["*"] = answer(body={}, delay=10)
    source = source_for(prom.url, *queries(catalogue), timeout_seconds=0.5)
    started = time.monotonic()
    await source.refresh(now=T0)
    assert time.monotonic() - started < 5  # 13 deadlines of 0.5 s one after the other would be 6.5 s
    assert source.health()[0].error == "timed out after 0.5s"  # the same reason for all 13: said once
    await source.close()


async def test_stale_values_turn_into_stale_points_downstream(prom, catalogue):
    """A Prometheus outage: the old values keep their time and the store marks them stale after max-age."""
    clock = [T0]
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0", pod="trainer-0", namespace="ml"), "97")]
    source = source_for(prom.url, *queries(catalogue), clock=clock)
    await source.refresh(now=T0)
    await prom.stop()
    clock[0] = T0 + 61
    await source.refresh(now=clock[0])
    snapshot = build_snapshot(catalogue, source.read, Attributor(Target), now=T0 + 61)
    point = snapshot.values["gpu_utilization"][pod("ml", "trainer-0")]
    assert point.stale and point.timestamp == T0
    assert "cannot connect" in source.health()[0].error
    await source.close()


# --- authentication and TLS ----------------------------------------------------------------------------------


async def test_bearer_token_and_token_file_reread_on_change(prom, tmp_path):
    source = source_for(prom.url, GAUGE, bearer_token="s3cret")
    await source.refresh(now=T0)
    assert prom.seen[-1].headers["Authorization"] == "Bearer s3cret"
    await source.close()

    token = tmp_path / "token"
    token.write_text("first\n")
    source = source_for(prom.url, GAUGE, bearer_token_file=token)
    await source.refresh(now=T0)
    assert prom.seen[-1].headers["Authorization"] == "Bearer first"
    # Kubernetes rotates a projected token by swapping a symlink: a new inode.
    (tmp_path / "token.new").write_text("second")
    (tmp_path / "token.new").replace(token)
    await source.refresh(now=T0)
    assert prom.seen[-1].headers["Authorization"] == "Bearer second"
    requests = len(prom.seen)
    token.unlink()
    await source.refresh(now=T0)
    assert len(prom.seen) == requests  # no unauthenticated request is sent
    (health,) = source.health()
    assert not health.healthy and health.error.startswith(f"bearer token file {token}: No such file")
    # Rotated into what no token is: the read is bounded (a FIFO never blocks it, 100 MB is not read), the
    # refresh fails with one line naming the file, and no unauthenticated request is sent.
    os.mkfifo(token)
    await asyncio.wait_for(source.refresh(now=T0), 10)
    assert len(prom.seen) == requests and "FIFO" in source.health()[0].error, source.health()[0].error
    token.unlink()
    with token.open("wb") as f:
        f.truncate(100 * 1024 * 1024)
    await asyncio.wait_for(source.refresh(now=T0), 10)
    assert len(prom.seen) == requests and str(token) in source.health()[0].error
    token.unlink()
    token.write_text("third")
    await source.refresh(now=T0)
    assert prom.seen[-1].headers["Authorization"] == "Bearer third" and source.health()[0].healthy
    await source.close()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    ca = trustme.CA()
    d = tmp_path_factory.mktemp("pki")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("gpuscale-client.example")
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client-combined.pem"))
    return ca, server, d


def _server_context(pki, *, require_client_cert: bool) -> ssl.SSLContext:
    ca, server, _ = pki
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.configure_cert(ctx)
    if require_client_cert:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


async def test_tls_server_verified_with_the_ca_file(pki):
    _, _, d = pki
    fake = await FakePrometheus().start(ssl_context=_server_context(pki, require_client_cert=False))
    fake.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0"), "97")]
    try:
        untrusted = source_for(fake.url, GAUGE)
        await untrusted.refresh(now=T0)
        assert "certificate verify failed" in untrusted.health()[0].error
        await untrusted.close()
        for kw in ({"ca_file": d / "ca.pem"}, {"insecure_skip_verify": True}):
            source = source_for(fake.url, GAUGE, **kw)
            await source.refresh(now=T0)
            assert source.health()[0].healthy, (kw, source.health())
            assert len(source.read(GAUGE)) == 1
            await source.close()
    finally:
        await fake.stop()


async def test_tls_client_certificate(pki):
    _, _, d = pki
    fake = await FakePrometheus().start(ssl_context=_server_context(pki, require_client_cert=True))
    try:
        anonymous = source_for(fake.url, GAUGE, ca_file=d / "ca.pem")
        await anonymous.refresh(now=T0)
        assert not anonymous.health()[0].healthy and anonymous.health()[0].error
        await anonymous.close()
        for kw in (
            {"client_cert": d / "client.pem", "client_key": d / "client.key"},
            {"client_cert": d / "client-combined.pem"},
        ):
            source = source_for(fake.url, GAUGE, ca_file=d / "ca.pem", **kw)
            await source.refresh(now=T0)
            assert source.health()[0].healthy, (kw, source.health())
            await source.close()
    finally:
        await fake.stop()


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"url": "prometheus:9090"}, "is not an http(s) URL"),
        ({"bearer_token": "a", "bearer_token_file": "/x"}, "not both"),
        ({"client_key": "/k"}, "client key needs a client certificate"),
        ({"timeout_seconds": 0}, "timeout must be a positive number"),
        ({"bearer_token_file": "/nonexistent/token"}, "bearer token file /nonexistent/token: No such file"),
        ({"ca_file": "/nonexistent/ca.pem"}, "CA file /nonexistent/ca.pem"),
        ({"url": "https://p", "client_cert": "/nonexistent/c.pem"}, "client certificate /nonexistent/c.pem"),
        ({"url": "http://u:p@prometheus:9090", "bearer_token": "t"}, "carries user:password"),
    ],
)
def test_bad_options_fail_at_construction(kw, message):
    kw = dict(kw)  # NB: the parameter's dict is shared by every run of this case
    url = kw.pop("url", "http://prometheus:9090")
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        PrometheusSource(url, queries=[GAUGE], **kw)


async def test_basic_auth_from_the_url(prom):
    source = source_for(prom.url.replace("http://", "http://gpuscale:pa%24%24@"), GAUGE)
    await source.refresh(now=T0)
    assert prom.seen[-1].headers["Authorization"] == "Basic Z3B1c2NhbGU6cGEkJA=="  # gpuscale:pa$$
    assert source.health()[0].target == prom.url
    await source.close()


def test_credentials_never_appear_in_health():
    source = PrometheusSource("https://user:pw@prom.example/api/", queries=[GAUGE])
    assert source.health()[0].target == "https://prom.example/api"


async def test_injected_session_is_used_and_left_open(prom):
    async with aiohttp.ClientSession() as session:
        source = source_for(prom.url, GAUGE, session=session)
        await source.refresh(now=T0)
        await source.close()
        assert not session.closed and len(prom.seen) == 1


def test_fresh_within_lets_the_server_drop_series_older_than_max_age():
    # An instant query's answer is stamped with the evaluation time; Prometheus looks back 5 minutes, so a
    # restarted server answers old samples as if taken now. The server judges each series' own sample age.
    assert [p.promql for p in plan(GAUGE, fresh_within=60)] == [
        "DCGM_FI_DEV_GPU_UTIL unless time() - timestamp(DCGM_FI_DEV_GPU_UTIL) > 60"
    ]
    assert [p.promql for p in plan(RATE, fresh_within=90)] == [
        "rate(nv_inference_request_success[60s]) unless time() - timestamp(nv_inference_request_success) > 90"
    ]
    override = TermQuery(series=("x",), input="rate", window_seconds=30, promql="sum by (pod) (rate(x[{window}]))")
    assert [p.promql for p in plan(override, fresh_within=60)] == ["sum by (pod) (rate(x[30s]))"]


async def test_answers_are_decoded_off_the_event_loop_one_at_a_time(prom, monkeypatch):
    """A decode stalled on purpose leaves the event loop free (HPA requests keep being served); the answers
    of one refresh share their label sets, so they are decoded one after another, never at once."""
    import threading

    import gpuscale.sources.prometheus as promsource

    prom.answers["DCGM_FI_DEV_FB_USED"] = [({"__name__": "DCGM_FI_DEV_FB_USED", "UUID": "GPU-0"}, "1024")]
    prom.answers["DCGM_FI_DEV_FB_FREE"] = [({"__name__": "DCGM_FI_DEV_FB_FREE", "UUID": "GPU-0"}, "80000")]
    entered, release, left = threading.Event(), threading.Event(), threading.Event()
    running, most = [0], [0]
    real = promsource.decode_answer

    def stalled(*args: Any, **kw: Any) -> Any:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            if not entered.is_set():
                entered.set()
                release.wait(10)  # NB: a bound, so a decode on the loop fails the test instead of hanging it
                left.set()
            return real(*args, **kw)
        finally:
            running[0] -= 1

    monkeypatch.setattr(promsource, "decode_answer", stalled)
    source = source_for(prom.url, FB, decode_in="thread")  # NB: the process: tests/sources/test_decoder_process.py
    refresh = asyncio.create_task(source.refresh(now=T0))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        await asyncio.sleep(0.05)  # NB: the loop runs while the first decode is still stalled
        stalled_meanwhile = not left.is_set()
    finally:
        release.set()
    await refresh
    assert stalled_meanwhile and most[0] == 1
    assert [(v.name, v.value) for v in source.read(FB)] == [("DCGM_FI_DEV_FB_USED", 1024), ("DCGM_FI_DEV_FB_FREE", 8e4)]
    await source.close()


# --- demand-driven refresh: a scope per term -------------------------------------------------------------------


def test_a_namespace_scope_filters_on_the_workload_labels_in_attribution_order():
    """One alternative per (pod, namespace) label pair, earlier pod labels empty, plus the series with no pod
    label (attributed through their scrape target, which PromQL cannot see); joined with ``or``."""
    (planned,) = plan(GAUGE, namespaces=frozenset({"ml"}))
    assert planned.promql == (
        '(DCGM_FI_DEV_GPU_UTIL{exported_pod!="",exported_namespace="ml"}) or '
        '(DCGM_FI_DEV_GPU_UTIL{exported_pod="",pod!="",namespace="ml"}) or '
        '(DCGM_FI_DEV_GPU_UTIL{exported_pod="",pod="",pod_name!="",pod_namespace="ml"}) or '
        '(DCGM_FI_DEV_GPU_UTIL{exported_pod="",pod="",pod_name=""})'
    )
    (rate,) = plan(RATE, namespaces=frozenset({"b", "a.x"}), fresh_within=60)
    first = rate.promql.split(" or ")[0]
    assert first == (
        '(rate(nv_inference_request_success{exported_pod!="",exported_namespace=~"a\\\\.x|b"}[60s]) unless '
        'time() - timestamp(nv_inference_request_success{exported_pod!="",exported_namespace=~"a\\\\.x|b"}) > 60)'
    )
    override = TermQuery(series=("x",), input="rate", window_seconds=30, promql="sum by (pod) (rate(x[{window}]))")
    assert [p.promql for p in plan(override, namespaces=frozenset({"ml"}))] == ["sum by (pod) (rate(x[30s]))"]


async def test_a_scope_queries_only_its_terms_and_reads_the_rest_as_empty(prom):
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0", pod="p", namespace="ml"), "50")]
    prom.answers["rate(nv_inference_request_success[60s])"] = [({"pod": "t", "namespace": "ml"}, "3")]
    source = source_for(prom.url, GAUGE, RATE)
    await source.refresh(now=T0)
    assert len(source.read(GAUGE)) == len(source.read(RATE)) == 1
    source.set_scope({RATE: None})
    await source.refresh(now=T0)
    assert prom.queries()[-1:] == ["rate(nv_inference_request_success[60s])"]
    assert source.read(GAUGE) == [] and len(source.read(RATE)) == 1
    assert source.promql == ["rate(nv_inference_request_success[60s])"]
    source.set_scope({})
    await source.refresh(now=T0)
    assert len(prom.seen) == 3 and source.read(RATE) == [] and source.health()[0].healthy
    source.set_scope(None)  # everything again
    await source.refresh(now=T0)
    assert sorted(prom.queries()[3:]) == ["DCGM_FI_DEV_GPU_UTIL", "rate(nv_inference_request_success[60s])"]
    await source.close()


async def test_a_term_whose_scope_changed_keeps_its_last_values_when_the_new_query_fails(prom):
    """Demand-driven refresh narrows a term's query to the namespaces asked for, which changes its text; if the
    server is down by then, the term keeps the values the old query brought (they age into staleness, so the
    adapter answers 503 after max-age) instead of having none (a 404 for a metric it served a second ago)."""
    prom.answers["DCGM_FI_DEV_GPU_UTIL"] = [(dcgm("0", pod="p", namespace="ml"), "50")]
    source = source_for(prom.url, GAUGE)
    await source.refresh(now=T0)  # every namespace
    (before,) = source.read(GAUGE)
    prom.faults["*"] = answer(503, {"status": "error", "errorType": "unavailable", "error": "down"})
    source.set_scope({GAUGE: frozenset({"ml"})})
    await source.refresh(now=T0)
    assert "namespace" in source.promql[0] and not source.health()[0].healthy
    assert source.read(GAUGE) == [before]  # the same value, with its old timestamp
    del prom.faults["*"]
    prom.answers[source.promql[0]] = [(dcgm("0", pod="p", namespace="ml"), "60")]  # the narrowed query's answer
    await source.refresh(now=T0)
    assert [v.value for v in source.read(GAUGE)] == [60.0] and source.health()[0].healthy
    await source.close()
