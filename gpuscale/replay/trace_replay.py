"""Replay a request trace through a serving model with one HPA manifest in the loop.

The clock advances in ``step_s`` steps; every ``refresh_s`` the adapter view refreshes; every ``sync_s``
(the controller's 15 s) the HPA reconciles on what the adapter last served and, when it rescales, the
Deployment's new pods start loading (each ready after a start-up drawn from ``startup``) or surplus pods
drain. The serving model is the LLM one (gpuscale/replay/serving.py) for a ServingProfile and the general one
(gpuscale/replay/general.py) for a ServiceProfile. Deterministic: the balancer breaks ties by order and every
draw (service times, swap times, start-ups) comes from generators seeded by ``seed``, so the same inputs give
the same bytes; every HPA of a run sees the same service and swap times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from gpuscale.hpa import SYNC_PERIOD_SECONDS, Autoscaler, Decision, Readiness, SelectedPod
from gpuscale.hpa.spec import HorizontalPodAutoscaler
from gpuscale.metrics.catalogue import Catalogue
from gpuscale.replay.budget import check_grid
from gpuscale.replay.distributions import Distribution, constant
from gpuscale.replay.general import GeneralServingModel, ServiceProfile
from gpuscale.replay.metric_history import Series
from gpuscale.replay.results import Event, Outcome, ReplaySample, summarize
from gpuscale.replay.serving import ServingModel, ServingProfile
from gpuscale.replay.signals import AdapterView, CpuProfile
from gpuscale.replay.traces import Trace


@dataclass(frozen=True)
class ReplaySettings:
    startup_s: float = 180.0  # model load before a new replica is ready
    step_s: float = 0.25
    refresh_s: float = 5.0  # the adapter's --refresh-interval
    sync_s: float = SYNC_PERIOD_SECONDS
    initial_replicas: int | None = None  # default: the manifest's minReplicas, ready at t = 0
    slo_queue_s: float = 2.0
    slo_quantile: float = 0.95
    max_tail_s: float = 1800.0  # after the last arrival, stop draining after this long
    startup: Distribution | None = None  # start-up as measured (default: the constant ``startup_s``)
    service_time: Distribution | None = None  # general model, when the trace has no service_time column
    swap_time: Distribution | None = None  # general model: loading a model a replica has not loaded
    # the general model is exact within a step, so its step is only how often GPU activity is sampled:
    # the adapter's refresh interval by default (one step per refresh keeps long traces fast)
    general_step_s: float | None = None
    seed: int = 0
    # kube-controller-manager's readiness flags, which gate a cpu Resource metric only, and the CPU replicas use
    readiness: Readiness = field(default_factory=Readiness)
    cpu: CpuProfile = field(default_factory=CpuProfile)


def replay(
    trace: Trace,
    hpa: HorizontalPodAutoscaler,
    *,
    catalogue: Catalogue,
    profile: ServingProfile | ServiceProfile,
    settings: ReplaySettings,
    source: str = "",
    externals: Mapping[str, Series] | None = None,
) -> Outcome:
    """``externals``: External metrics fed as series (``--external``), timestamps on the trace file's clock."""
    model = make_model(trace, profile=profile, settings=settings)
    startup = settings.startup or constant(settings.startup_s)
    startups = np.random.default_rng([settings.seed, 1])
    view = AdapterView(
        model,
        catalogue=catalogue,
        metrics=frozenset(m.metric_name for m in hpa.spec.metrics),
        externals=externals,
        origin=trace.origin,
        cpu=settings.cpu,
    )
    auto = Autoscaler(hpa, readiness=settings.readiness)
    requests = {"cpu": round(settings.cpu.request_cores * 1000)}
    spec = settings.initial_replicas or hpa.min_replicas
    spec = max(hpa.min_replicas, min(spec, hpa.spec.max_replicas))
    for _ in range(spec):
        model.add_replica(0.0, startup_s=0.0)
    step_s = model.step_s
    per_refresh = max(1, round(settings.refresh_s / step_s))
    per_sync = max(1, round(settings.sync_s / step_s))
    duration_s = trace.duration_s  # NB: a property over the arrays: read once, not once per step
    last_step = int((duration_s + settings.max_tail_s) / step_s) + 1
    timeline: list[ReplaySample] = []
    events: list[Event] = []
    for k in range(last_step + 1):
        now = k * step_s
        if k % per_refresh == 0:
            view.refresh(now)
        if k and k % per_sync == 0:
            # NB: a pod starts when it is created (scheduling is immediate here); its Ready condition is False
            # from then until its model is loaded, and True from ready_at on
            pods = [
                SelectedPod(
                    r.name,
                    ready=now >= r.ready_at,
                    deleting=r.deleting_since is not None,
                    started=r.created,
                    ready_changed=r.ready_at if now >= r.ready_at else r.created,
                    requests_milli=requests,
                )
                for r in model.present
                if r.gone_at is None
            ]
            decision = auto.reconcile(now, spec_replicas=spec, pods=pods, readings=view)
            if decision.rescale:
                events.append(Event(now, spec, decision.desired_replicas, decision.reason, _why(decision, hpa)))
                new = max(0, decision.desired_replicas - len(model.live()))
                model.scale_to(now, decision.desired_replicas, startup_s=list(startup.draw(startups, new)))
                spec = decision.desired_replicas
            timeline.append(_sample(now, spec, model))
        if now > duration_s and model.done():
            break
        model.advance(now)
    return summarize(
        name=hpa.name,
        source=source,
        trace=trace,
        model=model,
        end_s=now,  # NB: the last request has completed (or the tail ran out)
        timeline=timeline,
        events=events,
        slo_queue_s=settings.slo_queue_s,
        slo_quantile=settings.slo_quantile,
    )


