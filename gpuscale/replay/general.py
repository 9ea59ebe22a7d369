"""The general service model: any service whose requests each keep one of a replica's slots busy for a while.

For services that are not token-level LLM serving (image generation, speech, embeddings, batch scoring): each
request has a service time (from the trace's ``service_time`` column or drawn from ``--service-time``), and a
replica serves at most ``concurrency`` requests at once, each for its own service time (no slowdown from
sharing: measure the service time at the concurrency you run).

Routing is a gateway with a concurrency limit (Knative's activator with ``containerConcurrency``, a Ray Serve
or Triton queue in front of the replicas): a request goes straight to a ready replica with a free slot (the
one with the most free slots, ties in replica order), otherwise it waits in one FCFS queue and takes the first
slot that frees. With a fixed replica count c·concurrency this is exactly the M/G/k queue of queueing theory
(tests/replay/test_theory.py checks Erlang C and Pollaczek–Khinchine against it).

Model swaps: with a ``model`` per request, each replica keeps ``models_per_replica`` models loaded
(least recently used goes first); a request for a model its replica has not loaded pays a swap time first (a
new replica starts with the first model it is asked for, loaded as part of its start-up). The time is exact:
events are processed in time order inside each step, so the step only sets how often the metrics are sampled.

What a replica reports: queue depth = its share of the gateway's queue (queue ÷ ready replicas, so the
Pods average is the queue per replica), batch size = requests running, GPU util = share of the last step with
a request running, SM activity = mean slot occupancy (illustrative, as in the LLM model), the counters as the
LLM model keeps them (``first_token`` is when the response completes: a general service does not stream).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field

import numpy as np

from gpuscale.replay.serving import Counters, Requests, resize
from gpuscale.replay.traces import Trace


@dataclass(frozen=True)
class ServiceProfile:
    """A general service: slots per replica and GPUs per replica (for GPU-hours)."""

    name: str = "general"
    concurrency: int = 1
    gpus_per_replica: int = 1
    models_per_replica: int = 1
    tensor_per_sm: float = 0.6


@dataclass(eq=False)
class ServiceReplica:
    name: str
    created: float
    ready_at: float
    profile: ServiceProfile
    model: GeneralServingModel
    deleting_since: float | None = None
    gone_at: float | None = None
    running: int = 0
    counters: Counters = field(default_factory=Counters)
    loaded: OrderedDict[int, None] = field(default_factory=OrderedDict)  # LRU: oldest first
    first_tokens: deque[tuple[float, float]] = field(default_factory=deque)
    busy: float = 0.0  # seconds with ≥ 1 request running, this step
    occupied: float = 0.0  # slot·seconds, this step
    last_change: float = 0.0
    util: tuple[float, float, float] = (0.0, 0.0, 0.0)
    waiting: tuple[()] = ()  # NB: the queue is the gateway's (``model.unrouted``), not a replica's

    def ready(self, now: float) -> bool:
        return now >= self.ready_at and self.deleting_since is None

    @property
    def free(self) -> int:
        return self.profile.concurrency - self.running

    @property
    def outstanding(self) -> int:
        return self.running

    @property
    def idle(self) -> bool:
        return not self.running

    @property
    def queue_depth(self) -> float:
        ready = self.model.ready_count
        return len(self.model.unrouted) / ready if ready and self.deleting_since is None else 0.0

    @property
    def kv_usage(self) -> float | None:
        return None

    def account(self, t: float) -> None:
        """Add the time since the last change to this step's busy and occupied seconds."""
        span = t - self.last_change
        if span > 0:
            if self.running:
                self.busy += span
                self.occupied += span * self.running
            self.last_change = t


