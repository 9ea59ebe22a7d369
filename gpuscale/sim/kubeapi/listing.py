"""Collections: lists with selectors and ``limit``/``continue`` paging (every page the first page's snapshot),
and ``deletecollection``."""

from __future__ import annotations

import base64
import json
from typing import Any

from aiohttp import web

from gpuscale.sim.api_errors import (
    bad_request,
    continue_expired,
)
from gpuscale.sim.kubeapi.payloads import (
    WriteOptions,
    json_response,
    table_of,
    to_served,
    wants_table,
)
from gpuscale.sim.kubeapi.storage import Filter, ObjectStore, parse_selectors
from gpuscale.sim.kubeapi.writer import ObjectWriter
from gpuscale.sim.resources import (
    ResourceType,
)


def list_response(request: web.Request, rt: ResourceType, namespace: str | None, store: ObjectStore) -> web.Response:
    query = request.query
    labels, fields = parse_selectors(rt, query)
    items = store.select(rt, namespace, labels, fields)
    list_rv = store.rv
    meta: dict[str, Any] = {}
    token = query.get("continue")
    if token:
        try:
            state = json.loads(base64.urlsafe_b64decode(token.encode()))
            start = (str(state["start"][0]), str(state["start"][1]))
            list_rv = int(state["rv"])
        except (ValueError, KeyError, TypeError, IndexError) as e:
            raise bad_request(f"invalid continue token: continue key is not valid: {e}") from e
        # NB: every page of a list is the same snapshot, the first page's resourceVersion (etcd serves the
        # later pages at that revision); once the history no longer reaches back to it, 410 Expired.
        snapshot = store.snapshot(rt, list_rv)
        if snapshot is None:
            raise continue_expired(store.rv, start)
        selection = Filter(rt, namespace, labels, fields)
        items = [o for _, o in sorted(snapshot.items()) if selection.passes(o)]
        items = [o for o in items if (o["metadata"].get("namespace", ""), o["metadata"]["name"]) > start]
    limit = query.get("limit")
    if limit:
        try:
            n = int(limit)
        except ValueError as e:
            raise bad_request(f"invalid limit {limit!r}") from e
        if 0 < n < len(items):
            last = items[n - 1]["metadata"]
            state = {"rv": list_rv, "start": [last.get("namespace", ""), last["name"]]}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
            meta["remainingItemCount"] = len(items) - n
            items = items[:n]
    meta["resourceVersion"] = str(list_rv)
    if wants_table(request):
        table = table_of(rt, items, rv=str(list_rv), include=query.get("includeObject", "Metadata"))
        table["metadata"].update(meta)
        return json_response(table)
    served = []
    for stored in items:
        obj = to_served(rt, stored)
        if not rt.custom:  # NB: custom resources are listed unstructured, each item with its TypeMeta
            obj.pop("kind", None)  # NB: kube-apiserver leaves TypeMeta off the items of a typed list
            obj.pop("apiVersion", None)
        served.append(obj)
    return json_response({"kind": f"{rt.kind}List", "apiVersion": rt.api_version, "metadata": meta, "items": served})


def delete_collection(
    request: web.Request,
    rt: ResourceType,
    namespace: str,
    store: ObjectStore,
    writer: ObjectWriter,
    *,
    write: WriteOptions,
) -> web.Response:
    labels, fields = parse_selectors(rt, request.query)
    deleted = []
    for stored in store.select(rt, namespace if rt.namespaced else None, labels, fields):
        meta = stored["metadata"]
        deleted.append(writer.delete(rt, meta.get("namespace", ""), meta["name"], {}, write=write))
    for obj in deleted:
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
    return json_response(
        {
            "kind": f"{rt.kind}List",
            "apiVersion": rt.api_version,
            "metadata": {"resourceVersion": str(store.rv)},
            "items": deleted,
        }
    )
