"""Simulated dcgm-exporter, Triton and LLM-server metrics endpoints: renderers, the simulation state, HTTP servers.

Layers, from pure to I/O, one module each:

- ``dcgm.render_dcgm`` / ``triton.render_triton`` / ``llm.render_llm`` — pure functions producing text in the
  exact upstream exposition format of ``tests/fixtures/dcgm/dcgm-exporter-h100-8gpu.prom`` (dcgm-exporter
  4.4.x: families in DCGM field-ID order, HELP/TYPE from the counters CSV, label order from
  ``render_metrics.go``, INT64 as ``%d``, DOUBLE as ``%f``, idle GPUs without pod labels, MIG instances
  repeating device-level values), of ``tests/fixtures/triton/triton.prom`` (prometheus-cpp: counters then
  gauges, labels sorted, per-instance series with ``gpu_uuid`` plus model-level series without it, NaN printed
  ``Nan``) and of ``tests/fixtures/llm/`` (vLLM, SGLang, TGI, NIM).
- ``simulation.ClusterSim`` — the in-memory simulation of a ``Scenario``: current placements, load models, and
  the cumulative state (energy, throttling time, Triton counters and queue backlogs) integrated over simulated
  time in steps of at most one second. Time is always passed in; nothing here reads a clock.
- ``endpoints.ExporterServer`` — one aiohttp runner serving any number of endpoints, each on its own 127.0.0.1
  port at ``/metrics``, rendering on every GET, with per-endpoint fault knobs (``Faults``).
- ``wiring.SimExporters`` — wires a scenario to an ``ExporterServer``: one dcgm-exporter per node and one
  Triton endpoint per running Triton pod, rendered from the load model at ``clock()``; run-time knobs
  ``set_load`` and ``set_replicas`` (for an HPA replay), fault injection, and ``kube_objects()`` with the
  real ports for the simulated Kubernetes API.
- ``clock`` — the clocks they read (``ManualClock`` for tests).

Load models see *seconds since the simulation started* (``clock()`` at ``start``), so a ``StepLoad`` at
60 s means one minute into the run whatever the clock's epoch.
"""

from gpuscale.sim.exporters.clock import Clock, ManualClock
from gpuscale.sim.exporters.dcgm import DCGM_FAMILIES, DcgmFamily, LabelStyle, render_dcgm
from gpuscale.sim.exporters.endpoints import CONTENT_TYPE, ExporterServer, Faults
from gpuscale.sim.exporters.simulation import ClusterSim
from gpuscale.sim.exporters.triton import TRITON_FAMILIES, TritonState, render_triton
from gpuscale.sim.exporters.wiring import SimExporters

__all__ = [
    "CONTENT_TYPE",
    "DCGM_FAMILIES",
    "TRITON_FAMILIES",
    "Clock",
    "ClusterSim",
    "DcgmFamily",
    "ExporterServer",
    "Faults",
    "LabelStyle",
    "ManualClock",
    "SimExporters",
    "TritonState",
    "render_dcgm",
    "render_triton",
]
