"""The serving model: replicas with continuous batching behind a load balancer, and what each one reports.

Each replica runs an LLM server the way vLLM schedules by default (FCFS, prefill first, then one decode
iteration for every running sequence):

- admission: the head of the waiting queue is scheduled while fewer than ``max_batch`` sequences run, the
  prompts being prefilled total at most ``prefill_token_budget`` tokens (vLLM's max_num_batched_tokens; a
  longer prompt goes alone), and its whole KV footprint (input + output tokens) fits in the KV cache (a
  conservative reservation; vLLM allocates blocks as it goes and preempts instead). Until then it waits:
  that is the queue depth and the queue time a server reports;
- prefill: ``a·n + b·n²`` seconds for an n-token prompt (linear layers + attention);
- decode: one iteration emits a token for every running sequence and takes ``c + d·(KV tokens held)``
  seconds (weights read once per iteration, then every sequence's KV cache).

Defaults: Llama-3-8B on one A100-SXM4-80GB. The linear-layer costs are microsoft/vidur's A100 profile of
Llama-2-7B (``data/profiling/compute/a100/meta-llama/Llama-2-7b-hf/mlp.csv``, median times per operator,
as quoted in a public excerpt of that table: at 4,096 tokens attn_pre_proj 1.72 + mlp_up_proj 3.04 +
mlp_down_proj 1.45 ms, + attn_post_proj ≈ 0.4 ms (missing in that row; 0.42 at 3,072 tokens) ≈ 6.6 ms
per layer, × 32 layers ≈ 0.21 s, i.e. ≈ 52 µs per prompt token; at 128 tokens ≈ 0.38 ms per layer, × 32 ≈
12 ms per decode iteration). NB: Llama-3-8B's linear layers do about 20 % more work than Llama-2-7B's, so
prefill is, if anything, underestimated by that much. The
attention and KV terms come from Llama-3-8B's shape: 32 layers × 8 KV heads × 128 dims × 2 (K, V) × 2 bytes
= 128 KiB of KV cache per token, read once per iteration at ≈ 1.5 TB/s (≈ 0.09 µs per KV token);
(80 GB × 0.9 − 16 GB of weights) / 128 KiB ≈ 430,000 tokens of KV cache; vLLM's default ``max_num_seqs``
256. A model is a profile: pass your own numbers (they are flags of ``gpuscale simulate``).

What each replica reports, as the catalogue defines the metrics (counters are updated when a request
completes, as Triton and vLLM do): GPU util = share of the last second with a kernel running (it saturates
at 100 as soon as one request runs); SM and tensor activity follow the batch's fill (decode at batch 1
keeps about a fifth of the SMs busy and a full batch about 70 %, prefill about 90 %: illustrative
numbers in the range of reference/gpu-metrics.md's fixtures, not measurements); queue depth = waiting
requests; queue time, queue:compute ratio, requests/s and prompt/generation tokens/s over the catalogue's
60 s window; the LLM servers' batch size (running sequences), KV-cache usage (reserved share, percent) and
TTFT p50/p95 (of the first tokens of the window; none when there were none, as a histogram quantile of an
empty window is NaN and is not served).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from gpuscale.replay.traces import Trace


@dataclass(frozen=True)
class ServingProfile:
    """Costs of one replica (seconds) and its limits."""

    name: str = "llama-3-8b-a100-80gb"
    prefill_s_per_token: float = 52e-6
    prefill_s_per_token_squared: float = 2.6e-9  # attention: 4·layers·d_model FLOPs per token pair at ~200 TFLOP/s
    decode_iteration_s: float = 0.012
    decode_s_per_kv_token: float = 9e-8
    max_batch: int = 256
    prefill_token_budget: int = 8192  # vLLM max_num_batched_tokens: prompt tokens scheduled at once
    kv_capacity_tokens: int = 430_000
    gpus_per_replica: int = 1
    sm_active_idle_batch: float = 0.2  # decode at batch 1
    sm_active_full_batch: float = 0.7  # decode at max_batch
    sm_active_prefill: float = 0.9
    tensor_per_sm: float = 0.6  # tensor-pipe activity as a share of SM activity (BF16 GEMMs)

    def prefill_s(self, tokens: int) -> float:
        return self.prefill_s_per_token * tokens + self.prefill_s_per_token_squared * tokens * tokens


@dataclass
class Counters:
    """Cumulative counters of one replica, as its exporters expose them."""

    success: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    prompt_tokens: int = 0  # counted when the prompt's prefill completes
    generation_tokens: int = 0  # counted when the request completes


@dataclass
class Replica:
    """One server. ``ready_at`` is when its model is loaded and it joins the Service's endpoints."""

    name: str
    created: float
    ready_at: float
    profile: ServingProfile
    deleting_since: float | None = None
    gone_at: float | None = None
    waiting: deque[int] = field(default_factory=deque)
    prefilling: deque[list[float]] = field(default_factory=deque)  # [request, seconds left]
    decoding: list[tuple[float, int]] = field(default_factory=list)  # heap of (finish iteration, request)
    iterations: float = 0.0
    kv_reserved: int = 0
    prefill_tokens: int = 0  # prompt tokens in ``prefilling``
    n_decoding: int = 0
    kv_base: float = 0.0  # Σ (input_i − start_iteration_i) over decoding requests
    counters: Counters = field(default_factory=Counters)
    busy_s: deque[tuple[float, float, float]] = field(default_factory=deque)  # (busy, sm·s, tensor·s) per step
    first_tokens: deque[tuple[float, float]] = field(default_factory=deque)  # (when, TTFT s), for the TTFT histogram

    def ready(self, now: float) -> bool:
        return now >= self.ready_at and self.deleting_since is None

    @property
    def running(self) -> int:
        return len(self.prefilling) + self.n_decoding

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + self.running

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @property
    def queue_depth(self) -> float:
        return float(len(self.waiting))

    @property
    def kv_usage(self) -> float | None:
        """Reserved share of the KV cache, percent."""
        return 100.0 * self.kv_reserved / self.profile.kv_capacity_tokens


