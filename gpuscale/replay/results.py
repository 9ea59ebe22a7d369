"""What one replay produced: cost, latency, SLO minutes, the replica timeline and the scaling events.

JSON schema (``gpuscale simulate --output json``; one object, ``schema`` = ``gpuscale.simulate/v2``)::

    {"schema": "gpuscale.simulate/v2",
     "trace": {"name", "requests", "duration_s"},
     "profile": {serving profile fields},
     "settings": {startup_s, step_s, refresh_s, sync_s, slo_queue_s, slo_quantile, ...},
     "results": [{
        "hpa": name, "source": manifest file,
        "gpu_hours": float, "replica_hours": float,
        "queue_time_s": {"mean", "p50", "p95", "p99", "max"},  # admission − arrival, every request served
        "queue_wait_s": {"mean", "p50", "p95", "p99"},    # the same, the name the summary uses
        "ttft_s": {"mean", "p50", "p95", "p99", "max"},   # first token − arrival (general model: response)
        "slo_violation_minutes": int,                     # = slo.violating_minutes
        "dropped": int,                                   # rejected + unfinished when the replay ended
        "slo": {"queue_s", "quantile", "violating_minutes", "minutes"},
        "requests": {"completed", "rejected", "unfinished"},
        "max_replicas": int, "swaps": int, "scale_ups": int, "scale_downs": int,
        "timeline": [{"t", "desired", "ready", "pods", "queue", "running", "gpu_util", "sm_active"}],  # per sync
        "events": [{"t", "from", "to", "reason", "why"}]}]}

History mode (``--history`` / ``--prometheus-url``) writes the same ``schema`` with ``"mode": "history"``::

    {"schema": "gpuscale.simulate/v2", "mode": "history",
     "history": {"source", "start", "duration_s", "metrics": [names], "conserve_load": bool},
     "results": [{"hpa", "source", "observed_replica_hours", "hpa_replica_hours", "max_replicas",
                  "scale_ups", "scale_downs",
                  "timeline": [{"t", "observed", "desired"}],          # per 15 s sync
                  "events": [{"t", "from", "to", "reason", "why"}]}]}

Times are seconds from the first request (the history's first sample). A minute violates the SLO when the
``quantile`` of the queue time of the requests that arrived in it exceeds ``queue_s`` (requests never
admitted count as waiting until the end). Floats are rounded (6 significant digits) so the bytes are stable.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from gpuscale.replay.general import GeneralServingModel
from gpuscale.replay.serving import ServingModel
from gpuscale.replay.traces import Trace

SCHEMA = "gpuscale.simulate/v2"


@dataclass(frozen=True)
class ReplaySample:
    t: float
    desired: int
    ready: int
    pods: int
    queue: int
    running: int
    gpu_util: float
    sm_active: float


@dataclass(frozen=True)
class Event:
    t: float
    from_replicas: int
    to_replicas: int
    reason: str
    why: str


@dataclass(frozen=True)
class Outcome:
    name: str
    source: str
    gpu_hours: float
    replica_hours: float
    queue_time_s: dict[str, float]
    ttft_s: dict[str, float]
    slo: dict[str, float]
    requests: dict[str, int]
    max_replicas: int
    timeline: list[ReplaySample]
    events: list[Event]
    swaps: int = 0  # general model: requests that waited for their replica to load their model

    def to_json(self) -> dict:
        out = {
            "hpa": self.name,
            "source": self.source,
            "gpu_hours": _round(self.gpu_hours),
            "replica_hours": _round(self.replica_hours),
            "queue_time_s": {k: _round(v) for k, v in self.queue_time_s.items()},
            "queue_wait_s": {k: _round(v) for k, v in self.queue_time_s.items() if k != "max"},
            "slo_violation_minutes": self.slo["violating_minutes"],
            "dropped": self.requests["rejected"] + self.requests["unfinished"],
            "ttft_s": {k: _round(v) for k, v in self.ttft_s.items()},
            "slo": {k: _round(v) for k, v in self.slo.items()},
            "requests": self.requests,
            "max_replicas": self.max_replicas,
            "swaps": self.swaps,
            "scale_ups": sum(1 for e in self.events if e.to_replicas > e.from_replicas),
            "scale_downs": sum(1 for e in self.events if e.to_replicas < e.from_replicas),
            "timeline": [{k: _round(v) for k, v in asdict(s).items()} for s in self.timeline],
            "events": [
                {"t": _round(e.t), "from": e.from_replicas, "to": e.to_replicas, "reason": e.reason, "why": e.why}
                for e in self.events
            ],
        }
        return out


def _round(v: float | int) -> float | int:
    if isinstance(v, int):
        return v
    return float(f"{v:.6g}")


def _quantiles(values: np.ndarray) -> dict[str, float]:
    if not len(values):
        return {"mean": 0.0, "p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}
    p50, p95, p99 = np.quantile(values, [0.5, 0.95, 0.99])
    return {
        "mean": float(values.mean()),
        "p50": float(p50),
        "p95": float(p95),
        "p99": float(p99),
        "max": float(values.max()),
    }


def summarize(
    *,
    name: str,
    source: str,
    trace: Trace,
    model: ServingModel | GeneralServingModel,
    end_s: float,
    timeline: list[ReplaySample],
    events: list[Event],
    slo_queue_s: float,
    slo_quantile: float,
) -> Outcome:
    req = model.requests
    replica_s = sum((r.gone_at if r.gone_at is not None else end_s) - r.created for r in model.replicas)
    served = ~req.rejected
    admitted = np.where(np.isnan(req.admitted), end_s, req.admitted)
    waited = (admitted - req.arrival)[served]
    first = np.where(np.isnan(req.first_token), end_s, req.first_token)
    done = ~np.isnan(req.finished)
    # SLO minutes: by the minute each request arrived
    minutes = int(np.ceil(trace.duration_s / 60.0)) or 1
    minute_of = np.minimum((req.arrival[served] // 60).astype(np.int64), minutes - 1)
    violating = 0
    order = np.argsort(minute_of, kind="stable")
    bounds = np.searchsorted(minute_of[order], np.arange(minutes + 1))
    for m in range(minutes):
        chunk = waited[order[bounds[m] : bounds[m + 1]]]
        if len(chunk) and float(np.quantile(chunk, slo_quantile)) > slo_queue_s:
            violating += 1
    return Outcome(
        name=name,
        source=source,
        gpu_hours=replica_s * model.profile.gpus_per_replica / 3600.0,
        replica_hours=replica_s / 3600.0,
        queue_time_s=_quantiles(waited),
        ttft_s=_quantiles((first - req.arrival)[served]),
        slo={"queue_s": slo_queue_s, "quantile": slo_quantile, "violating_minutes": violating, "minutes": minutes},
        requests={
            "completed": int(done.sum()),
            "rejected": int(req.rejected.sum()),
            "unfinished": int((served & ~done).sum()),
        },
        max_replicas=max([s.pods for s in timeline], default=len(model.replicas)),
        timeline=timeline,
        events=events,
        swaps=getattr(model, "swaps", 0),
    )


def latency_column(doc: dict[str, Any]) -> str:
    """The heading of ``ttft_s``'s p95 in a summary table: time to first token for an LLM, the response time for the
    general model (``"model": "general"``)."""
    return "TTFT p95 s" if doc.get("model", "llm") == "llm" else "latency p95 s"
