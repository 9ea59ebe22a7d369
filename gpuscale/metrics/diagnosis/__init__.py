"""The "util trap" diagnosis: one GPU's (or one pod's) signals → one typed verdict.

``DCGM_FI_DEV_GPU_UTIL`` counts time with *any* kernel running, so one small kernel or an NCCL hang reads
100 % (gpu-metrics.md §4). This package is the single place that reads the profiling fields next to it and
says what the GPU is really doing, for every consumer (``top``, ``report``, the controller):

    signals_from_dcgm(values)  →  GpuSignals  ─┐
    combine([GpuSignals, …])   →  GpuSignals  ─┼→  diagnose(signals, policy)  →  Verdict
    load_policy(policies/)     →  DiagnosisPolicy ┘

Contracts:

- ``diagnose`` is pure: no I/O, no clock, no globals; the same inputs give the same verdict.
- Every threshold comes from ``policies/diagnosis.yaml`` and ``policies/health.yaml``; the code only
  knows the *order* of the rules and the DCGM field definitions (bit names, field names).
- A signal that is not reported is ``None``, never 0. When a missing signal prevents a rule, the verdict
  says so (``missing`` plus the explanation) instead of guessing: e.g. on MIG, where GPU_UTIL is absent,
  GR_ENGINE_ACTIVE stands in (rule 5) and the verdict lists GPU_UTIL as missing.

Verdict priority (the first that applies is the verdict; all that apply are ``findings``):

    unhealthy > throttled > idle / idle-holding-memory > under-filled > memory-bound > precision
    > low-occupancy > compute-bound > moderate;  unknown when nothing could be decided.

Nonfatal health findings (a nonfatal Xid, remapped rows) and temperature warnings never decide the verdict
but raise its ``severity``: a compute-bound GPU with a fresh Xid 13 is ``compute-bound`` at ``warning``.

The package, by concern: ``gpu_signals`` (the DCGM facts, ``GpuSignals``, reading and combining it, clock-event
decoding), ``diagnosis_policy`` (the two policy files as models), ``verdict_codes`` and ``verdicts`` (the codes
and records), ``health_rules`` and ``workload_rules`` (the findings), ``gpu_diagnosis`` (``diagnose``: the
findings → one verdict) and ``serving_diagnosis`` (an inference server's own verdict). Import from here.
"""

from gpuscale.metrics.diagnosis.diagnosis_policy import (
    BusyThresholds,
    ClockEventPolicy,
    CounterRule,
    DiagnosisPolicy,
    DiagnosisThresholds,
    DramThresholds,
    FindingSeverities,
    HealthPolicy,
    HealthSeverity,
    IdleThresholds,
    LowThreshold,
    MemoryHeldThresholds,
    NonNegative,
    Percent,
    Ratio,
    ServingCode,
    ServingThresholds,
    SmActiveThresholds,
    TemperatureThresholds,
    Text,
    UnknownXidRule,
    VerdictText,
    XidInfo,
    load_policy,
    xid_info,
)
from gpuscale.metrics.diagnosis.gpu_diagnosis import diagnose
from gpuscale.metrics.diagnosis.gpu_signals import (
    CLOCK_EVENT_BITS,
    DRAM_ACTIVE,
    FB_USED,
    GPU_UTIL,
    GR_ENGINE_ACTIVE,
    KNOWN_DCGM_NAMES,
    SM_ACTIVE,
    SM_OCCUPANCY,
    TENSOR_ACTIVE,
    ClockEventName,
    GpuSignals,
    combine,
    decode_clock_events,
    signals_from_dcgm,
)
from gpuscale.metrics.diagnosis.health_rules import health_findings
from gpuscale.metrics.diagnosis.serving_diagnosis import ServingSignals, ServingVerdict, diagnose_serving
from gpuscale.metrics.diagnosis.trusted_records import trusted
from gpuscale.metrics.diagnosis.verdict_codes import FindingCode, Severity, VerdictCode
from gpuscale.metrics.diagnosis.verdicts import Finding, Verdict

__all__ = [
    "CLOCK_EVENT_BITS",
    "DRAM_ACTIVE",
    "FB_USED",
    "GPU_UTIL",
    "GR_ENGINE_ACTIVE",
    "KNOWN_DCGM_NAMES",
    "SM_ACTIVE",
    "SM_OCCUPANCY",
    "TENSOR_ACTIVE",
    "BusyThresholds",
    "ClockEventName",
    "ClockEventPolicy",
    "CounterRule",
    "DiagnosisPolicy",
    "DiagnosisThresholds",
    "DramThresholds",
    "Finding",
    "FindingCode",
    "FindingSeverities",
    "GpuSignals",
    "HealthPolicy",
    "HealthSeverity",
    "IdleThresholds",
    "LowThreshold",
    "MemoryHeldThresholds",
    "NonNegative",
    "Percent",
    "Ratio",
    "ServingCode",
    "ServingSignals",
    "ServingThresholds",
    "ServingVerdict",
    "Severity",
    "SmActiveThresholds",
    "TemperatureThresholds",
    "Text",
    "UnknownXidRule",
    "Verdict",
    "VerdictCode",
    "VerdictText",
    "XidInfo",
    "combine",
    "decode_clock_events",
    "diagnose",
    "diagnose_serving",
    "health_findings",
    "load_policy",
    "signals_from_dcgm",
    "trusted",
    "xid_info",
]
