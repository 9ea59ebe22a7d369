"""Malformed HTTP over a raw socket, against the real ``gpuscale adapter`` process.

The adapter runs as a user starts it — ``python -m gpuscale.cli.main adapter --insecure-port 0`` with the
simulated cluster's kubeconfig and exporter URLs (as tests/e2e/test_kubectl.py does); the simulated Kubernetes
API and exporters run in an event loop on a thread of this process. Its stderr (the adapter's log, in the CLI's
own format) goes to a file read after every request. Requests are written byte for byte to a plain socket:

- a fixed list: a request line over 8190 bytes (aiohttp's default limit; the adapter accepts 64 KiB) and over
  64 KiB, an unknown method, ``Content-Length: -1``, a NUL in a header, more than 500 headers, a raw ``\\xff``
  in the path, a header over 16 KiB, bad chunking, request smuggling headers, no Host, TLS bytes, a selector
  whose integer is past Python's digit limit, and truncated requests (the client goes away mid-request);
- hypothesis-generated garbage: random bytes, byte-level mutations of a real HPA request, and requests built
  from random methods, targets, versions and headers.

For each, the adapter must answer with a 4xx (or close the connection; never a 5xx), the answer must be a JSON
metav1.Status (kind Status, apiVersion v1, ``code`` = the HTTP status) wherever it has a body, the next good
request (on a new connection) must be served, and the log written meanwhile must hold no traceback and no
ERROR line: a client's malformed request is the client's problem, not the server's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.sim.cluster import SimCluster
from tests.fuzz import HealthCheck, fuzz_settings

pytestmark = pytest.mark.e2e  # it starts a real process, as the e2e tests do (still part of a plain `pytest` run)

EXAMPLES_GARBAGE_REQUESTS = 80
"""Hypothesis-generated garbage requests, each followed by a good request and a look at the log."""

ROOT = Path(__file__).resolve().parents[2]
ANSWER_WAIT = 1.0  # seconds to wait for an answer to a complete (if malformed) request
TRUNCATED_WAIT = 0.3  # seconds to wait before the client gives up on a request it never finishes
GARBAGE_WAIT = 0.5  # seconds to wait for an answer to generated garbage (which may be an unfinished request)
GOOD_REQUEST = b"GET /apis HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
HPA_REQUEST = (
    b"GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization"
    b"?labelSelector=app%3Dtriton-bert HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/json, */*\r\n"
    b"User-Agent: kube-controller-manager/v1.30.0\r\n\r\n"
)
_LOG_PROBLEM = re.compile(r"Traceback|^\S+ \S+ (ERROR|CRITICAL) ", re.MULTILINE)


# --- the adapter process ------------------------------------------------------------------------------------


class Adapter:
    """The running adapter: its port, its process, and its log read incrementally."""

    def __init__(self, port: int, proc: subprocess.Popen, log_path: Path) -> None:
        self.port, self.proc, self.log_path = port, proc, log_path
        self._offset = 0

    def new_log(self) -> str:
        """The log written since the last call."""
        with self.log_path.open("rb") as f:
            f.seek(self._offset)
            data = f.read()
        self._offset += len(data)
        return data.decode("utf-8", errors="replace")

    def whole_log(self) -> str:
        return self.log_path.read_bytes().decode("utf-8", errors="replace")


def _wait_for_port(log_path: Path, proc: subprocess.Popen, deadline: float) -> int:
    while time.monotonic() < deadline:
        m = re.search(r"serving the metrics APIs on http://127\.0\.0\.1:(\d+)", log_path.read_text(errors="replace"))
        if m:
            return int(m.group(1))
        assert proc.poll() is None, f"the adapter exited: {log_path.read_text(errors='replace')}"
        time.sleep(0.05)
    raise AssertionError(f"the adapter did not start: {log_path.read_text(errors='replace')}")


@pytest.fixture(scope="module")
def adapter(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Adapter]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="sim-cluster", daemon=True)
    thread.start()
    cluster = asyncio.run_coroutine_threadsafe(SimCluster().start(), loop).result(30)
    log_path = tmp_path_factory.mktemp("adapter") / "adapter.log"
    args = [sys.executable, "-m", "gpuscale.cli.main", "adapter", "--kubeconfig", cluster.kubeconfig]
    args += ["--insecure-port", "0", "--refresh-interval", "1s", "--log-level", "info"]
    for url in cluster.scrape_urls:
        args += ["--scrape-url", url]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, cwd=ROOT, env=os.environ.copy())
    try:
        deadline = time.monotonic() + 30
        running = Adapter(_wait_for_port(log_path, proc, deadline), proc, log_path)
        while time.monotonic() < deadline:  # ready: the first refresh is done, the watch cache synced
            answer = exchange(running.port, b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if answer.responses and answer.responses[0].status == 200:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"the adapter did not become ready: {running.whole_log()}")
        running.new_log()  # the start-up lines are not any request's
        yield running
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        asyncio.run_coroutine_threadsafe(cluster.stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


# --- a raw HTTP exchange --------------------------------------------------------------------------------------


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes | None  # None: the body did not arrive (a HEAD answer, or the server stopped writing)


@dataclass
class Answer:
    responses: list[Response] = field(default_factory=list)
    closed: bool = False  # the server closed (or reset) the connection
    raw: bytes = b""


def _parse_responses(data: bytes, *, complete: bool) -> tuple[list[Response], bytes]:
    """Responses at the start of ``data`` (``complete``: no more bytes will come), and what is left."""
    responses = []
    while True:
        head_end = data.find(b"\r\n\r\n")
        if head_end < 0:
            return responses, data
        head = data[:head_end].decode("latin-1").split("\r\n")
        m = re.fullmatch(r"HTTP/\d\.\d (\d{3})(?: .*)?", head[0])
        assert m, f"not an HTTP status line: {head[0]!r}"
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        status = int(m.group(1))
        length = int(headers.get("content-length", "0")) if status >= 200 and status not in (204, 304) else 0
        rest = data[head_end + 4 :]
        if len(rest) < length:
            if complete:
                responses.append(Response(status, headers, None))
                return responses, b""
            return responses, data
        responses.append(Response(status, headers, rest[:length]))
        data = rest[length:]


def exchange(
    port: int, request: bytes, *, wait: float = ANSWER_WAIT, finish: bool = True, until_closed: bool = False
) -> Answer:
    """Send ``request`` on a new connection and read what comes back within ``wait`` seconds.

    Stops early at EOF, or (unless ``until_closed``) once a response is complete and the server keeps the
    connection open. With
    ``finish=False`` the request is one the client never completes: after ``wait`` the client half-closes
    (goes away) and reads whatever the server still says until it closes.
    """
    answer = Answer()
    buffer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:

        def read(seconds: float, *, stop_when_answered: bool) -> None:
            nonlocal buffer
            deadline = time.monotonic() + seconds
            while not answer.closed and (remaining := deadline - time.monotonic()) > 0:
                sock.settimeout(remaining)
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    return
                except ConnectionResetError:
                    chunk = b""
                if not chunk:
                    answer.closed = True
                    return
                answer.raw += chunk
                parsed, buffer = _parse_responses(buffer + chunk, complete=False)
                answer.responses += parsed
                if stop_when_answered and answer.responses and not buffer:
                    return  # a complete answer; the server may keep the connection open

        # NB: the server may answer early and close; its answer can still be read.
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(request)
        read(wait, stop_when_answered=finish and not until_closed)
        if not finish and not answer.closed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_WR)
            read(ANSWER_WAIT, stop_when_answered=False)
    parsed, _ = _parse_responses(buffer, complete=True)
    answer.responses += parsed
    return answer


# --- the checks -------------------------------------------------------------------------------------------------


def check_answer(answer: Answer, what: str, *, rejected: bool) -> None:
    """No 5xx; every answer with a body that is an error is a metav1.Status whose code is its status.

    ``rejected``: the request is malformed, so it must get a 4xx or a closed connection, never a success.
    """
    for response in answer.responses:
        where = f"{what}: {answer.raw[:400]!r}"
        assert response.status < 500, where
        if rejected:
            assert 400 <= response.status < 500, where
        if response.status >= 400 and response.body:
            assert response.headers.get("content-type", "").startswith("application/json"), where
            status = json.loads(response.body)
            assert status.get("kind") == "Status" and status.get("apiVersion") == "v1", where
            assert status.get("code") == response.status, where
    if rejected:
        assert answer.responses or answer.closed, f"{what}: neither an answer nor a close: {answer.raw[:400]!r}"


def check_still_serving(adapter: Adapter, what: str) -> None:
    assert adapter.proc.poll() is None, f"the adapter exited after {what}: {adapter.whole_log()[-3000:]}"
    answer = exchange(adapter.port, GOOD_REQUEST)
    assert answer.responses, f"after {what}: no answer to a good request"
    response = answer.responses[0]
    assert response.status == 200 and response.body, (what, answer.raw[:400])
    assert json.loads(response.body)["kind"] == "APIGroupList", what


def run_case(adapter: Adapter, what: str, request: bytes, *, rejected: bool, wait: float, finish: bool = True) -> None:
    """Send one request and make every check, reporting all that fail together.

    The log is always read, so lines a failing case caused are never blamed on the next one.
    """
    problems: list[str] = []
    try:
        for check in (
            lambda: check_answer(exchange(adapter.port, request, wait=wait, finish=finish), what, rejected=rejected),
            lambda: check_still_serving(adapter, what),
        ):
            try:
                check()
            except AssertionError as e:
                problems.append(str(e))
    finally:
        log = adapter.new_log()
    if _LOG_PROBLEM.search(log):
        problems.append(f"the adapter logged an error for {what}:\n{log[-4000:]}")
    assert not problems, "\n\n".join(problems)


# --- fixed malformed requests -------------------------------------------------------------------------------------

LONG_NAME = b"p" * 9000  # a request line over aiohttp's default 8190 bytes, under the adapter's 64 KiB
MALFORMED = [
    (
        "request line over 8190 bytes",
        b"GET /apis/custom.metrics.k8s.io/v1beta1/namespaces/inference/pods/" + LONG_NAME + b"/gpu_utilization"
        b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
    ("request line over 64 KiB", b"GET /apis/" + b"a" * (64 * 1024 + 10) + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("unknown method FOO", b"FOO /apis HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("Content-Length: -1", b"GET /apis HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n"),
    ("Content-Length not a number", b"POST /apis HTTP/1.1\r\nHost: x\r\nContent-Length: 1x\r\n\r\n1"),
    ("Content-Length past 2**64", b"POST /apis HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
    ("NUL in a header value", b"GET /apis HTTP/1.1\r\nHost: x\r\nX-A: a\x00b\r\n\r\n"),
    ("NUL in a header name", b"GET /apis HTTP/1.1\r\nHost: x\r\nX-\x00: b\r\n\r\n"),
    ("501 headers", b"GET /apis HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-%d: y\r\n" % i for i in range(501)) + b"\r\n"),
    ("a header over 16 KiB", b"GET /apis HTTP/1.1\r\nHost: x\r\nX-Big: " + b"y" * (16 * 1024 + 10) + b"\r\n\r\n"),
    ("raw \\xff in the path", b"GET /apis/\xff\xfe HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("raw \\xff in the query", b"GET /apis?labelSelector=\xff HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("a space in the path", b"GET /apis/custom metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
    ("no Host in HTTP/1.1", b"GET /apis HTTP/1.1\r\n\r\n"),
    ("two Host headers", b"GET /apis HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"),
    ("unknown HTTP version", b"GET /apis HTTP/3.7\r\nHost: x\r\n\r\n"),
    ("not a request line", b"hello\r\n\r\n"),
    ("TLS ClientHello on the plain port", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 40 + b"\r\n\r\n"),
    (
        "bad chunk size",
        b"POST /apis HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n",
    ),
    (
        "Content-Length and Transfer-Encoding (smuggling)",
        b"POST /apis HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    ),
    ("unknown Transfer-Encoding", b"POST /apis HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, zz\r\n\r\n"),
    ("header without a colon", b"GET /apis HTTP/1.1\r\nHost: x\r\nnot a header\r\n\r\n"),
    ("obsolete header folding", b"GET /apis HTTP/1.1\r\nHost: x\r\nX-A: a\r\n folded\r\n\r\n"),
    (
        "labelSelector with an integer past Python's int() digit limit",
        b"GET /apis/custom.metrics.k8s.io/v1beta2/namespaces/inference/pods/*/gpu_utilization?labelSelector=a%3E"
        + b"1" * 4301
        + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
    (
        "external labelSelector with an integer past Python's int() digit limit",
        b"GET /apis/external.metrics.k8s.io/v1beta1/namespaces/inference/inference_queue_depth?labelSelector=a%3C"
        + b"9" * 5000
        + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
]

TRUNCATED = [
    ("request line cut short", b"GET /apis HT"),
    ("headers never finished", b"GET /apis HTTP/1.1\r\nHost: x\r\nAccept: appl"),
    ("body shorter than Content-Length", b"POST /apis HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"),
    ("chunked body cut short", b"POST /apis HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nab"),
    ("an HPA request cut short", HPA_REQUEST[: len(HPA_REQUEST) // 2]),
]


@pytest.mark.parametrize(("what", "request_bytes"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_a_4xx_status_and_no_error_in_the_log(adapter: Adapter, what: str, request_bytes: bytes):
    run_case(adapter, what, request_bytes, rejected=True, wait=ANSWER_WAIT)


@pytest.mark.parametrize(("what", "request_bytes"), TRUNCATED, ids=[t[0] for t in TRUNCATED])
def test_truncated_request_is_dropped_quietly(adapter: Adapter, what: str, request_bytes: bytes):
    run_case(adapter, what, request_bytes, rejected=True, wait=TRUNCATED_WAIT, finish=False)


def test_good_requests_still_work_on_a_kept_alive_connection(adapter: Adapter):
    """The harness itself: two pipelined good requests get two answers, the HPA request a MetricValueList."""
    answer = exchange(adapter.port, HPA_REQUEST + GOOD_REQUEST, until_closed=True)
    assert [r.status for r in answer.responses] == [200, 200], answer.raw[:600]
    assert json.loads(answer.responses[0].body or b"{}")["kind"] == "MetricValueList"
    log = adapter.new_log()
    assert not _LOG_PROBLEM.search(log), log


# --- generated garbage ------------------------------------------------------------------------------------------

_INSERTS = [
    b"\x00",
    b"\xff",
    b"\r",
    b"\n",
    b"\r\n",
    b" ",
    b"\t",
    b":",
    b"%",
    b"%ff",
    b"%00",
    b"?",
    b"#",
    b"Content-Length: -1\r\n",
    b"Content-Length: 5\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: 99999999999999999999\r\n",
    b"Connection: keep-alive\r\n",
    b"Connection: close\r\n",
    b"Expect: 100-continue\r\n",
    b"Upgrade: websocket\r\nConnection: Upgrade\r\n",
    b"Host: y\r\n",
    b"\r\n\r\n",
    b"HTTP/1.1",
    b"HTTP/1.0",
    b"GET ",
    b"FOO ",
    b"a" * 9000,
]


@st.composite
def _mutated_request(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from([HPA_REQUEST, GOOD_REQUEST])))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        at = draw(st.integers(min_value=0, max_value=len(data)))
        op = draw(st.sampled_from(["insert", "insert", "replace", "delete", "flip"]))
        if op == "insert":
            data[at:at] = draw(st.sampled_from(_INSERTS) | st.binary(min_size=1, max_size=6))
        elif op == "replace":
            data[at : at + 1] = draw(st.binary(min_size=1, max_size=3))
        elif op == "delete":
            del data[at : at + draw(st.integers(min_value=1, max_value=20))]
        elif at < len(data):
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
    return bytes(data)


_token = st.binary(min_size=1, max_size=10).filter(lambda b: b"\r\n" not in b)


@st.composite
def _built_request(draw: st.DrawFn) -> bytes:
    method = draw(st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"PRI", b"get"]) | _token)
    target = draw(
        st.sampled_from([b"/apis", b"*", b"http://x/apis", b"/apis/%ff", b"/healthz", b"//", b"/../.."]) | _token
    )
    version = draw(st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 x", b"", b"HTTP/9"]) | _token)
    headers = draw(st.lists(st.tuples(_token, st.binary(max_size=12)), max_size=5))
    lines = [method + b" " + target + (b" " + version if version else b"")]
    if draw(st.booleans()):
        lines.append(b"Host: 127.0.0.1")
    lines += [name + b": " + value for name, value in headers]
    body = draw(st.binary(max_size=20))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


_garbage = st.one_of(
    st.binary(min_size=1, max_size=300).map(lambda b: b + b"\r\n\r\n"),
    _mutated_request(),
    _mutated_request(),
    _built_request(),
)


# NB: too_slow: every example is a real network exchange with a subprocess (and a good request after it).
@fuzz_settings(EXAMPLES_GARBAGE_REQUESTS, suppress=(HealthCheck.too_slow,))
@given(_garbage)
def test_garbage_requests_never_5xx_and_never_break_the_server(adapter: Adapter, request_bytes: bytes):
    run_case(adapter, f"garbage {request_bytes[:120]!r}", request_bytes, rejected=False, wait=GARBAGE_WAIT)
