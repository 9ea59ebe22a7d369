"""Plain REST to the Kubernetes API for any kind, over kubernetes-asyncio's ApiClient (its auth, TLS, proxies).

kubernetes-asyncio's typed APIs cover the built-in kinds one method at a time; the controller reads and writes
kinds it only knows by apiVersion/kind (Leases, PodDisruptionBudgets, ProvisioningRequests…). ``KubeRest``
maps a kind to its resource the way kubectl's RESTMapper does — from the server's discovery documents
(``/api/v1``, ``/apis/<group>/<version>``), cached per group/version — and sends JSON requests through
``ApiClient.call_api``, so the kubeconfig / in-cluster credentials work exactly as for the typed APIs.

Answers are returned, never raised: ``KubeAnswer`` carries the status, the decoded body (a metav1.Status for
errors) and the headers (``Retry-After``). Transport failures raise ``SourceUnavailable``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from kubernetes_asyncio import client

from gpuscale.errors import KindNotServed, SourceUnavailable

__all__ = ["KubeAnswer", "KubeRest", "ResourceInfo", "api_path"]

JSON = "application/json"
PATCH_CONTENT_TYPES = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
}
_TIMEOUT_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class ResourceInfo:
    """A served resource: ``api_version`` (``v1``, ``policy/v1``), ``plural`` and whether it is namespaced."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool


@dataclass(frozen=True, slots=True)
class KubeAnswer:
    status: int
    body: Mapping[str, Any] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def reason(self) -> str:
        """The metav1.Status ``reason`` (``AlreadyExists``, ``Conflict``, ``NotFound``…), or ""."""
        return str(self.body.get("reason") or "") if not self.ok else ""

    @property
    def message(self) -> str:
        return str(self.body.get("message") or "") if not self.ok else ""

    @property
    def retry_after_seconds(self) -> float:
        raw = self.headers.get("Retry-After") or (self.body.get("details") or {}).get("retryAfterSeconds") or 0
        try:
            return min(max(float(raw), 0.0), 60.0)
        except (TypeError, ValueError):
            return 0.0


def api_path(api_version: str) -> str:
    """``/api/v1`` for the core group, ``/apis/<group>/<version>`` otherwise."""
    return f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"


class KubeRest:
    """JSON requests to the API server for any resource; kinds resolved through discovery."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self._resources: dict[str, dict[str, ResourceInfo]] = {}  # apiVersion → kind → info

    async def resource(self, api_version: str, kind: str) -> ResourceInfo:
        """Where ``kind`` is served; SourceUnavailable when the server does not serve it (a missing CRD)."""
        kinds = self._resources.get(api_version)
        if kinds is None:
            answer = await self.request("GET", api_path(api_version))
            if answer.status == 404:
                raise KindNotServed("kubernetes", f"{api_version} is not served")
            if not answer.ok:
                raise SourceUnavailable(
                    "kubernetes", f"cannot read discovery of {api_version}: HTTP {answer.status} {answer.message}"
                )
            kinds = {}
            for entry in answer.body.get("resources") or []:
                if "/" in entry.get("name", ""):
                    continue  # a subresource
                kinds.setdefault(
                    entry["kind"], ResourceInfo(api_version, entry["kind"], entry["name"], bool(entry["namespaced"]))
                )
            self._resources[api_version] = kinds
        info = kinds.get(kind)
        if info is None:
            raise KindNotServed("kubernetes", f"{api_version} serves no kind {kind}")
        return info

    async def path(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        name: str | None = None,
        subresource: str | None = None,
    ) -> str:
        info = await self.resource(api_version, kind)
        parts = [api_path(api_version)]
        if info.namespaced and namespace:
            parts.append(f"namespaces/{quote(namespace, safe='')}")
        parts.append(info.plural)
        if name is not None:
            parts.append(quote(name, safe=""))
        if subresource:
            parts.append(subresource)
        return "/".join(parts)

    async def request(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
        timeout_seconds: float = _TIMEOUT_SECONDS,
    ) -> KubeAnswer:
        """One request; the answer whatever its status. SourceUnavailable when no answer came."""
        try:
            response = await self.api_client.call_api(
                path,
                method,
                query_params=list((query or {}).items()),
                header_params={"Content-Type": content_type, "Accept": JSON},
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=timeout_seconds,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            raise SourceUnavailable("kubernetes", f"{method} {path}: {type(e).__name__}: {e}".rstrip(": ")) from e
        try:
            raw = await response.read()
        finally:
            response.release()
        decoded: Any = {}
        if raw:
            try:
                decoded = json.loads(raw)
            except ValueError:
                decoded = {"message": raw.decode(errors="replace")[:300]}
        if not isinstance(decoded, dict):
            decoded = {"message": str(decoded)[:300]}
        return KubeAnswer(response.status, decoded, dict(response.headers))

    def list_call(self, path: str) -> Callable[..., Awaitable[Any]]:
        """A callable shaped like kubernetes-asyncio's ``list_*`` methods for ``path`` (what the reflector's
        list and watch loops call): keyword arguments in, the raw aiohttp response out."""

        async def call(**kwargs: Any) -> Any:
            names = {
                "limit": "limit",
                "_continue": "continue",
                "watch": "watch",
                "resource_version": "resourceVersion",
                "timeout_seconds": "timeoutSeconds",
                "allow_watch_bookmarks": "allowWatchBookmarks",
                "label_selector": "labelSelector",
                "field_selector": "fieldSelector",
            }
            query = []
            for key, value in kwargs.items():
                if key in names and value not in (None, ""):
                    query.append((names[key], str(value).lower() if isinstance(value, bool) else str(value)))
            return await self.api_client.call_api(
                path,
                "GET",
                query_params=query,
                header_params={"Accept": JSON},
                auth_settings=["BearerToken"],
                _preload_content=False,
                _request_timeout=kwargs.get("_request_timeout"),
            )

        return call
