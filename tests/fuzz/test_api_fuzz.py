"""Fuzzing the metrics API paths in-process (gpuscale/adapter/app.py behind gpuscale/adapter/transport.py).

The app is built as tests/adapter/test_api.py builds it (the 8×H100 DCGM scrape and two Triton scrapes through
the real pipeline, an in-memory cluster) and served by aiohttp's test client through the adapter's own HTTP
layer (``AdapterRunner``, what ``gpuscale adapter`` serves with). Generated requests: random methods, the three
group-versions and near misses, every URL shape with known and random namespaces, resources, names and metric
names, each segment percent-encoded one of several ways (``%2F``, double encoding, stray ``%``, invalid UTF-8),
``labelSelector``/``metricLabelSelector`` values that are valid, near-valid or hostile, other query parameters,
Accept headers, and a clock at which the values are fresh or stale. Every answer must be

- one of 200/400/403/404/405/406/503 (never 500);
- when it is not 200: ``application/json``, a metav1.Status (kind Status, apiVersion v1, status Failure, a reason
  and a message) whose ``code`` is the HTTP status; a 503 carries ``Retry-After``;
- when it is a 200 MetricValueList/ExternalMetricValueList: JSON without NaN/Infinity tokens, every item's value
  a canonical quantity with a finite value (never "NaN"), for a metric the catalogue defines.
"""

from __future__ import annotations

import asyncio
import json
import re
from urllib.parse import quote

import pytest
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import given
from hypothesis import strategies as st
from yarl import URL

from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.metrics.attribution import Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.sources.cluster_index import StaticClusterObjects
from tests.adapter.test_api import make_cluster
from tests.fuzz import fuzz_settings
from tests.fuzz.test_selector_fuzz import _token_soup, selectors
from tests.helpers import H100, H100_NODE, T0, TRITON, TRITON_POD, TRITON_T0, fixture_store

EXAMPLES_API_REQUESTS = 600
"""Generated requests against the in-process app."""

CUSTOM = "/apis/custom.metrics.k8s.io"
EXTERNAL = "/apis/external.metrics.k8s.io/v1beta1"
TRITON_URL = "http://10.0.0.5:8002/metrics"
FRESH = T0 + 61
STALE = T0 + 60 + 61  # past every metric's max-age (60 s)

ALLOWED = {200, 400, 403, 404, 405, 406, 503}
_QUANTITY = re.compile(r"-?(0|[1-9][0-9]*)(m|k|M|G|T|P|E)?")
_LIST_KINDS = {"MetricValueList", "ExternalMetricValueList"}
_OK_KINDS = {"APIGroupList", "APIGroup", "APIResourceList", *_LIST_KINDS}


# --- the app, as tests/adapter/test_api.py builds it ------------------------------------------------------------


POD_NAMES = {
    "inference": [TRITON_POD.name, "triton-inference-7d9f8b6c5-cpu01"],
    "nim": ["llama3-8b-instruct-5c6b9d8f47-qz7mh"],
    "ml-training": ["llm-finetune-worker-0"],
    "ml-batch": ["embeddings-batch-28471-8xk2p"],
}


def _cluster() -> StaticClusterObjects:
    # NB: the same cluster as the API tests, so the fuzzed paths hit real pods, workloads and namespaces.
    return make_cluster()


class AdapterTestServer(TestServer):
    """aiohttp's TestServer, serving through the adapter's HTTP layer rather than a plain AppRunner."""

    async def _make_runner(self, **kwargs):  # type: ignore[override]
        return AdapterRunner(self.app, rejections=RejectionLog(), **kwargs)


CATALOGUE = load_catalogue()
METRIC_NAMES = [m.name for m in CATALOGUE]
EXTERNAL_METRICS = [m.name for m in CATALOGUE if m.external]


