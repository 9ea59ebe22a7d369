"""The aiohttp application: routes for discovery, metrics, health, OpenAPI and /metrics.

URL shapes (custom-metrics-apiserver's installer), after ``/apis/custom.metrics.k8s.io/{version}/``:

    namespaces/{ns}/metrics/{metric}                the namespace itself
    namespaces/{ns}/{resource}/{name|*}/{metric}    namespaced objects (pods, deployments.apps, …)
    {resource}/{name|*}/{metric}                    root-scoped objects (nodes, namespaces)

and ``/apis/external.metrics.k8s.io/v1beta1/namespaces/{ns}/{metric}``. ``labelSelector`` selects
objects (for external metrics: metric labels); ``metricLabelSelector`` selects series and is echoed.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuscale.adapter.answers import AnswerCache, MetricQuery
from gpuscale.adapter.discovery import NAMESPACED, Discovery
from gpuscale.adapter.fastpath import FAST_PATH, FastPath
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.status import error_response, status_response
from gpuscale.adapter.wire import CUSTOM_GROUP, EXTERNAL_GROUP
from gpuscale.errors import GpuscaleError, SelectorError
from gpuscale.selectors import LabelSelector

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
ReadyCheck = Callable[[], tuple[bool, str]]

PROVIDER = web.AppKey("provider", MetricsProvider)
DISCOVERY = web.AppKey("discovery", Discovery)
SELFMETRICS = web.AppKey("selfmetrics", AdapterMetrics)
READY = web.AppKey("ready", object)
RESOURCE = web.RequestKey("resource", str)


def _json(body: dict, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body, separators=(",", ":")), content_type="application/json")


ANSWERS = web.AppKey("answers", AnswerCache)


def _answer(request: web.Request, query: MetricQuery) -> web.Response:
    body = request.app[ANSWERS].body(request.app[PROVIDER], query)
    request.app[FAST_PATH].remember(request, query, request[RESOURCE])  # NB: the next request skips to the body
    return web.Response(body=body, content_type="application/json")


# NB: selectors are immutable and an HPA sends the same text on every poll: parse each text once.
_parse_selector = functools.lru_cache(maxsize=4096)(LabelSelector.parse)


def _selector(request: web.Request, param: str) -> LabelSelector:
    return _parse_selector(request.query.get(param, ""))


# --- discovery ------------------------------------------------------------------------------------------


async def apis(request: web.Request) -> web.Response:
    return _json(request.app[DISCOVERY].api_group_list())


async def api_legacy(request: web.Request) -> web.Response:
    # NB: kubectl asks /api before /apis; an empty core group keeps `kubectl api-resources` happy.
    return _json({"kind": "APIVersions", "versions": [], "serverAddressByClientCIDRs": []})


async def api_group(request: web.Request) -> web.Response:
    body = request.app[DISCOVERY].api_group(request.match_info["group"])
    return _json(body) if body else status_response(404, "the server could not find the requested resource")


async def resource_list(request: web.Request) -> web.Response:
    body = request.app[DISCOVERY].resource_list(request.match_info["group"], request.match_info["version"])
    return _json(body) if body else status_response(404, "the server could not find the requested resource")


async def version(request: web.Request) -> web.Response:
    from gpuscale import __version__

    return _json({"major": "1", "minor": "0", "gitVersion": f"v{__version__}-gpuscale", "platform": "python"})


# --- metrics --------------------------------------------------------------------------------------------


async def custom_metrics(request: web.Request) -> web.Response:
    version = request.match_info["version"]
    if request.app[DISCOVERY].resource_list(CUSTOM_GROUP, version) is None:
        return status_response(404, "the server could not find the requested resource")
    parts = request.match_info["tail"].split("/")
    selector = _selector(request, "labelSelector")
    metric_selector = _selector(request, "metricLabelSelector")
    if len(parts) == 4 and parts[0] == "namespaces" and parts[2] == "metrics":
        resource, namespace, name, metric = "namespaces", None, parts[1], parts[3]
    elif len(parts) == 5 and parts[0] == "namespaces":
        _, namespace, resource, name, metric = parts
    elif len(parts) == 3:
        resource, name, metric = parts
        namespace = None
    else:
        return status_response(404, "the server could not find the requested resource")
    # NB: the label of gpuscale_adapter_requests_total: only names we serve, never what a URL made up (a
    # client could otherwise grow /metrics without bound)
    request[RESOURCE] = resource if resource in NAMESPACED else "unknown"
    if resource not in NAMESPACED or ((namespace is None) == NAMESPACED[resource] and resource != "namespaces"):
        where = "namespaced" if namespace else "cluster-scoped"
        return status_response(404, f"the server could not find the metric {metric} for {where} {resource}")
    if not metric or not name:
        return status_response(404, "the server could not find the requested resource")

    query = MetricQuery(CUSTOM_GROUP, version, resource, namespace, name, metric, selector, metric_selector)
    return _answer(request, query)


async def external_metrics(request: web.Request) -> web.Response:
    namespace, metric = request.match_info["namespace"], request.match_info["metric"]
    request[RESOURCE] = metric if metric in request.app[DISCOVERY].external_names else "unknown"
    selector = _selector(request, "labelSelector")
    everything = LabelSelector.everything()
    return _answer(request, MetricQuery(EXTERNAL_GROUP, "v1beta1", metric, namespace, "", metric, selector, everything))


# --- health, OpenAPI, own metrics -----------------------------------------------------------------------


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def readyz(request: web.Request) -> web.Response:
    ready, reason = request.app[READY]()  # type: ignore[operator]
    # NB: ready can still carry a warning (a target failing while its last values are served).
    text = ("ok" + (f" ({reason})" if reason else "")) if ready else f"not ready: {reason}"
    return web.Response(text=text, status=200 if ready else 503)


async def openapi(request: web.Request) -> web.Response:
    # NB: kube-aggregator skips a 404 from an aggregated server on purpose; anything else but a valid
    # document fills its logs with errors (kubernetes/kubernetes #90434).
    return status_response(404, "the server does not publish an OpenAPI document")


async def own_metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[SELFMETRICS].registry)
    resp = web.Response(body=body)
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


@web.middleware
async def errors_and_metrics(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes a metav1.Status; metrics requests are counted and timed."""
    started = time.perf_counter()
    group = request.match_info.get("group_name", "")
    try:
        response = await handler(request)
    except web.HTTPException as e:
        response = status_response(e.status, e.reason)
    except (GpuscaleError, SelectorError) as e:
        response = error_response(e)
    except Exception as e:  # NB: the HPA must get a Status, never a traceback
        response = error_response(e)
    if group:
        request.app[SELFMETRICS].observe_request(group, request.get(RESOURCE, ""), response.status, started)
    return response


