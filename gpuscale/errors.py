"""One exception tree for gpuscale.

    GpuscaleError
    ├── ConfigError            a config/policy file is invalid (names file, field, reason)
    ├── ExpositionError        exporter text is malformed (names source and line)
    ├── SelectorError          a label/field selector does not parse (→ 400 BadRequest)
    ├── SourceUnavailable      a source (exporter, Prometheus, Kubernetes API) could not be read
    │   └── KindNotServed      the Kubernetes API serves no such apiVersion/kind (a CRD not installed)
    ├── Unauthenticated        (adapter/access_request.py) no valid credential on a request (→ 401)
    ├── CertificateRejected    (adapter/tls.py) a client certificate does not chain to a trusted CA
    └── MetricsError           the adapter cannot answer a metrics request
        ├── MetricNotFound     unknown metric, or no value for the requested objects (→ 404 NotFound)
        ├── ObjectNotFound     the described object does not exist (→ 404 NotFound)
        └── MetricStale        the newest value is older than the metric's max-age (→ 503 ServiceUnavailable)

Foreign exceptions are translated at the boundary that sees them and chained (``raise X from e``).
The adapter maps this tree to metav1.Status in exactly one place (``adapter/status.py``).
"""

from __future__ import annotations


class GpuscaleError(Exception):
    """Base of every error gpuscale raises on purpose."""


class ConfigError(GpuscaleError):
    """A configuration or policy file is invalid.

    ``str(error)`` names the file, the field path and the reason, ready to print to a user.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class ExpositionError(GpuscaleError):
    """Exporter text does not follow the Prometheus/OpenMetrics text format."""

    def __init__(self, reason: str, *, source: str = "<text>", line_number: int = 0, line: str = "") -> None:
        self.reason = reason
        self.source = source
        self.line_number = line_number
        self.line = line
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"{source}:{line_number}: {reason}: {shown!r}")


class SelectorError(GpuscaleError):
    """A Kubernetes label or field selector could not be parsed."""


class SourceUnavailable(GpuscaleError):
    """A source could not be read; the message says which and why (never a traceback).

    ``kind`` is one of a fixed set of words (``timeout``, ``http_status``, ``connection``, ``too_large``…)
    so it can be a metric label; ``reason`` is the human sentence.
    """

    def __init__(self, source: str, reason: str, *, kind: str = "unavailable") -> None:
        self.source = source
        self.reason = reason
        self.kind = kind
        super().__init__(f"{source}: {reason}")


class KindNotServed(SourceUnavailable):
    """The Kubernetes API does not serve an apiVersion/kind (its discovery document lacks it)."""


def one_line(text: str, limit: int = 160) -> str:
    """``text`` safe to show an operator: control characters replaced, whitespace collapsed, at most ``limit``
    characters (an exporter's or a client's bytes end up in /readyz, /metrics and logs)."""
    cleaned = "".join(c if c.isprintable() else " " for c in text)
    cleaned = " ".join(cleaned.split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


class MetricsError(GpuscaleError):
    """The adapter cannot answer a metrics request; subclasses choose the HTTP status."""


class MetricNotFound(MetricsError):
    """No such metric, or no value for the requested objects (404)."""


class ObjectNotFound(MetricsError):
    """The described object does not exist (404)."""


class MetricStale(MetricsError):
    """Values exist but are older than the metric's max-age (503); never served as fresh."""

    def __init__(self, message: str, *, retry_after_seconds: int = 5) -> None:
        self.retry_after_seconds = retry_after_seconds
        super().__init__(message)
