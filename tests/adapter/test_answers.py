"""Answers encoded once per snapshot, and for queries asked before, before the first request after a refresh.

Scope: a cached or prepared answer is always byte-for-byte what computing it afresh gives (every URL shape,
selectors spelt differently, both API versions, errors); a refresh prepares the recent queries' bodies in its
worker thread and the first request after it is served from them; a change of the watch cache, the clock
passing max-age, and queries not asked for a while are never answered from a prepared body; the cache stays
within its bounds.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from gpuscale.adapter.answers import AnswerCache
from gpuscale.adapter.app import make_app
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.exposition import parse_samples
from gpuscale.metrics.store import MetricsStore
from gpuscale.pipeline import Pipeline
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
from gpuscale.sources.scrape import ScrapeSource
from tests.adapter.test_api import CUSTOM, EXTERNAL, NOW, ROUTES, make_cluster, store  # noqa: F401  (a fixture)

CATALOGUE = load_catalogue()

# Requests whose bodies must differ from each other although their URLs are alike (and two spellings of one).
ALIKE = [
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization",
    f"{CUSTOM}/v1beta2/namespaces/inference/pods/*/gpu_utilization",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=app%3Dtriton,tier%3Dgpu",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=tier%3Dgpu,app%3Dtriton",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=tier+in+(gpu,cpu)",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?labelSelector=tier%21%3Dgpu",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_utilization?fieldSelector=metadata.name%3Dx",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/gpu_sm_active",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/inference_queue_depth?metricLabelSelector=model%3Dbert_qa_onnx",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/inference_queue_depth?metricLabelSelector=model%21%3Dbert_qa_onnx",
    f"{CUSTOM}/v1beta1/namespaces/inference/pods/*/inference_queue_depth",
    f"{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization",
    f"{CUSTOM}/v1beta1/namespaces/inference/deployments.apps/triton-inference/gpu_utilization",
    f"{CUSTOM}/v1beta1/namespaces/inference/deployments.apps/*/gpu_utilization",
    f"{CUSTOM}/v1beta1/namespaces/inference/metrics/gpu_utilization",
    f"{EXTERNAL}/namespaces/inference/inference_queue_depth",
    f"{EXTERNAL}/namespaces/inference/inference_queue_depth?labelSelector=model%3Dbert_qa_onnx",
]


def _app(store, cluster=None, *, answers: AnswerCache | None = None, clock=None):  # noqa: F811
    provider = MetricsProvider(CATALOGUE, store, cluster or make_cluster(), clock=clock or (lambda: NOW))
    metrics = AdapterMetrics(lambda: [])
    answers = answers if answers is not None else AnswerCache(count=metrics.count_answer)
    app = make_app(provider, Discovery(CATALOGUE), metrics, ready=lambda: (True, ""), answers=answers)
    return app, provider, metrics


async def _read(client, path):
    resp = await client.get(path)
    return resp.status, await resp.read()


def _answered(metrics: AdapterMetrics) -> dict[str, int]:
    return {
        how: int(metrics.registry.get_sample_value("gpuscale_adapter_answers_total", {"how": how}) or 0)
        for how in ("prepared", "cached", "computed")
    }


async def test_cached_answers_equal_fresh_ones_for_every_url_in_any_order(aiohttp_client, store):  # noqa: F811
    paths = [p for p, _, _ in ROUTES] + ALIKE
    cached = await aiohttp_client(_app(store)[0])
    expected = {}
    for path in paths:  # NB: a fresh cache per request: what the adapter answered before any cache existed
        fresh = await aiohttp_client(_app(store, answers=AnswerCache(max_entries=1))[0])
        expected[path] = await _read(fresh, path)
        await fresh.close()
    order = paths * 3
    random.Random(21).shuffle(order)
    for path in order:
        assert await _read(cached, path) == expected[path], path
    # metric label selectors select different series of one pod: three values
    assert [_values(expected[ALIKE[i]][1]) for i in (9, 10, 11)] == [["118"], ["3"], ["121"]]
    assert expected[ALIKE[0]] != expected[ALIKE[1]]  # v1beta1 and v1beta2 of one query


async def test_errors_are_never_cached_and_stay_the_same_status(aiohttp_client, store):  # noqa: F811
    app, _, metrics = _app(store)
    client = await aiohttp_client(app)
    errors = [(p, s) for p, s, _ in ROUTES if s != 200]
    first = [await _read(client, p) for p, _ in errors]
    again = [await _read(client, p) for p, _ in errors]
    assert first == again and [s for s, _ in first] == [s for _, s in errors]
    assert all(json.loads(body)["kind"] == "Status" for _, body in first)
    assert _answered(metrics) == {"prepared": 0, "cached": 0, "computed": 0}


SELECTED = [  # (labelSelector, the pods it selects) over _serving_cluster(): web-0..2 app=web, web-3 app=batch
    ("app%3Dweb", ["web-0", "web-1", "web-2"]),
    ("app%3D%3Dweb", ["web-0", "web-1", "web-2"]),
    ("app%3Dbatch", ["web-3"]),
    ("app%21%3Dweb", ["web-3"]),
    ("app+in+(web,batch)", ["web-0", "web-1", "web-2", "web-3"]),
    ("app+notin+(batch)", ["web-0", "web-1", "web-2"]),
    ("", ["web-0", "web-1", "web-2", "web-3"]),
    ("app", ["web-0", "web-1", "web-2", "web-3"]),
    ("%21app", None),  # selects nothing: 404, as uncached
]


async def test_every_selector_gets_its_own_pods_however_often_and_in_whatever_order(aiohttp_client):
    r = Refreshing()
    client = await aiohttp_client(r.app)
    await r.refresh(10)
    base = f"{CUSTOM}/v1beta1/namespaces/serving/pods/*/gpu_utilization?labelSelector="
    order = SELECTED * 4
    random.Random(4).shuffle(order)
    for selector, pods in order:
        status, body = await _read(client, base + selector)
        if pods is None:
            assert status == 404, body
        else:
            assert status == 200 and [i["describedObject"]["name"] for i in json.loads(body)["items"]] == pods
    await r.refresh(20)  # and the same once prepared by a refresh
    for selector, pods in order:
        status, body = await _read(client, base + selector)
        assert status == (404 if pods is None else 200) and (status, body) == await r.fresh(
            aiohttp_client, base + selector
        )
    assert _answered(r.metrics)["prepared"] == len(SELECTED) - 1


def _dcgm(value: float) -> str:
    lines = [
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{i}",UUID="GPU-{i}",Hostname="n1",namespace="serving",pod="web-{i}"}} {value + i}'
        for i in range(4)
    ]
    return "\n".join(lines) + "\n"


def _serving_cluster() -> StaticClusterObjects:
    pods = [
        PodInfo("serving", f"web-{i}", {"app": "web" if i < 3 else "batch"}, "n1", None, (), "Running", None)
        for i in range(4)
    ]
    return StaticClusterObjects(pods=pods, nodes={"n1": {}}, namespaces=["serving"])


WEB = f"{CUSTOM}/v1beta2/namespaces/serving/pods/*/gpu_utilization?labelSelector=app%3Dweb"
BATCH = f"{CUSTOM}/v1beta1/namespaces/serving/pods/*/gpu_utilization?labelSelector=app%3Dbatch"


class Refreshing:
    """A real pipeline over a scrape source fed by hand, an answer cache it prepares, and the app serving both."""

    def __init__(self) -> None:
        self.now = 1_790_000_000.0
        self.monotonic = 0.0
        self.source = ScrapeSource(
            [], series=CATALOGUE.series_names, windowed_series=CATALOGUE.windowed_series, history_seconds=600
        )
        self.store = MetricsStore()
        self.cluster = _serving_cluster()
        self.metrics = AdapterMetrics(lambda: [])
        self.answers = AnswerCache(count=self.metrics.count_answer, monotonic=lambda: self.monotonic)
        self.provider = MetricsProvider(CATALOGUE, self.store, self.cluster, clock=lambda: self.now)
        self.pipeline = Pipeline(
            CATALOGUE,
            self.source,
            self.store,
            Attributor(Target),
            clock=lambda: self.now,
            prepare=lambda snapshot: self.answers.prepare(self.provider, snapshot),
        )
        self.app = make_app(
            self.provider, Discovery(CATALOGUE), self.metrics, ready=lambda: (True, ""), answers=self.answers
        )

    async def refresh(self, value: float) -> None:
        self.now += 5
        self.source.ingest("http://dcgm/metrics", parse_samples(_dcgm(value)), timestamp=self.now)
        await self.pipeline.refresh_once()

    async def fresh(self, aiohttp_client, path: str) -> tuple[int, bytes]:
        """What an adapter without a cache answers now: the reference every cached body must equal."""
        app = make_app(self.provider, Discovery(CATALOGUE), AdapterMetrics(lambda: []), ready=lambda: (True, ""))
        client = await aiohttp_client(app)
        try:
            return await _read(client, path)
        finally:
            await client.close()


def _values(body: bytes) -> list[str]:
    return [i["value"] for i in json.loads(body)["items"]]


async def test_the_first_request_after_a_refresh_is_answered_from_a_body_the_refresh_built(aiohttp_client):
    r = Refreshing()
    client = await aiohttp_client(r.app)
    await r.refresh(10)
    status, body = await _read(client, WEB)
    assert status == 200 and _values(body) == ["10", "11", "12"]
    assert _answered(r.metrics) == {"prepared": 0, "cached": 0, "computed": 1}  # never asked before: computed

    await r.refresh(50)
    status, body = await _read(client, WEB)
    assert status == 200 and _values(body) == ["50", "51", "52"]
    assert _answered(r.metrics) == {"prepared": 1, "cached": 0, "computed": 1}
    await _read(client, WEB)
    assert _answered(r.metrics)["cached"] == 1

    # and a prepared body is exactly what computing it afresh gives
    await _read(client, BATCH)
    await r.refresh(70)
    for path in (WEB, BATCH):
        status, body = await _read(client, path)
        assert status == 200 and (status, body) == await r.fresh(aiohttp_client, path)
    assert _answered(r.metrics)["prepared"] == 3
    async with client.get(BATCH) as resp:
        assert _values(await resp.read()) == ["73"]


async def test_a_prepared_body_is_not_served_once_the_watch_cache_or_the_clock_moved(aiohttp_client):
    r = Refreshing()
    client = await aiohttp_client(r.app)
    await r.refresh(10)
    await _read(client, WEB)
    await r.refresh(20)
    # a pod relabelled after the refresh prepared its answers: the prepared body would list it
    r.cluster._index.put_pod(PodInfo("serving", "web-2", {"app": "batch"}, "n1", None, (), "Running", None))
    status, body = await _read(client, WEB)
    assert status == 200 and _values(body) == ["20", "21"]
    assert _answered(r.metrics)["prepared"] == 0

    await r.refresh(30)
    r.now += 61  # past max-age (60 s): a prepared body must not serve old values as fresh
    status, _ = await _read(client, WEB)
    assert status == 503 and _answered(r.metrics)["prepared"] == 0


def test_a_watch_event_that_changes_nothing_kept_leaves_the_generation_alone():
    cluster = _serving_cluster()
    generation = cluster.generation
    same = PodInfo("serving", "web-0", {"app": "web"}, "n1", None, (), "Running", None)
    cluster._index.put_pod(same)  # e.g. a status-only update: conditions, restarts
    cluster._index.put_node("n1", {})
    cluster._index.put_namespace("serving")
    assert cluster.generation == generation
    cluster._index.put_pod(PodInfo("serving", "web-0", {"app": "web", "v": "2"}, "n1", None, (), "Running", None))
    assert cluster.generation > generation


async def test_only_queries_asked_recently_are_prepared(aiohttp_client):
    r = Refreshing()
    client = await aiohttp_client(r.app)
    await r.refresh(10)
    await _read(client, WEB)
    r.monotonic += 301  # the default keep-warm is 300 s: an HPA deleted 5 minutes ago costs nothing more
    await _read(client, BATCH)
    await r.refresh(20)
    assert len(r.answers) == 1
    await _read(client, WEB)
    await _read(client, BATCH)
    assert _answered(r.metrics) == {"prepared": 1, "cached": 0, "computed": 3}


async def test_each_of_thousands_of_distinct_queries_is_prepared_by_the_next_refresh():
    # 1,000 HPAs × 4 metrics ask 4,000 distinct queries; at a bound of 2,048 half of them were computed on request
    from gpuscale.adapter.answers import MetricQuery
    from gpuscale.adapter.wire import CUSTOM_GROUP
    from gpuscale.selectors import LabelSelector

    r = Refreshing()
    await r.refresh(10)
    queries = [
        MetricQuery(
            CUSTOM_GROUP,
            "v1beta2",
            "pods",
            "serving",
            "*",
            "gpu_utilization",
            LabelSelector.parse(f"app=web,hpa!=h{i}"),
            LabelSelector.everything(),
        )
        for i in range(4100)
    ]
    for query in queries:
        r.answers.body(r.provider, query)
    await r.refresh(20)
    assert {_values(r.answers.body(r.provider, query))[0] for query in queries} == {"20"}
    assert _answered(r.metrics) == {"prepared": 4100, "cached": 0, "computed": 4100}


@pytest.mark.parametrize(("max_entries", "max_bytes", "kept"), [(2, 1 << 20, 2), (100, 700, 1), (100, 1 << 20, 4)])
async def test_the_cache_stays_within_its_bounds(aiohttp_client, max_entries, max_bytes, kept):
    r = Refreshing()
    r.answers = AnswerCache(max_entries=max_entries, max_bytes=max_bytes, count=r.metrics.count_answer)
    r.app = make_app(r.provider, Discovery(CATALOGUE), r.metrics, ready=lambda: (True, ""), answers=r.answers)
    r.pipeline.prepare = lambda snapshot: r.answers.prepare(r.provider, snapshot)
    client = await aiohttp_client(r.app)
    await r.refresh(10)
    paths = [WEB, BATCH, WEB.replace("v1beta2", "v1beta1"), BATCH.replace("v1beta1", "v1beta2")]
    for path in paths:
        assert (await _read(client, path))[0] == 200
    assert len(r.answers) == kept
    await r.refresh(20)
    assert len(r.answers) == kept
    for path in paths:  # whatever was evicted is computed again, the same as ever
        status, body = await _read(client, path)
        assert status == 200 and _values(body)[0] in ("20", "23")


@pytest.mark.parametrize("version", ["v1beta1", "v1beta2"])
@pytest.mark.parametrize(
    "selector", [None, {"matchLabels": {"model": "bert"}}, {"matchExpressions": [{"key": "a", "operator": "Exists"}]}]
)
def test_the_item_encoder_writes_exactly_what_json_dumps_of_the_item_shape_gives(version, selector):
    from gpuscale.adapter.provider import Item
    from gpuscale.adapter.wire import CUSTOM_GROUP, ItemEncoder, custom_item
    from gpuscale.metrics.store import MetricPoint
    from gpuscale.model import DEPLOYMENT, NODE, POD, ObjectRef

    objects = [ObjectRef(POD, "p-0", "ns"), ObjectRef(DEPLOYMENT, "web", "ns"), ObjectRef(NODE, "nöde-ü")]
    points = [
        MetricPoint(87.5, 1_790_000_000.4),
        MetricPoint(0.0012, 1_790_000_001.0, 60.0),
        MetricPoint(3e9, 1.0, 0.5),
    ]
    shared = [MetricPoint(v, 1_790_000_000.4, w) for v, w in ((87.5, 60.0), (0.0, 60.0), (-3e-3, 60.0))]  # one stamp
    cases = [
        [Item(o, p) for o in objects for p in points],  # timestamps and windows differ: written per value
        [Item(o, p) for o in objects for p in shared],  # one timestamp and window: written once per answer
        [Item(objects[0], points[1])],
        [],
    ]
    encoder = ItemEncoder()
    for items in cases * 2:  # the second time from the kept parts
        body = encoder.custom(version, "gpu_utilization", items, selector)
        expected = {
            "kind": "MetricValueList",
            "apiVersion": f"{CUSTOM_GROUP}/{version}",
            "metadata": {},
            "items": [custom_item(version, "gpu_utilization", i.obj, i.point, selector) for i in items],
        }
        assert body == json.dumps(expected, separators=(",", ":")).encode()


def test_values_by_selector_are_by_selectors_items_whatever_is_missing_or_stale():
    from gpuscale.adapter.provider import Values
    from gpuscale.metrics.store import MetricPoint, Snapshot
    from gpuscale.model import POD, ObjectRef
    from gpuscale.selectors import LabelSelector

    now = 1_790_000_000.0
    cluster = _serving_cluster()
    pods = [ObjectRef(POD, f"web-{i}", "serving") for i in range(4)]
    fresh = [MetricPoint(10.0 + i, now - i, 60.0 if i % 2 else None) for i in range(4)]
    other = ObjectRef(POD, "elsewhere", "serving")
    cases = {
        "all fresh": dict(zip(pods, fresh, strict=True)),
        "again, new points": dict(zip(pods, [p._replace(value=p.value + 1) for p in fresh], strict=True)),
        "another order": dict(reversed(list(zip(pods, fresh, strict=True)))),
        "one more object": {other: fresh[0], **dict(zip(pods, fresh, strict=True))},
        "one missing": dict(zip(pods[:2] + pods[3:], fresh[:2] + fresh[3:], strict=True)),
        "one stale": {**dict(zip(pods, fresh, strict=True)), pods[1]: MetricPoint(5.0, now, stale=True)},
        "one too old": {**dict(zip(pods, fresh, strict=True)), pods[2]: MetricPoint(5.0, now - 3600)},
        "all too old": {p: MetricPoint(1.0, now - 3600) for p in pods},
        "none": {},
    }
    reader = MetricsStore()
    provider = MetricsProvider(CATALOGUE, reader, cluster, clock=lambda: now)  # NB: one, across the snapshots
    for case, values in [*cases.items(), *cases.items()]:
        reader.update(Snapshot(values={"gpu_utilization": dict(values)}, taken_at=now))
        for text, _ in SELECTED:
            selector = LabelSelector.parse(text.replace("%3D", "=").replace("%21", "!").replace("+", " "))
            args = ("pods", "serving", selector, "gpu_utilization", LabelSelector.everything())
            try:
                expected = Values.of(provider.by_selector(*args))
            except Exception as e:
                with pytest.raises(type(e), match=re.escape(str(e))):
                    provider.values_by_selector("gpu_utilization", *args[:3], args[4])
                continue
            got = provider.values_by_selector("gpu_utilization", *args[:3], args[4])
            assert (list(got.objs), list(got.points), got.oldest) == (
                list(expected.objs),
                list(expected.points),
                expected.oldest,
            ), (case, text)


async def test_no_replaced_snapshot_is_kept_alive_by_what_answers_keep(aiohttp_client):
    # The provider's per-snapshot read positions, the encoder's kept parts and the prepared bodies must not hold a
    # replaced snapshot (at 100,000 GPUs one is hundreds of MB).
    import gc

    from gpuscale.metrics.store import Snapshot

    r = Refreshing()
    r.now = start = 1_234_500_000.0  # NB: this test's snapshots, told apart from other tests' by their time
    client = await aiohttp_client(r.app)
    for value in range(10, 70, 10):
        await r.refresh(value)
        for path in (WEB, BATCH, WEB.replace("v1beta2", "v1beta1")):
            assert (await _read(client, path))[0] == 200
    gc.collect()
    alive = [o for o in gc.get_objects() if type(o) is Snapshot and start < o.taken_at <= r.now]
    assert alive == [r.store.snapshot]
