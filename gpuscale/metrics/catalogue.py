"""The metric catalogue: what each public metric name means, loaded from policies/metrics.yaml.

The catalogue plays the role of prometheus-adapter's naming rules: series ↔ API metric name, how values
of one object's devices combine, which resources a metric is served for. Code never hard-codes a metric;
users add entries to the YAML file. An invalid file raises ConfigError naming the file, the field path
(e.g. ``metrics[3].aggregate``) and the reason, so the adapter fails at start rather than at 3 a.m.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuscale.config import Seconds, read_yaml, validate
from gpuscale.metrics.histograms import BUCKET_SUFFIX
from gpuscale.model import QUANTITY_MAX
from gpuscale.policy_files import CATALOGUE_FILE, policy_file, shipped

DEFAULT_CATALOGUE_PATH = shipped(CATALOGUE_FILE)

# Units a catalogue entry may name (what its values are measured in; consumers format values by it).
UNITS = (
    "percent",
    "ratio",
    "bytes",
    "watts",
    "joules",
    "seconds",
    "celsius",
    "hertz",
    "requests",
    "requests/s",
    "tokens",
    "tokens/s",
    "count",
)

# Resources a custom metric can be requested for (GroupResource strings, as the HPA sends them).
RESOURCES = (
    "pods",
    "nodes",
    "namespaces",
    "deployments.apps",
    "statefulsets.apps",
    "resourceclaims.resource.k8s.io",  # DRA claims: values of the GPUs allocated through them
)

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
_SERIES = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Input = Literal["gauge", "rate", "increase", "histogram_quantile"]


class Term(_Strict):
    """One side of a metric: a sum over series, read as gauge, rate, increase or a histogram quantile.

    ``histogram_quantile`` names histograms (their base name, without ``_bucket``) and reads the ``quantile``
    of each histogram series' bucket increases over the window (metrics/histograms.py).
    """

    series: list[str] = Field(min_length=1)
    input: Input = "gauge"
    quantile: float | None = None
    match: dict[str, str] = Field(default_factory=dict)
    floor: float = 0.0
    prometheus: str | None = None

    @model_validator(mode="after")
    def _check_series(self) -> Term:
        for s in self.series:
            if not _SERIES.match(s):
                raise ValueError(f"invalid series name {s!r}")
        check_quantile(self.input, self.quantile)
        return self

    @property
    def windowed(self) -> bool:
        return self.input != "gauge"

    @property
    def source_series(self) -> list[str]:
        """The series a source must keep to answer this term (a histogram's ``_bucket`` counters)."""
        if self.input == "histogram_quantile":
            return [f"{s}{BUCKET_SUFFIX}" for s in self.series]
        return list(self.series)


def check_quantile(input: str, quantile: float | None) -> None:
    if input == "histogram_quantile":
        if quantile is None or not 0.0 < quantile < 1.0:
            raise ValueError(f"input 'histogram_quantile' needs a 'quantile' between 0 and 1, got {quantile!r}")
    elif quantile is not None:
        raise ValueError(f"'quantile' is only allowed with input 'histogram_quantile', not {input!r}")


class MetricDefinition(_Strict):
    name: str
    help: str = ""
    unit: str = ""
    aggregate: Literal["mean", "sum", "max", "ratio"]
    series: list[str] | None = None
    input: Input = "gauge"
    quantile: float | None = None
    match: dict[str, str] = Field(default_factory=dict)
    numerator: Term | None = None
    denominator: Term | None = None
    scale: float = 1.0
    dedupe: Literal["none", "physical_gpu"] = "none"
    resources: list[str] = Field(default_factory=lambda: list(RESOURCES))
    external: bool = False
    max_age: Seconds | None = None
    window: Seconds | None = None
    # The physical range of the served value (after ``scale``), either end open when None: a value outside it
    # (a negative utilisation, a queue of -3) is a broken exporter's, left out of answers like a missing one.
    minimum: float | None = None
    maximum: float | None = None

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, unit: str) -> str:
        if unit and unit not in UNITS:
            raise ValueError(f"unknown unit {unit!r}; valid: {', '.join(UNITS)}")
        return unit

    @model_validator(mode="after")
    def _check(self) -> MetricDefinition:
        if not _NAME.match(self.name):
            raise ValueError(f"name {self.name!r} must be lower_snake_case ([a-z][a-z0-9_]*)")
        if self.series is not None and self.numerator is not None:
            raise ValueError("give either 'series' or 'numerator', not both")
        if self.series is None and self.numerator is None:
            raise ValueError("one of 'series' or 'numerator' is required")
        if self.aggregate == "ratio" and self.denominator is None:
            raise ValueError("aggregate 'ratio' needs a 'denominator'")
        if self.aggregate != "ratio" and self.denominator is not None:
            raise ValueError(f"'denominator' is only allowed with aggregate 'ratio', not {self.aggregate!r}")
        for r in self.resources:
            if r not in RESOURCES:
                raise ValueError(f"unknown resource {r!r}; valid: {', '.join(RESOURCES)}")
        if self.series is not None:
            Term(series=self.series, input=self.input, quantile=self.quantile, match=self.match)  # validates
        elif self.quantile is not None:
            raise ValueError("'quantile' belongs in the 'numerator' when one is given")
        _check_range(self.minimum, self.maximum)
        return self

    @cached_property
    def bounds(self) -> tuple[float, float]:
        """The lowest and highest value that may be served (inclusive): the catalogue's range within what a
        Kubernetes quantity can say. ``low <= v <= high`` is False for NaN, so one comparison checks all."""
        low = -QUANTITY_MAX if self.minimum is None else max(self.minimum, -QUANTITY_MAX)
        high = QUANTITY_MAX if self.maximum is None else min(self.maximum, QUANTITY_MAX)
        return low, high

    @cached_property
    def terms(self) -> tuple[Term, Term | None]:
        """(numerator, denominator); the short form ``series:`` becomes the numerator."""
        num = self.numerator or Term(
            series=self.series or [], input=self.input, quantile=self.quantile, match=self.match
        )
        return num, self.denominator


