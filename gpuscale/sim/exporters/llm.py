"""Simulated LLM servers (vLLM, SGLang, TGI, NIM for LLMs): their state under load and their ``/metrics`` text.

Layers, from pure to stateful (the HTTP side is ``SimExporters(llm=...)`` in ``gpuscale.sim.exporters.wiring``):

- ``LlmServer`` — what one workload's pods run: the exposition ``format``, the served model, the batch
  limit (``max_num_seqs``), the KV-cache size in tokens, mean prompt/output lengths and base latencies.
- ``llm_rates`` — one replica's queue (``load.replica_queue``) → gauges (waiting, running, KV-cache usage)
  and per-second rates (requests, tokens, preemptions) plus the mean TTFT and inter-token latency. A
  stylised model: the batch fills with load up to ``max_num_seqs``; KV demand is running × (prompt +
  output/2) tokens; demand above the cache preempts requests; latencies grow with queueing and batch size.
- ``LlmState`` — cumulative counters and histogram buckets, integrated over simulated time.
- ``render_llm`` — the text in the exact format of ``tests/fixtures/llm/`` for the server's ``format``:
  vLLM 0.11 (V1 engine, prometheus_client multiprocess: sorted labels, ``floatToGoString`` numbers),
  SGLang, TGI (metrics-exporter-prometheus: no HELP, no labels) and NIM (unprefixed vLLM 0.x names).

Latency histograms are filled from a fixed spread around the mean (half the requests at 0.8×, then
1.2×, 2× and 3×), so percentiles move with load the way a real server's do, deterministically.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client.utils import floatToGoString

from gpuscale.sim.serving_queue import QueueState, advance_backlog, replica_queue
from gpuscale.sim.workloads import Placement, PodKey

if TYPE_CHECKING:
    from gpuscale.sim.exporters.simulation import ClusterSim

LlmFormat = Literal["vllm", "sglang", "tgi", "nim"]
FORMATS: tuple[LlmFormat, ...] = ("vllm", "sglang", "tgi", "nim")

# Histogram bucket upper bounds, per upstream (see tests/fixtures/README.md, llm/).
VLLM_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
VLLM_TTFT_BUCKETS += (20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
VLLM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0)
VLLM_ITL_BUCKETS += (40.0, 80.0)
SGLANG_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
SGLANG_TTFT_BUCKETS += (15.0, 20.0, 25.0, 30.0)
SGLANG_ITL_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4)
SGLANG_ITL_BUCKETS += (0.5, 0.75, 1.0, 2.5)
NIM_TTFT_BUCKETS = VLLM_TTFT_BUCKETS[:16]
NIM_ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

# The spread of one window's observations around the mean: (share, multiple of the mean).
_SPREAD = ((0.5, 0.8), (0.3, 1.2), (0.15, 2.0), (0.05, 3.0))


@dataclass(frozen=True, slots=True)
class LlmServer:
    """What a workload's pods serve and how it behaves. Latencies in seconds, sizes in tokens."""

    format: LlmFormat = "vllm"
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    max_num_seqs: int = 256
    kv_cache_tokens: int = 200_000
    prompt_tokens: float = 512.0
    output_tokens: float = 256.0
    ttft_s: float = 0.08  # prefill of one request on an idle server
    itl_s: float = 0.015  # one decode step with an empty batch
    max_input_tokens: int = 4000  # TGI's bucket layout
    max_total_tokens: int = 4096
    queue_timeout_s: float = 300.0  # LLM servers queue rather than reject: the backlog may hold this long

    def __post_init__(self) -> None:
        if self.format not in FORMATS:
            raise ValueError(f"unknown LLM server format {self.format!r}; valid: {', '.join(FORMATS)}")
        if self.max_num_seqs < 1 or self.kv_cache_tokens < 1:
            raise ValueError("max_num_seqs and kv_cache_tokens must be >= 1")


