"""Durations as measured: a constant, a named distribution, or samples from a file — one syntax for every flag.

Used for ``--service-time``, ``--startup`` and ``--swap-time`` of ``gpuscale simulate``::

    1.8s | 250ms | 2m | 0           a constant (a bare number is seconds)
    exp:mean=1.8s                   exponential with that mean (Poisson-process service: M/M/c)
    lognormal:p50=1.2s,p95=4s       lognormal through those two quantiles (model loads, image generation)
    @file.csv                       resampled (uniformly, with replacement) from the file's numbers: one per
                                    line, seconds, an optional header line; blank lines ignored

Draws come from the replay's seeded generator, so the same seed gives the same bytes. Every duration is a
finite number of seconds in [0, MAX_DURATION_S] (so means and sums of them stay finite); a value that is not
is an error naming the flag (and the file and line). A file is read within gpuscale/files.py's limits.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from gpuscale.errors import ConfigError
from gpuscale.files import DATA_LIMIT_BYTES, read_text
from gpuscale.model import parse_duration
from gpuscale.replay.traces import check_rows

MAX_DURATION_S = 1e9
"""The longest duration any flag or sample may give (~32 years)."""

Z95 = 1.6448536269514722  # the standard normal's 95th percentile


@dataclass(frozen=True)
class Distribution:
    """A non-negative duration distribution (seconds); ``text`` is how the user wrote it."""

    text: str
    kind: str  # "constant" | "exp" | "lognormal" | "samples"
    params: tuple[float, ...] = ()
    samples: np.ndarray | None = None

    @property
    def mean(self) -> float:
        if self.kind == "constant":
            return self.params[0]
        if self.kind == "exp":
            return self.params[0]
        if self.kind == "lognormal":
            mu, sigma = self.params
            return math.exp(mu + sigma * sigma / 2)
        assert self.samples is not None
        return float(self.samples.mean())

    @property
    def median(self) -> float:
        if self.kind == "constant":
            return self.params[0]
        if self.kind == "exp":
            return self.params[0] * math.log(2)
        if self.kind == "lognormal":
            return math.exp(self.params[0])
        assert self.samples is not None
        return float(np.median(self.samples))

    @property
    def constant(self) -> bool:
        return self.kind == "constant"

    def draw(self, rng: np.random.Generator, n: int | None = None) -> np.ndarray | float:
        """``n`` draws (an array), or one (a float) when ``n`` is None."""
        size = 1 if n is None else n
        if self.kind == "constant":
            out = np.full(size, self.params[0])
        elif self.kind == "exp":
            out = rng.exponential(self.params[0], size)
        elif self.kind == "lognormal":
            out = rng.lognormal(self.params[0], self.params[1], size)
        else:
            assert self.samples is not None
            out = self.samples[rng.integers(0, len(self.samples), size)]
        return float(out[0]) if n is None else out


def constant(seconds: float) -> Distribution:
    return Distribution(f"{seconds:g}s", "constant", (float(seconds),))


def parse_distribution(text: str, *, flag: str) -> Distribution:
    """``text`` in the syntax above; ConfigError naming ``flag`` (e.g. ``--service-time``) otherwise."""
    text = text.strip()
    if text.startswith("@"):
        return _from_file(text[1:], flag=flag)
    kind, colon, rest = text.partition(":")
    if not colon:
        return Distribution(text, "constant", (_seconds(text, flag=flag, what="a duration"),))
    params = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq:
            raise ConfigError(f"{flag}: expected key=value in {text!r} (got {part!r})")
        params[key.strip()] = _seconds(value, flag=flag, what=key.strip())
    if kind == "exp":
        _expect(params, {"mean"}, text=text, flag=flag)
        if params["mean"] <= 0:
            raise ConfigError(f"{flag}: exp:mean must be positive (got {text!r})")
        return Distribution(text, "exp", (params["mean"],))
    if kind == "lognormal":
        _expect(params, {"p50", "p95"}, text=text, flag=flag)
        p50, p95 = params["p50"], params["p95"]
        if not 0 < p50 < p95:
            raise ConfigError(f"{flag}: lognormal needs 0 < p50 < p95 (got {text!r})")
        return Distribution(text, "lognormal", (math.log(p50), math.log(p95 / p50) / Z95))
    raise ConfigError(
        f"{flag}: unknown distribution {kind!r} in {text!r}; expected a duration (1.8s), exp:mean=1.8s, "
        "lognormal:p50=1.2s,p95=4s or @file.csv"
    )


def _expect(params: dict[str, float], keys: set[str], *, text: str, flag: str) -> None:
    if set(params) != keys:
        raise ConfigError(
            f"{flag}: {text!r} needs exactly {', '.join(sorted(keys))} (got {', '.join(params) or 'none'})"
        )


def _seconds(value: str, *, flag: str, what: str) -> float:
    try:
        seconds = float(parse_duration(value.strip()))
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(f"{flag}: {what} is not a duration like 1.8s or 250ms (got {value!r})") from None
    if not 0 <= seconds <= MAX_DURATION_S:  # NB: false for NaN too
        raise ConfigError(f"{flag}: {what} must be a duration from 0 to {MAX_DURATION_S:g} s (got {value!r})")
    return seconds


_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _from_file(path: str, *, flag: str) -> Distribution:
    try:
        text = read_text(path, limit_bytes=DATA_LIMIT_BYTES, what="samples")
        check_rows(text, source=path)
    except ConfigError as e:
        raise ConfigError(f"{flag}: {str(e).removeprefix(f'{e.path}: ')}", path=e.path) from None
    lines = text.splitlines()
    values = []
    for line_no, line in enumerate(lines, 1):
        cell = line.split(",")[0].strip()
        if not cell:
            continue
        if not _NUMBER.match(cell):
            if line_no == 1 and not values:
                continue  # a header
            raise ConfigError(f"{flag}: line {line_no}: not a number of seconds (got {cell!r})", path=path)
        v = float(cell)
        if not 0 <= v <= MAX_DURATION_S:
            raise ConfigError(
                f"{flag}: line {line_no}: a duration must be from 0 to {MAX_DURATION_S:g} s (got {cell})", path=path
            )
        values.append(v)
    if not values:
        raise ConfigError(f"{flag}: no samples in the file", path=path)
    return Distribution("@" + path, "samples", (), np.asarray(values, dtype=np.float64))
