"""``ClusterSim``: a ``Scenario`` running in simulated time — placements, load models, and the cumulative state
(energy, throttling time, Triton counters and queue backlogs) integrated in steps of at most one second. Time
is always passed in; nothing here reads a clock."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from gpuscale.sim.device_gauges import InstanceLoad, SimGpuGauges, device_signals
from gpuscale.sim.exporters.dcgm import LabelStyle, render_dcgm
from gpuscale.sim.exporters.triton import TritonState, render_triton
from gpuscale.sim.gpu_activity import Activity, activity
from gpuscale.sim.gpu_nodes import GpuSlot
from gpuscale.sim.load import LoadModel, smooth_noise, unit_hash
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.serving_queue import QueueState, advance_backlog, replica_queue, triton_rates
from gpuscale.sim.workloads import ContainerRef, Placement, PodKey, SimWorkload


@dataclass(slots=True)
class _GpuCounters:
    energy_mj: float
    power_violation_ns: float = 0.0
    thermal_violation_ns: float = 0.0


_GPU_SIGNAL_FIELDS = frozenset(f.name for f in dataclasses.fields(SimGpuGauges))


class _Instant(NamedTuple):
    signals: dict[str, dict[int, SimGpuGauges]]  # node → GPU index → gauges (no cumulative values)
    queues: dict[PodKey, QueueState]  # Triton pods only


class ClusterSim:
    """A scenario running in simulated time: placements, loads, and everything cumulative.

    Every method that observes or changes the cluster takes ``now`` (seconds on the caller's clock) and
    first integrates the elapsed time under the old conditions, so changing load or replicas never rewrites
    the past. A ``now`` earlier than the last one integrates nothing (counters never go down).
    """

    max_step_s = 1.0
    max_steps = 240

    def __init__(self, scenario: Scenario, *, start: float) -> None:
        self.scenario = scenario
        self.start = float(start)
        self._t = float(start)
        self._placements = scenario.placements()
        self._retired: set[PodKey] = set()
        self._gpu_counters: dict[tuple[str, int], _GpuCounters] = {}
        self._overrides: dict[tuple[str, int], dict[str, Any]] = {}
        self._vanished: set[tuple[str, int]] = set()
        self._triton: dict[PodKey, TritonState] = {}
        self._gpu_by_uuid = {gpu.uuid: (node.name, gpu.index) for node in scenario.nodes for gpu in node.gpus}
        for node in scenario.nodes:
            for gpu in node.gpus:
                # NB: "since boot" — start every GPU at a plausible, deterministic number of mJ.
                energy = (1.0 + 8.0 * unit_hash(scenario.seed, gpu.uuid, "energy")) * 1e11
                self._gpu_counters[(node.name, gpu.index)] = _GpuCounters(energy_mj=energy)
        for p in self._placements:
            self._start_pod(p)

    # state -----------------------------------------------------------------------------------------

    @property
    def now(self) -> float:
        """The simulated time integrated up to."""
        return self._t

    @property
    def placements(self) -> list[Placement]:
        return list(self._placements)

    def triton_pods(self) -> list[Placement]:
        """Running pods that serve Triton metrics."""
        return [p for p in self._placements if p.scheduled and p.key in self._triton]

    def triton_state(self, key: PodKey) -> TritonState:
        try:
            return self._triton[key]
        except KeyError:
            valid = ", ".join(f"{ns}/{pod}" for ns, pod in self._triton)
            raise KeyError(f"no running Triton pod {key[0]}/{key[1]}; running: {valid}") from None

    def pods_by_gpu(self) -> dict[str, dict[GpuSlot, ContainerRef]]:
        return self.scenario.pods_by_gpu(self._placements)

    def kube_objects(
        self, *, triton_ports: Mapping[PodKey, int] | None = None, exporter_ports: Mapping[str, int] | None = None
    ) -> list[dict[str, Any]]:
        return self.scenario.kube_objects(
            triton_ports=triton_ports, exporter_ports=exporter_ports, placements=self._placements
        )

    def _start_pod(self, p: Placement) -> None:
        w = self.scenario.workload(p.workload_key)
        if not (p.scheduled and w.triton_models) or p.node is None:
            return
        node = self.scenario.node(p.node)
        uuids = tuple(node.gpu(s.gpu).uuid for s in p.slots if s.instance is None)
        self._triton[p.key] = TritonState(gpu_uuids=uuids)

    # run-time changes ------------------------------------------------------------------------------

    def set_load(self, ref: str | SimWorkload, load: LoadModel, *, now: float) -> None:
        """From ``now`` on, ``ref`` is offered ``load`` (a ``LoadModel``)."""
        self.advance(now)
        self.scenario = self.scenario.with_load(ref, load)

    def set_replicas(
        self, ref: str | SimWorkload, replicas: int, *, now: float
    ) -> tuple[list[Placement], list[Placement]]:
        """Scale ``ref`` to ``replicas``; returns the pods that started and stopped running."""
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        self.advance(now)
        old = {p.key: p for p in self._placements}
        self.scenario = self.scenario.with_replicas(ref, replicas)
        new_list = self.scenario.placements(keep=self._placements, retired=self._retired)
        new = {p.key: p for p in new_list}
        self._retired.update(k for k in old if k not in new)
        started = [p for p in new_list if p.scheduled and not (p.key in old and old[p.key].scheduled)]
        stopped = [p for p in old.values() if p.scheduled and not (p.key in new and new[p.key].scheduled)]
        self._placements = new_list
        for p in stopped:
            self._triton.pop(p.key, None)
        for p in started:
            self._start_pod(p)
        return started, stopped

    def override_gpu(self, node: str, index: int, **fields: Any) -> None:
        """Force ``SimGpuGauges`` fields of one GPU (e.g. ``last_xid=79, xid_window=((79, 1),)``)."""
        unknown = set(fields) - _GPU_SIGNAL_FIELDS
        if unknown:
            raise ValueError(
                f"unknown SimGpuGauges fields {sorted(unknown)}; valid: {', '.join(sorted(_GPU_SIGNAL_FIELDS))}"
            )
        self.scenario.node(node).gpu(index)
        self._overrides.setdefault((node, index), {}).update(fields)

    def clear_overrides(self) -> None:
        self._overrides.clear()
        self._vanished.clear()

    def vanish_gpu(self, node: str, index: int) -> None:
        """Drop one GPU from its node's dcgm-exporter output (as after Xid 79, "fallen off the bus"), until
        ``restore_gpu`` or ``clear_overrides``."""
        self.scenario.node(node).gpu(index)
        self._vanished.add((node, index))

    def restore_gpu(self, node: str, index: int) -> None:
        self._vanished.discard((node, index))

    # time ------------------------------------------------------------------------------------------

    def advance(self, now: float) -> None:
        """Integrate counters and queues from the last time to ``now``."""
        dt = now - self._t
        if dt <= 0:
            return
        steps = min(self.max_steps, max(1, math.ceil(dt / self.max_step_s)))
        h = dt / steps
        for i in range(steps):
            tm = self._t + (i + 0.5) * h
            instant = self._instant(tm)
            self._integrate(instant, tm, h)
        self._t = now

    def _integrate(self, instant: _Instant, t: float, h: float) -> None:
        for node_name, by_gpu in instant.signals.items():
            for index, s in by_gpu.items():
                c = self._gpu_counters[(node_name, index)]
                c.energy_mj += s.power_w * h * 1000.0
                if s.clock_event_mask & 0x4:
                    c.power_violation_ns += h * 1e9 * 0.85
                if s.clock_event_mask & 0x68:  # hw_slowdown | sw_thermal | hw_thermal
                    c.thermal_violation_ns += h * 1e9 * 0.5
        for key, queue in instant.queues.items():
            state = self._triton[key]
            w = self._workload_of(key)
            state.integrate(w.triton_models, triton_rates(w.triton_models, queue), h)
            state.backlog = advance_backlog(queue, h)
            for gpu_uuid in state.gpu_uuids:
                power = self._signals_of(instant, gpu_uuid).power_w
                state.energy_j[gpu_uuid] = state.energy_j.get(gpu_uuid, 0.0) + power * h

    def _workload_of(self, key: PodKey) -> SimWorkload:
        for p in self._placements:
            if p.key == key:
                return self.scenario.workload(p.workload_key)
        raise KeyError(f"no pod {key[0]}/{key[1]}")

    def _signals_of(self, instant: _Instant, gpu_uuid: str) -> SimGpuGauges:
        node, index = self._gpu_by_uuid[gpu_uuid]
        return instant.signals[node][index]

    def _variation(self, gpu_uuid: str, t: float) -> float:
        return 0.6 * (2.0 * unit_hash(self.scenario.seed, gpu_uuid) - 1.0) + 0.4 * smooth_noise(t, gpu_uuid)

    def _instant(self, t: float) -> _Instant:
        """Gauges and queues at time ``t`` given the current backlogs (no side effects)."""
        elapsed = t - self.start
        running: dict[str, list[Placement]] = {}
        for p in self._placements:
            if p.scheduled:
                running.setdefault(p.workload_key, []).append(p)
        queues: dict[PodKey, QueueState] = {}
        pod_util: dict[PodKey, tuple[SimWorkload, float]] = {}
        for w in self.scenario.workloads:
            pods = running.get(w.key, [])
            if not pods:
                continue
            per_replica = w.offered_load.rate_at(elapsed) / len(pods)
            for p in pods:
                if p.key in self._triton:
                    q = replica_queue(
                        per_replica,
                        capacity_rps=w.capacity_rps,
                        backlog=self._triton[p.key].backlog,
                        timeout_s=w.queue_timeout_s,
                    )
                    queues[p.key] = q
                    pod_util[p.key] = (w, q.utilisation)
                else:
                    u = per_replica / w.capacity_rps if w.capacity_rps > 0 else 0.0
                    pod_util[p.key] = (w, min(1.0, u))
        holders: dict[tuple[str, GpuSlot], PodKey] = {}
        for p in self._placements:
            if p.node is not None:
                for slot in p.slots:
                    holders[(p.node, slot)] = p.key

        def act_of(node: str, slot: GpuSlot, variation: float) -> Activity | None:
            key = holders.get((node, slot))
            if key is None:
                return None
            w, u = pod_util[key]
            return activity(w.profile, u, variation=variation)

        signals: dict[str, dict[int, SimGpuGauges]] = {}
        for node in self.scenario.nodes:
            by_gpu: dict[int, SimGpuGauges] = {}
            for gpu in node.gpus:
                v = self._variation(gpu.uuid, t)
                if gpu.mig:
                    instances = {
                        inst.instance_id: InstanceLoad(
                            inst.slices / 7.0,
                            inst.fb_total_mib,
                            act_of(node.name, GpuSlot(gpu.index, inst.instance_id), v),
                        )
                        for inst in gpu.mig
                    }
                    by_gpu[gpu.index] = device_signals(gpu.hardware, None, variation=v, instances=instances)
                else:
                    by_gpu[gpu.index] = device_signals(
                        gpu.hardware, act_of(node.name, GpuSlot(gpu.index), v), variation=v
                    )
            signals[node.name] = by_gpu
        return _Instant(signals, queues)

    # observation -----------------------------------------------------------------------------------

    def _with_counters(self, node: str, index: int, s: SimGpuGauges) -> SimGpuGauges:
        c = self._gpu_counters[(node, index)]
        s = dataclasses.replace(
            s,
            total_energy_mj=round(c.energy_mj),
            power_violation_ns=round(c.power_violation_ns),
            thermal_violation_ns=round(c.thermal_violation_ns),
        )
        overrides = self._overrides.get((node, index))
        return dataclasses.replace(s, **overrides) if overrides else s

    def gpu_signals(self, node: str, *, now: float) -> dict[int, SimGpuGauges]:
        """Every GPU of ``node`` at ``now``: gauges at that instant plus the integrated counters."""
        self.advance(now)
        self.scenario.node(node)
        instant = self._instant(max(now, self._t))
        return {i: self._with_counters(node, i, s) for i, s in instant.signals[node].items()}

    def render_dcgm(
        self,
        node: str,
        *,
        now: float,
        version: str = "4.4",
        label_style: LabelStyle = "default",
        hostname_label: str | None = "Hostname",
    ) -> str:
        signals = {i: s for i, s in self.gpu_signals(node, now=now).items() if (node, i) not in self._vanished}
        return render_dcgm(
            self.scenario.node(node),
            signals,
            pods_by_gpu=self.pods_by_gpu()[node],
            version=version,
            label_style=label_style,
            hostname_label=hostname_label,
        )

    def render_triton(self, key: PodKey, *, now: float) -> str:
        self.advance(now)
        state = self.triton_state(key)
        w = self._workload_of(key)
        instant = self._instant(max(now, self._t))
        queue = instant.queues.get(key)
        if queue is not None:
            rates = triton_rates(w.triton_models, queue)
            for m in w.triton_models:
                r = rates.get((m.name, str(m.version)))
                state.level(m).pending = r.pending if r is not None else 0.0
            state.cpu_utilization = 0.05 + 0.2 * queue.utilisation
        for gpu_uuid in state.gpu_uuids:
            node, index = self._gpu_by_uuid[gpu_uuid]
            state.gpus[gpu_uuid] = self._with_counters(node, index, instant.signals[node][index])
        return render_triton(w.triton_models, state)