async def _start(clock: dict[str, float]) -> TestClient:
    store = fixture_store(
        [("http://dcgm:9400/metrics", H100, T0 + 60), (TRITON_URL, TRITON_T0, T0), (TRITON_URL, TRITON, T0 + 60)],
        targets={TRITON_URL: Target(TRITON_URL, TRITON_POD, H100_NODE)},
        now=T0 + 60,
    )
    provider = MetricsProvider(CATALOGUE, store, _cluster(), clock=lambda: clock["now"])
    app = make_app(provider, Discovery(CATALOGUE), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
    client = TestClient(AdapterTestServer(app, host="127.0.0.1"))
    await client.start_server()
    return client


# --- requests -----------------------------------------------------------------------------------------------

_PREFIXES = [
    f"{CUSTOM}/v1beta1",
    f"{CUSTOM}/v1beta2",
    EXTERNAL,
    f"{CUSTOM}/v1beta1",
    f"{CUSTOM}/v1beta2",
    EXTERNAL,
    f"{CUSTOM}/v1beta3",
    f"{CUSTOM}/v1",
    CUSTOM,
    "/apis/external.metrics.k8s.io/v1beta2",
    "/apis/metrics.k8s.io/v1beta1",
    "/apis",
]
_NAMESPACES = [*POD_NAMES, "empty", "nowhere", "default", "kube-system", "*", "-", "namespaces"]
_RESOURCES = [
    "pods",
    "nodes",
    "namespaces",
    "deployments.apps",
    "statefulsets.apps",
    "services",
    "deployments",
    "Pods",
    "pods.",
    "metrics",
    "jobs.batch",
]
_NAMES = [
    "*",
    H100_NODE,
    "triton-inference",
    "llm-finetune-worker",
    "ghost",
    *(name for names in POD_NAMES.values() for name in names),
]
_METRICS = [*METRIC_NAMES, "no_such_metric", "GPU_UTILIZATION", "gpu_utilization.", "*"]

_random_segment = st.one_of(
    st.text(max_size=12),
    st.text(alphabet="/%?#&=*. ab\x00\xff\u2028é", max_size=8),
    st.just(""),
    st.sampled_from([".", "..", "%", "%2", "%zz", "%ff", "%c3", "%00", "%2F", "%252F"]),
)


def _word(choices: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(*[st.sampled_from(choices)] * 6, _random_segment)


@st.composite
def _encoded(draw: st.DrawFn, segment: str) -> str:
    how = draw(st.sampled_from(["quote"] * 6 + ["keep_slash", "double", "raw", "stray_percent"]))
    if how == "quote":
        return quote(segment, safe="*")
    if how == "keep_slash":
        return quote(segment, safe="/*")
    if how == "double":
        return quote(quote(segment, safe=""), safe="")
    if how == "raw":
        # Only what can stand unescaped in a request target (the rest is quoted as usual).
        return "".join(c if re.fullmatch(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%/]", c) else quote(c) for c in segment)
    return quote(segment, safe="*") + draw(st.sampled_from(["%", "%f", "%zz", "%ff", "%e2%82", "%00"]))


@st.composite
def _valid_segments(draw: st.DrawFn) -> tuple[str, list[str]]:
    """A URL the adapter serves (or answers 404/503 for on purpose): consistent group, version, shape and names."""
    metric = draw(st.sampled_from(METRIC_NAMES))
    namespace = draw(st.sampled_from([*POD_NAMES, *POD_NAMES, "empty", "nowhere"]))
    if draw(st.integers(min_value=0, max_value=4)) == 0:
        metric = draw(st.sampled_from([*EXTERNAL_METRICS, *EXTERNAL_METRICS, metric]))
        return EXTERNAL, ["namespaces", draw(st.sampled_from(["inference", namespace])), metric]
    prefix = draw(st.sampled_from([f"{CUSTOM}/v1beta1", f"{CUSTOM}/v1beta2"]))
    shape = draw(st.sampled_from(["pods", "pods", "workload", "namespace", "nodes"]))
    if shape == "pods":
        name = draw(st.sampled_from(["*", "*", *POD_NAMES.get(namespace, ["ghost"])]))
        return prefix, ["namespaces", namespace, "pods", name, metric]
    if shape == "workload":
        namespace, resource, name = draw(
            st.sampled_from(
                [
                    ("inference", "deployments.apps", "triton-inference"),
                    ("ml-training", "statefulsets.apps", "llm-finetune-worker"),
                    (namespace, "deployments.apps", "ghost"),
                ]
            )
        )
        return prefix, ["namespaces", namespace, resource, name, metric]
    if shape == "namespace":
        return prefix, ["namespaces", namespace, "metrics", metric]
    return prefix, ["nodes", draw(st.sampled_from(["*", H100_NODE, H100_NODE, "no-such-node"])), metric]


@st.composite
def _path(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["valid"] * 8 + ["namespaced", "namespace", "root", "external", "random"]))
    prefix = draw(st.sampled_from(_PREFIXES))
    if shape == "valid":
        prefix, segments = draw(_valid_segments())
    elif shape == "namespaced":
        segments = ["namespaces", draw(_word(_NAMESPACES)), draw(_word(_RESOURCES)), draw(_word(_NAMES))]
        segments.append(draw(_word(_METRICS)))
    elif shape == "namespace":
        segments = ["namespaces", draw(_word(_NAMESPACES)), "metrics", draw(_word(_METRICS))]
    elif shape == "root":
        segments = [draw(_word(_RESOURCES)), draw(_word(_NAMES)), draw(_word(_METRICS))]
    elif shape == "external":
        segments = ["namespaces", draw(_word(_NAMESPACES)), draw(_word(_METRICS))]
    else:
        segments = draw(st.lists(_word([*_NAMESPACES, *_RESOURCES, *_METRICS]), max_size=7))
    if shape == "valid":  # NB: as a client sends it; now and then one segment encoded another way
        mangled = draw(st.integers(min_value=0, max_value=4 * len(segments)))
        encoded = [draw(_encoded(s)) if i == mangled else quote(s, safe="*") for i, s in enumerate(segments)]
    else:
        encoded = [draw(_encoded(s)) for s in segments]
    path = prefix + "".join("/" + e for e in encoded)
    return path + draw(st.sampled_from([""] * 8 + ["/", "//", "/extra"]))


# A dictionary of selectors: what an HPA sends, near misses, and hostile ones (sizes and numbers past limits).
_KNOWN_SELECTORS = [
    "",
    "app=triton",
    "app%3Dtriton",
    "app in (triton,llama3),tier!=cpu",
    "tier notin (cpu)",
    "model=bert_qa_onnx",
    "model=none",
    "!app",
    "app",
    "app===",
    "in (",
    "a>5",
]
_HOSTILE_SELECTORS = [
    "a<" + "9" * 19,  # past int64
    "0>" + "1" * 4301,  # past Python's int() digit limit (4300 digits)
    "a<-" + "9" * 5000,
    "a in (" + ",".join(f"v{i}" for i in range(1500)) + ")",  # long but valid
    ",".join(f"k{i}" for i in range(400)),
    "a=" + "b" * 64,  # one past the value limit
    "a/" + "b" * 254 + "=c",
    "(" * 200,
    "!" * 200,
    "a\x00=b",
    "é=ü",
    "a in (b,,,c)",
]
_SELECTOR_VALUES = st.one_of(
    st.sampled_from(_KNOWN_SELECTORS),
    st.sampled_from(_HOSTILE_SELECTORS),
    selectors().map(lambda s: s[1]),
    _token_soup(),
    st.text(max_size=20),
)
_PARAMS = ["labelSelector", "metricLabelSelector"]


@st.composite
def _query(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["none", "known", "generated"]))
    if shape == "none":
        return draw(st.sampled_from(["", "", "", "?", "?&", "?labelSelector", "?watch=true&timeout=32s"]))
    if shape == "known":
        return draw(
            st.sampled_from(["?labelSelector=app%3Dtriton", "?metricLabelSelector=model%3Dbert_qa_onnx", "?limit=500"])
        )
    key = st.one_of(st.sampled_from(_PARAMS), st.sampled_from(_PARAMS), st.sampled_from(["fieldSelector", "watch"]))
    pairs = draw(
        st.lists(st.tuples(key | st.text(max_size=6), _SELECTOR_VALUES, st.booleans()), min_size=1, max_size=3)
    )
    parts = []
    for name, value, plus in pairs:
        encoded = quote(value, safe="") if not plus else quote(value, safe="=(),!<> ").replace(" ", "+")
        parts.append(f"{quote(name, safe='')}={encoded}")
    return "?" + "&".join(parts)


_METHODS = ["GET"] * 12 + ["HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"]
_ACCEPT = [
    None,
    "application/json",
    "application/json, */*",
    "application/vnd.kubernetes.protobuf, */*",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    "text/html",
    "application/yaml",
]


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, str, dict[str, str], float]:
    method = draw(st.sampled_from(_METHODS))
    target = draw(_path()) + draw(_query())
    accept = draw(st.sampled_from(_ACCEPT))
    headers = {"Accept": accept} if accept else {}
    return method, target, headers, draw(st.sampled_from([FRESH, FRESH, FRESH, STALE]))