def demo_llm_servers() -> dict[str, LlmServer]:
    """What the demo's ``nim/llama3-8b`` pods serve (``demo_scenario``): NIM for LLMs, Llama 3 8B on one H100.

    Long RAG-style prompts (2k tokens, a slow prefill) and a batch cap of 64 sequences: near the diurnal peak a
    few requests wait while the KV cache is a third full and the SMs less than half busy — the serving side of
    the utilisation trap (``gpuscale top`` calls it batch-limited).
    """
    server = LlmServer(
        format="nim",
        model="meta/llama3-8b-instruct",
        max_num_seqs=64,
        kv_cache_tokens=400_000,
        prompt_tokens=2048.0,
        output_tokens=256.0,
        ttft_s=0.4,
        itl_s=0.02,
    )
    return {"nim/llama3-8b": server}


@dataclass(frozen=True, slots=True)
class LlmRates:
    """One replica at an instant: gauges, per-second counter increments and mean latencies."""

    waiting: float
    running: float
    kv_usage: float  # 0–1
    success: float
    prompt_tokens: float
    generation_tokens: float
    preemptions: float
    ttft_s: float
    itl_s: float


def llm_rates(server: LlmServer, queue: QueueState) -> LlmRates:
    """What one replica reports while its queue is ``queue`` (see the module docstring for the model)."""
    u = min(1.0, queue.utilisation)
    running = server.max_num_seqs * u
    kv_demand = running * (server.prompt_tokens + server.output_tokens / 2) / server.kv_cache_tokens
    # NB: when the batch needs more KV cache than there is, the excess requests are preempted (recomputed).
    preempted_share = max(0.0, 1.0 - 1.0 / kv_demand) if kv_demand > 1.0 else 0.0
    waiting = queue.backlog + queue.offered_rps * queue.wait_ratio * server.ttft_s + running * preempted_share
    itl = server.itl_s * (1.0 + running / server.max_num_seqs) * (1.0 + preempted_share)
    ttft = server.ttft_s * (1.0 + 4.0 * queue.wait_ratio) + queue.backlog_wait_s
    return LlmRates(
        waiting=waiting,
        running=running * (1.0 - preempted_share),
        kv_usage=min(1.0, kv_demand),
        success=queue.served_rps,
        prompt_tokens=queue.served_rps * server.prompt_tokens,
        generation_tokens=queue.served_rps * server.output_tokens,
        preemptions=queue.served_rps * preempted_share,
        ttft_s=ttft,
        itl_s=itl,
    )


def _observe(buckets: list[float], bounds: Sequence[float], mean: float, count: float) -> None:
    """Add ``count`` observations spread around ``mean`` to per-bucket (non-cumulative) counts."""
    for share, factor in _SPREAD:
        value = mean * factor
        index = next((i for i, b in enumerate(bounds) if value <= b), len(bounds))  # len(bounds): +Inf
        buckets[index] += share * count


@dataclass(slots=True)
class Histogram:
    """Per-bucket counts (the last is +Inf) and the sum of observations."""

    bounds: tuple[float, ...]
    counts: list[float] = field(default_factory=list)
    total: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * (len(self.bounds) + 1)

    def observe(self, mean: float, count: float) -> None:
        _observe(self.counts, self.bounds, mean, count)
        self.total += mean * count

    def cumulative(self) -> Iterator[tuple[float, float]]:
        """(upper bound, cumulative count), whole observations only, so counts only ever step up."""
        running = 0.0
        for bound, count in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += count
            yield bound, float(math.floor(running + 1e-9))


