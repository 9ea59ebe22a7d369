"""metav1.Status bodies, and the one place gpuscale errors become HTTP answers.

Messages follow custom-metrics-apiserver's wording ("the server could not find the metric …") so
operators can search for them; unexpected failures become 500 "unable to fetch metrics" with the cause
in the log only (prometheus-adapter's rule: don't leak implementation details to API clients).
"""

from __future__ import annotations

import json
import logging

from aiohttp import web

from gpuscale.errors import GpuscaleError, MetricNotFound, MetricStale, ObjectNotFound, SelectorError

log = logging.getLogger(__name__)

_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    500: "InternalError",
    503: "ServiceUnavailable",
}


def status_body(code: int, message: str, *, reason: str | None = None, details: dict | None = None) -> dict:
    body: dict = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason or _REASONS.get(code, ""),
        "code": code,
    }
    if details:
        body["details"] = details
    return body


def status_response(
    code: int, message: str, *, reason: str | None = None, details: dict | None = None, headers: dict | None = None
) -> web.Response:
    return web.Response(
        status=code,
        text=json.dumps(status_body(code, message, reason=reason, details=details)),
        content_type="application/json",
        headers=headers,
    )


def error_response(error: Exception) -> web.Response:
    """Map an exception to its Status answer."""
    if isinstance(error, MetricNotFound | ObjectNotFound):
        return status_response(404, str(error))
    if isinstance(error, SelectorError):
        return status_response(400, str(error))
    if isinstance(error, MetricStale):
        return status_response(503, str(error), headers={"Retry-After": str(error.retry_after_seconds)})
    if isinstance(error, GpuscaleError):
        log.warning("request failed: %s", error)
    else:
        log.error("unexpected error serving metrics", exc_info=error)
    return status_response(500, "unable to fetch metrics")