class GeneralServingModel:
    """Replicas of a general service behind a concurrency-limiting gateway; same surface as ServingModel."""

    def __init__(
        self,
        trace: Trace,
        *,
        profile: ServiceProfile,
        service_s: np.ndarray,
        swap_s: np.ndarray | None = None,
        step_s: float = 1.0,
    ) -> None:
        """``service_s``: each request's service time; ``swap_s``: each request's swap cost should it need
        one (drawn up front so the draws do not depend on the HPA under test)."""
        self.profile = profile
        self.requests = Requests(trace)
        self.service_s = service_s
        self.model_of = trace.model
        self.swap_s = swap_s
        self.step_s = step_s
        self.replicas: list[ServiceReplica] = []  # every replica ever started (for GPU-hours)
        self.present: list[ServiceReplica] = []  # those not gone yet: what each step looks at
        self.next_arrival = 0
        self.unrouted: deque[int] = deque()
        self.ready_count = 0
        self._finishing: list[tuple[float, int, int, ServiceReplica]] = []  # (time, serial, request, replica)
        self._serial = 0
        self.swaps = 0

    # --- the Deployment ----------------------------------------------------------------------------

    def add_replica(self, now: float, *, startup_s: float) -> ServiceReplica:
        self._serial += 1
        replica = ServiceReplica(f"server-{self._serial:03d}", now, now + startup_s, self.profile, self)
        replica.last_change = now
        self.replicas.append(replica)
        self.present.append(replica)
        return replica

    def live(self) -> list[ServiceReplica]:
        return [r for r in self.present if r.deleting_since is None]

    def scale_to(self, now: float, replicas: int, *, startup_s: float | list[float]) -> None:
        """As ServingModel.scale_to; a deleted replica finishes what it runs (it has no queue of its own)."""
        for r in resize(self, now, replicas, startup_s=startup_s):
            if r.idle:
                r.gone_at = now

    # --- time ----------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Process every arrival, completion and readiness in [now, now + step) in time order."""
        end = now + self.step_s
        arrival = self.requests.arrival
        present = self.present
        pending_ready = sorted((r.ready_at, i) for i, r in enumerate(present) if now < r.ready_at < end)
        self.ready_count = sum(1 for r in present if r.ready(now))
        self._dispatch(now)
        k = 0
        while True:
            t_arrival = arrival[self.next_arrival] if self.next_arrival < len(arrival) else np.inf
            t_finish = self._finishing[0][0] if self._finishing else np.inf
            t_ready = pending_ready[k][0] if k < len(pending_ready) else np.inf
            t = min(t_arrival, t_finish, t_ready)
            if t >= end:
                break
            if t_finish == t:  # NB: completions first, so a slot freed at t serves an arrival at t
                _, _, i, r = heapq.heappop(self._finishing)
                self._finish(i, r, t)
            elif t_ready == t:
                k += 1
                if present[pending_ready[k - 1][1]].ready(t):
                    self.ready_count += 1
            else:
                self.unrouted.append(self.next_arrival)
                self.next_arrival += 1
            self._dispatch(max(t, now))
        for r in present:
            if r.gone_at is None:
                r.account(end)
                r.util = (100 * r.busy / self.step_s, 100 * r.occupied / (self.step_s * r.profile.concurrency), 0.0)
                r.util = (r.util[0], r.util[1], r.util[1] * r.profile.tensor_per_sm)
                r.busy = r.occupied = 0.0
                if r.deleting_since is not None and r.idle:
                    r.gone_at = end
        self.present = [r for r in present if r.gone_at is None]

    def _dispatch(self, t: float) -> None:
        if not self.unrouted:
            return
        ready = [r for r in self.present if r.ready(t) and r.free > 0]
        while self.unrouted and ready:
            best = max(ready, key=lambda r: r.free)  # NB: max keeps the first of equals: replica order
            i = self.unrouted.popleft()
            self._start(i, best, t)
            if not best.free:
                ready.remove(best)

    def _start(self, i: int, r: ServiceReplica, t: float) -> None:
        req = self.requests
        r.account(t)
        r.running += 1
        req.admitted[i] = t
        cost = float(self.service_s[i])
        if self.model_of is not None:
            model = int(self.model_of[i])
            if model in r.loaded:
                r.loaded.move_to_end(model)
            else:
                if r.loaded:  # NB: a new replica's first model loads with its start-up
                    cost += float(self.swap_s[i]) if self.swap_s is not None else 0.0
                    self.swaps += 1
                r.loaded[model] = None
                while len(r.loaded) > self.profile.models_per_replica:
                    r.loaded.popitem(last=False)
        self._serial += 1
        heapq.heappush(self._finishing, (t + cost, self._serial, i, r))

    def _finish(self, i: int, r: ServiceReplica, t: float) -> None:
        req = self.requests
        r.account(t)
        r.running -= 1
        req.finished[i] = t
        req.first_token[i] = t
        c = r.counters
        c.success += 1
        c.queue_s += req.admitted[i] - req.arrival[i]
        c.compute_s += t - req.admitted[i]
        r.first_tokens.append((t, t - float(req.arrival[i])))

    def gpu_activity(self, r: ServiceReplica) -> tuple[float, float, float]:
        """(GPU util %, SM active %, tensor active %) over the last step."""
        return r.util

    def done(self) -> bool:
        return (
            self.next_arrival >= len(self.requests.arrival)
            and not self.unrouted
            and not self._finishing
            and all(r.idle for r in self.present if r.gone_at is None)
        )
