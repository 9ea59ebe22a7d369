"""The embedded scrape source against real HTTP servers on loopback, healthy and faulty.

Each fault must leave a clear reason in the target's health, keep the previous values (which then
age into staleness), and never raise out of refresh().
"""

from __future__ import annotations

import asyncio
import math

import pytest
from aiohttp import web

from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.sources.base import TermQuery
from gpuscale.sources.scrape import ScrapeSource
from tests.helpers import H100, TRITON, TRITON_T0

GAUGE = TermQuery(series=("DCGM_FI_DEV_GPU_UTIL",))
RATE = TermQuery(series=("nv_inference_request_success",), input="rate", window_seconds=60)


class Exporter:
    """A tiny programmable exporter: what to answer is set per test."""

    def __init__(self) -> None:
        self.body: bytes = H100.read_bytes()
        self.status = 200
        self.hang = False
        self.content_type = "text/plain; version=0.0.4"

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if self.hang:
            await asyncio.sleep(3600)
        if self.status != 200:
            return web.Response(status=self.status, text="boom")
        resp = web.StreamResponse(headers={"Content-Type": self.content_type})
        await resp.prepare(request)
        for i in range(0, len(self.body), 1 << 20):
            await resp.write(self.body[i : i + (1 << 20)])
        await resp.write_eof()
        return resp


@pytest.fixture
async def exporter(aiohttp_server):
    e = Exporter()
    app = web.Application()
    app.router.add_get("/metrics", e.handle)
    server = await aiohttp_server(app)
    e.url = str(server.make_url("/metrics"))
    return e


_OFF_LOOP = [False]


@pytest.fixture(autouse=True, params=[False, True], ids=["on-the-loop", "off-loop"])
def off_loop(request):
    """Sources made by make_source scrape on the caller's loop (top) and on a loop of their own in a thread (the
    adapter): same values, faults and reasons."""
    _OFF_LOOP[0] = request.param
    yield request.param
    _OFF_LOOP[0] = False


def make_source(url, clock, **kw):
    catalogue = load_catalogue()
    if "session" not in kw:
        kw.setdefault("off_loop", _OFF_LOOP[0])
    return ScrapeSource(
        [url],
        series=catalogue.series_names,
        windowed_series=catalogue.windowed_series,
        history_seconds=120,
        clock=lambda: clock[0],
        **kw,
    )


async def test_healthy_scrape_keeps_catalogue_series_only(exporter):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    await source.refresh(now=clock[0])
    values = source.read(GAUGE)
    assert len(values) == 8 and {v.timestamp for v in values} == {1000.0}
    (health,) = source.health()
    assert health.healthy and health.error is None and health.series > 0
    assert source.read(TermQuery(series=("DCGM_FI_DEV_SM_CLOCK",))) == []  # not in the catalogue: not kept
    await source.close()


async def test_rate_from_two_scrapes(exporter):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    exporter.body = TRITON_T0.read_bytes()
    await source.refresh(now=clock[0])
    assert source.read(RATE) == []  # one scrape: no rate yet
    clock[0] += 60
    exporter.body = TRITON.read_bytes()
    await source.refresh(now=clock[0])
    rates = {(v.labels["model"], "gpu_uuid" in v.labels): v.value for v in source.read(RATE)}
    assert rates[("resnet50_trt", True)] == pytest.approx(330.0)
    assert rates[("bert_qa_onnx", True)] == pytest.approx(41.0)
    await source.close()


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("hang", "timed out after 0.3s"),
        ("status", "HTTP 500"),
        ("huge", "exceeds"),
        ("malformed", ":3: "),
    ],
)
async def test_faults_mark_target_unhealthy_and_keep_old_values(exporter, fault, reason):
    clock = [1000.0]
    source = make_source(exporter.url, clock, timeout_seconds=0.3, max_body_bytes=4 * 1024 * 1024)
    await source.refresh(now=clock[0])
    assert len(source.read(GAUGE)) == 8
    if fault == "hang":
        exporter.hang = True
    elif fault == "status":
        exporter.status = 500
    elif fault == "huge":
        exporter.body = b"# filler\n" * (50 * 1024 * 1024 // 9)  # ~50 MB
    else:
        exporter.body = b'# HELP x y\n# TYPE x gauge\nx{gpu="0" 1\n'
    clock[0] += 5
    await asyncio.wait_for(source.refresh(now=clock[0]), timeout=10)
    (health,) = source.health()
    assert not health.healthy
    assert reason in health.error
    assert health.failures_total == 1
    assert health.last_success == 1000.0
    # The previous values remain, with their old timestamp, to age into staleness.
    values = source.read(GAUGE)
    assert len(values) == 8 and {v.timestamp for v in values} == {1000.0}
    await source.close()


async def test_connection_refused_is_a_clear_error():
    clock = [1000.0]
    source = make_source("http://127.0.0.1:9/metrics", clock, timeout_seconds=1)
    await source.refresh(now=clock[0])
    (health,) = source.health()
    assert not health.healthy and "ClientConnectorError" in health.error
    await source.close()


async def test_nan_values_are_kept_as_nan_never_as_numbers(exporter):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    exporter.body = (
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1",Hostname="n1"} NaN\n'
        b'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2",Hostname="n1"} 40\n'
    )
    await source.refresh(now=clock[0])
    values = {v.labels["gpu"]: v.value for v in source.read(GAUGE)}
    assert math.isnan(values["0"]) and values["1"] == 40
    await source.close()


USELESS_PAGES = [
    # (what the exporter answers with status 200, health.error_kind, words of the reason)
    (b"", "empty", "no samples"),
    (b"# HELP go_goroutines x\n# TYPE go_goroutines gauge\ngo_goroutines 12\n", "no_series", "none of the"),
    (
        b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} NaN\nDCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2"} NaN\n',
        "all_nan",
        "NaN",
    ),
]


