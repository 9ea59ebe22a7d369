"""Requests aiohttp's parser rejects: a Status answer, a counter, one log line per client — never a traceback."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web
from prometheus_client import generate_latest

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.transport import MAX_REQUEST_LINE, AdapterRunner, RejectionLog
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.store import MetricsStore
from tests.adapter.test_api import make_cluster

MALFORMED = [
    (
        "request line too long",
        b"GET /apis/" + b"a" * (MAX_REQUEST_LINE + 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        "too_long",
    ),
    ("unknown method", b"FOO /apis HTTP/1.1\r\nHost: x\r\n\r\n", "bad_method"),
    ("negative Content-Length", b"GET /apis HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", None),
    ("NUL in a header", b"GET /apis HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n", None),
    (
        "600 headers",
        b"GET /apis HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(600)) + b"\r\n",
        None,
    ),
    ("raw \\xff in the path", b"GET /apis/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n", None),
    ("not HTTP at all", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n", None),
]


@pytest.fixture
async def server():
    catalogue = load_catalogue()
    metrics = AdapterMetrics(lambda: [])
    store = MetricsStore()
    provider = MetricsProvider(catalogue, store, make_cluster())
    app = make_app(provider, Discovery(catalogue), metrics, ready=lambda: (True, ""))
    runner = AdapterRunner(
        app, rejections=RejectionLog(count=lambda r: metrics.rejected_requests.labels(r).inc()), access_log=None
    )
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    yield port, metrics
    await runner.cleanup()


async def exchange(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


def status_of(answer: bytes) -> tuple[int, dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    code = int(head.split(b" ", 2)[1])
    return code, json.loads(body)


@pytest.mark.parametrize(("what", "request_bytes", "reason"), MALFORMED, ids=[m[0] for m in MALFORMED])
async def test_a_malformed_request_gets_a_status_and_one_line_without_traceback(
    server, caplog, what, request_bytes, reason
):
    port, metrics = server
    caplog.set_level(logging.DEBUG)
    code, body = status_of(await exchange(port, request_bytes))
    assert code == 400
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["code"] == 400
    assert body["reason"] == "BadRequest"
    assert "\\x" not in body["message"] and "aaaa" not in body["message"] and "X-A" not in body["message"]
    for record in caplog.records:
        assert record.exc_info is None and "Traceback" not in record.getMessage(), record.getMessage()
        assert record.levelno < logging.ERROR, record.getMessage()
    lines = [r for r in caplog.records if r.name == "gpuscale.adapter.transport"]
    assert len(lines) == 1 and "from 127.0.0.1" in lines[0].getMessage()
    if reason is not None:
        assert f"[{reason}]" in lines[0].getMessage()
    exposed = generate_latest(metrics.registry).decode()
    assert "gpuscale_adapter_rejected_requests_total{reason=" in exposed
    # The server keeps serving.
    answer = await exchange(port, b"GET /apis HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 200")


async def test_a_client_fills_no_log(server, caplog):
    port, metrics = server
    caplog.set_level(logging.INFO)
    for _ in range(50):
        await exchange(port, b"FOO /apis HTTP/1.1\r\nHost: x\r\n\r\n")
    lines = [r for r in caplog.records if r.name == "gpuscale.adapter.transport"]
    assert len(lines) == 1
    assert metrics.rejected_requests.labels("bad_method")._value.get() == 50


async def test_a_long_but_valid_label_selector_is_accepted(server):
    port, _ = server
    selector = "app%20in%20(" + "%2C".join(f"triton-{i:04d}" for i in range(1500)) + ")"  # ~20 KB
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector={selector}"
    assert 16_000 < len(path) < MAX_REQUEST_LINE
    answer = await exchange(port, f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    code, body = status_of(answer)
    assert code != 400 or "too long" not in body["message"], body
    assert body["kind"] in ("MetricValueList", "Status") and code in (200, 404, 503), body["message"]


def test_rejection_log_is_bounded_per_client_and_per_interval(caplog):
    caplog.set_level(logging.INFO)
    now = [0.0]
    counted: list[str] = []
    rejections = RejectionLog(interval=60.0, max_lines=3, count=counted.append, clock=lambda: now[0])
    assert rejections.record("10.0.0.1", "bad_method", "unsupported HTTP method")
    assert not rejections.record("10.0.0.1", "bad_method", "unsupported HTTP method")
    assert rejections.record("10.0.0.2", "bad_url", "malformed request URL")
    assert rejections.record("10.0.0.3", "bad_url", "malformed request URL")
    assert not rejections.record("10.0.0.4", "bad_url", "malformed request URL")  # 3 lines this interval
    now[0] = 61.0
    assert rejections.record("10.0.0.1", "bad_method", "unsupported HTTP method")
    assert len(counted) == 6
    last = [r.getMessage() for r in caplog.records][-1]
    assert last.endswith("(1 more from this client since its last line)"), last
