"""A small synchronous REST client for the tests' own calls to a Kubernetes API (the real one or gpuscale/sim).

The tests set up the world (nodes, pods, their status) and read it back as a person or another agent would;
they must not go through the product's client code, which is what is under test. Answers are returned, never
raised: ``Answer`` carries the HTTP status and the decoded body (a metav1.Status for errors).
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

__all__ = ["Answer", "Rest"]

PATCH = {
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    "json": "application/json-patch+json",
    "apply": "application/apply-patch+yaml",
}


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def reason(self) -> str:
        return str(self.body.get("reason") or "") if isinstance(self.body, dict) and not self.ok else ""

    def expect(self, *statuses: int) -> Any:
        assert self.status in (statuses or (200, 201)), f"HTTP {self.status}: {self.body}"
        return self.body


class Rest:
    def __init__(
        self,
        server: str,
        *,
        ca_file: str | None = None,
        cert: tuple[str, str] | None = None,
        token: str | None = None,
        timeout_seconds: float = 30.0,
    ) -> None:
        url = urlsplit(server)
        self.server = server
        self._https = url.scheme == "https"
        self._host = url.hostname or "127.0.0.1"
        self._port = url.port or (443 if self._https else 80)
        self._token = token
        self._timeout = timeout_seconds
        self._ssl: ssl.SSLContext | None = None
        if self._https:
            self._ssl = ssl.create_default_context(cafile=ca_file)
            if cert:
                self._ssl.load_cert_chain(*cert)

    def _connection(self, timeout: float | None = None) -> http.client.HTTPConnection:
        if self._https:
            return http.client.HTTPSConnection(
                self._host, self._port, context=self._ssl, timeout=timeout or self._timeout
            )
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout or self._timeout)

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        if params:
            path = f"{path}?{urlencode({k: v for k, v in params.items() if v is not None})}"
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        conn = self._connection()
        try:
            conn.request(method, path, body=data, headers=self._headers(content_type if data is not None else None))
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            decoded: Any = json.loads(raw) if raw else {}
        except ValueError:
            decoded = raw.decode(errors="replace")
        return Answer(response.status, decoded)

    def get(self, path: str, **params: Any) -> Answer:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any, **params: Any) -> Answer:
        return self.request("POST", path, body, params=params)

    def put(self, path: str, body: Any, **params: Any) -> Answer:
        return self.request("PUT", path, body, params=params)

    def patch(self, path: str, body: Any, kind: str = "merge", **params: Any) -> Answer:
        return self.request("PATCH", path, body, params=params, content_type=PATCH[kind])

    def delete(self, path: str, body: Any = None, **params: Any) -> Answer:
        return self.request("DELETE", path, body, params=params)

    def watch(self, path: str, *, timeout_seconds: float = 10.0, **params: Any) -> Iterator[dict[str, Any]]:
        """The events of a watch (``?watch=1``), one decoded JSON object per line, until the server ends it
        or ``timeout_seconds`` pass (the server is asked to end it then too)."""
        params = {"watch": "1", "timeoutSeconds": max(1, int(timeout_seconds)), **params}
        conn = self._connection(timeout=timeout_seconds + 5)
        try:
            conn.request("GET", f"{path}?{urlencode(params)}", headers=self._headers(None))
            response = conn.getresponse()
            if response.status != 200:
                yield {"type": "HTTP", "status": response.status, "object": json.loads(response.read() or b"{}")}
                return
            while line := response.readline():
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()