def check_budget(
    trace: Trace,
    hpa: HorizontalPodAutoscaler,
    *,
    profile: ServingProfile | ServiceProfile,
    settings: ReplaySettings,
    trace_source: str,
    source: str,
) -> None:
    """ConfigError naming the trace or the manifest when replaying ``trace`` through ``hpa`` is past the budget
    (gpuscale/replay/budget.py): checked before any replica or array is made."""
    check_grid(
        span_s=trace.duration_s + settings.max_tail_s,
        step_s=model_step_s(profile, settings),
        max_replicas=hpa.spec.max_replicas,
        trace=trace_source,
        hpa=source,
    )


def model_step_s(profile: ServingProfile | ServiceProfile, settings: ReplaySettings) -> float:
    """The step the serving model (and so the replay's clock) advances by."""
    if isinstance(profile, ServingProfile):
        return settings.step_s
    return settings.general_step_s or settings.refresh_s


def make_model(
    trace: Trace, *, profile: ServingProfile | ServiceProfile, settings: ReplaySettings
) -> ServingModel | GeneralServingModel:
    if isinstance(profile, ServingProfile):
        return ServingModel(trace, profile=profile, step_s=settings.step_s)
    draws = np.random.default_rng([settings.seed, 0])
    if settings.service_time is not None:  # NB: the flag wins over the trace's column: the user asked for it
        service_s = np.asarray(settings.service_time.draw(draws, len(trace)), dtype=np.float64)
    elif trace.service_s is not None:
        service_s = trace.service_s
    else:
        raise ValueError("the general model needs service times: a service_time column or a service_time distribution")
    swap_s = None
    if settings.swap_time is not None:
        swap_s = np.asarray(settings.swap_time.draw(draws, len(trace)), dtype=np.float64)
    return GeneralServingModel(
        trace, profile=profile, service_s=service_s, swap_s=swap_s, step_s=model_step_s(profile, settings)
    )


def _why(decision: Decision, hpa: HorizontalPodAutoscaler) -> str:
    parts = [
        # NB: a Utilization target's usage is a percent of the requests, every other one a milli-value
        f"{p.metric}={p.usage_milli}%→{p.replicas}"
        if m.resource is not None and m.resource.target.average_utilization is not None
        else f"{p.metric}={p.usage_milli / 1000:g}→{p.replicas}"
        for p, m in zip(decision.proposals, hpa.spec.metrics, strict=False)  # NB: none when out of bounds
        if p.replicas is not None and p.usage_milli is not None
    ]
    parts += [p.error for p in decision.proposals if p.replicas is None]
    return "; ".join(parts)


def _sample(now: float, spec: int, model: ServingModel | GeneralServingModel) -> ReplaySample:
    live = [r for r in model.present if r.gone_at is None]
    ready = [r for r in live if r.ready(now)]
    util = [model.gpu_activity(r) for r in ready]
    return ReplaySample(
        t=now,
        desired=spec,
        ready=len(ready),
        pods=len(live),
        queue=sum(len(r.waiting) for r in live) + len(model.unrouted),  # type: ignore[arg-type]
        running=sum(r.running for r in live),
        gpu_util=float(np.mean([u[0] for u in util])) if util else 0.0,
        sm_active=float(np.mean([u[1] for u in util])) if util else 0.0,
    )
