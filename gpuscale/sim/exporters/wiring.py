"""``SimExporters``: a scenario wired to an ``ExporterServer`` — one dcgm-exporter per node, one Triton endpoint
per running Triton pod, one LLM server endpoint per pod of an LLM workload — with run-time knobs (load,
replicas, faults) and ``kube_objects()`` carrying the real ports for the simulated Kubernetes API."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from gpuscale.sim.exporters.clock import Clock
from gpuscale.sim.exporters.dcgm import LabelStyle
from gpuscale.sim.exporters.endpoints import ExporterServer, Faults
from gpuscale.sim.exporters.llm import LlmFleet, LlmServer, LlmState, with_llm_endpoints
from gpuscale.sim.exporters.simulation import ClusterSim
from gpuscale.sim.load import LoadModel
from gpuscale.sim.scenario import Scenario
from gpuscale.sim.workloads import Placement, PodKey, SimWorkload

Listener = Callable[[list[dict[str, Any]]], Awaitable[None] | None]


def _dcgm_name(node: str) -> str:
    return f"dcgm/{node}"


def _llm_name(key: PodKey) -> str:
    return f"llm/{key[0]}/{key[1]}"


def _triton_name(key: PodKey) -> str:
    return f"triton/{key[0]}/{key[1]}"


class SimExporters:
    """Simulated exporters for a whole scenario: one dcgm-exporter per node, one Triton per Triton pod.

    ``await start(scenario, clock=...)`` binds every endpoint on 127.0.0.1 and starts the simulation at
    ``clock()``; each GET renders at the current ``clock()``. The constructor's ``dcgm_version``,
    ``label_style`` and ``hostname_label`` select a dcgm-exporter output variant (see ``render_dcgm``).
    ``async with SimExporters() as exporters:`` stops everything on exit (``start`` is still explicit).
    """

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        dcgm_version: str = "4.4",
        label_style: LabelStyle = "default",
        hostname_label: str | None = "Hostname",
        llm: Mapping[str, LlmServer] | None = None,
        termination_grace_s: float = 0.0,
    ) -> None:
        """``llm``: workload (``namespace/name``) → the LLM server its pods run; each running pod then serves
        that server's ``/metrics`` (vLLM, SGLang, TGI or NIM format, ``gpuscale.sim.exporters.llm``).
        ``termination_grace_s``: how long a scaled-down pod's endpoint keeps serving (``ExporterServer.retire``)."""
        self._llm_servers = dict(llm or {})
        self._grace_s = termination_grace_s
        self._llm: LlmFleet | None = None
        self._server = ExporterServer(host=host)
        self._dcgm_style: dict[str, Any] = {
            "version": dcgm_version,
            "label_style": label_style,
            "hostname_label": hostname_label,
        }
        self._sim: ClusterSim | None = None
        self._clock: Clock = time.time
        self._listeners: list[Listener] = []

    async def __aenter__(self) -> SimExporters:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self, scenario: Scenario, *, clock: Clock = time.time) -> None:
        if self._sim is not None:
            raise RuntimeError("SimExporters already started")
        self._clock = clock
        self._sim = ClusterSim(scenario, start=clock())
        await self._server.start()
        try:
            for node in scenario.nodes:
                await self._server.add(_dcgm_name(node.name), self._dcgm_renderer(node.name), nan_literal="NaN")
            for p in self._sim.triton_pods():
                await self._add_triton(p.key)
            if self._llm_servers:
                for key in self._llm_servers:
                    scenario.workload(key)  # NB: an unknown workload fails here, naming the valid ones
                self._llm = LlmFleet(self._llm_servers, start=self._sim.start)
                self._llm.sync(self._sim)
                for p in self._llm.pods(self._sim):
                    await self._add_llm(p.key)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        await self._server.stop()
        self._sim = None
        self._llm = None

    # state -----------------------------------------------------------------------------------------

    @property
    def sim(self) -> ClusterSim:
        if self._sim is None:
            raise RuntimeError("SimExporters is not started")
        return self._sim

    @property
    def scenario(self) -> Scenario:
        return self.sim.scenario

    @property
    def server(self) -> ExporterServer:
        return self._server

    @property
    def dcgm_urls(self) -> dict[str, str]:
        """Node name → dcgm-exporter URL."""
        return {n.name: self._server.url(_dcgm_name(n.name)) for n in self.scenario.nodes}

    @property
    def triton_urls(self) -> dict[PodKey, str]:
        """``(namespace, pod)`` → Triton metrics URL, for running Triton pods."""
        return {p.key: self._server.url(_triton_name(p.key)) for p in self.sim.triton_pods()}

    @property
    def dcgm_ports(self) -> dict[str, int]:
        return {n.name: self._server.port(_dcgm_name(n.name)) for n in self.scenario.nodes}

    @property
    def triton_ports(self) -> dict[PodKey, int]:
        return {p.key: self._server.port(_triton_name(p.key)) for p in self.sim.triton_pods()}

    @property
    def ports(self) -> dict[str, int]:
        """Every endpoint name (``dcgm/<node>``, ``triton/<ns>/<pod>``) → port."""
        return {name: self._server.port(name) for name in self._server.names}

    @property
    def llm_urls(self) -> dict[PodKey, str]:
        """``(namespace, pod)`` → LLM server metrics URL, for running LLM server pods."""
        return {p.key: self._server.url(_llm_name(p.key)) for p in self._llm_pods()}

    @property
    def llm_ports(self) -> dict[PodKey, int]:
        return {p.key: self._server.port(_llm_name(p.key)) for p in self._llm_pods()}

    def llm_state(self, key: PodKey) -> LlmState:
        """The ``LlmState`` of a running LLM server pod (counters, histograms, latest gauges)."""
        if self._llm is None:
            raise KeyError(f"no LLM servers configured; {key[0]}/{key[1]} serves none")
        return self._llm.state(key)

    def _llm_pods(self) -> list[Placement]:
        return self._llm.pods(self.sim) if self._llm is not None else []

    def kube_objects(self) -> list[dict[str, Any]]:
        """The cluster's Kubernetes objects, with the ports the exporters really listen on."""
        objects = self.sim.kube_objects(triton_ports=self.triton_ports, exporter_ports=self.dcgm_ports)
        return with_llm_endpoints(objects, self.llm_ports) if self._llm is not None else objects

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(kube_objects())`` after every change of pods (``set_replicas``)."""
        self._listeners.append(listener)

    # run-time knobs --------------------------------------------------------------------------------

    def set_load(self, workload: str | SimWorkload, load: LoadModel) -> None:
        """From now on ``workload`` (``namespace/name``) is offered ``load`` (a ``LoadModel``)."""
        self.sim.set_load(workload, load, now=self._clock())

    async def set_replicas(self, workload: str | SimWorkload, replicas: int) -> None:
        """Scale ``workload``; Triton endpoints start and stop with their pods, listeners are told."""
        now = self._clock()
        if self._llm is not None:
            self._llm.advance(self.sim, now)  # NB: the past under the old replicas
        started, stopped = self.sim.set_replicas(workload, replicas, now=now)
        for p in stopped:
            for name in (_triton_name(p.key), _llm_name(p.key)):
                if name in self._server.names and self._grace_s:
                    await self._server.retire(name, after_s=self._grace_s)
                elif name in self._server.names:
                    await self._server.remove(name)
        if self._llm is not None:
            self._llm.sync(self.sim)
            for p in started:
                if p.workload_key in self._llm_servers and p.scheduled:
                    await self._add_llm(p.key)
        for p in started:
            if p.key in {t.key for t in self.sim.triton_pods()}:
                await self._add_triton(p.key)
        if started or stopped or self._listeners:
            objects = self.kube_objects()
            for listener in self._listeners:
                result = listener(objects)
                if asyncio.iscoroutine(result):
                    await result

    def _target(self, target: str | PodKey) -> str:
        if isinstance(target, tuple):
            return _llm_name(target) if _llm_name(target) in self._server.names else _triton_name(target)
        if target in self._server.names:
            return target
        return _dcgm_name(target)

    def faults(self, target: str | PodKey) -> Faults:
        """Live fault knobs of a node's dcgm-exporter (node name) or a Triton pod (``(ns, pod)``)."""
        return self._server.faults(self._target(target))

    def set_faults(self, target: str | PodKey, **knobs: Any) -> Faults:
        """``set_faults("node-a", hang=True)``; ``set_faults(("ns", "pod"))`` heals."""
        return self._server.set_faults(self._target(target), **knobs)

    def requests(self, target: str | PodKey) -> int:
        return self._server.requests(self._target(target))

    # endpoints -------------------------------------------------------------------------------------

    def _dcgm_renderer(self, node: str) -> Callable[[], str]:
        def render() -> str:
            return self.sim.render_dcgm(node, now=self._clock(), **self._dcgm_style)

        return render

    async def _add_triton(self, key: PodKey) -> None:
        def render() -> str:
            return self.sim.render_triton(key, now=self._clock())

        await self._server.add(_triton_name(key), render, nan_literal="Nan")

    async def _add_llm(self, key: PodKey) -> None:
        fleet = self._llm
        assert fleet is not None

        def render() -> str:
            return fleet.render(self.sim, key, now=self._clock())

        await self._server.add(_llm_name(key), render, nan_literal="NaN")