def _check_range(minimum: float | None, maximum: float | None) -> None:
    for name, bound in (("minimum", minimum), ("maximum", maximum)):
        if bound is not None and not math.isfinite(bound):
            raise ValueError(f"'{name}' must be a finite number, got {bound!r}")
    if minimum is not None and maximum is not None and minimum > maximum:
        raise ValueError(f"'minimum' ({minimum:g}) is above 'maximum' ({maximum:g})")


class Defaults(_Strict):
    max_age: Seconds = 60.0
    window: Seconds = 60.0


class Catalogue(_Strict):
    defaults: Defaults = Field(default_factory=Defaults)
    metrics: list[MetricDefinition] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique(self) -> Catalogue:
        seen: set[str] = set()
        for m in self.metrics:
            if m.name in seen:
                raise ValueError(f"metric {m.name!r} is defined twice")
            seen.add(m.name)
        return self

    @cached_property
    def by_name(self) -> dict[str, MetricDefinition]:
        return {m.name: m for m in self.metrics}

    def get(self, name: str) -> MetricDefinition | None:
        return self.by_name.get(name)

    def __iter__(self) -> Iterator[MetricDefinition]:  # type: ignore[override]
        return iter(self.metrics)

    def max_age(self, metric: MetricDefinition) -> float:
        return metric.max_age if metric.max_age is not None else self.defaults.max_age

    def window(self, metric: MetricDefinition) -> float:
        return metric.window if metric.window is not None else self.defaults.window

    @cached_property
    def series_names(self) -> frozenset[str]:
        """Every series name any term reads: the scrape source keeps only these."""
        names: set[str] = set()
        for m in self.metrics:
            for term in m.terms:
                if term is not None:
                    names.update(term.source_series)
        return frozenset(names)

    @cached_property
    def windowed_series(self) -> frozenset[str]:
        """Series read as rate/increase: the scrape source keeps a window of history for these only."""
        names: set[str] = set()
        for m in self.metrics:
            for term in m.terms:
                if term is not None and term.windowed:
                    names.update(term.source_series)
        return frozenset(names)

    @property
    def longest_window(self) -> float:
        return max((self.window(m) for m in self.metrics), default=self.defaults.window)


def parse_catalogue(data: Any, *, path: str = "<catalogue>") -> Catalogue:
    return validate(Catalogue, data, path)


def load_catalogue(path: str | Path | None = None, *, policies: str | Path | None = None) -> Catalogue:
    """Load and validate a catalogue: ``path`` if given, else ``metrics.yaml`` of the ``policies`` directory
    if it holds one, else the shipped catalogue."""
    p = Path(path) if path else policy_file(CATALOGUE_FILE, policies)
    return parse_catalogue(read_yaml(p), path=str(p))
