"""GPU telemetry for planners: per node and per GPU, the latest DCGM signals plus what only a window shows.

A planner needs more than one scrape: "hardware slowdown *sustained* for five minutes", "the ECC double-bit
counter *increased* in the last ten", "this GPU was reported before and is gone now", "idle for an hour".
``TelemetryHistory`` is fed the device readings of each refresh (``metrics.devices.read_devices``) and keeps,
per GPU, the little state those answers need (no samples: change points of counters, the start of the
current run of a condition, the last time a GPU was active); ``snapshot`` returns an immutable
``ClusterTelemetry``, the typed input of every planner.

Contracts:

- Pure and clock-free: ``observe`` is given ``now``; the same readings at the same times give the same
  telemetry. It is in-memory: after a restart the windows start empty, so a "sustained" or "idle" answer
  takes a full window to come back (never a guess from before the restart).
- A node whose exporter gave nothing this refresh is ``reporting=False``: its GPUs are neither healthy nor
  vanished, they are unknown. A GPU is ``vanished`` only when its node's exporter answered without it.
- Counters (ECC DBE, PCIe replays) count from the first observation; a decrease is an exporter or driver
  restart, after which the new value is the increase (as PromQL's ``increase`` treats a reset).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuscale.metrics.devices import DEVICE_SERIES, DeviceReading, device_id, reading_signals
from gpuscale.metrics.diagnosis import GpuSignals

__all__ = [
    "HW_SLOWDOWN_MASK",
    "PCIE_REPLAY",
    "TELEMETRY_SERIES",
    "ClusterTelemetry",
    "GpuTelemetry",
    "NodeGpuTelemetry",
    "TelemetryHistory",
    "activity_of",
    "mean_activity_by_node",
]

PCIE_REPLAY = "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
ECC_DBE = "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"
TELEMETRY_SERIES: tuple[str, ...] = tuple(sorted({*DEVICE_SERIES, PCIE_REPLAY}))
"""What the controller reads from its source: the diagnosis fields plus the PCIe replay counter."""

# gpu-metrics.md §5: hw_slowdown | hw_thermal | hw_power_brake; 0x4 (power cap) alone is normal.
HW_SLOWDOWN_MASK = 0x8 | 0x40 | 0x80


def activity_of(signals: GpuSignals) -> float | None:
    """How busy a GPU really is, 0–1: SM active, else GR engine active, else GPU util / 100 (None: unknown)."""
    if signals.sm_active is not None:
        return signals.sm_active
    if signals.gr_engine_active is not None:
        return signals.gr_engine_active
    if signals.gpu_util_percent is not None:
        return signals.gpu_util_percent / 100.0
    return None


@dataclass(frozen=True, slots=True)
class GpuTelemetry:
    """One GPU (or MIG instance) on one node, now and over the window.

    ``gpu`` is the device id on the node (``"3"`` or ``"3/1"`` for a MIG instance); ``pod`` the
    (namespace, name) holding it, if any. ``ecc_dbe_increase`` / ``pcie_replay_increase`` are counter
    increases over the window (None: not reported). ``slowdown_seconds`` is how long the hardware slowdown
    bits (``HW_SLOWDOWN_MASK``) have been set without a break (0 when not set now). ``idle_seconds`` is how
    long activity (``activity_of``) has stayed below the history's threshold, counted from the first
    observation at most; ``observed_seconds`` how long this GPU has been watched.
    """

    node: str
    gpu: str
    uuid: str | None
    signals: GpuSignals
    sampled_at: float
    pod: tuple[str, str] | None = None
    ecc_dbe_increase: float | None = None
    pcie_replay_increase: float | None = None
    slowdown_seconds: float = 0.0
    idle_seconds: float = 0.0
    observed_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class NodeGpuTelemetry:
    """The GPUs of one node. ``reporting``: its exporter answered this refresh. ``vanished``: GPU ids seen
    before on this node and missing from an answer that came (since when, seconds since the epoch)."""

    node: str
    reporting: bool
    gpus: Mapping[str, GpuTelemetry] = field(default_factory=dict)
    vanished: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ClusterTelemetry:
    """Every node with GPU telemetry, at ``at``. ``window_seconds`` is the span increases cover."""

    at: float
    window_seconds: float
    nodes: Mapping[str, NodeGpuTelemetry] = field(default_factory=dict)

    def node(self, name: str) -> NodeGpuTelemetry | None:
        return self.nodes.get(name)

    @classmethod
    def empty(cls, *, at: float = 0.0, window_seconds: float = 600.0) -> ClusterTelemetry:
        return cls(at=at, window_seconds=window_seconds)


def mean_activity_by_node(telemetry: ClusterTelemetry) -> dict[str, float]:
    """node → mean activity (``activity_of``, 0–1) of its reporting GPUs now; nodes without a figure left out.

    What a pool-level consumer averages (e.g. the expander's cost per useful GPU-hour): group these by pool."""
    out = {}
    for name, node in telemetry.nodes.items():
        values = [a for g in node.gpus.values() if (a := activity_of(g.signals)) is not None]
        if node.reporting and values:
            out[name] = sum(values) / len(values)
    return out


class _GpuState:
    __slots__ = ("counters", "first_seen", "idle_since", "slowdown_since")

    def __init__(self, now: float) -> None:
        self.first_seen = now
        self.slowdown_since: float | None = None
        self.idle_since: float | None = None
        self.counters: dict[str, _WindowCounter] = {}


class _WindowCounter:
    """A counter's increases since first seen, kept as (time, delta) change points within the window."""

    __slots__ = ("changes", "last")

    def __init__(self, value: float) -> None:
        self.last = value
        self.changes: deque[tuple[float, float]] = deque()

    def increase(self, value: float, now: float, window: float) -> float:
        delta = value - self.last if value >= self.last else value  # NB: a decrease is a reset
        self.last = value
        if delta > 0:
            self.changes.append((now, delta))
        while self.changes and self.changes[0][0] <= now - window:
            self.changes.popleft()
        return sum(d for _, d in self.changes)


class TelemetryHistory:
    """Per-GPU state across refreshes → ``ClusterTelemetry``.

    ``window_seconds`` is the span of counter increases; ``idle_below`` the activity (0–1) under which a GPU
    counts as idle; ``forget_after_seconds`` drops a node not reporting for that long (a deleted node).
    """

    def __init__(
        self, *, window_seconds: float = 600.0, idle_below: float = 0.05, forget_after_seconds: float = 3600.0
    ) -> None:
        self.window_seconds = float(window_seconds)
        self.idle_below = float(idle_below)
        self.forget_after_seconds = float(forget_after_seconds)
        self._gpus: dict[tuple[str, str], _GpuState] = {}
        self._seen_on: dict[str, set[str]] = {}  # node → GPU ids ever reported
        self._vanished: dict[str, dict[str, float]] = {}
        self._last_report: dict[str, float] = {}
        self._snapshot = ClusterTelemetry.empty(window_seconds=self.window_seconds)

    def observe(
        self, readings: Iterable[DeviceReading], *, now: float, max_age_seconds: float = 60.0
    ) -> ClusterTelemetry:
        """Take one refresh's readings (older than ``max_age_seconds`` are ignored) and return the snapshot."""
        window = self.window_seconds
        by_node: dict[str, dict[str, GpuTelemetry]] = {}
        for reading in readings:
            node = reading.device.node
            if not node or now - reading.sampled_at > max_age_seconds:
                continue
            gpu = device_id(reading.labels)
            signals = reading_signals(reading)
            state = self._gpus.get((node, gpu))
            if state is None:
                state = self._gpus[(node, gpu)] = _GpuState(now)
            mask = signals.clock_event_reasons or 0
            if mask & HW_SLOWDOWN_MASK:
                state.slowdown_since = state.slowdown_since if state.slowdown_since is not None else now
            else:
                state.slowdown_since = None
            activity = activity_of(signals)
            if activity is not None and activity < self.idle_below:
                state.idle_since = state.idle_since if state.idle_since is not None else now
            else:
                state.idle_since = None
            increases: dict[str, float | None] = {}
            for name in (ECC_DBE, PCIE_REPLAY):
                value = reading.values.get(name)
                if value is None or value != value:  # NB: NaN is "not reported"
                    increases[name] = None
                    continue
                counter = state.counters.get(name)
                if counter is None:
                    counter = state.counters[name] = _WindowCounter(value)
                increases[name] = counter.increase(value, now, window)
            owner = reading.device.pod
            by_node.setdefault(node, {})[gpu] = GpuTelemetry(
                node=node,
                gpu=gpu,
                uuid=reading.labels.get("UUID") or reading.labels.get("uuid") or None,
                signals=signals,
                sampled_at=reading.sampled_at,
                pod=(owner.namespace or "", owner.name) if owner is not None else None,
                ecc_dbe_increase=increases[ECC_DBE],
                pcie_replay_increase=increases[PCIE_REPLAY],
                slowdown_seconds=now - state.slowdown_since if state.slowdown_since is not None else 0.0,
                idle_seconds=now - state.idle_since if state.idle_since is not None else 0.0,
                observed_seconds=now - state.first_seen,
            )
        nodes: dict[str, NodeGpuTelemetry] = {}
        for node, gpus in by_node.items():
            self._last_report[node] = now
            seen = self._seen_on.setdefault(node, set())
            vanished = self._vanished.setdefault(node, {})
            for gpu in list(vanished):
                if gpu in gpus:
                    del vanished[gpu]
            for gpu in seen - gpus.keys():
                vanished.setdefault(gpu, now)
                self._gpus.pop((node, gpu), None)
            seen.update(gpus)
            nodes[node] = NodeGpuTelemetry(node, True, dict(sorted(gpus.items())), dict(sorted(vanished.items())))
        for node, last in list(self._last_report.items()):
            if node in nodes:
                continue
            if now - last > self.forget_after_seconds:
                self._forget(node)
                continue
            nodes[node] = NodeGpuTelemetry(node, False, {}, dict(self._vanished.get(node, {})))
        self._snapshot = ClusterTelemetry(at=now, window_seconds=window, nodes=dict(sorted(nodes.items())))
        return self._snapshot

    @property
    def snapshot(self) -> ClusterTelemetry:
        return self._snapshot

    def _forget(self, node: str) -> None:
        self._last_report.pop(node, None)
        self._seen_on.pop(node, None)
        self._vanished.pop(node, None)
        for key in [k for k in self._gpus if k[0] == node]:
            del self._gpus[key]
