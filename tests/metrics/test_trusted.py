"""Records built as trusted (``diagnosis.trusted``) are the records validation builds, field for field.

The per-GPU and per-pod records of ``gpuscale top`` skip pydantic's validation (the code computed every value
with its field's type). So each kind is checked against ``model_validate`` of its own fields: equal, the same
fields set, the same ``__dict__`` order, the same JSON and repr — on random DCGM values (NaN, ±Inf, DCGM blanks,
aliases, ``_total`` spellings, Xid windows) and on the random clusters of test_device_paths.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel

from gpuscale.metrics.attribution import Attributor, Target
from gpuscale.metrics.devices import DEVICE_SERIES, gpu_statuses, read_devices
from gpuscale.metrics.diagnosis import (
    KNOWN_DCGM_NAMES,
    GpuSignals,
    Severity,
    Verdict,
    VerdictCode,
    diagnose,
    load_policy,
    signals_from_dcgm,
    trusted,
)
from gpuscale.metrics.diagnosis.gpu_signals import _DCGM_FIELDS, _INT_FIELDS, _reported
from gpuscale.metrics.rollups import inference_stats, pod_statuses_of_readings
from gpuscale.metrics.store import MetricPoint
from gpuscale.model import pod
from tests.metrics.test_device_paths import as_read, cluster

POLICY = load_policy()
NAMES = sorted(KNOWN_DCGM_NAMES | {f"{n}_total" for n in KNOWN_DCGM_NAMES})
VALUES = st.one_of(
    st.floats(min_value=0, max_value=1e5),  # NB: a negative Xid fails in xid_info (not this test's subject)
    st.sampled_from([math.nan, math.inf, -math.inf, 1.5e14, 9.2e18, 0.0, 13.0, 79.0, 0x44, 1.0]),
    st.integers(min_value=0, max_value=200),
)


def assert_as_validated(record: BaseModel) -> None:
    again = type(record).model_validate({name: getattr(record, name) for name in record.model_fields_set})
    assert record == again
    assert record.model_fields_set == again.model_fields_set
    assert list(record.__dict__) == list(again.__dict__)
    assert record.model_dump_json() == again.model_dump_json()
    assert repr(record) == repr(again)


@given(
    st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=20),
    st.none() | st.dictionaries(st.sampled_from([0, 13, 31, 79]), VALUES, max_size=3),
    st.none() | st.sampled_from(["1g.10gb", "3g.40gb"]),
)
def test_signals_and_verdicts_are_what_validation_builds(values, xid_counts, mig_profile):
    signals = signals_from_dcgm(values, xid_counts=xid_counts, mig_profile=mig_profile)
    assert_as_validated(signals)
    verdict = diagnose(signals, POLICY)
    assert_as_validated(verdict)
    for finding in verdict.findings:
        assert_as_validated(finding)


@pytest.mark.parametrize("seed", range(20))
def test_gpu_and_pod_records_are_what_validation_builds(seed):
    series, inference = cluster(seed)
    readings = read_devices(as_read(series), Attributor(Target))
    for gpu in gpu_statuses(readings, POLICY):
        assert_as_validated(gpu)
    for record in pod_statuses_of_readings(readings, POLICY, inference=inference):
        assert_as_validated(record)


def test_inference_values_are_what_validation_builds():
    points = {"inference_queue_depth": {pod("a", "p"): MetricPoint(3, 1_790_000_000)}}
    points["inference_requests_per_second"] = {pod("a", "p"): MetricPoint(2.5, 1_789_999_990.0, 15.0)}
    (stats,) = inference_stats(points, now=1_790_000_001.0, max_age_seconds=60).values()
    assert_as_validated(stats)
    assert stats.queue_depth == 3.0 and isinstance(stats.queue_depth, float)
    assert stats.sampled_at == 1_789_999_990.0


SIGNAL_FIELDS = {
    name: (st.none() | st.integers(0, 99) if info.annotation == (int | None) else st.none() | st.floats(0, 1e4))
    for name, info in GpuSignals.model_fields.items()
}
SIGNAL_FIELDS["xid_counts"] = st.none() | st.dictionaries(st.integers(1, 99), st.integers(1, 9), max_size=2)
SIGNAL_FIELDS["mig_profile"] = st.none() | st.just("1g.10gb")


@given(
    st.lists(st.sampled_from(sorted(SIGNAL_FIELDS)), unique=True).flatmap(
        lambda names: st.fixed_dictionaries({n: SIGNAL_FIELDS[n] for n in names})
    )
)
def test_trusted_construction_is_validation_of_the_same_fields(fields):
    built, validated = trusted(GpuSignals)(dict(fields)), GpuSignals.model_validate(fields)
    assert built == validated
    assert built.model_fields_set == validated.model_fields_set == set(fields)
    assert list(built.__dict__) == list(validated.__dict__)
    assert built.model_dump_json() == validated.model_dump_json() and repr(built) == repr(validated)
    verdict = {"code": "idle", "severity": "ok", "explanation": "e", "next_step": "n"}
    built_verdict = trusted(Verdict)(verdict | {"code": VerdictCode.IDLE, "severity": Severity.OK})
    assert built_verdict == Verdict.model_validate(verdict) and built_verdict.findings == []


def test_models_with_validators_are_refused():
    from gpuscale.metrics.diagnosis import SmActiveThresholds

    with pytest.raises(TypeError, match="validators"):
        trusted(SmActiveThresholds)
    assert trusted(GpuSignals)({}) == GpuSignals() and trusted(Verdict)  # defaults as validation fills them


def test_device_series_are_known():
    assert set(DEVICE_SERIES) <= KNOWN_DCGM_NAMES


ALL_REPORTED = st.fixed_dictionaries({n: st.floats(0, 1e4) | st.integers(0, 99) for n in DEVICE_SERIES})
SPECIAL = [math.nan, math.inf, -math.inf, 1.5e14, -1.5e14, 9.2e18]


def signals_by_definition(values, xid_counts, mig_profile) -> GpuSignals:
    """GpuSignals field by field as diagnosis defines them: the first spelling (newer name, its ``_total``
    form, then older aliases) whose value is reported (finite, not a DCGM blank) — validated."""
    fields: dict = {}
    for field, names in _DCGM_FIELDS.items():
        spellings = [spelling for name in names for spelling in (name, f"{name}_total")]
        reported = [values[n] for n in spellings if n in values and _reported(values[n]) is not None]
        if reported:
            fields[field] = int(reported[0]) if field in _INT_FIELDS else float(reported[0])
    if xid_counts is not None:
        fields["xid_counts"] = {int(c): int(n) for c, n in xid_counts.items() if c and (_reported(n) or 0) > 0}
    elif "DCGM_EXP_XID_ERRORS_COUNT" in values or "DCGM_EXP_XID_ERRORS_COUNT_total" in values:
        fields["xid_counts"] = {}
    return GpuSignals.model_validate(fields | {"mig_profile": mig_profile})


@given(
    st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=20)
    | ALL_REPORTED  # the fast path
    | ALL_REPORTED.flatmap(  # … but for one value: NaN, ±Inf or a DCGM blank
        lambda values: st.tuples(st.sampled_from(sorted(values)), st.sampled_from(SPECIAL)).map(
            lambda one: values | {one[0]: one[1]}
        )
    ),
    st.none() | st.dictionaries(st.sampled_from([0, 13, 79]), VALUES, max_size=2),
)
def test_signals_are_what_the_field_definitions_give(values, xid_counts):
    signals = signals_from_dcgm(values, xid_counts=xid_counts)
    assert signals.model_dump_json() == signals_by_definition(values, xid_counts, None).model_dump_json()