_IDLE = (0.0, 0.0, 0.0)  # a step without work: (busy, sm·s, tensor·s)


def resize(model, now: float, replicas: int, *, startup_s: float | list[float]) -> list:
    """Start the missing replicas of ``model`` (ServingModel or GeneralServingModel) and mark the surplus
    deleting, picked the way a ReplicaSet picks them (not-ready before ready, newest first); the victims."""
    live = model.live()
    for k in range(replicas - len(live)):
        model.add_replica(now, startup_s=startup_s[k] if isinstance(startup_s, list) else startup_s)
    victims = sorted(live, key=lambda r: (r.ready(now), -r.created, r.name))[: max(0, len(live) - replicas)]
    for r in victims:
        r.deleting_since = now
    return victims


class Requests:
    """Per-request state of a replay (arrays indexed by request number)."""

    def __init__(self, trace: Trace) -> None:
        self.arrival = trace.arrival_s
        self.input = trace.input_tokens
        self.output = trace.output_tokens
        n = len(trace)
        self.admitted = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.finished = np.full(n, np.nan)
        self.rejected = np.zeros(n, dtype=bool)


class ServingModel:
    """Replicas of one Deployment fed by a least-outstanding-requests balancer, advanced ``step_s`` at a time."""

    def __init__(self, trace: Trace, *, profile: ServingProfile, step_s: float = 0.25) -> None:
        self.profile = profile
        self.requests = Requests(trace)
        self.step_s = step_s
        self.replicas: list[Replica] = []  # every replica ever started (for GPU-hours)
        self.present: list[Replica] = []  # those not gone yet: what each step looks at
        self.next_arrival = 0
        self.unrouted: deque[int] = deque()  # requests with no ready replica to go to
        self._serial = 0
        self._samples_kept = max(1, round(1.0 / step_s))  # steps of GPU activity kept: the last second
        self._next_arrival_s = float(trace.arrival_s[0]) if len(trace) else math.inf

    # --- the Deployment ----------------------------------------------------------------------------

    def add_replica(self, now: float, *, startup_s: float) -> Replica:
        self._serial += 1
        replica = Replica(f"server-{self._serial:03d}", now, now + startup_s, self.profile)
        self.replicas.append(replica)
        self.present.append(replica)
        return replica

    def live(self) -> list[Replica]:
        return [r for r in self.present if r.deleting_since is None]

    def scale_to(self, now: float, replicas: int, *, startup_s: float | list[float]) -> None:
        """The Deployment's new replica count: new pods start loading (``startup_s``: one for all, or one
        per new pod); surplus pods are deleted the way a ReplicaSet picks them (not-ready before ready,
        newest first) and drain their running requests; their waiting requests go back to the balancer."""
        for r in resize(self, now, replicas, startup_s=startup_s):
            self.unrouted.extend(r.waiting)
            r.waiting.clear()
            if r.idle:
                r.gone_at = now

    # --- time ----------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Route the arrivals up to ``now`` and run every replica for one step.

        A request that arrives within a step is scheduled at the next step's start (the server's scheduler
        runs between iterations), so no request starts — and no first token comes — before it arrived."""
        end = now + self.step_s
        if self.unrouted or self._next_arrival_s <= now:  # NB: most steps of a long trace route nothing
            arrival = self.requests.arrival
            ready = [r for r in self.present if r.ready(now)]
            if ready:
                while self.unrouted:
                    self._route(self.unrouted.popleft(), ready)
            while self.next_arrival < len(arrival) and arrival[self.next_arrival] <= now:
                i = self.next_arrival
                self.next_arrival += 1
                if ready:
                    self._route(i, ready)
                else:
                    self.unrouted.append(i)
            n = self.next_arrival
            self._next_arrival_s = float(arrival[n]) if n < len(arrival) else math.inf
        gone = False
        keep = self._samples_kept
        for r in self.present:
            if r.gone_at is None:
                if r.waiting or r.prefilling or r.n_decoding:
                    self._run(r, now)
                else:  # NB: idle: what _run would record, without its loop (most replica-steps of a long trace)
                    busy = r.busy_s
                    busy.append(_IDLE)
                    if len(busy) > keep:
                        busy.popleft()
                if r.deleting_since is not None and r.idle:
                    r.gone_at = end
                    gone = True
            else:
                gone = True
        if gone:
            self.present = [r for r in self.present if r.gone_at is None]

    @staticmethod
    def _route(i: int, ready: list[Replica]) -> None:
        # NB: Replica.outstanding spelled out: this runs for every ready replica on every arrival
        best = ready[0]
        fewest = len(best.waiting) + len(best.prefilling) + best.n_decoding
        for r in ready[1:]:
            outstanding = len(r.waiting) + len(r.prefilling) + r.n_decoding
            if outstanding < fewest:
                best, fewest = r, outstanding
        best.waiting.append(i)

    def _admit(self, r: Replica, now: float) -> None:
        req, p = self.requests, self.profile
        while r.waiting and len(r.prefilling) + r.n_decoding < p.max_batch:  # NB: r.running, spelled out
            i = r.waiting[0]
            need = int(req.input[i] + req.output[i])
            if need > p.kv_capacity_tokens:
                r.waiting.popleft()
                req.rejected[i] = True  # NB: can never fit; a real server answers 400 (context too long)
                continue
            if r.kv_reserved + need > p.kv_capacity_tokens:
                break
            if r.prefilling and r.prefill_tokens + int(req.input[i]) > p.prefill_token_budget:
                break
            r.waiting.popleft()
            r.kv_reserved += need
            r.prefill_tokens += int(req.input[i])
            req.admitted[i] = max(now, req.arrival[i])
            r.prefilling.append([i, p.prefill_s(int(req.input[i]))])

    def _run(self, r: Replica, now: float) -> None:
        p, req = self.profile, self.requests
        budget = self.step_s
        if not r.waiting and not r.prefilling and r.n_decoding and self._decode_whole_step(r, budget):
            return
        busy = sm = 0.0
        self._admit(r, now)
        while budget > 1e-12 and (r.prefilling or r.n_decoding):
            t = now + self.step_s - budget
            if r.prefilling:
                head = r.prefilling[0]
                use = min(budget, head[1])
                head[1] -= use
                budget -= use
                busy += use
                sm += use * p.sm_active_prefill
                if head[1] <= 1e-12:
                    r.prefilling.popleft()
                    i = int(head[0])
                    r.prefill_tokens -= int(req.input[i])
                    req.first_token[i] = t + use
                    r.counters.prompt_tokens += int(req.input[i])
                    r.first_tokens.append((t + use, t + use - float(req.arrival[i])))
                    heapq.heappush(r.decoding, (r.iterations + float(req.output[i]), i))
                    r.n_decoding += 1
                    r.kv_base += float(req.input[i]) - r.iterations
                    if not r.prefilling:
                        self._admit(r, t + use)
                continue
            kv_tokens = r.kv_base + r.n_decoding * r.iterations
            iteration_s = p.decode_iteration_s + p.decode_s_per_kv_token * kv_tokens
            fill = min(1.0, r.n_decoding / p.max_batch)
            activity = p.sm_active_idle_batch + (p.sm_active_full_batch - p.sm_active_idle_batch) * fill
            next_finish = r.decoding[0][0]
            possible = budget / iteration_s if iteration_s > 0 else np.inf  # free decoding: all of it now
            if r.iterations + possible < next_finish:
                r.iterations += possible
                busy += budget
                sm += budget * activity
                budget = 0.0
                break
            use = (next_finish - r.iterations) * iteration_s
            r.iterations = next_finish
            budget -= use
            busy += use
            sm += use * activity
            done_at = now + self.step_s - budget
            while r.decoding and r.decoding[0][0] <= r.iterations + 1e-9:
                finish, i = heapq.heappop(r.decoding)
                r.n_decoding -= 1
                r.kv_base -= float(req.input[i]) - (finish - float(req.output[i]))
                r.kv_reserved -= int(req.input[i] + req.output[i])
                req.finished[i] = done_at
                c = r.counters
                c.success += 1
                c.queue_s += req.admitted[i] - req.arrival[i]
                c.compute_s += done_at - req.admitted[i]
                c.generation_tokens += int(req.output[i])
            self._admit(r, done_at)
        r.busy_s.append((busy, sm, sm * p.tensor_per_sm))
        if len(r.busy_s) > self._samples_kept:
            r.busy_s.popleft()

    def _decode_whole_step(self, r: Replica, step_s: float) -> bool:
        """The commonest step of a busy replica: nothing to admit, nothing to prefill, and no sequence
        finishing within the step — the loop of ``_run`` would do exactly this one decode stretch. False
        (nothing done) when a sequence finishes within the step."""
        p = self.profile
        iteration_s = p.decode_iteration_s + p.decode_s_per_kv_token * (r.kv_base + r.n_decoding * r.iterations)
        possible = step_s / iteration_s if iteration_s > 0 else np.inf
        if r.iterations + possible >= r.decoding[0][0]:
            return False
        fill = min(1.0, r.n_decoding / p.max_batch)
        activity = p.sm_active_idle_batch + (p.sm_active_full_batch - p.sm_active_idle_batch) * fill
        r.iterations += possible
        sm = 0.0 + step_s * activity  # NB: the same float operations as the loop's, so the same bytes out
        r.busy_s.append((0.0 + step_s, sm, sm * p.tensor_per_sm))
        if len(r.busy_s) > self._samples_kept:
            r.busy_s.popleft()
        return True

    def gpu_activity(self, r: Replica) -> tuple[float, float, float]:
        """(GPU util %, SM active %, tensor active %) over the last second, as DCGM samples them."""
        if not r.busy_s:
            return 0.0, 0.0, 0.0
        span = len(r.busy_s) * self.step_s
        busy, sm, tensor = (sum(x) for x in zip(*r.busy_s, strict=True))
        return 100 * busy / span, 100 * sm / span, 100 * tensor / span

    def done(self) -> bool:
        return (
            self.next_arrival >= len(self.requests.arrival)
            and not self.unrouted
            and all(r.idle for r in self.present if r.gone_at is None)
        )