@dataclass(slots=True)
class LlmState:
    """Everything one LLM server pod reports: cumulative counters, histograms, its backlog, latest gauges."""

    server: LlmServer
    backlog: float = 0.0
    success: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    preemptions: float = 0.0
    gauges: LlmRates | None = None
    ttft: Histogram = field(init=False)
    itl: Histogram = field(init=False)

    def __post_init__(self) -> None:
        ttft, itl = {
            "vllm": (VLLM_TTFT_BUCKETS, VLLM_ITL_BUCKETS),
            "sglang": (SGLANG_TTFT_BUCKETS, SGLANG_ITL_BUCKETS),
            "tgi": (VLLM_TTFT_BUCKETS, VLLM_ITL_BUCKETS),  # TGI exports neither; kept for uniformity
            "nim": (NIM_TTFT_BUCKETS, NIM_ITL_BUCKETS),
        }[self.server.format]
        self.ttft = Histogram(ttft)
        self.itl = Histogram(itl)

    def integrate(self, rates: LlmRates, dt: float) -> None:
        """Add ``dt`` seconds at ``rates``."""
        self.success += rates.success * dt
        self.prompt_tokens += rates.prompt_tokens * dt
        self.generation_tokens += rates.generation_tokens * dt
        self.preemptions += rates.preemptions * dt
        self.ttft.observe(rates.ttft_s, rates.success * dt)
        self.itl.observe(rates.itl_s, max(0.0, rates.generation_tokens - rates.success) * dt)
        self.gauges = rates


# --- rendering -----------------------------------------------------------------------------------------


def _py(value: float) -> str:
    return floatToGoString(value)


