"""Triton queueing: how one serving replica queues its offered load, and Triton's counters from that, pure.

Per replica, ``replica_queue`` is a fluid queue: below capacity the mean wait is ``queue_wait_ratio(ρ)`` ×
compute time (< 1 for ρ < 1, exactly 1 at ρ = 1); above capacity the excess accumulates as a backlog
(``advance_backlog``) that adds ``backlog / capacity`` seconds of wait to every request, up to the queue
timeout, beyond which requests are REJECTED. ``triton_rates`` splits that per model into per-second increments
of Triton's counters and the pending-request gauge. So the ``queue:compute`` ratio of the autoscaling recipe
stays below 1 under light load and grows past 1 as an overload persists — honest-ish, not an M/M/c model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuscale.sim.gpu_activity import clip

__all__ = [
    "ModelRates",
    "QueueState",
    "TritonModel",
    "advance_backlog",
    "queue_wait_ratio",
    "replica_queue",
    "triton_rates",
]


@dataclass(frozen=True, slots=True)
class TritonModel:
    """A model a Triton server serves. Durations are per request, in µs.

    ``share`` is this model's relative weight in the workload's traffic (normalised over the server's
    models). ``max_batch_size`` > 1 enables dynamic batching: the mean batch grows with load.
    """

    name: str
    version: str = "1"
    share: float = 1.0
    compute_infer_us: float = 5000.0
    compute_input_us: float | None = None  # default 8 % of compute_infer_us
    compute_output_us: float | None = None  # default 4.5 % of compute_infer_us
    max_batch_size: int = 1
    load_duration_s: float = 5.0

    @property
    def input_us(self) -> float:
        return self.compute_input_us if self.compute_input_us is not None else 0.08 * self.compute_infer_us

    @property
    def output_us(self) -> float:
        return self.compute_output_us if self.compute_output_us is not None else 0.045 * self.compute_infer_us


def queue_wait_ratio(rho: float) -> float:
    """Steady-state mean queue wait as a multiple of compute time at utilisation ``rho``.

    ``ρ⁴ / (2 − ρ⁴)``: ≈ 0 under light load, 0.26 at ρ = 0.8, 0.49 at 0.9, exactly 1 at saturation. A
    stylised curve for a batching server (queues form only near saturation), not a queueing-theory result.
    """
    r = clip(rho) ** 4
    return r / (2.0 - r)


@dataclass(frozen=True, slots=True)
class QueueState:
    """One replica's queue at an instant. Rates in requests/s, waits in s."""

    offered_rps: float
    capacity_rps: float
    served_rps: float
    rejected_rps: float
    backlog: float  # requests queued beyond the steady state
    wait_ratio: float  # steady-state wait / compute time
    backlog_wait_s: float  # extra wait every request sees because of the backlog
    max_backlog: float

    @property
    def utilisation(self) -> float:
        """Served share of capacity, 0–1 (what the GPU sees)."""
        return self.served_rps / self.capacity_rps if self.capacity_rps > 0 else 0.0


def replica_queue(
    offered_rps: float, *, capacity_rps: float, backlog: float = 0.0, timeout_s: float = 1.0
) -> QueueState:
    """The queue of one replica offered ``offered_rps`` while ``backlog`` requests are already waiting.

    The server runs at capacity while it is overloaded or draining a backlog. The backlog is bounded by
    ``capacity × timeout_s`` (a request would wait longer than the queue timeout); arrivals beyond that are
    rejected (Triton's REJECTED reason).
    """
    lam = max(0.0, offered_rps)
    mu = max(0.0, capacity_rps)
    backlog = max(0.0, backlog)
    max_backlog = mu * max(0.0, timeout_s)
    if mu <= 0:
        return QueueState(lam, mu, 0.0, lam, backlog, 0.0, 0.0, max_backlog)
    saturated = lam >= mu or backlog > 0
    served = mu if saturated else lam
    rejected = lam - mu if (lam > mu and backlog >= max_backlog) else 0.0
    rho = 1.0 if saturated else lam / mu
    return QueueState(
        offered_rps=lam,
        capacity_rps=mu,
        served_rps=served,
        rejected_rps=rejected,
        backlog=backlog,
        wait_ratio=queue_wait_ratio(rho),
        backlog_wait_s=backlog / mu,
        max_backlog=max_backlog,
    )


def advance_backlog(queue: QueueState, dt: float) -> float:
    """The backlog ``dt`` seconds later if rates stay as in ``queue`` (fluid approximation)."""
    change = queue.offered_rps - queue.served_rps - queue.rejected_rps
    return clip(queue.backlog + change * max(0.0, dt), 0.0, queue.max_backlog)


@dataclass(frozen=True, slots=True)
class ModelRates:
    """Per-second increments of one model's Triton counters on one replica, plus its pending gauge."""

    success: float
    inference_count: float
    exec_count: float
    request_duration_us: float
    queue_duration_us: float
    compute_input_duration_us: float
    compute_infer_duration_us: float
    compute_output_duration_us: float
    rejected: float  # model-level failure reason="REJECTED"
    canceled: float  # model-level failure reason="CANCELED"
    pending: float  # nv_inference_pending_request_count (model level)


def triton_rates(models: Sequence[TritonModel], queue: QueueState) -> dict[tuple[str, str], ModelRates]:
    """Split one replica's queue into per-model counter increments, keyed by ``(model, version)``.

    Mean wait of model m = ``wait_ratio × compute_infer_us(m) + backlog_wait``, so summed over models
    ``queue_duration / compute_infer_duration`` is below 1 under light load and grows with the backlog.
    """
    total_share = sum(max(0.0, m.share) for m in models)
    rates: dict[tuple[str, str], ModelRates] = {}
    rho = min(1.0, queue.utilisation)
    for model in models:
        w = max(0.0, model.share) / total_share if total_share > 0 else 0.0
        served = queue.served_rps * w
        wait_us = queue.wait_ratio * model.compute_infer_us + queue.backlog_wait_s * 1e6
        batch = 1.0 + (model.max_batch_size - 1) * rho**1.5 if model.max_batch_size > 1 else 1.0
        compute_us = model.input_us + model.compute_infer_us + model.output_us
        rejected = queue.rejected_rps * w
        rates[(model.name, str(model.version))] = ModelRates(
            success=served,
            inference_count=served,
            exec_count=served / batch,
            request_duration_us=served * (wait_us + compute_us),
            queue_duration_us=served * wait_us,
            compute_input_duration_us=served * model.input_us,
            compute_infer_duration_us=served * model.compute_infer_us,
            compute_output_duration_us=served * model.output_us,
            rejected=rejected,
            canceled=0.02 * rejected,
            pending=queue.offered_rps * w * queue.wait_ratio * model.compute_infer_us / 1e6 + w * queue.backlog,
        )
    return rates