# --- the property -------------------------------------------------------------------------------------------


def _reject_constant(token: str) -> None:
    raise AssertionError(f"a bare {token} in a JSON answer")


async def _check(client: TestClient, clock: dict[str, float], request: tuple[str, str, dict[str, str], float]) -> None:
    method, target, headers, now = request
    clock["now"] = now
    url = URL(str(client.make_url("/")).rstrip("/") + target, encoded=True)
    async with client.session.request(
        method, url, headers=headers, data=b"{}" if method in ("POST", "PUT") else None
    ) as resp:
        body = await resp.read()
        status, content_type = resp.status, resp.content_type
        retry_after = resp.headers.get("Retry-After")
    where = f"{method} {target} -> {status} {body[:300]!r}"
    assert status in ALLOWED, where
    if status != 200:
        assert content_type == "application/json", where
    if method == "HEAD":
        assert body == b"", where
        return
    if status != 200:
        doc = json.loads(body, parse_constant=_reject_constant)
        assert doc["kind"] == "Status" and doc["apiVersion"] == "v1", where
        assert doc["code"] == status and doc["status"] == "Failure", where
        assert isinstance(doc["message"], str) and doc["message"], where
        assert isinstance(doc["reason"], str) and doc["reason"], where
        if status == 503:
            assert retry_after is not None and int(retry_after) >= 1, where
        return
    assert content_type == "application/json", where
    doc = json.loads(body, parse_constant=_reject_constant)
    assert doc.get("kind") in _OK_KINDS, where
    if doc["kind"] not in _LIST_KINDS:
        return
    for item in doc["items"]:
        value = item["value"]
        assert isinstance(value, str) and _QUANTITY.fullmatch(value), (where, item)
        name = item.get("metricName") or item["metric"]["name"]
        assert name in METRIC_NAMES, (where, item)