def _rust(value: float) -> str:
    """Rust's f64 ``Display``: integers without a fraction, ``+Inf``."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(labels: dict[str, str], *, sort: bool) -> str:
    items = sorted(labels.items()) if sort else labels.items()
    return "{" + ",".join(f'{k}="{v}"' for k, v in items) + "}" if labels else ""


class _Writer:
    """prometheus_client-style families (HELP, TYPE, samples); ``sort`` = multiprocess label order."""

    def __init__(self, *, sort: bool) -> None:
        self.lines: list[str] = []
        self.sort = sort

    def simple(self, name: str, kind: str, help_text: str, labels: dict[str, str], value: float) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
        self.lines.append(f"{name}{_labels(labels, sort=self.sort)} {_py(value)}")

    def histogram(self, name: str, help_text: str, labels: dict[str, str], h: Histogram) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} histogram"]
        count = 0.0
        for bound, count in h.cumulative():
            self.lines.append(f"{name}_bucket{_labels({**labels, 'le': _py(bound)}, sort=self.sort)} {_py(count)}")
        self.lines.append(f"{name}_count{_labels(labels, sort=self.sort)} {_py(count)}")
        self.lines.append(f"{name}_sum{_labels(labels, sort=self.sort)} {_py(round(h.total, 6))}")


def _whole(value: float) -> float:
    return float(math.floor(value + 1e-9))


def _render_vllm(state: LlmState, g: LlmRates) -> list[str]:
    labels = {"engine": "0", "model_name": state.server.model}
    w = _Writer(sort=True)
    w.simple(
        "vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", labels, round(g.running)
    )
    w.simple(
        "vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", labels, round(g.waiting)
    )
    w.simple(
        "vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", labels, round(g.kv_usage, 6)
    )
    w.simple(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        labels,
        _whole(state.preemptions),
    )
    w.simple(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        labels,
        _whole(state.prompt_tokens),
    )
    w.simple(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        labels,
        _whole(state.generation_tokens),
    )
    w.lines += [
        "# HELP vllm:request_success_total Count of successfully processed requests.",
        "# TYPE vllm:request_success_total counter",
    ]
    for reason, share in (("abort", 0.0), ("length", 0.25), ("stop", 0.75)):
        sample_labels = _labels({**labels, "finished_reason": reason}, sort=True)
        w.lines.append(f"vllm:request_success_total{sample_labels} {_py(_whole(state.success * share))}")
    w.histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, state.ttft)
    w.histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, state.itl)
    return w.lines


def _render_sglang(state: LlmState, g: LlmRates) -> list[str]:
    labels = {"model_name": state.server.model}
    w = _Writer(sort=True)
    w.simple(
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        labels,
        _whole(state.prompt_tokens),
    )
    w.simple(
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        labels,
        _whole(state.generation_tokens),
    )
    w.simple("sglang:num_requests_total", "counter", "Number of requests processed.", labels, _whole(state.success))
    w.simple(
        "sglang:num_retracted_requests_total",
        "counter",
        "Total number of retracted requests.",
        labels,
        _whole(state.preemptions),
    )
    w.simple("sglang:token_usage", "gauge", "The token usage", labels, round(g.kv_usage, 6))
    w.histogram(
        "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, state.ttft
    )
    w.histogram("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", labels, state.itl)
    w.simple("sglang:num_running_reqs", "gauge", "The number of running requests.", labels, round(g.running))
    w.simple("sglang:num_queue_reqs", "gauge", "The number of requests in the waiting queue.", labels, round(g.waiting))
    return w.lines


def _render_tgi(state: LlmState, g: LlmRates) -> list[str]:
    s = state.server
    lines = [
        "# TYPE tgi_request_count counter",
        f"tgi_request_count {_rust(_whole(state.success))}",
        "# TYPE tgi_request_success counter",
        f"tgi_request_success {_rust(_whole(state.success))}",
        "# TYPE tgi_batch_current_size gauge",
        f"tgi_batch_current_size {_rust(round(g.running))}",
        "# TYPE tgi_queue_size gauge",
        f"tgi_queue_size {_rust(round(g.waiting))}",
    ]
    n = _whole(state.success)
    for name, limit, mean, total in (
        ("tgi_request_input_length", s.max_input_tokens, s.prompt_tokens, state.prompt_tokens),
        ("tgi_request_generated_tokens", s.max_total_tokens, s.output_tokens, state.generation_tokens),
    ):
        # Every request at the mean length: one bucket holds them all.
        bounds = [limit / 20 * (k + 1) for k in range(20)]
        lines.append(f"# TYPE {name} histogram")
        for bound in (*bounds, math.inf):
            lines.append(f'{name}_bucket{{le="{_rust(bound)}"}} {_rust(n if mean <= bound else 0.0)}')
        lines.append(f"{name}_sum {_rust(_whole(total))}")
        lines.append(f"{name}_count {_rust(n)}")
    return lines


def _render_nim(state: LlmState, g: LlmRates) -> list[str]:
    labels = {"model_name": state.server.model}
    w = _Writer(sort=False)
    w.simple("num_requests_running", "gauge", "Number of requests currently running on GPU.", labels, round(g.running))
    w.simple("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", labels, round(g.waiting))
    w.simple(
        "num_request_max",
        "gauge",
        "Max number of concurrently running requests.",
        labels,
        float(state.server.max_num_seqs),
    )
    w.simple(
        "gpu_cache_usage_perc", "gauge", "GPU KV-cache usage. 1 means 100 percent usage.", labels, round(g.kv_usage, 6)
    )
    w.simple(
        "prompt_tokens_total", "counter", "Number of prefill tokens processed.", labels, _whole(state.prompt_tokens)
    )
    w.simple(
        "generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        labels,
        _whole(state.generation_tokens),
    )
    w.histogram("time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels, state.ttft)
    w.histogram("time_per_output_token_seconds", "Histogram of time per output token in seconds.", labels, state.itl)
    w.lines += [
        "# HELP request_success_total Count of successfully processed requests.",
        "# TYPE request_success_total counter",
    ]
    for reason, share in (("length", 0.25), ("stop", 0.75)):
        sample_labels = _labels({**labels, "finished_reason": reason}, sort=False)
        w.lines.append(f"request_success_total{sample_labels} {_py(_whole(state.success * share))}")
    return w.lines


_RENDERERS = {"vllm": _render_vllm, "sglang": _render_sglang, "tgi": _render_tgi, "nim": _render_nim}


def render_llm(state: LlmState) -> str:
    """The server's ``/metrics`` text in its ``format`` (an idle server before any load: zero gauges)."""
    gauges = state.gauges or LlmRates(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
    return "\n".join(_RENDERERS[state.server.format](state, gauges)) + "\n"


# --- the fleet -----------------------------------------------------------------------------------------


class LlmFleet:
    """The LLM server pods of a ``ClusterSim``: one ``LlmState`` per running pod of a workload in ``servers``.

    Integrates in the same steps as ``ClusterSim.advance`` (at most ``ClusterSim.max_step_s``), splitting each
    workload's offered load equally over its running pods, each with its own backlog. Pods that start get a
    fresh state; pods that stop lose theirs. Nothing here reads a clock.
    """

    def __init__(self, servers: Mapping[str, LlmServer], *, start: float) -> None:
        self.servers = dict(servers)
        self._t = float(start)
        self._states: dict[PodKey, LlmState] = {}

    def pods(self, sim: ClusterSim) -> list[Placement]:
        """Running pods that serve LLM metrics."""
        return [p for p in sim.placements if p.scheduled and p.workload_key in self.servers]

    def state(self, key: PodKey) -> LlmState:
        try:
            return self._states[key]
        except KeyError:
            valid = ", ".join(f"{ns}/{pod}" for ns, pod in self._states)
            raise KeyError(f"no running LLM server pod {key[0]}/{key[1]}; running: {valid}") from None

    def sync(self, sim: ClusterSim) -> None:
        """Start states for new pods, drop those of pods gone."""
        running = {p.key: p for p in self.pods(sim)}
        for key in [k for k in self._states if k not in running]:
            del self._states[key]
        for key, p in running.items():
            self._states.setdefault(key, LlmState(self.servers[p.workload_key]))

    def _queues(self, sim: ClusterSim, t: float) -> dict[PodKey, tuple[LlmState, QueueState]]:
        by_workload: dict[str, list[Placement]] = {}
        for p in self.pods(sim):
            by_workload.setdefault(p.workload_key, []).append(p)
        out: dict[PodKey, tuple[LlmState, QueueState]] = {}
        for key, pods in by_workload.items():
            w = sim.scenario.workload(key)
            per_replica = w.offered_load.rate_at(t - sim.start) / len(pods)
            for p in pods:
                state = self._states[p.key]
                out[p.key] = (
                    state,
                    replica_queue(
                        per_replica,
                        capacity_rps=w.capacity_rps,
                        backlog=state.backlog,
                        timeout_s=state.server.queue_timeout_s,
                    ),
                )
        return out

    def advance(self, sim: ClusterSim, now: float) -> None:
        """Integrate every pod's counters and backlog up to ``now``; gauges are those at ``now``."""
        self.sync(sim)
        dt = now - self._t
        if dt > 0:
            steps = min(sim.max_steps, max(1, math.ceil(dt / sim.max_step_s)))
            h = dt / steps
            for i in range(steps):
                for state, queue in self._queues(sim, self._t + (i + 0.5) * h).values():
                    state.integrate(llm_rates(state.server, queue), h)
                    state.backlog = advance_backlog(queue, h)
            self._t = now
        for state, queue in self._queues(sim, max(now, self._t)).values():
            state.gauges = llm_rates(state.server, queue)

    def render(self, sim: ClusterSim, key: PodKey, *, now: float) -> str:
        self.advance(sim, now)
        return render_llm(self.state(key))


def with_llm_endpoints(objects: list[dict[str, Any]], ports: Mapping[PodKey, int]) -> list[dict[str, Any]]:
    """The scenario's Kubernetes objects with each LLM pod's metrics port declared and annotated for discovery."""
    for obj in objects:
        meta = obj.get("metadata") or {}
        port = ports.get((meta.get("namespace", ""), meta.get("name", ""))) if obj.get("kind") == "Pod" else None
        if port is None:
            continue
        meta.setdefault("annotations", {}).update(
            {
                "gpuscale.io/scrape": "true",
                "gpuscale.io/port": str(port),
                "gpuscale.io/path": "/metrics",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics",
            }
        )
        container = obj["spec"]["containers"][0]
        container.setdefault("ports", []).append({"name": "metrics", "containerPort": port, "protocol": "TCP"})
    return objects
