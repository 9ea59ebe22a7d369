"""The seam between sources and the metric pipeline, owned by the pure core.

A source fetches series values from the outside world (``refresh``, the only I/O) and answers term
queries from what it fetched (``read``, pure and cheap). The pipeline asks for exactly the terms the
catalogue needs: the embedded scrape source answers from its own window of scrapes, the Prometheus
source with one PromQL query per series a term names. Neither the adapter nor any other consumer sees a source.

NB: the core defines this seam and sources implement it (dependency inversion), so metrics/ never imports
sources/; ``gpuscale.sources.base`` re-exports these names for the sources' side.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Literal, NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class TermQuery:
    """What the pipeline needs from a source: the sum of some series, read one way, over a window.

    ``histogram_quantile``: ``series`` are histograms' base names; the answer is one value per histogram
    series, the ``quantile`` of its bucket increases over the window (metrics/histograms.py).
    """

    series: tuple[str, ...]
    input: Literal["gauge", "rate", "increase", "histogram_quantile"] = "gauge"
    window_seconds: float = 60.0
    match: tuple[tuple[str, str], ...] = ()
    promql: str | None = None
    quantile: float | None = None


class SeriesValue(NamedTuple):
    """One series' value for a term, with the time it describes and the target it came from.

    ``timestamp`` is the sample time (scrape time or exporter timestamp), never the time of the read,
    so an exporter that stopped answering shows up as old data, not as fresh data.
    ``window_seconds`` is the span a rate/increase covered (None for gauges).
    A NamedTuple, not a dataclass: a refresh of a large cluster creates hundreds of thousands of them.
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp: float
    target: str
    window_seconds: float | None = None


# NB: a SeriesValue from a complete 6-tuple without the NamedTuple's generated __new__, a Python frame per
# call: sources build one per series per refresh (100,000s), and this is the C-level tuple constructor.
series_value: Callable[[tuple[str, Mapping[str, str], float, float, str, float | None]], SeriesValue] = partial(
    tuple.__new__, SeriesValue
)


@dataclass(frozen=True, slots=True)
class TargetHealth:
    """The health of one thing a source reads (an exporter URL, a Prometheus server)."""

    target: str
    healthy: bool
    last_success: float | None = None
    last_attempt: float | None = None
    last_duration_seconds: float | None = None
    error: str | None = None
    series: int = 0
    failures_total: int = 0
    extra: dict[str, str] = field(default_factory=dict)
    # What is wrong, in one word from a fixed set (a metric label): why the last read failed, or why a read
    # that succeeded is suspect (``degraded``, e.g. a GPU missing from its exporter).
    error_kind: str | None = None
    degraded: str | None = None
    # The last problem seen, kept after recovery so an operator can still tell what happened and when.
    last_error: str | None = None
    last_error_kind: str | None = None
    last_error_at: float | None = None
    # Counts since start, by one word from a fixed set (metric labels): reads of the target's parts that failed
    # (a Prometheus source's queries, by kind), and series left out of reads that were used (by reason).
    failed_reads: dict[str, int] = field(default_factory=dict)
    dropped_series: dict[str, int] = field(default_factory=dict)


class HealthReporter(Protocol):
    """Anything that reports the health of what it reads, per target: sources, and the Kubernetes watch cache."""

    name: str

    def health(self) -> list[TargetHealth]: ...


class MetricsSource(Protocol):
    name: str

    async def refresh(self, *, now: float) -> None:
        """Fetch from the outside world. Never raises for a target failure: it is recorded in health()."""

    def read(self, query: TermQuery) -> list[SeriesValue]:
        """Values for one term from the last refresh; pure, no I/O."""

    def health(self) -> list[TargetHealth]:
        """One entry per target, for /readyz, /metrics and logs."""

    async def close(self) -> None: ...