@pytest.mark.parametrize(("body", "kind", "words"), USELESS_PAGES, ids=[k for _, k, _ in USELESS_PAGES])
async def test_a_200_with_nothing_usable_is_a_failed_read_not_a_healthy_one(exporter, body, kind, words):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    await source.refresh(now=clock[0])  # a good scrape first
    clock[0] = 1005.0
    exporter.body = body
    await source.refresh(now=clock[0])
    (health,) = source.health()
    assert not health.healthy and health.error_kind == kind and words in health.error, health
    assert health.last_success == 1000.0 and health.last_error_at == 1005.0
    # The good values stay, with their old timestamp, to age into 503s; nothing NaN or empty replaces them.
    values = source.read(GAUGE)
    assert len(values) == 8 and {v.timestamp for v in values} == {1000.0}
    await source.close()


async def test_a_gpu_missing_from_its_exporter_marks_the_target_degraded(exporter):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    full = exporter.body
    await source.refresh(now=clock[0])
    assert source.health()[0].degraded is None
    gone = b"\n".join(line for line in full.split(b"\n") if b'gpu="3"' not in line)
    assert gone != full
    exporter.body = gone
    clock[0] = 1005.0
    await source.refresh(now=clock[0])
    (health,) = source.health()
    assert health.healthy and health.error_kind == "gpus_missing"
    assert health.degraded == "exports 7 GPUs, 8 earlier: a GPU is missing from its exporter"
    assert len(source.read(GAUGE)) == 7  # the read itself is served: the other GPUs are real
    exporter.body = full
    clock[0] = 1010.0
    await source.refresh(now=clock[0])
    (health,) = source.health()
    assert health.degraded is None and health.last_error_kind == "gpus_missing"  # what happened stays visible
    await source.close()


async def test_an_exporters_bytes_never_reach_the_reason_raw(exporter):
    clock = [1000.0]
    source = make_source(exporter.url, clock)
    exporter.body = b'DCGM_FI_DEV_GPU_UTIL{gpu="0\x1b[31m\x07' + b"x" * 500 + b"\n"
    await source.refresh(now=clock[0])
    (health,) = source.health()
    assert not health.healthy and health.error_kind == "malformed"
    assert health.error.isprintable() and len(health.error) <= 160, health.error
    await source.close()


# --- windowed reads (pure: ingest + read) ----------------------------------------------------------------

COUNTER = "nv_inference_request_success"


def counter_page(**values: float) -> list:
    """A Triton-like page: one request counter per model (model=value), plus a gauge."""
    from gpuscale.metrics.exposition import parse_samples

    lines = [f'{COUNTER}{{model="{m}",version="1"}} {v}' for m, v in values.items()]
    return parse_samples("\n".join([*lines, "nv_inference_pending_request_count 3", ""]))


def windowed_source() -> ScrapeSource:
    return ScrapeSource([], series={COUNTER}, windowed_series={COUNTER}, history_seconds=300)


def by_model(values) -> dict[str, tuple[float, float | None]]:
    return {v.labels["model"]: (v.value, v.window_seconds) for v in values}


def test_increase_and_rate_over_several_scrapes_count_a_reset_as_a_restart():
    source = windowed_source()
    for at, a in ((0, 100.0), (15, 160.0), (30, 10.0), (45, 40.0)):  # "a" restarts between 15 s and 30 s
        source.ingest("http://t", counter_page(a=a), timestamp=1000.0 + at)
    increase = TermQuery(series=(COUNTER,), input="increase", window_seconds=60)
    rate = TermQuery(series=(COUNTER,), input="rate", window_seconds=60)
    assert by_model(source.read(increase)) == {"a": (60.0 + 10.0 + 30.0, 45.0)}
    assert by_model(source.read(rate)) == {"a": (pytest.approx(100.0 / 45.0), 45.0)}
    # A 20 s window holds the last two scrapes only.
    short = TermQuery(series=(COUNTER,), input="increase", window_seconds=20)
    assert by_model(source.read(short)) == {"a": (30.0, 15.0)}


