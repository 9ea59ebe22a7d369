"""What one replay may cost, checked before it starts: the grid it walks is steps × replicas.

A replay advances a clock in steps over the trace (or history) and the tail after it, and each step looks at
every replica; a manifest's maxReplicas bounds the replicas. Inputs the API server accepts can still ask for an
impossible grid (``maxReplicas: 2000000000``, a 2-row trace spanning 10¹² s: 4·10¹² steps), so a replay is
refused, naming the file and the way out, when it would pass any of these (generous for real use:
docs/simulate.md's 23-day, 2.2-million-request benchmark is 8 million steps of 0.25 s):
"""

from __future__ import annotations

import math

from gpuscale.errors import ConfigError

MAX_STEPS = 20_000_000
"""Steps of one replay (58 days of the LLM model's 0.25 s step; 3 years of the general model's 5 s)."""
MAX_REPLICAS = 10_000
"""maxReplicas a replay models (each replica is simulated; the API server allows 2³¹-1)."""
MAX_REPLICA_STEPS = 2_000_000_000
"""Steps × maxReplicas of one replay."""


def check_grid(*, span_s: float, step_s: float, max_replicas: int, trace: str, hpa: str) -> int:
    """The number of steps of a replay over ``span_s`` seconds (tail included) at ``step_s``; ConfigError
    naming the trace (``trace``) or the manifest (``hpa``) when the grid is past the budget."""
    steps = math.ceil(span_s / step_s) + 1 if math.isfinite(span_s / step_s) else math.inf
    if steps > MAX_STEPS:
        raise ConfigError(
            f"replaying {span_s:g} s in steps of {step_s:g} s takes {_count(steps)} steps, more than the "
            f"{MAX_STEPS:,} a replay may take: replay a window (--start, --duration) or a coarser step",
            path=trace,
        )
    if max_replicas > MAX_REPLICAS:
        raise ConfigError(
            f"spec.maxReplicas: {max_replicas:,} is more replicas than a replay models ({MAX_REPLICAS:,})", path=hpa
        )
    if steps * max_replicas > MAX_REPLICA_STEPS:
        raise ConfigError(
            f"spec.maxReplicas: {max_replicas:,} replicas × {_count(steps)} steps is more than the "
            f"{MAX_REPLICA_STEPS:,} replica-steps a replay may take: lower maxReplicas, or replay a window "
            "(--start, --duration) or a coarser step",
            path=hpa,
        )
    return int(steps)


def _count(n: float) -> str:
    return f"{n:,.0f}" if n < 1e15 else f"{n:.2e}"
