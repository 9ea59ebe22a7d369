"""The demo's autoscaling act: a real trace slice as the Triton Deployment's load, an HPA loop over HTTP.

The slice (30 minutes of the Azure LLM conversation trace, package data) is binned per trace minute and
offered to ``inference/triton-bert`` sped up ``speedup`` times, its rate scaled to the simulated model's
capacity (the shape is the trace's, the level the demo's). The controller's clock runs at the same speed:
the HPA loop (hpa_loop.py, on gpuscale.hpa) syncs every 15 trace-seconds, its stabilization windows and
policy periods are in trace time, and the adapter's rate window is shortened to the same 60 trace-seconds
(a demo catalogue, unless --config/--policies is given). The simulated Deployment controller
(``SimCluster.follow_scale``) gives the Deployment the pods the HPA asked for.

The slice loops: after its last minute the load runs on into its first again (``RepeatingLoad``, the seam
interpolated like any two minutes, so a new pass is no load cliff) and the HPA loop keeps syncing with its
state and clock carried over, as a controller would see a recurring day. A caller asks for a number of
passes or for passes until ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import yaml
from rich.console import Console

from gpuscale.cli.hpa_loop import HpaLoop, SyncResult
from gpuscale.errors import SourceUnavailable
from gpuscale.hpa import SYNC_PERIOD_SECONDS, parse_manifests
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from gpuscale.metrics.catalogue import DEFAULT_CATALOGUE_PATH
from gpuscale.model import parse_quantity
from gpuscale.replay.results import SCHEMA, Event, ReplaySample
from gpuscale.replay.traces import Trace, read_trace
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.load import PiecewiseLinearLoad, RepeatingLoad

DATA = files("gpuscale.replay") / "data"
TRACE_FILE = "azure-conv-15-45min.csv.gz"
WORKLOAD = "inference/triton-bert"
MEAN_REPLICAS = 2.7  # the slice's mean rate in replicas' worth of the simulated Triton's capacity
SLO_QUEUE_S = 0.05  # the demo's SLO on the mean queue time (Triton bert: a few ms of compute)


@dataclass
class _ReplayState:
    """What the replay carries from one sync to the next: the pass's record, the scale-ups whose pods are not all
    ready yet, when a line was last printed and how many whole passes are done."""

    timeline: list[ReplaySample] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    queue_times: list[float] = field(default_factory=list)
    waiting: list[tuple[float, int]] = field(default_factory=list)  # (scale-up time, replicas asked for)
    last_print: float = -1e9
    done: int = 0  # whole passes replayed


@dataclass
class DemoReplay:
    trace: Trace
    hpa: HorizontalPodAutoscaler
    speedup: float
    bin_s: float = 60.0
    ready_after: list[float] = field(default_factory=list)

    @property
    def slice_s(self) -> float:
        """The slice's length in trace seconds: its whole minutes (one pass of the replay)."""
        return len(self._bins()) * self.bin_s

    @property
    def startup_s(self) -> float:
        """Median trace-seconds from a scale-up until its pods were counted ready (one sync period if none),
        in whole seconds: the fraction is the wall clock's scheduling jitter scaled by the speed-up."""
        return float(round(np.median(self.ready_after))) if self.ready_after else float(SYNC_PERIOD_SECONDS)

    @staticmethod
    def manifest() -> dict[str, Any]:
        """The HPA as an object for the simulated API (``kubectl get hpa`` then shows it and its status)."""
        return yaml.safe_load((DATA / "demo-hpa.yaml").read_text(encoding="utf-8"))

    @classmethod
    def load(cls, *, phase_s: float) -> DemoReplay:
        trace = read_trace(DATA / TRACE_FILE)
        hpa = parse_manifests((DATA / "demo-hpa.yaml").read_text(encoding="utf-8"), source="demo-hpa.yaml")[0]
        replay = cls(trace, hpa, speedup=1.0)
        replay.speedup = max(1.0, replay.slice_s / phase_s)
        return replay

    def _bins(self) -> np.ndarray:
        """Requests per second in each ``bin_s`` of the slice."""
        return np.bincount((self.trace.arrival_s // self.bin_s).astype(int)) / self.bin_s

    def catalogue_file(self, out_dir: Path, *, refresh_s: float) -> Path:
        """The shipped catalogue with its windows and max-age in trace time (at least two refreshes)."""
        data = yaml.safe_load(DEFAULT_CATALOGUE_PATH.read_text(encoding="utf-8"))
        defaults = data.setdefault("defaults", {})
        defaults["window"] = f"{max(2.5 * refresh_s, 60.0 / self.speedup):.3f}s"
        defaults["max_age"] = f"{max(5 * refresh_s, 60.0 / self.speedup):.3f}s"
        path = out_dir / "demo-metrics.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    def load_model(self, *, start_s: float, capacity_rps: float) -> tuple[RepeatingLoad, float]:
        """The slice's per-minute rate as a load from sim time ``start_s``, looped; and the scale factor.

        Each minute's rate sits at the minute's middle, linear in between; the seam (the last minute running
        into the first) is interpolated the same way, so every pass joins the next without a step."""
        rates = self._bins()
        factor = MEAN_REPLICAS * capacity_rps / float(rates.mean())
        bins = rates * factor
        step = self.bin_s / self.speedup
        seam = float(bins[-1] + bins[0]) / 2
        points = (
            (start_s, seam),
            *((start_s + (i + 0.5) * step, float(rate)) for i, rate in enumerate(bins)),
            (start_s + len(bins) * step, seam),
        )
        return RepeatingLoad(PiecewiseLinearLoad(points), start_s=start_s, period_s=len(bins) * step), factor

    async def run(
        self,
        cluster: SimCluster,
        *,
        session: aiohttp.ClientSession,
        adapter_url: str,
        console: Console,
        stop: asyncio.Event,
        passes: int | None,
        on_pass: Callable[[int, dict[str, Any]], Awaitable[None]],
    ) -> None:
        """Replay the slice ``passes`` times (``None``: until ``stop``); print a line per change and every few
        trace-minutes; after each whole pass, await ``on_pass(number, summary document of that pass)``.

        In named steps: the load offered and the banner (``_offer_load``), then per sync period the pass ended
        (``_end_pass``), the HPA's sync and what it is recorded as (``_record``)."""
        load_at = self._offer_load(cluster, console, forever=passes is None)
        loop = HpaLoop(self.hpa, session=session, adapter_url=adapter_url, kube_url=cluster.api.url)
        follower = asyncio.create_task(_follow(cluster, stop))
        state = _ReplayState()
        self.ready_after = []
        started = time.monotonic()
        period = SYNC_PERIOD_SECONDS / self.speedup
        try:
            k = 0
            while not stop.is_set():
                k += 1
                wake = started + k * period
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), max(0.0, wake - time.monotonic()))
                if stop.is_set():
                    break
                now = (time.monotonic() - started) * self.speedup  # the controller's clock, in trace seconds
                if now >= (state.done + 1) * self.slice_s and not await self._end_pass(
                    state, console, passes=passes, on_pass=on_pass
                ):
                    break
                at = now - state.done * self.slice_s  # where in the slice this sync is
                try:
                    result = await loop.sync(now)
                except SourceUnavailable as e:  # NB: the controller logs and retries next sync; so does the demo
                    console.print(f"  [dim]{_clock(at)}  sync failed: {e}[/]")
                    continue
                signals = await _signals(loop, session, adapter_url)
                self._record(state, result, signals, now=now, at=at, load_at=load_at, console=console)
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower

    def _offer_load(self, cluster: SimCluster, console: Console, *, forever: bool) -> Callable[[float], float]:
        """Set the slice as the workload's load and print the banner; returns the offered rate (req/s) at a
        trace-second of the controller's clock."""
        workload = cluster.exporters.scenario.workload(WORKLOAD)
        sim_now = cluster.exporters.sim.now
        load, factor = self.load_model(
            start_s=sim_now - cluster.exporters.sim.start, capacity_rps=workload.capacity_rps
        )
        cluster.exporters.set_load(WORKLOAD, load)
        console.print(
            f"\n[bold]Autoscaling[/] {WORKLOAD} with the HPA [bold]{self.hpa.name}[/] "
            f"(targets: {targets_text(self.hpa)}) on {len(self.trace)} requests of the Azure LLM conversation "
            f"trace ({self.slice_s / 60:.0f} min, rate ×{factor:.0f}), {self.speedup:.0f}× faster than real time"
            + (", over and over until Ctrl-C:" if forever else ":")
        )
        return lambda now: load.rate_at(sim_now - cluster.exporters.sim.start + now / self.speedup)

    async def _end_pass(
        self,
        state: _ReplayState,
        console: Console,
        *,
        passes: int | None,
        on_pass: Callable[[int, dict[str, Any]], Awaitable[None]],
    ) -> bool:
        """A whole pass is done: hand its summary to ``on_pass`` and start the next; False when it was the last."""
        state.done += 1
        await on_pass(state.done, self.summary(state.timeline, state.events, state.queue_times))
        state.timeline, state.events, state.queue_times = [], [], []
        if passes is not None and state.done >= passes:
            return False
        console.print(
            f"  [dim]pass {state.done + 1}: the slice again from its first minute (the load runs on into it; "
            "the HPA carries on)[/]",
            highlight=False,
        )
        return True

    def _record(
        self,
        state: _ReplayState,
        result: SyncResult,
        signals: dict[str, float],
        *,
        now: float,
        at: float,
        load_at: Callable[[float], float],
        console: Console,
    ) -> None:
        """One sync into the pass's timeline and events, the pods counted ready since a scale-up, and its line
        printed on a change or every two trace-minutes."""
        d = result.decision
        ready = sum(1 for p in result.pods if p.ready and not p.deleting)
        self.ready_after += [now - t for t, n in state.waiting if ready >= n]
        state.waiting = [(t, n) for t, n in state.waiting if ready < n]
        if d.desired_replicas > d.current_replicas:
            state.waiting.append((now, d.desired_replicas))
        sample = ReplaySample(
            at,
            d.desired_replicas,
            ready,
            len(result.pods),
            signals["queue"],
            0,
            signals["util"],
            signals["sm"],
        )
        state.timeline.append(sample)
        state.queue_times.append(signals["queue_time"])
        if d.rescale:
            why = "; ".join(
                f"{p.metric}={p.usage_milli / 1000:g}" if p.replicas is not None else p.error for p in d.proposals
            )
            state.events.append(Event(at, d.current_replicas, d.desired_replicas, d.reason, why))
        if d.rescale or now - state.last_print >= 120:
            state.last_print = now
            console.print(_line(at, load_at(now), d, ready, signals), highlight=False)

    def summary(self, timeline: list[ReplaySample], events: list[Event], queue_times: list[float]) -> dict[str, Any]:
        period = SYNC_PERIOD_SECONDS
        qt = np.array(queue_times or [0.0])
        minutes = {int(s.t // 60) for s in timeline}
        bad = {int(s.t // 60) for s, q in zip(timeline, queue_times, strict=True) if q > SLO_QUEUE_S}
        gpu_hours = sum(s.pods for s in timeline) * period / 3600.0
        result = {
            "hpa": self.hpa.name,
            "source": "gpuscale/replay/data/demo-hpa.yaml (live, over HTTP)",
            "gpu_hours": gpu_hours,
            "replica_hours": gpu_hours,
            # NB: percentiles of the adapter's per-sync mean queue time, not of single requests
            "queue_time_s": {f"p{q}": float(np.percentile(qt, q)) for q in (50, 95, 99)} | {"max": float(qt.max())},
            "slo": {"queue_s": SLO_QUEUE_S, "quantile": 0.5, "violating_minutes": len(bad), "minutes": len(minutes)},
            "max_replicas": max((s.pods for s in timeline), default=0),
            "scale_ups": sum(1 for e in events if e.to_replicas > e.from_replicas),
            "scale_downs": sum(1 for e in events if e.to_replicas < e.from_replicas),
            "timeline": [asdict(s) for s in timeline],
            "events": [
                {"t": e.t, "from": e.from_replicas, "to": e.to_replicas, "reason": e.reason, "why": e.why}
                for e in events
            ],
        }
        return {
            "schema": SCHEMA,
            "trace": {
                "name": TRACE_FILE.removesuffix(".gz"),
                "requests": len(self.trace),
                "duration_s": self.trace.duration_s,
                "speedup": self.speedup,
            },
            # NB: measured, not assumed: from a scale-up until the HPA loop counted the new pods ready (trace
            # seconds, in steps of one sync period; the simulated Deployment starts pods without a model load)
            "settings": {"slo_queue_s": SLO_QUEUE_S, "slo_quantile": 0.5, "startup_s": self.startup_s},
            "results": [result],
        }


def targets_text(hpa: HorizontalPodAutoscaler) -> str:
    """Each metric of ``hpa`` with its target as the manifest writes it (``inference_queue_compute_ratio 250m``)."""
    parts = []
    for spec in hpa.spec.metrics:
        target = spec.source.target
        milli = target.average_value if target.average_value is not None else target.value
        text = (
            f"{target.average_utilization}%"
            if milli is None
            else (f"{milli // 1000}" if milli % 1000 == 0 else f"{milli}m")
        )
        parts.append(f"{spec.metric_name} {text}")
    return ", ".join(parts)


async def _follow(cluster: SimCluster, stop: asyncio.Event) -> None:
    while not stop.is_set():
        await cluster.follow_scale()
        await asyncio.sleep(0.05)


async def _signals(loop: HpaLoop, session: aiohttp.ClientSession, adapter_url: str) -> dict[str, float]:
    """What the adapter serves about the Deployment's pods now: queue (sum), queue time, GPU util and SM (mean)."""
    base = f"{adapter_url}/apis/custom.metrics.k8s.io/v1beta1/namespaces/{loop.namespace}/pods/*/"
    selector = "?labelSelector=app%3Dtriton-bert"
    out: dict[str, float] = {}
    for key, metric, how in (
        ("queue", "inference_queue_depth", sum),
        ("queue_time", "inference_queue_time_seconds", np.mean),
        ("util", "gpu_utilization", np.mean),
        ("sm", "gpu_sm_active", np.mean),
        ("ratio", "inference_queue_compute_ratio", np.mean),
    ):
        try:
            async with session.get(base + metric + selector) as resp:
                items = (await resp.json()).get("items", []) if resp.status == 200 else []
        except aiohttp.ClientError:
            items = []  # NB: shown as 0 on this line; the HPA's own reads decide, and report their errors
        values = [parse_quantity(i["value"]) for i in items]
        out[key] = float(how(values)) if values else 0.0
    return out


def _clock(at: float) -> str:
    """Trace seconds as the slice's mm:ss."""
    return f"{int(at // 60):02d}:{int(at % 60):02d}"


def _line(at: float, rps: float, d: Any, ready: int, s: dict[str, float]) -> str:
    change = f"{d.current_replicas} → {d.desired_replicas}" if d.rescale else f"{d.current_replicas}"
    return (
        f"  {_clock(at)}  load {rps:6.0f} req/s │ replicas {change:<7} (ready {ready}) │ "
        f"queue:compute {s['ratio']:5.2f} │ queue {s['queue']:6.0f} │ GPU util {s['util']:5.1f} % │ "
        f"SM active {s['sm']:5.1f} %" + (f"  [{d.reason}]" if d.rescale else "")
    )
