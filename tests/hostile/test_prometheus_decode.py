"""Hostile Prometheus answers against the adapter's decode path (issue 32, item 7), in both decode modes.

A fake Prometheus on loopback answers a refresh's good queries with good series and each hostile query with one
hostile body (nesting 100,000 deep, wrong JSON types at every level, values and timestamps that are not numbers,
repeated label sets, 50 MB and 300 MB bodies, bytes that are not UTF-8, truncated JSON, HTML pages, HTTP errors,
``"status": "error"``), all in the same refresh. Whatever comes back, in a worker thread or in the decoder process:
the good queries' values arrive, each hostile query fails alone with a specific reason and is counted by kind in
health's ``failed_reads`` (``gpuscale_source_failed_reads`` on /metrics), nothing escapes ``refresh`` and no
traceback reaches the log. Values that are numbers to ``float()`` ("NaN", "+Inf", "1e400") are read as such; what
is served of them is the adapter's concern (tests/hostile/test_adapter_values.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import pytest
import pytest_asyncio
from aiohttp import web

from gpuscale.sources.base import TermQuery
from gpuscale.sources.prometheus import PrometheusSource
from tests.helpers import T0
from tests.sources.test_prometheus import FakePrometheus, Handler

DEEP = 100_000
MB = 1024 * 1024


def raw(body: bytes, status: int = 200, content_type: str = "application/json") -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return web.Response(body=body, status=status, content_type=content_type)

    return handler


def streamed(total_bytes: int, *, declared: bool) -> Handler:
    """``total_bytes`` of a JSON string sent a chunk at a time (never held whole), with or without Content-Length."""

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        if declared:
            resp.content_length = total_bytes
        await resp.prepare(request)
        chunk = b"a" * MB
        try:
            await resp.write(b'"')
            for _ in range(total_bytes // MB - 1):
                await resp.write(chunk)
        except (ConnectionError, RuntimeError):
            pass  # NB: the client refused the answer at its size cap and closed the connection
        return resp

    return handler


def body(obj: object) -> Handler:
    return raw(json.dumps(obj).encode())


def vector(result: object, **top: object) -> Handler:
    return body({"status": "success", "data": {"resultType": "vector", "result": result}, **top})


_GOOD = object()


def item(metric: object = _GOOD, value: object = _GOOD) -> dict:
    return {"metric": {"pod": "p"} if metric is _GOOD else metric, "value": [T0, "1"] if value is _GOOD else value}


def nested(depth: int, leaf: str = "1") -> bytes:
    return b"[" * depth + leaf.encode() + b"]" * depth


@dataclass(frozen=True)
class Hostile:
    name: str
    handler: Handler
    kind: str | None  # the failed query's kind; None: the answer is read (its values are numbers to float())
    says: str = ""


VALID = json.dumps({"status": "success", "data": {"resultType": "vector", "result": [item()]}}).encode()
WRONG_TYPES: list[tuple[str, object]] = [
    ("null", None),
    ("true", True),
    ("number", 3),
    ("string", "x"),
    ("list", [1]),
    ("object", {"a": 1}),
]
HOSTILE = [
    # nesting far past any recursion limit, at the top and inside a valid shape
    Hostile("array nesting 100k", raw(nested(DEEP)), "malformed", "nested too deeply"),
    Hostile("object nesting 100k", raw(b'{"a":' * DEEP + b"1" + b"}" * DEEP), "malformed", "nested too deeply"),
    Hostile(
        "label value nesting 100k",
        raw(b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":' + nested(DEEP) + b"}}]}}"),
        "malformed",
        "nested too deeply",
    ),
    Hostile("warnings nesting 100k", raw(VALID[:-1] + b',"warnings":' + nested(DEEP) + b"}"), "malformed", "nested"),
    Hostile("value nesting 900", vector([item(value=json.loads(nested(900)))]), "malformed", "result[0].value"),
    # wrong types at each level
    *(Hostile(f"body {n}", body(v), "malformed", "malformed response") for n, v in WRONG_TYPES if n != "object"),
    Hostile("body object", body({"a": 1}), "query_error", "status None"),
    *(Hostile(f"status {n}", body({"status": v}), "query_error", "error") for n, v in WRONG_TYPES),
    *(
        Hostile(f"data {n}", body({"status": "success", "data": v}), "malformed", "no 'data'")
        for n, v in WRONG_TYPES
        if n != "object"
    ),
    *(
        Hostile(f"resultType {n}", body({"status": "success", "data": {"resultType": v, "result": []}}), "malformed")
        for n, v in WRONG_TYPES
    ),
    *(Hostile(f"result {n}", vector(v), "malformed", "'result' is not a list") for n, v in WRONG_TYPES if n != "list"),
    *(Hostile(f"item {n}", vector([item(), v]), "malformed", "result[1]") for n, v in WRONG_TYPES),
    *(Hostile(f"metric {n}", vector([item(metric=v)]), "malformed", "result[0]") for n, v in WRONG_TYPES),
    *(
        Hostile(f"label value {n}", vector([item(metric={"pod": v})]), "malformed", "not a string")
        for n, v in WRONG_TYPES
        if n != "string"
    ),
    *(
        Hostile(f"__name__ {n}", vector([item(metric={"__name__": v, "pod": "p"})]), "malformed", "__name__")
        for n, v in WRONG_TYPES
        if v and n != "string"
    ),
    *(Hostile(f"value pair {n}", vector([item(value=v)]), "malformed", "result[0].value") for n, v in WRONG_TYPES),
    Hostile("value pair of 3", vector([item(value=[T0, "1", "2"])]), "malformed", "[timestamp, value] pair"),
    # values and timestamps
    Hostile("value x", vector([item(value=[T0, "x"])]), "malformed", "could not convert string to float"),
    Hostile("value empty", vector([item(value=[T0, ""])]), "malformed", "result[0].value"),
    Hostile("value 10**400", raw(VALID.replace(b'"1"]', b"1" + b"0" * 400 + b"]")), "malformed", "too large"),
    Hostile("value 5000 digits", raw(VALID.replace(b'"1"]', b"1" * 5000 + b"]")), "malformed", "malformed JSON"),
    Hostile("value NaN", vector([item(value=[T0, "NaN"])]), None),
    Hostile("value +Inf", vector([item(value=[T0, "+Inf"])]), None),
    Hostile("value 1e400 string", vector([item(value=[T0, "1e400"])]), None),
    Hostile("value 1e400 number", raw(VALID.replace(b'"1"]', b"1e400]")), None),
    *(
        Hostile(f"timestamp {n}", vector([item(value=[v, "1"])]), "malformed", "result[0].value")
        for n, v in WRONG_TYPES
        if n not in ("true", "number")
    ),
    Hostile("timestamp as a number string", vector([item(value=[str(T0), "1"])]), None),
    Hostile("repeated label set", vector([item(), item(value=[T0, "2"])]), "malformed", "repeats the label set"),
    # sizes, encodings, truncation
    Hostile("50 MB error text", body({"status": "error", "error": "e" * 50 * MB}), "query_error", "eeee..."),
    Hostile("50 MB not JSON", raw(b"<" * 50 * MB), "malformed", "malformed JSON"),
    Hostile("300 MB chunked", streamed(300 * MB, declared=False), "too_large", "answer larger than 64 MiB"),
    Hostile("300 MB declared", streamed(300 * MB, declared=True), "too_large", "refused unread"),
    Hostile("not UTF-8", raw(b"\xff\xfe\xfa" * 1000), "malformed", "malformed JSON"),
    Hostile("not UTF-8 in a label", raw(VALID.replace(b'"p"', b'"\xff\xc0"')), "malformed", "malformed JSON"),
    Hostile("empty body", raw(b""), "malformed", "malformed JSON"),
    Hostile("truncated", raw(VALID[: len(VALID) // 2]), "malformed", "malformed JSON"),
    Hostile("truncated to one byte", raw(b"{"), "malformed", "malformed JSON"),
    # what proxies and servers say instead
    Hostile("HTML 200", raw(b"<html>Sign in</html>", content_type="text/html"), "malformed", "text/html"),
    Hostile("HTML 502", raw(b"<html>Bad Gateway</html>", 502, "text/html"), "http_status", "HTTP 502"),
    Hostile("HTML 401", raw(b"<html>Unauthorized</html>", 401, "text/html"), "http_status", "HTTP 401"),
    Hostile("200 status error", body({"status": "error", "errorType": "bad_data", "error": "x"}), "query_error"),
    Hostile("error type nesting 900", body({"status": "error", "errorType": json.loads(nested(900))}), "query_error"),
    Hostile("503 JSON", raw(b'{"status":"error","error":"not ready"}', 503), "http_status", "not ready"),
    Hostile("matrix", body({"status": "success", "data": {"resultType": "matrix", "result": []}}), "malformed"),
]
GOOD = [TermQuery(series=(f"good_{i}",)) for i in range(3)]
BAD = [TermQuery(series=(f"hostile_{i}",)) for i in range(len(HOSTILE))]


def good_series(i: int) -> list[tuple[dict[str, str], str]]:
    return [({"__name__": f"good_{i}", "pod": f"pod-{n}", "namespace": "ml"}, str(10 * i + n)) for n in range(3)]


@pytest.fixture(params=["thread", "process"])
def decode_in(request):
    return request.param


async def test_every_hostile_answer_fails_its_query_alone(decode_in, caplog):
    """One refresh: 3 good queries and every hostile body, one per query; then a refresh with every answer good."""
    prom = await FakePrometheus().start()
    for i in range(len(GOOD)):
        prom.answers[f"good_{i}"] = good_series(i)
    for term, hostile in zip(BAD, HOSTILE, strict=True):
        prom.faults[term.series[0]] = hostile.handler
    clock = [T0]
    source = PrometheusSource(
        prom.url,
        queries=[*GOOD, *BAD],
        clock=lambda: clock[0],
        timeout_seconds=60,
        decode_in=decode_in,
        off_loop=decode_in == "process",
    )
    caplog.set_level(logging.DEBUG)
    try:
        await source.refresh(now=T0)  # NB: must not raise, whatever the answers
        for i, term in enumerate(GOOD):
            assert [v.value for v in source.read(term)] == [10 * i + n for n in range(3)], term
        (health,) = source.health()
        expected_kinds: dict[str, int] = {}
        for term, hostile in zip(BAD, HOSTILE, strict=True):
            values = source.read(term)
            if hostile.kind is None:
                assert len(values) == 1 and isinstance(values[0].value, float), hostile.name
            else:
                assert values == [], hostile.name  # NB: nothing of a failed first answer is served
                expected_kinds[hostile.kind] = expected_kinds.get(hostile.kind, 0) + 1
        assert health.failed_reads == expected_kinds
        assert health.extra["failed_queries"] == str(sum(expected_kinds.values()))
        # Healed: every query answers well; the counts stay (counters), the health is good again.
        prom.faults.clear()
        for term in BAD:
            prom.answers[term.series[0]] = [({"pod": "p"}, "5")]
        prom.sample_time = clock[0] = T0 + 5
        await source.refresh(now=clock[0])
        (health,) = source.health()
        assert health.healthy, health.error
        assert all([(v.value, v.timestamp) for v in source.read(term)] == [(5.0, T0 + 5)] for term in BAD)
        assert health.failed_reads == expected_kinds
    finally:
        await source.close()
        await prom.stop()
    ours = [r for r in caplog.records if r.name.startswith("gpuscale")]  # NB: not the fake server's
    assert not [r for r in ours if r.exc_info or "Traceback" in r.getMessage()], "a traceback reached the log"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.endswith("prometheus")]
    assert len(warnings) == 1, [r.getMessage()[:200] for r in warnings]  # NB: one line for the refresh, not per query
    print(f"\n{len(HOSTILE)} hostile answers beside {len(GOOD)} good queries, decoded in a {decode_in}")


@dataclass
class OneQuery:
    """A source with one query, against a fake Prometheus whose every answer a test chooses."""

    prom: FakePrometheus
    source: PrometheusSource
    term: TermQuery


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["thread", "process"])
async def one_query(request):
    """One per decode mode for all of test_each_hostile_answer_says_why, as an adapter's source lives across
    refreshes: a new source per answer started a decoder process each time (~0.2 s of CPU, most of this module's)."""
    prom = await FakePrometheus().start()
    term = TermQuery(series=("hostile",))
    source = PrometheusSource(
        prom.url, queries=[term], clock=lambda: T0, timeout_seconds=60, decode_in=request.param, off_loop=True
    )
    try:
        yield OneQuery(prom, source, term)
    finally:
        await source.close()
        await prom.stop()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("hostile", HOSTILE, ids=[h.name for h in HOSTILE])
async def test_each_hostile_answer_says_why(hostile: Hostile, one_query: OneQuery):
    """A hostile answer to the only query of a source: its reason names what is wrong, its kind is counted once."""
    prom, source, term = one_query.prom, one_query.source, one_query.term
    prom.faults["*"] = hostile.handler
    (before,) = source.health()
    await source.refresh(now=T0)
    (health,) = source.health()
    if hostile.kind is None:
        assert health.healthy, health.error
        assert len(source.read(term)) == 1
        assert health.failed_reads == before.failed_reads
    else:
        assert not health.healthy and health.error_kind == hostile.kind, (health.error_kind, health.error)
        assert hostile.says in health.error, health.error
        counted = before.failed_reads | {hostile.kind: before.failed_reads.get(hostile.kind, 0) + 1}
        assert health.failed_reads == counted, (before.failed_reads, health.failed_reads)
        assert len(health.error) < 400  # NB: a 50 MB error text is quoted short
