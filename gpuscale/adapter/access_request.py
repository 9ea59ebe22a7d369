"""Who is asking, and for what: the identity (``UserInfo``), the request's attributes as apiserver's
``RequestInfo`` derives them, the SubjectAccessReview spec they make, and kube-apiserver's Forbidden answer.

Pure: no I/O. The authenticator (authn.py) produces a ``UserInfo``, the authorizer (authz.py) judges it against
``RequestAttributes``; the middleware (auth.py) answers 403 with ``forbidden_response``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuscale.adapter.status import status_response
from gpuscale.errors import GpuscaleError

__all__ = [
    "ANONYMOUS",
    "AUTHENTICATED_GROUP",
    "UNAUTHENTICATED_GROUP",
    "RequestAttributes",
    "Unauthenticated",
    "UserInfo",
    "forbidden_message",
    "forbidden_response",
    "request_attributes",
    "review_spec",
]

AUTHENTICATED_GROUP = "system:authenticated"
UNAUTHENTICATED_GROUP = "system:unauthenticated"


class Unauthenticated(GpuscaleError):
    """The request carries no acceptable credentials (→ 401 Unauthorized; the reason is logged, not sent)."""


@dataclass(frozen=True, slots=True)
class UserInfo:
    """An authenticated identity, as Kubernetes' ``user.Info``: name, uid, groups and extra (key → values)."""

    name: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


ANONYMOUS = UserInfo("system:anonymous", groups=(UNAUTHENTICATED_GROUP,))


@dataclass(frozen=True, slots=True)
class RequestAttributes:
    """What a request asks to do, as apiserver's ``RequestInfo`` derives it from method and path.

    A resource request has group/version/resource (and maybe namespace, name, subresource); any other request
    is a non-resource request on ``path``. ``verb`` is the Kubernetes verb (get, list, create…) for the first,
    the lower-case HTTP method for the second.
    """

    verb: str
    path: str
    resource_request: bool = False
    api_group: str = ""
    api_version: str = ""
    namespace: str = ""
    resource: str = ""
    subresource: str = ""
    name: str = ""


_METHOD_VERBS = {"POST": "create", "GET": "get", "HEAD": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})


def request_attributes(method: str, path: str, query: Mapping[str, str]) -> RequestAttributes:
    """apiserver's ``RequestInfoFactory.NewRequestInfo`` for the ``/api`` and ``/apis`` prefixes.

    ``/apis/custom.metrics.k8s.io/v1beta2/namespaces/ns/pods/*/m`` → get pods, name ``*``, subresource ``m`` in
    ``ns``; ``…/namespaces/ns/metrics/m`` → get ``metrics`` named ``m``; ``/apis/external.metrics.k8s.io/v1beta1/
    namespaces/ns/m`` → list ``m`` (no name); ``/apis/custom.metrics.k8s.io/v1beta1`` (discovery) and everything
    outside ``/api(s)`` → non-resource. Resource names are taken verbatim (``deployments.apps``). The legacy
    ``/watch/`` and ``/proxy/`` path prefixes are not interpreted.
    """
    non_resource = RequestAttributes(verb=method.lower(), path=path)
    parts = [p for p in path.strip("/").split("/")] if path.strip("/") else []
    if len(parts) < 3 or parts[0] not in ("api", "apis"):
        return non_resource
    prefix, parts = parts[0], parts[1:]
    group = ""
    if prefix == "apis":
        if len(parts) < 3:
            return non_resource
        group, parts = parts[0], parts[1:]
    version, parts = parts[0], parts[1:]
    verb = _METHOD_VERBS.get(method.upper(), "")
    namespace = ""
    if parts[0] == "namespaces" and len(parts) > 1:
        namespace = parts[1]
        if len(parts) > 2 and parts[2] not in _NAMESPACE_SUBRESOURCES:
            parts = parts[2:]
    resource = parts[0]
    name = parts[1] if len(parts) > 1 else ""
    subresource = parts[2] if len(parts) > 2 else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "").lower() in ("1", "t", "true") else "list"
        for term in query.get("fieldSelector", "").split(","):
            key, _, value = term.replace("==", "=").partition("=")
            if key.strip() == "metadata.name" and value.strip() and "/" not in value:
                name = value.strip()
    if not name and verb == "delete":
        verb = "deletecollection"
    return RequestAttributes(verb, path, True, group, version, namespace, resource, subresource, name)


def _q(text: str) -> str:
    """Go's %q, near enough for names and paths."""
    return json.dumps(text, ensure_ascii=False)


def forbidden_message(user: UserInfo, attributes: RequestAttributes, reason: str = "") -> str:
    """kube-apiserver's Forbidden message (``responsewriters.Forbidden`` wrapped by ``apierrors.NewForbidden``)."""
    a = attributes
    if not a.resource_request:
        what = f"User {_q(user.name)} cannot {a.verb} path {_q(a.path)}"
    else:
        resource = f"{a.resource}/{a.subresource}" if a.subresource else a.resource
        where = f"in the namespace {_q(a.namespace)}" if a.namespace else "at the cluster scope"
        what = f"User {_q(user.name)} cannot {a.verb} resource {_q(resource)} in API group {_q(a.api_group)} {where}"
    if reason:
        what = f"{what}: {reason}"
    if not a.resource_request or not (a.resource or a.api_group):
        return f"forbidden: {what}"
    qualified = f"{a.resource}.{a.api_group}" if a.api_group else a.resource
    if a.name:
        return f"{qualified} {_q(a.name)} is forbidden: {what}"
    return f"{qualified} is forbidden: {what}"


def forbidden_response(user: UserInfo, attributes: RequestAttributes, reason: str = "") -> web.Response:
    details = None
    if attributes.resource_request:
        details = {
            k: v
            for k, v in (("group", attributes.api_group), ("kind", attributes.resource), ("name", attributes.name))
            if v
        }
    return status_response(403, forbidden_message(user, attributes, reason), details=details or None)


def review_spec(user: UserInfo, attributes: RequestAttributes) -> dict[str, Any]:
    """The ``spec`` of a SubjectAccessReview for this user and request (what the webhook authorizer sends)."""
    spec: dict[str, Any] = {"user": user.name, "groups": list(user.groups)}
    if user.uid:
        spec["uid"] = user.uid
    if user.extra:
        spec["extra"] = {k: list(v) for k, v in sorted(user.extra.items())}
    a = attributes
    if a.resource_request:
        resource = {"verb": a.verb, "group": a.api_group, "version": a.api_version, "resource": a.resource}
        resource.update({k: v for k, v in (("namespace", a.namespace), ("subresource", a.subresource)) if v})
        if a.name:
            resource["name"] = a.name
        spec["resourceAttributes"] = resource
    else:
        spec["nonResourceAttributes"] = {"path": a.path, "verb": a.verb}
    return spec