def test_two_scrapes_give_one_value_per_series_present_in_both():
    source = windowed_source()
    source.ingest("http://t", counter_page(a=5.0, b=7.0), timestamp=1000.0)
    source.ingest("http://t", counter_page(a=20.0, b=3.0, new=9.0), timestamp=1010.0)
    increase = TermQuery(series=(COUNTER,), input="increase", window_seconds=60)
    # b went down: a restart, its increase is its new value; "new" has one point: no value, not zero.
    assert by_model(source.read(increase)) == {"a": (15.0, 10.0), "b": (3.0, 10.0)}
    matched = TermQuery(series=(COUNTER,), input="increase", window_seconds=60, match=(("model", "b"),))
    assert by_model(source.read(matched)) == {"b": (3.0, 10.0)}


def test_a_series_missing_from_a_middle_scrape_spans_from_its_first_point():
    source = windowed_source()
    source.ingest("http://t", counter_page(a=1.0, b=100.0), timestamp=1000.0)
    source.ingest("http://t", counter_page(a=2.0), timestamp=1010.0)
    source.ingest("http://t", counter_page(a=4.0, b=130.0), timestamp=1020.0)
    increase = TermQuery(series=(COUNTER,), input="increase", window_seconds=60)
    assert by_model(source.read(increase)) == {"a": (3.0, 20.0), "b": (30.0, 20.0)}
    source.ingest("http://t", counter_page(a=5.0), timestamp=1100.0)  # the window now holds one scrape of b
    assert by_model(source.read(TermQuery(series=(COUNTER,), input="increase", window_seconds=60))) == {}


def test_the_fast_series_value_constructor_builds_the_same_named_tuple():
    from gpuscale.sources.base import SeriesValue, series_value

    made = series_value(("DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 42.0, 1000.0, "http://t", None))
    assert type(made) is SeriesValue and made == SeriesValue(
        "DCGM_FI_DEV_GPU_UTIL", {"gpu": "0"}, 42.0, 1000.0, "http://t"
    )
    assert (made.labels, made.target, made.window_seconds) == ({"gpu": "0"}, "http://t", None)


async def test_a_hung_exporter_does_not_hold_back_the_others(aiohttp_server):
    """publish_early (the adapter's mode): the refresh returns with the answering targets' values; the hung
    target's scrape goes on until its own timeout and is then reported, its values never replaced by nothing."""
    exporters = []
    for _ in range(3):
        e = Exporter()
        app = web.Application()
        app.router.add_get("/metrics", e.handle)
        e.url = str((await aiohttp_server(app)).make_url("/metrics"))
        exporters.append(e)
    clock = [1000.0]
    catalogue = load_catalogue()
    source = ScrapeSource(
        [e.url for e in exporters],
        series=catalogue.series_names,
        windowed_series=catalogue.windowed_series,
        timeout_seconds=2.0,
        clock=lambda: clock[0],
        publish_early=True,
        off_loop=_OFF_LOOP[0],
    )
    await source.refresh(now=clock[0])
    assert len(source.read(GAUGE)) == 24  # 3 × 8 GPUs
    exporters[0].hang = True
    clock[0] = 1005.0
    loop = asyncio.get_running_loop()
    started = loop.time()
    await source.refresh(now=clock[0])
    took = loop.time() - started
    assert took < 1.5, f"the refresh waited {took:.2f}s for a hung exporter (timeout 2s)"
    by_target = {}
    for v in source.read(GAUGE):
        by_target.setdefault(v.target, set()).add(v.timestamp)
    assert by_target[exporters[1].url] == {1005.0} and by_target[exporters[2].url] == {1005.0}
    assert by_target[exporters[0].url] == {1000.0}  # its last values, ageing
    # The next refresh does not start a second scrape of it; once its timeout passes it is reported.
    await source.refresh(now=clock[0])
    await asyncio.sleep(2.2)
    hung = next(h for h in source.health() if h.target == exporters[0].url)
    assert not hung.healthy and hung.error_kind == "timeout" and hung.failures_total == 1
    await source.close()


async def test_scrapes_off_the_loop_leave_the_loop_free(exporter, monkeypatch):
    """The adapter's mode: while a page's parse is stalled on purpose, the caller's event loop keeps running (an HPA
    request would be served); the page's values arrive once the parse ends."""
    import threading

    import gpuscale.sources.scrape as scrape

    entered, release = threading.Event(), threading.Event()
    real = scrape.parse_samples

    def stalled(*args, **kw):
        entered.set()
        release.wait(10)  # NB: a bound: a parse on the loop fails the test instead of hanging it
        return real(*args, **kw)

    monkeypatch.setattr(scrape, "parse_samples", stalled)
    clock = [1000.0]
    source = make_source(exporter.url, clock, off_loop=True)
    refresh = asyncio.create_task(source.refresh(now=clock[0]))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        ticks = 0
        for _ in range(5):
            await asyncio.sleep(0.01)  # NB: the loop runs while the parse is stalled
            ticks += 1
        assert not refresh.done()
    finally:
        release.set()
    await refresh
    assert ticks == 5 and len(source.read(GAUGE)) == 8
    await source.close()
