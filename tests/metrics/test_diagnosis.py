"""Diagnosis ("util trap") behaviour: signals → verdict, policy loading, helpers.

Scope: the verdict table (priority and thresholds), the fixture GPUs (8×H100, MIG, 3.x legacy) read from
the .prom files, missing-signal handling, health findings, pod-level combination, and policy validation.
Values of fixture GPUs are read from the fixture files, never copied into the tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuscale.config import read_yaml
from gpuscale.errors import ConfigError
from gpuscale.metrics.diagnosis import (
    FindingCode,
    GpuSignals,
    Severity,
    Verdict,
    VerdictCode,
    combine,
    decode_clock_events,
    diagnose,
    load_policy,
    signals_from_dcgm,
    xid_info,
)
from gpuscale.policy_files import shipped

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm"
H100 = FIXTURES / "dcgm-exporter-h100-8gpu.prom"
MIG = FIXTURES / "dcgm-exporter-mig.prom"
LEGACY = FIXTURES / "dcgm-exporter-3x-legacy.prom"

Device = tuple[str, str | None]  # (gpu, GPU_I_ID)


def read_devices(path: Path) -> dict[Device, dict[str, Any]]:
    """Per device: latest value per DCGM name, windowed Xid counts, MIG profile (from the exposition text)."""
    devices: dict[Device, dict[str, Any]] = {}
    for family in text_string_to_metric_families(path.read_text()):
        for sample in family.samples:
            labels = sample.labels
            device = devices.setdefault(
                (labels["gpu"], labels.get("GPU_I_ID")),
                {"values": {}, "xid_counts": None, "mig_profile": labels.get("GPU_I_PROFILE")},
            )
            if "clock_event" in labels:
                continue
            if "xid" in labels:
                device["xid_counts"] = {**(device["xid_counts"] or {}), int(labels["xid"]): sample.value}
                continue
            device["values"][sample.name] = sample.value
    return devices


def signals_of(path: Path, gpu: str, instance: str | None = None) -> GpuSignals:
    device = read_devices(path)[(gpu, instance)]
    return signals_from_dcgm(device["values"], xid_counts=device["xid_counts"], mig_profile=device["mig_profile"])


def value_of(path: Path, gpu: str, name: str) -> float:
    return read_devices(path)[(gpu, None)]["values"][name]


@pytest.fixture(scope="module")
def policy():
    return load_policy()


@pytest.fixture
def policy_dir(tmp_path: Path) -> Path:
    """A writable copy of the shipped policies."""
    for name in ("diagnosis.yaml", "health.yaml"):
        (tmp_path / name).write_text(shipped(name).read_text(encoding="utf-8"), encoding="utf-8")
    return tmp_path


def edit(path: Path, change) -> None:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def codes(verdict: Verdict) -> list[str]:
    return [f.code.value for f in verdict.findings]


# --- the verdict table -------------------------------------------------------------------------------

BUSY_EFFECTIVE = {"gpu_util_percent": 100, "sm_active": 0.9, "tensor_active": 0.6, "dram_active": 0.4}

VERDICTS = [
    # (case, signals, expected verdict code)
    (
        "util 95, tensor 0.20, DRAM 0.90 → memory-bound",
        {"gpu_util_percent": 95, "sm_active": 0.7, "tensor_active": 0.2, "dram_active": 0.9},
        "memory-bound",
    ),
    (
        "util 100, SM 0.38 → under-filled",
        {"gpu_util_percent": 100, "sm_active": 0.38, "dram_active": 0.2},
        "under-filled",
    ),
    (
        "under-filled beats memory-bound",
        {"gpu_util_percent": 100, "sm_active": 0.3, "dram_active": 0.9},
        "under-filled",
    ),
    ("util 89 with SM 0.3 is not the trap", {"gpu_util_percent": 89, "sm_active": 0.3, "dram_active": 0.1}, "moderate"),
    ("high SM, low tensor → precision", {**BUSY_EFFECTIVE, "tensor_active": 0.05}, "precision"),
    ("effective SMs, few warps → low-occupancy", {**BUSY_EFFECTIVE, "sm_occupancy": 0.1}, "low-occupancy"),
    ("effective use → compute-bound", {**BUSY_EFFECTIVE, "sm_occupancy": 0.3}, "compute-bound"),
    ("SM between 0.5 and 0.8 → moderate", {"gpu_util_percent": 80, "sm_active": 0.6, "dram_active": 0.3}, "moderate"),
    ("nothing running → idle", {"gpu_util_percent": 0, "sm_active": 0, "fb_used_mib": 0}, "idle"),
    (
        "idle but memory held → idle-holding-memory",
        {"gpu_util_percent": 0, "sm_active": 0.0, "fb_used_mib": 40000},
        "idle-holding-memory",
    ),
    ("0x4 (power_cap) alone under load is normal", {**BUSY_EFFECTIVE, "clock_event_reasons": 0x4}, "compute-bound"),
    ("0x1 (gpu_idle) is benign", {"gpu_util_percent": 0, "fb_used_mib": 0, "clock_event_reasons": 0x1}, "idle"),
    ("0x8 hw_slowdown → throttled", {**BUSY_EFFECTIVE, "clock_event_reasons": 0x8}, "throttled"),
    ("0x40 hw_thermal → throttled", {**BUSY_EFFECTIVE, "clock_event_reasons": 0x44}, "throttled"),
    ("0x80 hw_power_brake → throttled", {**BUSY_EFFECTIVE, "clock_event_reasons": 0x80}, "throttled"),
    ("fatal Xid → unhealthy", {**BUSY_EFFECTIVE, "last_xid": 79}, "unhealthy"),
    ("ECC DBE → unhealthy", {**BUSY_EFFECTIVE, "ecc_dbe_volatile": 2}, "unhealthy"),
    ("row-remap failure → unhealthy", {**BUSY_EFFECTIVE, "row_remap_failure": 1}, "unhealthy"),
    ("unhealthy beats throttled", {**BUSY_EFFECTIVE, "clock_event_reasons": 0x8, "last_xid": 48}, "unhealthy"),
    ("nonfatal Xid leaves the workload verdict", {**BUSY_EFFECTIVE, "last_xid": 13}, "compute-bound"),
    ("no signals at all → unknown", {}, "unknown"),
]


@pytest.mark.parametrize(("signals", "expected"), [c[1:] for c in VERDICTS], ids=[c[0] for c in VERDICTS])
def test_verdict_table(policy, signals, expected):
    verdict = diagnose(GpuSignals(**signals), policy)
    assert verdict.code == expected
    assert verdict.explanation
    assert verdict.next_step == policy.diagnosis.verdicts[verdict.code].next_step or verdict.code == "unhealthy"


def test_explanation_cites_the_numbers(policy):
    verdict = diagnose(GpuSignals(gpu_util_percent=95, sm_active=0.7, tensor_active=0.2, dram_active=0.9), policy)
    assert "DRAM active 90%" in verdict.explanation
    assert "60%" in verdict.explanation  # the threshold it crossed


def test_nonfatal_xid_raises_severity_but_not_the_code(policy):
    verdict = diagnose(GpuSignals(**BUSY_EFFECTIVE, last_xid=13), policy)
    assert verdict.code == "compute-bound"
    assert verdict.severity == Severity.WARNING
    (xid,) = [f for f in verdict.findings if f.code == FindingCode.XID]
    assert xid.xid == 13 and xid.action == "RESTART_APP"


def test_stale_last_xid_outside_the_window_is_informational(policy):
    verdict = diagnose(GpuSignals(**BUSY_EFFECTIVE, last_xid=48, xid_counts={}), policy)
    assert verdict.code == "compute-bound"
    (xid,) = verdict.findings[:1]
    assert xid.code == FindingCode.XID and xid.severity == Severity.INFO
    assert "not in the current Xid window" in xid.explanation


def test_unknown_xid_is_reported_not_dropped(policy):
    verdict = diagnose(GpuSignals(**BUSY_EFFECTIVE, xid_counts={999: 2}), policy)
    (xid,) = [f for f in verdict.findings if f.xid == 999]
    assert "not in the health policy" in xid.explanation and xid.action == "LOOK_UP_XID"


def test_temperature_is_a_finding_not_a_verdict(policy):
    verdict = diagnose(GpuSignals(**BUSY_EFFECTIVE, gpu_temp_c=90, memory_temp_c=0), policy)
    assert verdict.code == "compute-bound"
    assert codes(verdict) == ["temperature", "compute-bound"]
    assert "memory" not in verdict.findings[0].explanation  # 0 °C = no memory sensor (DE #460)


def test_diagnose_is_pure(policy):
    signals = GpuSignals(**BUSY_EFFECTIVE, last_xid=13, clock_event_reasons=0x2C)
    first = diagnose(signals, policy)
    assert diagnose(signals, policy) == first
    assert Verdict.model_validate_json(first.model_dump_json()) == first


# --- 8×H100 fixture ------------------------------------------------------------------------------------

H100_EXPECTED = {
    "0": "moderate",
    "1": "under-filled",
    "2": "compute-bound",
    "3": "compute-bound",
    "4": "compute-bound",
    "5": "unhealthy",
    "6": "idle",
    "7": "moderate",
}


@pytest.mark.parametrize(("gpu", "expected"), H100_EXPECTED.items())
def test_h100_fixture_verdicts(policy, gpu, expected):
    assert diagnose(signals_of(H100, gpu), policy).code == expected


def test_h100_gpu1_is_the_util_trap(policy):
    util = value_of(H100, "1", "DCGM_FI_DEV_GPU_UTIL")
    sm = value_of(H100, "1", "DCGM_FI_PROF_SM_ACTIVE")
    dram = value_of(H100, "1", "DCGM_FI_PROF_DRAM_ACTIVE")
    assert util >= policy.diagnosis.busy.gpu_util_percent and sm < policy.diagnosis.sm_active.ineffective

    verdict = diagnose(signals_of(H100, "1"), policy)

    assert verdict.code == VerdictCode.UNDER_FILLED
    assert verdict.severity == Severity.WARNING
    assert f"GPU util {util:.0f}%" in verdict.explanation
    assert f"SM active {sm * 100:.0f}%" in verdict.explanation
    assert "batch" in verdict.next_step
    # DRAM 0.71 is above the bandwidth-bound threshold too: listed, after the verdict.
    assert codes(verdict) == ["under-filled", "memory-bound"]
    assert f"DRAM active {dram * 100:.0f}%" in verdict.findings[1].explanation


def test_h100_gpu5_faulty_has_every_finding(policy):
    verdict = diagnose(signals_of(H100, "5"), policy)

    assert verdict.code == VerdictCode.UNHEALTHY
    assert verdict.severity == Severity.CRITICAL
    found = codes(verdict)
    assert found.index("unhealthy") < found.index("xid") < found.index("throttled") < found.index("moderate")
    throttled = next(f for f in verdict.findings if f.code == FindingCode.THROTTLED)
    assert "0x2C" in throttled.explanation
    assert "hw_slowdown" in throttled.explanation and "sw_thermal" in throttled.explanation
    assert "also power_cap, normal" in throttled.explanation
    xid63 = next(f for f in verdict.findings if f.xid == 63)
    assert "Row-remap or page-retire event" in xid63.explanation and xid63.action == "IGNORE"
    assert xid63.severity == Severity.INFO
    xid94 = next(f for f in verdict.findings if f.xid == 94)  # only in the windowed count
    assert "Contained ECC error" in xid94.explanation and xid94.severity == Severity.WARNING
    assert "memory-errors" in found and "temperature" in found


def test_h100_power_capped_training_is_not_throttled(policy):
    signals = signals_of(H100, "2")
    assert signals.clock_event_reasons == 0x4
    verdict = diagnose(signals, policy)
    assert verdict.code == "compute-bound" and verdict.severity == Severity.OK
    assert "throttled" not in codes(verdict)


def test_h100_gpu6_idle_names_the_clock_event(policy):
    verdict = diagnose(signals_of(H100, "6"), policy)
    assert verdict.code == VerdictCode.IDLE
    assert "gpu_idle" in verdict.explanation and verdict.missing == []


# --- MIG and exporters without profiling fields ---------------------------------------------------------

MIG_EXPECTED = {
    ("0", "2"): "moderate",
    ("0", "3"): "moderate",
    ("0", "9"): "moderate",
    ("0", "10"): "idle",
    ("1", "1"): "moderate",
    ("1", "2"): "idle",
    ("2", None): "unknown",  # MIG disabled: GPU_UTIL 96 but no SM_ACTIVE to tell busy from effective
}


@pytest.mark.parametrize(("device", "expected"), MIG_EXPECTED.items(), ids=[f"{g}/{i}" for g, i in MIG_EXPECTED])
def test_mig_fixture_verdicts(policy, device, expected):
    assert diagnose(signals_of(MIG, *device), policy).code == expected


def test_mig_instance_uses_gr_engine_active_and_lists_missing(policy):
    device = read_devices(MIG)[("0", "2")]
    assert "DCGM_FI_DEV_GPU_UTIL" not in device["values"]
    gr = device["values"]["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]

    verdict = diagnose(signals_of(MIG, "0", "2"), policy)

    assert verdict.missing == ["GPU_UTIL", "SM_ACTIVE"]
    assert f"GR engine active {gr * 100:.0f}%" in verdict.explanation
    assert "MIG 3g.40gb" in verdict.explanation
    assert "SM_ACTIVE not reported" in verdict.explanation


def test_idle_mig_instance_misses_only_gpu_util(policy):
    verdict = diagnose(signals_of(MIG, "0", "10"), policy)
    assert verdict.code == "idle" and verdict.missing == ["GPU_UTIL"]


def test_mig_without_the_gr_bound_says_unknown(policy_dir):
    edit(policy_dir / "diagnosis.yaml", lambda d: d["sm_active"].update(gr_engine_upper_bound=False))
    verdict = diagnose(signals_of(MIG, "0", "2"), load_policy(policy_dir))
    assert verdict.code == VerdictCode.UNKNOWN
    assert "cannot tell busy from effective" in verdict.explanation


def test_mig_disabled_gpu_without_sm_active_is_unknown(policy):
    verdict = diagnose(signals_of(MIG, "2"), policy)
    assert verdict.code == VerdictCode.UNKNOWN
    assert verdict.missing == ["SM_ACTIVE"]
    assert "GPU util 96%" in verdict.explanation
    assert "SM_ACTIVE not reported (profiling metrics disabled): cannot tell busy from effective" in verdict.explanation


def test_legacy_exporter_without_dcp_fields(policy):
    signals = signals_of(LEGACY, "0")
    assert signals.sm_active is None and signals.last_xid == 13 and signals.xid_counts is None

    verdict = diagnose(signals, policy)

    assert verdict.code == VerdictCode.UNKNOWN
    assert "SM_ACTIVE" in verdict.missing
    assert "SM_ACTIVE not reported" in verdict.explanation
    assert "GPU util 88%" in verdict.explanation and "GR engine active 86%" in verdict.explanation
    (xid,) = verdict.findings
    assert xid.code == FindingCode.XID and xid.xid == 13 and xid.action == "RESTART_APP"
    assert "Graphics engine exception" in xid.explanation
    assert verdict.severity == Severity.WARNING  # raised by the nonfatal Xid


def test_legacy_idle_gpu(policy):
    assert diagnose(signals_of(LEGACY, "1"), policy).code == "idle"


def test_memory_bound_without_sm_active_says_what_was_skipped(policy):
    verdict = diagnose(GpuSignals(gpu_util_percent=97, dram_active=0.85), policy)
    assert verdict.code == "memory-bound"
    assert "SM_ACTIVE" in verdict.missing and "SM_ACTIVE not reported" in verdict.explanation


# --- pod level -----------------------------------------------------------------------------------------


def test_combine_training_pod_takes_the_worst_health(policy):
    gpus = [signals_of(H100, g) for g in ("2", "3", "4", "5")]
    pod = combine(gpus, policy=policy)

    assert pod.sm_active == pytest.approx(sum(g.sm_active for g in gpus) / 4)
    assert pod.fb_used_mib == sum(g.fb_used_mib for g in gpus)
    assert pod.power_watts == pytest.approx(sum(g.power_watts for g in gpus))
    assert pod.clock_event_reasons == 0x2C
    assert pod.gpu_temp_c == max(g.gpu_temp_c for g in gpus)
    assert pod.sm_clock_mhz == min(g.sm_clock_mhz for g in gpus)
    assert pod.xid_counts == {94: 1, 63: 1}
    assert diagnose(pod, policy).code == "unhealthy"


def test_combine_keeps_the_most_severe_last_xid(policy):
    pod = combine([GpuSignals(last_xid=13), GpuSignals(last_xid=0), GpuSignals(last_xid=79)], policy=policy)
    assert pod.last_xid == 79
    assert combine([GpuSignals(last_xid=0), GpuSignals()]).last_xid == 0
    assert combine([]) == GpuSignals()


def test_combine_mean_ignores_gpus_that_do_not_report():
    pod = combine([GpuSignals(sm_active=0.8), GpuSignals(sm_active=None), GpuSignals(sm_active=0.4)])
    assert pod.sm_active == pytest.approx(0.6)
    assert pod.tensor_active is None


# --- helpers -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("mask", "names"),
    [
        (0x0, []),
        (0x1, ["gpu_idle"]),
        (0x4, ["power_cap"]),
        (0x2C, ["power_cap", "hw_slowdown", "sw_thermal"]),
        (0xC8, ["hw_slowdown", "hw_thermal", "hw_power_brake"]),
        (0x204, ["power_cap", "0x200"]),
    ],
)
def test_decode_clock_events(mask, names):
    assert decode_clock_events(mask) == names


def test_xid_info_from_the_health_table(policy):
    info = xid_info(79, policy=policy)
    assert (info.severity, info.action) == ("fatal", "RESTART_BM")
    assert "fallen off the bus" in info.meaning
    assert xid_info(12345, policy=policy).severity == "nonfatal"


def test_signals_from_dcgm_names_and_sentinels():
    signals = signals_from_dcgm(
        {
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 8.0,  # pre-rename name of field 112
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL_total": 1.0,  # prometheus_client's counter suffix
            "DCGM_FI_DEV_MEMORY_TEMP": 9223372036854775794.0,  # DCGM blank leaked by an old exporter
            "DCGM_FI_PROF_SM_ACTIVE": float("nan"),
            "DCGM_FI_DEV_GPU_UTIL": 42.0,
            "DCGM_FI_DEV_UNRELATED": 1.0,
        }
    )
    assert signals.clock_event_reasons == 8
    assert signals.ecc_dbe_volatile == 1
    assert signals.memory_temp_c is None and signals.sm_active is None
    assert signals.gpu_util_percent == 42.0
    assert signals.xid_counts is None  # window not reported


def test_signals_from_dcgm_prefers_the_new_clock_events_name():
    signals = signals_from_dcgm({"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 4, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 8})
    assert signals.clock_event_reasons == 4
    # A blank or NaN under the new name is "not reported": the old name's value is used.
    for blank in (float("nan"), float("inf"), 9.223372036854775794e18):
        values = {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": blank, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 8}
        assert signals_from_dcgm(values).clock_event_reasons == 8
    assert signals_from_dcgm({"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float("nan")}).clock_event_reasons is None


def test_signals_from_dcgm_xid_window():
    assert signals_from_dcgm({"DCGM_EXP_XID_ERRORS_COUNT_total": 0}).xid_counts == {}
    assert signals_from_dcgm({}, xid_counts={94: 1.0, 63: 0.0}).xid_counts == {94: 1}


def test_a_negative_xid_from_a_broken_exporter_is_not_an_xid(policy):
    """Xids are positive: a negative gauge or window label is not reported (it crashed diagnose with a
    ValidationError from the Xid table before), and the GPU still gets a verdict."""
    values = {"DCGM_FI_DEV_XID_ERRORS": -1.0, "DCGM_FI_DEV_GPU_UTIL": 50.0}
    signals = signals_from_dcgm(values, xid_counts={-5: 2.0, 79: 1.0})
    assert signals.last_xid is None and signals.xid_counts == {79: 1}
    assert diagnose(signals, policy).code
    assert diagnose(signals_from_dcgm(values), policy).code


# --- the policy files ----------------------------------------------------------------------------------


def test_thresholds_come_from_the_policy_file(policy, policy_dir):
    gpu1 = signals_of(H100, "1")  # SM 0.38
    assert diagnose(gpu1, policy).code == "under-filled"

    edit(policy_dir / "diagnosis.yaml", lambda d: d["sm_active"].update(ineffective=0.3))
    assert diagnose(gpu1, load_policy(policy_dir)).code == "memory-bound"

    # With SM 0.38 now "active enough", its occupancy (0.11) is what stands out once DRAM is not bound.
    edit(policy_dir / "diagnosis.yaml", lambda d: d["dram_active"].update(bandwidth_bound=0.75))
    assert diagnose(gpu1, load_policy(policy_dir)).code == "low-occupancy"


def test_health_table_comes_from_the_policy_file(policy_dir):
    def make_13_fatal(data):
        next(x for x in data["xids"] if x["code"] == 13)["severity"] = "fatal"

    edit(policy_dir / "health.yaml", make_13_fatal)
    assert diagnose(signals_of(LEGACY, "0"), load_policy(policy_dir)).code == "unhealthy"


def test_abnormal_clock_bits_come_from_the_policy_file(policy_dir):
    signals = GpuSignals(**BUSY_EFFECTIVE, clock_event_reasons=0x4)
    edit(policy_dir / "diagnosis.yaml", lambda d: d["clock_events"].update(abnormal=["power_cap"]))
    assert diagnose(signals, load_policy(policy_dir)).code == "throttled"


def _set(*keys: str, value: Any):
    def change(data):
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return change


def _drop(*keys: str):
    def change(data):
        node = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]

    return change


def _xid0(field: str, value: Any):
    def change(data):
        data["xids"][0][field] = value

    return change


POLICY_ERRORS = [
    # (case, file, change, text the error must contain)
    ("bad type", "diagnosis.yaml", _set("sm_active", "effective", value="high"), "sm_active.effective"),
    ("quoted number", "diagnosis.yaml", _set("busy", "gpu_util_percent", value="90"), "busy.gpu_util_percent"),
    (
        "ratio above 1",
        "diagnosis.yaml",
        _set("dram_active", "bandwidth_bound", value=60),
        "dram_active.bandwidth_bound",
    ),
    ("unknown key", "diagnosis.yaml", _set("sm_active", "efective", value=0.8), "sm_active.efective: unknown key"),
    ("unknown top-level key", "diagnosis.yaml", _set("thresholds", value={}), "thresholds: unknown key"),
    (
        "unknown bit name",
        "diagnosis.yaml",
        _set("clock_events", "abnormal", value=["hw_slowdwn"]),
        "clock_events.abnormal[0]",
    ),
    ("missing verdict text", "diagnosis.yaml", _drop("verdicts", "precision"), "missing precision"),
    (
        "inverted SM thresholds",
        "diagnosis.yaml",
        _set("sm_active", "ineffective", value=0.9),
        "must not exceed effective",
    ),
    ("bad Xid severity", "health.yaml", _xid0("severity", "deadly"), "xids[0].severity"),
    ("unknown Xid key", "health.yaml", _xid0("sevrity", "fatal"), "xids[0].sevrity: unknown key"),
    ("undocumented action", "health.yaml", _xid0("action", "PRAY"), "no entry for PRAY"),
    ("Xid listed twice", "health.yaml", _xid0("code", 31), "code 31 is listed twice"),
]


@pytest.mark.parametrize(
    ("file", "change", "expected"), [c[1:] for c in POLICY_ERRORS], ids=[c[0] for c in POLICY_ERRORS]
)
def test_policy_errors_name_file_and_field(policy_dir, file, change, expected):
    edit(policy_dir / file, change)
    with pytest.raises(ConfigError) as caught:
        load_policy(policy_dir)
    message = str(caught.value)
    assert caught.value.path == str(policy_dir / file)
    assert file in message
    assert expected in message


def test_unknown_key_lists_the_allowed_keys(policy_dir):
    edit(policy_dir / "diagnosis.yaml", _set("idle", "busy", value=5))
    with pytest.raises(ConfigError, match=r"idle\.busy: unknown key \(allowed: busy_percent, sm_active\)"):
        load_policy(policy_dir)


def test_policy_yaml_syntax_and_missing_file(policy_dir):
    (policy_dir / "health.yaml").write_text("xids: [\n")
    with pytest.raises(ConfigError, match=r"health\.yaml: line \d+, column \d+: invalid YAML"):
        load_policy(policy_dir)
    with pytest.raises(ConfigError, match=r"health\.yaml: cannot read file"):
        read_yaml(policy_dir / "missing" / "health.yaml")
    # A policies directory overrides the files it holds; one it does not hold stays the shipped one.
    (policy_dir / "health.yaml").unlink()
    assert load_policy(policy_dir).health == load_policy().health


def test_a_key_given_twice_is_refused_with_both_lines(policy_dir):
    """YAML keeps the last of two equal keys silently: an edited threshold undone by a forgotten copy below it."""
    path = policy_dir / "diagnosis.yaml"
    text = path.read_text()
    path.write_text(text + "\nidle:\n  busy_percent: 99\n")
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("idle:"))
    last = len(text.splitlines()) + 2
    with pytest.raises(
        ConfigError, match=rf"diagnosis\.yaml: line {last}: key 'idle' appears twice \(first on line {first}\)"
    ):
        load_policy(policy_dir)


def test_shipped_policy_loads_and_covers_the_reference_xid_table(policy):
    table = {x.code for x in policy.health.xids}
    assert {13, 31, 43, 45, 48, 62, 63, 64, 74, 79, 94, 95, 119, 120, 140, 154} <= table
    fatal = {x.code for x in policy.health.xids if x.severity == "fatal"}
    assert fatal == {48, 62, 64, 74, 79, 95, 119, 120, 140}
