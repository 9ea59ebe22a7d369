"""The simulated API server: the HTTP front (authentication, dispatch by path, resource requests) and the
in-process helpers, over the collaborators each concern lives in (store, writes, watch, eviction, faults,
reviews, discovery, custom resources). See the package docstring for what it covers."""

from __future__ import annotations

import asyncio
import builtins
import copy
import logging
import os
from collections import deque
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from gpuscale.sim.api_errors import (
    NO_RESOURCE,
    NOT_ALLOWED,
    ApiStatusError,
    check_write_options,
    delete_answer,
)
from gpuscale.sim.kubeapi.customresources import CustomResources
from gpuscale.sim.kubeapi.discovery_docs import (
    KUBERNETES_VERSION,
    api_versions,
    deletes_collections,
    group_doc,
    openapi_v3,
    resource_list,
    root_paths,
)
from gpuscale.sim.kubeapi.eviction import evict, keep_budget_statuses
from gpuscale.sim.kubeapi.faults import FaultPlan, ServedFault, planned_status
from gpuscale.sim.kubeapi.listing import delete_collection, list_response
from gpuscale.sim.kubeapi.payloads import (
    APPLY_PATCH,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    RecordedRequest,
    WriteOptions,
    json_response,
    read_body,
    read_delete_options,
    read_patch,
    scale_of,
    table_of,
    to_served,
    truthy,
    verb_of,
    wants_table,
    write_options,
)
from gpuscale.sim.kubeapi.proxy import proxy_to_pod
from gpuscale.sim.kubeapi.reviews import Reviews
from gpuscale.sim.kubeapi.storage import ObjectStore, parse_selectors
from gpuscale.sim.kubeapi.watch import Watches
from gpuscale.sim.kubeapi.writer import ObjectWriter
from gpuscale.sim.resources import (
    BY_PATH,
    REVIEWS,
    ResourceType,
)

log = logging.getLogger(__name__)


# --- the server -------------------------------------------------------------------------------------