def test_api_paths_answer_a_status_or_finite_values() -> None:
    clock = {"now": FRESH}
    with asyncio.Runner() as runner:
        client = runner.run(_start(clock))
        try:

            @fuzz_settings(EXAMPLES_API_REQUESTS)
            @given(requests())
            def check(request: tuple[str, str, dict[str, str], float]) -> None:
                runner.run(_check(client, clock, request))

            check()
        finally:
            runner.run(client.close())


# --- the fuzz dictionary's hostile selectors, on every route that parses a selector, every run ----------------
# NB: the property above draws these only now and then (how often depends on everything hypothesis sees,
# including the constants of every loaded module); a known-hostile input is also checked deterministically.

_SELECTOR_ROUTES = [
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=",
    f"{CUSTOM}/v1beta2/namespaces/inference/pods/*/inference_queue_depth?metricLabelSelector=",
    f"{CUSTOM}/v1beta2/nodes/*/gpu_utilization?labelSelector=",
    f"{EXTERNAL}/namespaces/inference/inference_queue_depth?labelSelector=",
]


def _short(selector: str) -> str:
    return re.sub(r"(.)\1{9,}", lambda m: f"{m.group(1)}*{len(m.group(0))}", selector)[:60]


@pytest.mark.parametrize("selector", _HOSTILE_SELECTORS, ids=[_short(s) for s in _HOSTILE_SELECTORS])
def test_hostile_selectors_answer_a_status(selector: str) -> None:
    clock = {"now": FRESH}
    with asyncio.Runner() as runner:
        client = runner.run(_start(clock))
        try:
            for route in _SELECTOR_ROUTES:
                runner.run(_check(client, clock, ("GET", route + quote(selector, safe=""), {}, FRESH)))
        finally:
            runner.run(client.close())