def make_app(
    provider: MetricsProvider,
    discovery: Discovery,
    selfmetrics: AdapterMetrics,
    *,
    ready: ReadyCheck,
    middlewares: Iterable[Middleware] = (),
    answers: AnswerCache | None = None,
) -> web.Application:
    """The adapter's app. ``middlewares`` run inside the error/metrics one (e.g. ``auth.make_auth_middleware``),
    so their answers are counted and every failure still becomes a metav1.Status. ``answers`` is the answer
    cache, shared by the apps of one adapter and prepared by its refreshes (``AnswerCache.prepare``)."""
    app = web.Application(middlewares=[errors_and_metrics, *middlewares])
    app[PROVIDER] = provider
    app[DISCOVERY] = discovery
    app[SELFMETRICS] = selfmetrics
    app[READY] = ready
    app[ANSWERS] = answers if answers is not None else AnswerCache(count=selfmetrics.count_answer)

    def answer(request: web.Request, query: MetricQuery, resource: str) -> bytes:
        request[RESOURCE] = resource
        return app[ANSWERS].body(provider, query)

    app[FAST_PATH] = FastPath(app, answer)  # NB: served by AdapterRunner (transport.py)
    r = app.router
    r.add_get("/apis", apis)
    r.add_get("/apis/", apis)
    r.add_get("/api", api_legacy)
    r.add_get("/version", version)
    r.add_get("/healthz", healthz)
    r.add_get("/livez", healthz)
    r.add_get("/readyz", readyz)
    r.add_get("/openapi/v2", openapi)
    r.add_get("/openapi/v3", openapi)
    r.add_get(r"/openapi/v3/{tail:.*}", openapi)
    r.add_get("/metrics", own_metrics)
    if discovery.serve_custom:
        r.add_get(r"/apis/{group_name:custom\.metrics\.k8s\.io}/{version}/{tail:.+}", custom_metrics)
    if discovery.serve_external:
        r.add_get(
            r"/apis/{group_name:external\.metrics\.k8s\.io}/v1beta1/namespaces/{namespace}/{metric}", external_metrics
        )
    r.add_get("/apis/{group}", api_group)
    r.add_get("/apis/{group}/{version}", resource_list)
    return app


__all__ = ["EXTERNAL_GROUP", "make_app"]