class SimKubeApi:
    """An in-memory Kubernetes API server over aiohttp. See the package docstring for what it covers.

    ``history_limit`` is how many changes a watch can replay (older resourceVersions get 410 Expired);
    ``tokens``, when given, is the set of bearer tokens accepted (others get 401), otherwise any token —
    or none — is accepted; ``bookmark_interval_seconds`` spaces BOOKMARK events on watches that allow them.
    """

    def __init__(
        self,
        *,
        history_limit: int = 1000,
        tokens: Collection[str] | None = None,
        bookmark_interval_seconds: float = 60.0,
        namespaces: Iterable[str] = ("default", "kube-system", "kube-public", "kube-node-lease"),
    ) -> None:
        if history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        self._tokens = frozenset(tokens) if tokens is not None else None
        self._store = ObjectStore(history_limit=history_limit)
        self._watches = Watches(self._store, bookmark_interval_seconds=bookmark_interval_seconds)
        self._custom = CustomResources()
        self._writer = ObjectWriter(self._store, commit=self._commit, served=self._custom.served)
        self._faults = FaultPlan()
        self._reviews = Reviews()
        self._runner: web.AppRunner | None = None
        self.url = ""
        self.requests: deque[RecordedRequest] = deque(maxlen=10_000)
        self.request_count = 0
        self.tokens_seen: set[str] = set()
        self.review_users = self._reviews.users
        """token → user, for TokenReviews (see ``add_token``)."""
        self.access_rules = self._reviews.rules
        """The grants SubjectAccessReviews are answered from (see ``allow``); clear it to deny everything again."""
        self.token_reviews = self._reviews.token_reviews
        """The ``spec`` of every TokenReview received, in order (failed ones included)."""
        self.access_reviews = self._reviews.access_reviews
        """The ``spec`` of every SubjectAccessReview received, in order (failed ones included)."""
        self.faults_served = self._faults.served
        """Every request answered by the fault plan (``fail_next``), in order."""
        self.watches_dropped = 0
        """How many open watch connections ``drop_watches`` and ``go_away`` cut."""
        self._address: tuple[str, int] | None = None
        # The review policy (add_token, allow: reviews.Reviews) and the fault plan (fail_next, clear_faults:
        # faults.FaultPlan) are set through the collaborators' own methods, documented there.
        self.add_token = self._reviews.add_token
        self.allow = self._reviews.allow
        self.fail_next = self._faults.add
        self.clear_faults = self._faults.clear
        for name in namespaces:
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    @property
    def review_delay_seconds(self) -> float:
        """How long each review takes to answer (to exercise clients' timeouts and request coalescing)."""
        return self._reviews.delay_seconds

    @review_delay_seconds.setter
    def review_delay_seconds(self, seconds: float) -> None:
        self._reviews.delay_seconds = seconds

    # -- lifecycle

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on host:port (0 = a free port) and return the base URL."""
        if self._runner is not None:
            raise RuntimeError("SimKubeApi is already started")
        app = web.Application(middlewares=[self._middleware], client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        self._runner = runner
        self._watches.stopping = False
        bound = runner.addresses[0]
        self._address = (host, bound[1])
        self.url = f"http://{host}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        """End every watch stream, then close the server. Safe to call twice."""
        self._watches.end_all()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def __aenter__(self) -> SimKubeApi:
        if self._runner is None:
            await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def write_kubeconfig(
        self, path: str | os.PathLike[str], *, token: str | None = None, namespace: str = "default"
    ) -> str:
        """Write a kubeconfig for this server (context "sim", bearer-token user) and return its path."""
        if not self.url:
            raise RuntimeError("start() the server before writing a kubeconfig")
        if token is None:
            token = sorted(self._tokens)[0] if self._tokens else "sim-token"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "users": [{"name": "sim", "user": {"token": token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}],
            "current-context": "sim",
            "preferences": {},
        }
        target = Path(path)
        target.write_text(yaml.safe_dump(config, sort_keys=False))
        return str(target)

    @property
    def resource_version(self) -> str:
        """The current global resourceVersion."""
        return str(self._store.rv)

    # -- in-process helpers (same semantics as HTTP)

    def create(self, obj: Mapping[str, Any], *, preserve_identity: bool = True) -> dict[str, Any]:
        """Create an object, as POST does, with two conveniences for seeding a scenario:

        * a ``status`` given for a resource with a status subresource is then written through ``/status``
          (a second change, as the kubelet or a controller would report it);
        * with ``preserve_identity`` a given ``metadata.uid`` and ``creationTimestamp`` are kept, so
          ownerReferences rendered ahead of time stay true (over HTTP the server always assigns both).
        """
        rt = self._custom.resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = self._helper_namespace(rt, obj)
        meta = obj.get("metadata") or {}
        identity = {k: meta[k] for k in ("uid", "creationTimestamp") if preserve_identity and meta.get(k)}
        created = self._writer.create(rt, namespace, copy.deepcopy(dict(obj)), identity=identity)
        return self._write_status(rt, namespace, created, obj.get("status"))

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create the object if absent, else merge the given fields into it (server-side apply without field
        ownership); a given ``status`` is applied through ``/status`` afterwards, as in ``create``."""
        rt = self._custom.resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        namespace = self._helper_namespace(rt, obj)
        name = (obj.get("metadata") or {}).get("name", "")
        if not name or self._store.stored(rt, namespace, name) is None:
            return self.create(obj)
        body = {k: copy.deepcopy(v) for k, v in obj.items() if k != "status"}
        for server_field in ("uid", "creationTimestamp", "resourceVersion", "generation"):
            body.get("metadata", {}).pop(server_field, None)
        applied = self._writer.patch(rt, namespace, name, APPLY_PATCH, body, field_manager="sim")
        return self._write_status(rt, namespace, applied, obj.get("status"))

    def _write_status(self, rt: ResourceType, namespace: str, current: dict[str, Any], status: Any) -> dict[str, Any]:
        if not rt.has_status or status is None or current.get("status") == status:
            return current
        updated = copy.deepcopy(current)
        updated["status"] = copy.deepcopy(status)
        return self._writer.update(rt, namespace, current["metadata"]["name"], updated, subresource="status")

    def replace(self, obj: Mapping[str, Any], *, subresource: str | None = None) -> dict[str, Any]:
        """PUT an object (``subresource="status"`` to write its status)."""
        rt = self._custom.resource_for(obj.get("apiVersion", ""), obj.get("kind", ""))
        name = (obj.get("metadata") or {}).get("name", "")
        return self._writer.update(rt, self._helper_namespace(rt, obj), name, dict(obj), subresource=subresource)

    def patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Any,
        *,
        namespace: str | None = None,
        patch_type: str = "merge",
        subresource: str | None = None,
    ) -> dict[str, Any]:
        """PATCH an object; ``patch_type`` is merge, strategic, json or apply (or a full content type)."""
        rt = self._custom.resource_for(api_version, kind)
        content_type = {
            "merge": MERGE_PATCH,
            "strategic": STRATEGIC_MERGE_PATCH,
            "json": JSON_PATCH,
            "apply": APPLY_PATCH,
        }.get(patch_type, patch_type)
        namespace = self._helper_namespace(rt, {"metadata": {"namespace": namespace}})
        return self._writer.patch(
            rt, namespace, name, content_type, patch, subresource=subresource, field_manager="sim"
        )

    def delete(self, api_version: str, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any]:
        rt = self._custom.resource_for(api_version, kind)
        return self._writer.delete(rt, self._helper_namespace(rt, {"metadata": {"namespace": namespace}}), name, {})

    def get(self, api_version: str, kind: str, name: str, *, namespace: str | None = None) -> dict[str, Any] | None:
        rt = self._custom.resource_for(api_version, kind)
        stored = self._store.stored(rt, self._helper_namespace(rt, {"metadata": {"namespace": namespace}}), name)
        return to_served(rt, stored) if stored is not None else None

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str = "",
        field_selector: str = "",
    ) -> builtins.list[dict[str, Any]]:
        """Objects of a kind (all namespaces when ``namespace`` is None), each with kind and apiVersion."""
        rt = self._custom.resource_for(api_version, kind)
        labels, fields = parse_selectors(rt, {"labelSelector": label_selector, "fieldSelector": field_selector})
        return [to_served(rt, o) for o in self._store.select(rt, namespace, labels, fields)]

    def compact(self) -> None:
        """Forget the change history: a watch from any resourceVersion before now gets 410 Expired."""
        self._store.compact()

    # -- delegated authentication and authorization policy: gpuscale.sim.kubeapi.reviews

    def fail_reviews(self, status: int | None = 503) -> None:
        """Answer every TokenReview and SubjectAccessReview with this HTTP status (None: answer normally)."""
        self._reviews.failure = status

    # -- fault injection: what a real control plane does to its clients now and then

    @property
    def pending_faults(self) -> int:
        """How many planned failures are still to be served."""
        return self._faults.pending

    def drop_watches(self, resource: str | None = None) -> int:
        """Cut every open watch (of ``resource``, or all) mid-stream, as a restarting apiserver or a load
        balancer's idle timeout does: the connection is aborted, with no final chunk and no BOOKMARK.
        Returns how many were cut."""
        dropped = self._watches.drop(resource)
        self.watches_dropped += dropped
        return dropped

    @property
    def available(self) -> bool:
        """False between ``go_away`` and ``come_back``."""
        return self._runner is not None

    async def go_away(self) -> None:
        """Stop answering entirely: cut every watch, close the listening socket and every connection (clients
        get connection refused). Storage stays, and in-process writes keep working (as other apiservers
        behind the same etcd would take them), so ``come_back`` serves what changed meanwhile."""
        if self._runner is None:
            raise RuntimeError("SimKubeApi is not serving")
        self.drop_watches()
        runner, self._runner = self._runner, None
        await runner.cleanup()

    async def come_back(self) -> str:
        """Listen again on the same address as before ``go_away``; returns the (unchanged) URL."""
        if self._address is None:
            raise RuntimeError("SimKubeApi was never started")
        host, port = self._address
        return await self.start(host, port)

    async def outage(self, seconds: float) -> None:
        """``go_away``, wait ``seconds``, ``come_back``."""
        await self.go_away()
        try:
            await asyncio.sleep(seconds)
        finally:
            await self.come_back()

    # -- storage: gpuscale.sim.kubeapi.storage; the write path: gpuscale.sim.kubeapi.writer

    def _commit(self, rt: ResourceType, kind: str, new: dict[str, Any], prev: dict[str, Any] | None) -> dict[str, Any]:
        """Write (or, for DELETED, remove) an object at a fresh resourceVersion and tell the watchers."""
        change = self._store.record(rt, kind, new, prev)
        self._watches.notify(change)
        if rt.kind == "CustomResourceDefinition" and not rt.custom:
            self._custom.changed(kind, new, self._store, self._commit)
        if not rt.custom and (rt.kind == "Pod" or (rt.kind == "PodDisruptionBudget" and kind != "DELETED")):
            keep_budget_statuses(self._store, new["metadata"].get("namespace", ""), commit=self._commit)
        return new

    def _helper_namespace(self, rt: ResourceType, obj: Mapping[str, Any]) -> str:
        if not rt.namespaced:
            return ""
        return (obj.get("metadata") or {}).get("namespace") or "default"

    # -- HTTP: middleware and dispatch

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Callable[[web.Request], Any]) -> web.StreamResponse:
        self.request_count += 1
        header = request.headers.get("Authorization", "")
        token = header[7:].strip() if header.lower().startswith("bearer ") else None
        self.requests.append(RecordedRequest(request.method, request.path_qs, token))
        if token:
            self.tokens_seen.add(token)
        try:
            if self._tokens is not None and token not in self._tokens:
                raise ApiStatusError(401, "Unauthorized", "Unauthorized")
            return await handler(request)
        except ApiStatusError as e:
            response = json_response(e.status, status=e.code)
            response.headers.update(e.headers)
            return response
        except web.HTTPException:
            raise
        except Exception as e:  # the server must answer with a Status, as kube-apiserver does
            log.exception("simulated apiserver failed on %s %s", request.method, request.path_qs)
            return json_response(
                ApiStatusError(500, "InternalError", f"Internal error occurred: {e}").status, status=500
            )

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if not parts:
            return json_response(root_paths(self._custom.groups()))
        head = parts[0]
        if head in ("healthz", "livez", "readyz") and len(parts) == 1:
            return web.Response(text="ok")
        if head == "openapi" and len(parts) >= 2 and parts[1] == "v3":
            return json_response(openapi_v3(parts[2:], self._custom.served()))
        if head == "version" and len(parts) == 1:
            return json_response(KUBERNETES_VERSION)
        if head == "api":
            if len(parts) == 1:
                return json_response(api_versions(self.url))
            group, version, rest = "", parts[1], parts[2:]
        elif head == "apis":
            groups = self._custom.groups()
            if len(parts) == 1:
                return json_response(
                    {"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_doc(g, groups) for g in groups]}
                )
            if parts[1] not in groups:
                raise NO_RESOURCE
            if len(parts) == 2:
                return json_response({"kind": "APIGroup", "apiVersion": "v1", **group_doc(parts[1], groups)})
            group, version, rest = parts[1], parts[2], parts[3:]
        else:
            raise NO_RESOURCE
        if any(rt.group == group and rt.version == version for rt in REVIEWS.values()):
            return await self._reviews.serve(request, group, version, rest)
        served = self._custom.served()
        if not any(rt.group == group and rt.version == version for rt in served):
            raise NO_RESOURCE
        if not rest:
            if request.method != "GET":
                raise NOT_ALLOWED
            return json_response(resource_list(group, version, served))
        if group == "" and len(rest) >= 5 and rest[0] == "namespaces" and rest[2] == "pods" and rest[4] == "proxy":
            return await proxy_to_pod(request, self._store, rest[1], rest[3], "/" + "/".join(rest[5:]))
        return await self._serve_resource(request, group, version, rest)

    async def _serve_resource(
        self, request: web.Request, group: str, version: str, rest: builtins.list[str]
    ) -> web.StreamResponse:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) > 1 and not (len(rest) > 2 and rest[2] in ("status", "finalize")):
            namespace, rest = rest[1], rest[2:]
            if not rest:  # /api/v1/namespaces/{name}
                rest = ["namespaces", namespace]
                namespace = None
        if len(rest) > 3:
            raise NO_RESOURCE
        rt = BY_PATH.get((group, version, rest[0])) or self._custom.by_path.get((group, version, rest[0]))
        if rt is None or (namespace is not None and not rt.namespaced):
            raise NO_RESOURCE
        name = rest[1] if len(rest) > 1 else None
        subresource = rest[2] if len(rest) > 2 else None
        if subresource is not None and subresource not in rt.subresources:
            raise NO_RESOURCE
        if rt.namespaced and name is not None and namespace is None:
            raise NO_RESOURCE
        ns = namespace if rt.namespaced else ""
        check_write_options(request.method, request.query)
        write = write_options(request.query)
        response = await self._serve_object(request, rt, namespace, ns, name, subresource, write)
        for warning in write.warnings:
            response.headers.add("Warning", f'299 - "{warning}"')
        return response

    async def _serve_object(
        self,
        request: web.Request,
        rt: ResourceType,
        namespace: str | None,
        ns: str | None,
        name: str | None,
        subresource: str | None,
        write: WriteOptions,
    ) -> web.StreamResponse:
        query = request.query
        method = request.method
        planned = self._faults.take(verb_of(method, name, subresource, query), rt)
        if planned is not None:
            verb = verb_of(method, name, subresource, query)
            self.faults_served.append(ServedFault(verb, rt.group_resource, planned.code, request.path_qs))
            if not (verb == "watch" and planned.code == 410):
                raise planned_status(planned, rt, name, floor=self._store.floor, rv=self._store.rv)
            return await self._watches.serve(request, rt, namespace if rt.namespaced else None, expire=True)
        if name is None:
            if method == "GET":
                if truthy(query.get("watch")):
                    return await self._watches.serve(request, rt, namespace if rt.namespaced else None)
                return list_response(request, rt, namespace if rt.namespaced else None, self._store)
            if method == "POST" and (ns or not rt.namespaced):
                created = self._writer.create(rt, ns or "", await read_body(request), write=write)
                return json_response(created, status=201)
            if method == "DELETE" and (ns or not rt.namespaced) and deletes_collections(rt):
                return delete_collection(request, rt, ns or "", self._store, self._writer, write=write)
            raise NOT_ALLOWED
        assert ns is not None
        if subresource == "binding":
            if method != "POST":
                raise NOT_ALLOWED
            return self._writer.bind(rt, ns, name, await read_body(request))
        if subresource == "eviction":
            if method != "POST":
                raise NOT_ALLOWED
            return evict(self._store, self._writer, ns, name, await read_body(request), write=write)
        if subresource == "scale":
            if method == "GET":
                return json_response(scale_of(self._store.require(rt, ns, name)))
            if method == "PUT":
                return json_response(self._writer.update_scale(rt, ns, name, await read_body(request), write=write))
        if method == "GET" and subresource in (None, "status"):
            stored = self._store.require(rt, ns, name)
            if wants_table(request):
                return json_response(
                    table_of(rt, [stored], rv=str(self._store.rv), include=query.get("includeObject", "Metadata"))
                )
            return json_response(to_served(rt, stored))
        if method == "PUT" and subresource in (None, "status"):
            return json_response(
                self._writer.update(rt, ns, name, await read_body(request), subresource=subresource, write=write)
            )
        if method == "PATCH":
            result = self._writer.patch(
                rt,
                ns,
                name,
                request.content_type,
                await read_patch(request),
                subresource=subresource,
                field_manager=query.get("fieldManager"),
                write=write,
            )
            return json_response(result)
        if method == "DELETE" and subresource is None:
            deleted = self._writer.delete(rt, ns, name, await read_delete_options(request), write=write)
            return json_response(delete_answer(rt, deleted))
        raise NOT_ALLOWED
