"""Delegated authentication and authorization for aggregated API servers: TokenReviews answered from
registered tokens, SubjectAccessReviews from RBAC-style grants, both recorded and able to fail or be slow."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuscale.sim.api_errors import (
    NO_RESOURCE,
    NOT_ALLOWED,
    ApiStatusError,
    Cause,
    bad_request,
    invalid,
)
from gpuscale.sim.kubeapi.discovery_docs import review_resource_list
from gpuscale.sim.kubeapi.payloads import (
    json_response,
    read_body,
)
from gpuscale.sim.resources import (
    ACCESS_REVIEWS,
    REVIEWS,
    TOKEN_REVIEWS,
)


@dataclass(frozen=True, slots=True)
class ReviewUser:
    """Who a token registered with ``add_token`` belongs to (a TokenReview's ``status.user``)."""

    username: str
    uid: str = ""
    groups: tuple[str, ...] = ()
    extra: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AccessRule:
    """One RBAC-style grant for SubjectAccessReviews: subjects, verbs, and resources or non-resource URLs.

    Matched as RBAC matches (``*`` everywhere; ``resources`` entries match ``resource`` or
    ``resource/subresource`` exactly, or ``*/subresource``; ``resource_names`` empty = any name, otherwise only
    requests naming one). ``namespace`` None grants cluster-wide (a ClusterRoleBinding), a namespace grants only
    requests in it (a RoleBinding). A rule with ``non_resource_urls`` grants non-resource requests only
    (exact paths, or prefixes ending in ``*``).
    """

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    verbs: frozenset[str] = frozenset({"*"})
    api_groups: frozenset[str] = frozenset({"*"})
    resources: frozenset[str] = frozenset({"*"})
    resource_names: frozenset[str] = frozenset()
    namespace: str | None = None
    non_resource_urls: frozenset[str] = frozenset()

    def allows(self, spec: Mapping[str, Any]) -> bool:
        """Whether this rule grants a SubjectAccessReview ``spec``."""
        if spec.get("user") not in self.users and not self.groups.intersection(spec.get("groups") or ()):
            return False
        resource = spec.get("resourceAttributes")
        if resource is None:
            attributes = spec.get("nonResourceAttributes") or {}
            path = attributes.get("path", "")
            return (
                self.namespace is None
                and _verb_matches(self.verbs, attributes.get("verb", ""))
                and any(
                    u == "*" or u == path or (u.endswith("*") and path.startswith(u[:-1]))
                    for u in self.non_resource_urls
                )
            )
        if self.non_resource_urls:
            return False
        if self.namespace is not None and resource.get("namespace", "") != self.namespace:
            return False
        if not _verb_matches(self.verbs, resource.get("verb", "")):
            return False
        if "*" not in self.api_groups and resource.get("group", "") not in self.api_groups:
            return False
        plural, sub = resource.get("resource", ""), resource.get("subresource", "")
        combined = f"{plural}/{sub}" if sub else plural
        if not any(r in ("*", combined) or (sub and r == f"*/{sub}") for r in self.resources):
            return False
        return not self.resource_names or resource.get("name", "") in self.resource_names


def _verb_matches(verbs: frozenset[str], verb: str) -> bool:
    return "*" in verbs or verb in verbs


_REVIEW_FAILURE_REASONS = {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable", 504: "Timeout"}


class Reviews:
    """The tokens and grants reviews are answered from, and every review received."""

    def __init__(self) -> None:
        self.users: dict[str, ReviewUser] = {}
        """token → user, for TokenReviews (see ``add_token``)."""
        self.rules: list[AccessRule] = []
        """The grants SubjectAccessReviews are answered from (see ``allow``); clear it to deny everything again."""
        self.token_reviews: list[dict[str, Any]] = []
        """The ``spec`` of every TokenReview received, in order (failed ones included)."""
        self.access_reviews: list[dict[str, Any]] = []
        """The ``spec`` of every SubjectAccessReview received, in order (failed ones included)."""
        self.delay_seconds = 0.0
        """How long each review takes to answer (to exercise clients' timeouts and request coalescing)."""
        self.failure: int | None = None
        """The HTTP status every review is answered with (None: answer normally)."""

    def add_token(
        self,
        token: str,
        username: str,
        *,
        uid: str = "",
        groups: Iterable[str] = (),
        extra: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """Make TokenReviews of ``token`` answer with this user (``system:authenticated`` is added)."""
        if not token or not username:
            raise ValueError("a token and a username are required")
        self.users[token] = ReviewUser(username, uid, tuple(groups), {k: tuple(v) for k, v in (extra or {}).items()})

    def allow(
        self,
        *,
        users: Iterable[str] = (),
        groups: Iterable[str] = (),
        verbs: Iterable[str] = ("*",),
        api_groups: Iterable[str] = ("*",),
        resources: Iterable[str] = ("*",),
        resource_names: Iterable[str] = (),
        namespace: str | None = None,
        non_resource_urls: Iterable[str] = (),
    ) -> AccessRule:
        """Grant, for SubjectAccessReviews, what an RBAC role bound to these users and groups would grant."""
        rule = AccessRule(
            frozenset(users),
            frozenset(groups),
            frozenset(verbs),
            frozenset(api_groups),
            frozenset(resources),
            frozenset(resource_names),
            namespace,
            frozenset(non_resource_urls),
        )
        if not rule.users and not rule.groups:
            raise ValueError("allow() needs at least one user or group")
        if rule.non_resource_urls and namespace is not None:
            raise ValueError("non-resource URLs can only be granted cluster-wide")
        self.rules.append(rule)
        return rule

    async def serve(self, request: web.Request, group: str, version: str, rest: list[str]) -> web.StreamResponse:
        if not rest:
            if request.method != "GET":
                raise NOT_ALLOWED
            return json_response(review_resource_list(group, version))
        rt = REVIEWS.get((group, version, rest[0]))
        if rt is None or len(rest) > 1:
            raise NO_RESOURCE
        if request.method != "POST":
            raise NOT_ALLOWED
        body = await read_body(request)
        if not isinstance(body, dict) or body.get("kind", rt.kind) != rt.kind:
            raise bad_request(f"the body is not a {rt.kind}: cannot be handled as a {rt.kind}")
        raw_spec = body.get("spec")
        spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
        (self.token_reviews if rt is TOKEN_REVIEWS else self.access_reviews).append(copy.deepcopy(spec))
        if self.delay_seconds > 0:
            await asyncio.sleep(self.delay_seconds)
        if self.failure is not None:
            code = self.failure
            raise ApiStatusError(
                code,
                _REVIEW_FAILURE_REASONS.get(code, "InternalError"),
                "the server is currently unable to handle the request",
            )
        status = self.token_review(spec) if rt is TOKEN_REVIEWS else self.access_review(spec)
        answer = {
            "kind": rt.kind,
            "apiVersion": rt.api_version,
            "metadata": {"creationTimestamp": None},
            "spec": spec,
            "status": status,
        }
        return json_response(answer, status=201)

    def token_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        token = spec.get("token")
        if not token:
            raise bad_request("token is required for TokenReview in authentication")
        user = self.users.get(token)
        if user is None:
            return {"user": {}, "error": "invalid bearer token"}
        groups = list(user.groups)
        if "system:authenticated" not in groups:
            groups.append("system:authenticated")
        info: dict[str, Any] = {"username": user.username, "groups": groups}
        if user.uid:
            info["uid"] = user.uid
        if user.extra:
            info["extra"] = {k: list(v) for k, v in user.extra.items()}
        status: dict[str, Any] = {"authenticated": True, "user": info}
        if spec.get("audiences"):
            status["audiences"] = list(spec["audiences"])
        return status

    def access_review(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        has_resource, has_path = (
            spec.get("resourceAttributes") is not None,
            spec.get("nonResourceAttributes") is not None,
        )
        causes = []
        if has_resource and has_path:
            causes.append(
                Cause(
                    "spec.nonResourceAttributes",
                    f"Invalid value: {json.dumps(spec['nonResourceAttributes'])}: "
                    "cannot be specified in combination with resourceAttributes",
                )
            )
        elif not has_resource and not has_path:
            causes.append(
                Cause(
                    "spec.resourceAttributes",
                    'Invalid value: "null": '
                    "exactly one of nonResourceAttributes or resourceAttributes must be specified",
                )
            )
        if not spec.get("user") and not spec.get("groups"):
            causes.append(Cause("spec.user", 'Invalid value: "": at least one of user or group must be specified'))
        if causes:
            raise invalid(ACCESS_REVIEWS, "", causes)
        if "system:masters" in (spec.get("groups") or ()):
            return {"allowed": True}
        for index, rule in enumerate(self.rules):
            if rule.allows(spec):
                return {"allowed": True, "reason": f"RBAC: allowed by sim access rule #{index}"}
        return {"allowed": False}
