"""The exposition parser: agreement with prometheus_client on every fixture, hand-checked fixture values,
format features (escapes, timestamps, special values, OpenMetrics), DCGM blank sentinels, family grouping,
malformed input (line number and reason) and generated round trips.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Exemplar

from gpuscale.errors import ExpositionError
from gpuscale.metrics.exposition import (
    _METRIC_NAME_RE,
    MetricFamily,
    Sample,
    _is_metric_name,
    _parse,
    is_dcgm_blank,
    parse_families,
    parse_samples,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
PROM_FILES = sorted(FIXTURES.glob("*/*.prom"))
H100 = FIXTURES / "dcgm" / "dcgm-exporter-h100-8gpu.prom"
MIG = FIXTURES / "dcgm" / "dcgm-exporter-mig.prom"
TRITON = FIXTURES / "triton" / "triton.prom"
TRITON_SUMMARIES = FIXTURES / "triton" / "triton-summaries-histograms.prom"

SampleKey = tuple[str, tuple[tuple[str, str], ...], object, float | None]


def key(name: str, labels: dict[str, str], value: float, timestamp: float | None) -> SampleKey:
    """Comparable identity of a sample; NaN compares equal to NaN."""
    return name, tuple(sorted(labels.items())), "NaN" if math.isnan(value) else float(value), timestamp


def keys(samples: list[Sample]) -> list[SampleKey]:
    return [key(s.name, s.labels, s.value, s.timestamp) for s in samples]


def reference_samples(text: str) -> list[tuple[SampleKey, int | float]]:
    """prometheus_client's samples, with sample names as written, and each raw value (int iff written so).

    prometheus_client appends ``_total`` to the samples of a counter whose TYPE name lacks it; undo that.
    """
    out = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            name = s.name
            if family.type == "counter" and f"# TYPE {family.name} counter\n" in text:
                name = name.removesuffix("_total")
            timestamp = None if s.timestamp is None else float(s.timestamp)
            out.append((key(name, s.labels, s.value, timestamp), s.value))
    return out


def reference_is_blank(sample_key: SampleKey, raw: int | float) -> bool:
    """The DCGM rule, stated independently: prometheus_client returns an int iff the value was an int literal."""
    if not sample_key[0].startswith("DCGM_"):
        return False
    if isinstance(raw, int):
        return raw >= 0x7FFFFFFFFFFFFFF0
    return raw >= 1.4e14


def sample(samples: list[Sample], name: str, **labels: str) -> Sample:
    found = [s for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def error_of(text: str, **kwargs: bool | None) -> ExpositionError:
    with pytest.raises(ExpositionError) as info:
        parse_samples(text, source="test.prom", **kwargs)
    return info.value


# --- agreement with prometheus_client ----------------------------------------------------------------


class TestFixturesAgreeWithPrometheusClient:
    @pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
    def test_same_samples_except_the_dcgm_blanks_we_drop(self, path: Path) -> None:
        text = path.read_text()
        reference = reference_samples(text)
        expected = [k for k, raw in reference if not reference_is_blank(k, raw)]
        assert keys(parse_samples(text, source=str(path))) == expected

    @pytest.mark.parametrize("path", PROM_FILES, ids=lambda p: p.name)
    def test_fixtures_hold_no_blanks(self, path: Path) -> None:
        # So the test above compares every sample: nothing is dropped from the fixtures as shipped.
        assert not [k for k, raw in reference_samples(path.read_text()) if reference_is_blank(k, raw)]

    def test_injected_sentinels_are_exactly_the_samples_dropped(self) -> None:
        labels = 'gpu="0",UUID="GPU-x"'
        injected = {
            f"DCGM_FI_DEV_MEMORY_TEMP{{{labels}}} 9223372036854775794",  # DCGM_INT64_BLANK + 2
            f"DCGM_FI_DEV_FB_USED{{{labels}}} 9223372036854775792",  # DCGM_INT64_BLANK
            f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 140737488355330.000000",  # DCGM_FP64_BLANK + 2
            f"DCGM_FI_PROF_SM_ACTIVE{{{labels}}} 140737488355328.000000",  # DCGM_FP64_BLANK
        }
        kept = {
            f"DCGM_FI_DEV_THERMAL_VIOLATION{{{labels}}} 9223372036854775000",  # below the int64 band
            f"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{labels}}} 288230376151711744",  # int64, > 1.4e14
            f"not_dcgm_metric{{{labels}}} 9223372036854775794",
            f"nv_energy_consumption{{{labels}}} 140737488355328.000000",
        }
        text = H100.read_text() + "\n".join(sorted(injected | kept)) + "\n"
        reference = reference_samples(text)
        dropped = [k for k, raw in reference if reference_is_blank(k, raw)]
        assert len(dropped) == len(injected)
        assert keys(parse_samples(text)) == [k for k, raw in reference if not reference_is_blank(k, raw)]


# --- hand-checked values -----------------------------------------------------------------------------


class TestHandCheckedFixtureValues:
    def test_h100_counts(self) -> None:
        text = H100.read_text()
        families = parse_families(text)
        assert len(families) == 39
        assert len(parse_samples(text)) == 312
        assert sum(len(f.samples) for f in families) == 312

    def test_h100_gpu1_shows_the_util_trap(self) -> None:
        samples = parse_samples(H100.read_text())
        assert sample(samples, "DCGM_FI_DEV_GPU_UTIL", gpu="1").value == 100
        # NB: the fixture README rounds this to 0.38; the file says 0.376559 (dcgm-exporter prints %f).
        sm_active = sample(samples, "DCGM_FI_PROF_SM_ACTIVE", gpu="1")
        assert sm_active.value == 0.376559
        assert sm_active.labels["pod"] == "llama3-8b-instruct-5c6b9d8f47-qz7mh"
        assert sm_active.labels["modelName"] == "NVIDIA H100 80GB HBM3"
        assert sm_active.labels["pod_uid"] == ""
        assert sm_active.timestamp is None

    def test_h100_idle_gpu6_has_no_pod_labels(self) -> None:
        gpu6 = sample(parse_samples(H100.read_text()), "DCGM_FI_DEV_SM_CLOCK", gpu="6")
        assert gpu6.value == 345
        assert "pod" not in gpu6.labels
        assert list(gpu6.labels) == [
            "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
        ]  # fmt: skip

    def test_h100_power_violation_above_the_fp64_threshold_is_kept(self) -> None:
        # An int64 nanosecond counter, not a blank: the fp64 rule (>= 1.4e14) must not touch it.
        samples = parse_samples(H100.read_text())
        assert sample(samples, "DCGM_FI_DEV_POWER_VIOLATION", gpu="2").value == 289114330055100
        assert len([s for s in samples if s.name == "DCGM_FI_DEV_POWER_VIOLATION" and s.value > 1.4e14]) == 4

    def test_h100_family_metadata(self) -> None:
        families = {f.name: f for f in parse_families(H100.read_text())}
        sm_clock = families["DCGM_FI_DEV_SM_CLOCK"]
        assert (sm_clock.type, sm_clock.help) == ("gauge", "SM clock frequency (in MHz).")
        assert families["DCGM_FI_DEV_POWER_VIOLATION"].type == "counter"
        assert len(sm_clock.samples) == 8

    def test_mig_instances_have_no_gpu_util(self) -> None:
        samples = parse_samples(MIG.read_text())
        assert [s.labels["gpu"] for s in samples if s.name == "DCGM_FI_DEV_GPU_UTIL"] == ["2"]
        engine = sample(samples, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpu="0", GPU_I_ID="2")
        assert engine.value == 0.781204
        assert engine.labels["GPU_I_PROFILE"] == "3g.40gb"

    def test_triton_values(self) -> None:
        samples = parse_samples(TRITON.read_text())
        assert len(samples) == 67
        assert sample(samples, "nv_gpu_utilization").value == 0.63
        # The model-level series (no gpu_uuid) holds the pending count; the per-instance one stays 0.
        pending = {
            s.labels.get("gpu_uuid", "model-level"): s.value
            for s in samples
            if s.name == "nv_inference_pending_request_count" and s.labels["model"] == "bert_qa_onnx"
        }
        assert pending == {"model-level": 118, "GPU-0e2ffabe-427b-c4aa-320d-e2f590b86d48": 0}

    def test_triton_nan_quantiles_parse_to_nan(self) -> None:
        samples = parse_samples(TRITON_SUMMARIES.read_text())
        quantiles = [s for s in samples if s.name == "nv_inference_request_summary_us"]
        # Unobserved model-level series (no gpu_uuid) print "Nan"; per-instance ones have values.
        unobserved = [s for s in quantiles if "gpu_uuid" not in s.labels]
        observed = [s for s in quantiles if "gpu_uuid" in s.labels]
        assert (len(unobserved), len(observed)) == (10, 10)
        assert all(math.isnan(s.value) for s in unobserved)
        assert not any(math.isnan(s.value) for s in observed)
        assert {s.labels["quantile"] for s in unobserved} == {"0.5", "0.9", "0.95", "0.99", "0.999"}
        assert sample(observed, "nv_inference_request_summary_us", model="bert_qa_onnx", quantile="0.99").value == 90117

    def test_triton_histogram_and_summary_families(self) -> None:
        families = {f.name: f for f in parse_families(TRITON_SUMMARIES.read_text())}
        assert len(families) == 28
        histogram = families["nv_inference_first_response_histogram_ms"]
        assert histogram.type == "histogram"
        assert {s.name for s in histogram.samples} == {
            "nv_inference_first_response_histogram_ms_count",
            "nv_inference_first_response_histogram_ms_sum",
            "nv_inference_first_response_histogram_ms_bucket",
        }
        tops = {
            s.labels.get("gpu_uuid", "model-level"): s.value
            for s in histogram.samples
            if s.name == histogram.name + "_bucket" and s.labels == {**s.labels, "model": "bert_qa_onnx", "le": "+Inf"}
        }
        assert tops == {"model-level": 402117, "GPU-0e2ffabe-427b-c4aa-320d-e2f590b86d48": 0}
        summary = families["nv_inference_queue_summary_us"]
        assert summary.type == "summary"
        assert {s.name for s in summary.samples} == {
            "nv_inference_queue_summary_us",
            "nv_inference_queue_summary_us_count",
            "nv_inference_queue_summary_us_sum",
        }


# --- format features ---------------------------------------------------------------------------------


class TestLabelValues:
    def test_escapes_are_decoded(self) -> None:
        (s,) = parse_samples('m{a="back\\\\slash",b="say \\"hi\\"",c="two\\nlines"} 1\n')
        assert s.labels == {"a": "back\\slash", "b": 'say "hi"', "c": "two\nlines"}

    def test_unknown_escapes_are_kept_verbatim(self) -> None:
        # Like Prometheus' own scrape parser and prometheus_client.
        (s,) = parse_samples('m{path="C:\\Program Files\\tmp"} 1\n')
        assert s.labels == {"path": "C:\\Program Files\\tmp"}

    def test_escaped_backslash_before_closing_quote(self) -> None:
        (s,) = parse_samples('m{a="x\\\\",b="y"} 1\n')
        assert s.labels == {"a": "x\\", "b": "y"}

    def test_braces_quotes_and_hashes_inside_values(self) -> None:
        (s,) = parse_samples('m{a="}",b="{x} # {y=\\"z\\"} 3",c=""} 7\n')
        assert s.labels == {"a": "}", "b": '{x} # {y="z"} 3', "c": ""}
        assert s.value == 7

    def test_unicode_values(self) -> None:
        (s,) = parse_samples('m{model="résnet-50 🚀",ns="日本"} 1\n')
        assert s.labels == {"model": "résnet-50 🚀", "ns": "日本"}

    def test_trailing_comma_and_blanks(self) -> None:
        assert parse_samples('m{a="1",} 1\n')[0].labels == {"a": "1"}
        assert parse_samples('m { a = "1" , b="2" , } 1\n')[0].labels == {"a": "1", "b": "2"}
        assert parse_samples("m{} 1\n")[0].labels == {}

    def test_labels_are_read_only_and_shared_by_equal_label_sets(self) -> None:
        first, second, third = parse_samples('a{x="1"} 1\nb{x="1"} 2\nc{x="2"} 3\n')
        with pytest.raises(TypeError):
            first.labels["x"] = "changed"  # type: ignore[index]
        assert second.labels is first.labels  # a GPU's ~40 families share one mapping
        assert third.labels == {"x": "2"} and third.labels is not first.labels


class TestValuesAndTimestamps:
    @pytest.mark.parametrize(
        ("token", "expected"),
        [
            ("0", 0.0),
            ("-1.5", -1.5),
            ("1e3", 1000.0),
            ("+3.25E-2", 0.0325),
            (".5", 0.5),
            ("+Inf", math.inf),
            ("-Inf", -math.inf),
            ("inf", math.inf),
            ("Infinity", math.inf),
            ("9223372036854775807", 9223372036854775807.0),
        ],
    )
    def test_numbers(self, token: str, expected: float) -> None:
        assert parse_samples(f"m {token}\n")[0].value == expected

    @pytest.mark.parametrize("token", ["NaN", "Nan", "nan", "NAN"])
    def test_nan_spellings(self, token: str) -> None:
        assert math.isnan(parse_samples(f"m {token}\n")[0].value)

    def test_text_format_timestamps_are_integer_milliseconds(self) -> None:
        (s,) = parse_samples('m{a="b"} 3 1712345678901\n')
        assert s.timestamp == 1712345678.901
        assert parse_samples("m 3 -1000\n")[0].timestamp == -1.0

    def test_openmetrics_timestamps_are_float_seconds(self) -> None:
        (s,) = parse_samples("m 3 1712345678.5\n# EOF\n")
        assert s.timestamp == 1712345678.5

    def test_blanks_tabs_and_crlf(self) -> None:
        text = '# TYPE m gauge\r\n  m{a="1"}\t 2 \t 1000\r\nm{a="2"}3\r\n\r\n'
        first, second = parse_samples(text)
        assert (first.value, first.timestamp) == (2.0, 1.0)
        assert (second.labels, second.value) == ({"a": "2"}, 3.0)

    def test_comments_and_empty_lines_are_ignored(self) -> None:
        text = "\n# just a comment\n#\n# HELPFUL not a help line\nm 1\n\n"
        assert keys(parse_samples(text)) == [key("m", {}, 1.0, None)]

    def test_names_with_colons(self) -> None:
        assert parse_samples("job:request_rate:5m 1\n")[0].name == "job:request_rate:5m"


class TestFamilies:
    def test_help_escapes_and_type(self) -> None:
        text = "# HELP m A \\\\ and a\\nnewline, \\q kept\n# TYPE m counter\nm 1\n"
        (family,) = parse_families(text)
        assert family == MetricFamily("m", "counter", "A \\ and a\nnewline, \\q kept", [Sample("m", {}, 1.0, None)])

    def test_histogram_samples_join_their_family(self) -> None:
        text = (
            '# TYPE rpc histogram\nrpc_bucket{le="0.5"} 1\nrpc_bucket{le="+Inf"} 2\nrpc_sum 0.7\nrpc_count 2\nother 1\n'
        )
        families = parse_families(text)
        assert [(f.name, f.type, len(f.samples)) for f in families] == [
            ("rpc", "histogram", 4),
            ("other", "untyped", 1),
        ]

    def test_untyped_samples_of_one_name_form_one_family(self) -> None:
        families = parse_families('a{x="1"} 1\na{x="2"} 2\nb 3\n')
        assert [(f.name, f.type, len(f.samples)) for f in families] == [("a", "untyped", 2), ("b", "untyped", 1)]

    def test_counter_owns_total_and_created(self) -> None:
        text = "# TYPE jobs counter\njobs_total 4\njobs_created 1.7e9\n"
        (family,) = parse_families(text)
        assert [s.name for s in family.samples] == ["jobs_total", "jobs_created"]

    def test_text_format_merges_non_contiguous_samples(self) -> None:
        # Like Go's expfmt; OpenMetrics forbids this (see TestMalformedInput).
        families = parse_families('# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na{x="y"} 2\n')
        assert [(f.name, len(f.samples)) for f in families] == [("a", 2), ("b", 1)]

    def test_parse_samples_keeps_document_order(self) -> None:
        text = '# TYPE a gauge\na 1\n# TYPE b gauge\nb 2\na{x="y"} 3\n'
        assert [s.value for s in parse_samples(text)] == [1.0, 2.0, 3.0]

    def test_help_only_family_is_listed(self) -> None:
        assert parse_families("# HELP lonely nothing yet\n") == [MetricFamily("lonely", "untyped", "nothing yet", [])]


class TestOpenMetrics:
    TEXT = (
        "# TYPE rpc_seconds histogram\n"
        "# UNIT rpc_seconds seconds\n"
        '# HELP rpc_seconds RPC latency, \\"quoted\\".\n'
        'rpc_seconds_bucket{le="0.1"} 3 # {trace_id="abc"} 0.05 1712345678.1\n'
        'rpc_seconds_bucket{le="+Inf"} 4\n'
        "rpc_seconds_count 4\n"
        "rpc_seconds_sum 0.9\n"
        "rpc_seconds_created 1712345000.0\n"
        "# TYPE jobs counter\n"
        "jobs_total 7 # {} 1\n"
        "# TYPE build info\n"
        'build_info{version="1.2"} 1\n'
        "# TYPE thing unknown\n"
        "thing 1\n"
        "# EOF\n"
    )

    def test_detected_by_eof_and_parsed(self) -> None:
        families = parse_families(self.TEXT)
        assert [(f.name, f.type, len(f.samples)) for f in families] == [
            ("rpc_seconds", "histogram", 5),
            ("jobs", "counter", 1),
            ("build", "info", 1),
            ("thing", "unknown", 1),
        ]
        assert families[0].help == 'RPC latency, "quoted".'
        assert families[0].samples[0].value == 3  # the exemplar is dropped

    def test_forced_mode_gives_the_same_result(self) -> None:
        assert parse_families(self.TEXT, openmetrics=True) == parse_families(self.TEXT)

    def test_unknown_is_the_default_type(self) -> None:
        assert parse_families("m 1\n# EOF\n")[0].type == "unknown"

    def test_eof_without_trailing_newline(self) -> None:
        assert parse_samples("m 1\n# EOF")[0].value == 1

    def test_forced_text_mode_treats_eof_as_a_comment(self) -> None:
        assert parse_samples("m 1 1000\n# EOF\n", openmetrics=False)[0].timestamp == 1.0


class TestDcgmBlanks:
    @pytest.mark.parametrize(
        ("line", "kept"),
        [
            ('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794', False),  # the README's leaked blank
            ('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775792', False),  # DCGM_INT64_BLANK itself
            ('DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775807', False),
            ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} 140737488355328.000000', False),  # DCGM_FP64_BLANK, %f
            ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} 1.4e14', False),
            ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} +Inf', False),
            ('DCGM_FI_DEV_POWER_VIOLATION{gpu="0"} 289114330055100', True),  # int64 counter
            ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} 139999999999999.9', True),
            ('DCGM_FI_DEV_POWER_USAGE{gpu="0"} NaN', True),
            ('dcgm_gpu_temp{gpu="0"} 9223372036854775794', True),  # only DCGM_* names
            ('nv_gpu_power_usage{gpu="0"} 140737488355328.0', True),
        ],
    )
    def test_sentinel_lines(self, line: str, kept: bool) -> None:
        assert len(parse_samples(line + "\n")) == (1 if kept else 0)

    def test_dropped_sample_leaves_its_family_and_neighbours(self) -> None:
        text = (
            "# TYPE DCGM_FI_DEV_MEMORY_TEMP gauge\n"
            'DCGM_FI_DEV_MEMORY_TEMP{gpu="0"} 9223372036854775794\n'
            'DCGM_FI_DEV_MEMORY_TEMP{gpu="1"} 71\n'
        )
        (family,) = parse_families(text)
        assert [(s.labels["gpu"], s.value) for s in family.samples] == [("1", 71.0)]

    def test_is_dcgm_blank(self) -> None:
        assert is_dcgm_blank("DCGM_FI_DEV_MEMORY_TEMP", 9223372036854775794.0, integer=True)
        assert not is_dcgm_blank("DCGM_FI_DEV_POWER_VIOLATION", 289114330055100.0, integer=True)
        assert is_dcgm_blank("DCGM_FI_DEV_POWER_USAGE", 140737488355328.0)
        assert is_dcgm_blank("DCGM_FI_DEV_POWER_USAGE", 1.4e14)
        assert not is_dcgm_blank("DCGM_FI_DEV_POWER_USAGE", 1.39e14)
        assert not is_dcgm_blank("DCGM_FI_DEV_POWER_USAGE", math.nan)
        assert not is_dcgm_blank("nv_gpu_power_usage", 1e20)


# --- malformed input ---------------------------------------------------------------------------------

MALFORMED: list[tuple[str, str, int, str]] = [
    # (id, text, line number, reason fragment)
    ("unterminated value", 'm{a="1} 1\n', 1, "unterminated label value"),
    ("unterminated by escape", 'ok 1\nm{a="x\\"} 1\n', 2, "unterminated label value"),
    ("missing brace", 'm{a="1" 1\n', 1, "missing '}' to close the label set"),
    ("blank between pairs", 'm{a="1" b="2"} 1\n', 1, "expected ',' or '}' after the value of label 'a'"),
    ("missing close", 'm{a="1",\n', 1, "missing '}'"),
    ("invalid value", "m abc\n", 1, "invalid value 'abc'"),
    ("underscore value", "m 1_000\n", 1, "invalid value '1_000'"),
    ("non-ascii digits", "m ١٢\n", 1, "invalid value"),
    ("missing value", 'm{a="1"}\n', 1, "missing value"),
    ("missing value, no labels", "ok 1\n\nm\n", 3, "missing value"),
    ("duplicate label", 'm{gpu="0",gpu="1"} 1\n', 1, "duplicate label 'gpu'"),
    ("invalid metric name", "0m 1\n", 1, "invalid metric name '0m'"),
    ("dash in name", "my-metric 1\n", 1, "invalid metric name 'my-metric'"),
    ("quoted utf-8 name", '{"my.metric"} 1\n', 1, "invalid metric name"),
    ("invalid label name", 'm{0a="1"} 1\n', 1, "invalid label name"),
    ("double comma", 'm{a="1",,b="2"} 1\n', 1, "invalid label name"),
    ("missing equals", 'm{a "1"} 1\n', 1, "expected '=' after label name 'a'"),
    ("unquoted value", "m{a=1} 1\n", 1, "expected '\"' to open the value of label 'a'"),
    ("invalid timestamp", "m 1 abc\n", 1, "invalid timestamp 'abc'"),
    ("float ms timestamp", "m 1 1.5\n", 1, "invalid timestamp '1.5'"),
    ("text after timestamp", "m 1 2 3\n", 1, "unexpected text after the timestamp: '3'"),
    ("exemplar in text format", 'm 1 # {a="b"} 1\n', 1, "unexpected text after the timestamp"),
    ("type after samples", "x 1\n# TYPE x gauge\n", 2, "TYPE for metric x after its samples"),
    ("type after bucket", 'h_bucket{le="1"} 1\n# TYPE h histogram\n', 2, "TYPE for metric h after its samples"),
    ("duplicate type", "# TYPE x gauge\n# TYPE x counter\n", 2, "duplicate TYPE for metric x"),
    ("duplicate help", "# HELP x a\n# HELP x b\n", 2, "duplicate HELP for metric x"),
    ("unknown type", "# TYPE x bogus\n", 1, "unknown metric type 'bogus'"),
    ("type without type", "# TYPE x\n", 1, "TYPE line for metric x without a type"),
    ("help without name", "# HELP\n", 1, "HELP line without a metric name"),
    ("type with extra text", "# TYPE x gauge extra\n", 1, "unexpected text after the metric type"),
    ("invalid name in type", "# TYPE 0x gauge\n", 1, "invalid metric name '0x' in TYPE line"),
    ("duplicate series", 'm{a="1",b="2"} 1\nm{b="2",a="1"} 2\n', 2, "duplicate series m{b='2',a='1'}"),
    ("duplicate series, no labels", "m 1\nm{} 2\n", 2, "duplicate series m"),
    ("bucket without le", "# TYPE h histogram\nh_bucket 1\n", 2, "sample h_bucket has no 'le' label"),
    ("invalid le", '# TYPE h histogram\nh_bucket{le="x"} 1\n', 2, "invalid 'le' label value 'x'"),
    ("quantile missing", "# TYPE s summary\ns 1\n", 2, "sample s has no 'quantile' label"),
    ("histogram own name", "# TYPE h histogram\nh 1\n", 2, "sample h of histogram h needs a suffix"),
    ("unit outside openmetrics", "# UNIT m seconds\nm 1\n", 1, "'# UNIT' marks OpenMetrics text"),
    ("om type outside openmetrics", "# TYPE m info\n", 1, "type 'info' marks OpenMetrics text"),
    ("text after eof", "m 1\n# EOF\nn 2\n", 3, "text after '# EOF'"),
    ("comment after eof", "m 1\n# EOF\n# HELP n x\n# EOF\n", 3, "text after '# EOF'"),
    ("om interleaved", '# TYPE a gauge\na 1\nb 1\na{x="1"} 2\n# EOF\n', 4, "not contiguous"),
    ("om bad exemplar", "c_total 1 # trace 1\n# EOF\n", 1, "an exemplar must start with a label set"),
    ("om exemplar value", 'c_total 1 # {a="b"} x\n# EOF\n', 1, "invalid exemplar value 'x'"),
]


class TestMalformedInput:
    @pytest.mark.parametrize(
        ("text", "line_number", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
    )
    def test_reports_line_and_reason(self, text: str, line_number: int, reason: str) -> None:
        error = error_of(text)
        assert error.line_number == line_number
        assert reason in error.reason
        assert error.source == "test.prom"
        assert error.line == text.split("\n")[line_number - 1]
        assert str(error).startswith(f"test.prom:{line_number}: ")

    def test_forced_openmetrics_requires_eof(self) -> None:
        error = error_of("m 1\n\n", openmetrics=True)
        assert (error.line_number, error.line) == (1, "m 1")
        assert "missing '# EOF'" in error.reason

    def test_openmetrics_float_timestamp_is_not_text_format(self) -> None:
        assert error_of("m 1 1.5\n", openmetrics=False).reason == "invalid timestamp '1.5'"

    def test_forced_text_mode_rejects_openmetrics_types(self) -> None:
        assert "unknown metric type 'info'" in error_of("# TYPE m info\nm_info 1\n# EOF\n", openmetrics=False).reason

    def test_error_names_a_real_fixture_line(self) -> None:
        lines = H100.read_text().split("\n")
        lines[99] = lines[99].replace("} ", "} bogus ", 1)
        error = error_of("\n".join(lines))
        assert error.line_number == 100
        assert "invalid value 'bogus'" in error.reason


# --- generated round trips ---------------------------------------------------------------------------

_names = st.from_regex(r"[a-z][a-z0-9]{0,12}", fullmatch=True).map(lambda s: "m_" + s)  # no suffix clashes
_label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,8}", fullmatch=True)
_label_values = st.one_of(
    st.text(max_size=20),
    st.text(alphabet='"\\\n{}=, #\t\r\x85\u2028é🚀', max_size=12),
)
_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**53), max_value=2**53).map(float),
)
_docs = st.text(alphabet=st.characters(codec="utf-8"), max_size=30).filter(lambda d: d == d.strip())


# (name, kind, help, [(labels, value, timestamp in ms or None)])
_GeneratedFamily = tuple[str, str, str, list[tuple[dict[str, str], float, int | None]]]


@st.composite
def _families(draw: st.DrawFn) -> list[_GeneratedFamily]:
    names = draw(st.lists(_names, min_size=1, max_size=4, unique=True))
    families = []
    for name in names:
        kind = draw(st.sampled_from(["gauge", "counter", "untyped"]))
        label_names = draw(st.lists(_label_names, max_size=4, unique=True))
        label_sets = draw(
            st.lists(
                st.fixed_dictionaries({k: _label_values for k in label_names}),
                min_size=1,
                max_size=4,
                unique_by=lambda d: tuple(sorted(d.items())),
            )
        )
        points = [
            (labels, draw(_values), draw(st.none() | st.integers(min_value=0, max_value=2**41)))
            for labels in label_sets
        ]
        families.append((name, kind, draw(_docs), points))
    return families


class _Collector:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


def _render(families: list[Metric], *, openmetrics: bool) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(families))
    return (generate_openmetrics if openmetrics else generate_latest)(registry).decode()


class TestGeneratedRoundTrips:
    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(_families(), st.booleans())
    def test_prometheus_client_output_round_trips(self, families: list[_GeneratedFamily], openmetrics: bool) -> None:
        metrics = []
        expected = []
        for name, kind, doc, points in families:
            metric = Metric(name, doc, kind if kind != "untyped" else "unknown")
            sample_name = name + "_total" if kind == "counter" else name
            for labels, value, millis in points:
                timestamp = None if millis is None else millis / 1000
                metric.add_sample(sample_name, labels, value, timestamp)
                if timestamp is not None and not openmetrics:
                    timestamp = int(timestamp * 1000) / 1000  # the text format carries milliseconds
                expected.append(key(sample_name, labels, value, timestamp))
            metrics.append(metric)
        text = _render(metrics, openmetrics=openmetrics)

        assert keys(parse_samples(text)) == expected
        parsed = parse_families(text)
        by_name = {f.name: f for f in parsed}
        for name, kind, doc, _ in families:
            family = by_name[name if openmetrics or kind != "counter" else name + "_total"]
            assert family.help == doc
            assert family.type == ("unknown" if openmetrics else "untyped") if kind == "untyped" else kind

    def test_openmetrics_exemplars_from_prometheus_client(self) -> None:
        metric = Metric("rpc", "latency", "histogram")
        metric.add_sample("rpc_bucket", {"le": "0.5"}, 1, exemplar=Exemplar({"trace_id": 'a"b'}, 0.2, 12.5))
        metric.add_sample("rpc_bucket", {"le": "+Inf"}, 2)
        metric.add_sample("rpc_count", {}, 2)
        metric.add_sample("rpc_sum", {}, 0.9)
        text = _render([metric], openmetrics=True)
        assert " # {" in text
        assert keys(parse_samples(text)) == [
            key("rpc_bucket", {"le": "0.5"}, 1, None),
            key("rpc_bucket", {"le": "+Inf"}, 2, None),
            key("rpc_count", {}, 2, None),
            key("rpc_sum", {}, 0.9, None),
        ]


def _pick(*choices: str) -> st.SearchStrategy[str]:
    return st.sampled_from(choices)


# Near-valid exposition lines: mostly well-formed pieces, with blanks, tabs, escapes, stray quotes and
# braces mixed in, so that both tokenisers see valid lines, lines only the careful one accepts, and errors.
_fuzz_names = _pick("m", "m_total", "h_bucket", "h_sum", "DCGM_FI_X", "s", "0m", "m-x", "", " m")
_fuzz_label_values = st.text(alphabet='ab"\\n{}=, #\t\ré', max_size=6)
_fuzz_pairs = st.builds(
    lambda name, eq, value, close: f'{name}{eq}"{value}{close}',
    _pick("a", "b", "le", "quantile", "0a", ""),
    _pick("=", " = ", "=", "==", ""),
    _fuzz_label_values,
    _pick('"', '"', '"', ""),
)
_fuzz_label_sets = st.builds(
    lambda pairs, sep, trailing, close: "{" + sep.join(pairs) + trailing + close,
    st.lists(_fuzz_pairs, max_size=3),
    _pick(",", ",", ", ", ",,", " "),
    _pick("", "", ","),
    _pick("}", "}", "} ", ""),
)
_fuzz_samples = st.builds(
    lambda name, labels, sep, value, timestamp, exemplar: f"{name}{labels}{sep}{value}{timestamp}{exemplar}",
    _fuzz_names,
    st.one_of(st.just(""), _fuzz_label_sets),
    _pick(" ", " ", "  ", "\t", ""),
    _pick("1", "-2.5", "Nan", "+Inf", "9223372036854775794", "140737488355328.000000", "1_0", "x", ""),
    _pick("", "", " 1712345678901", " 1.5", " x", " 1 2"),
    _pick("", "", ' # {t="1"} 0.5', " # x", "\r"),
)
_fuzz_comments = st.builds(
    lambda keyword, name, rest: f"# {keyword} {name}{rest}",
    _pick("HELP", "TYPE", "UNIT", "EOF", "note"),
    _fuzz_names,
    _pick("", " gauge", " counter", " histogram", " summary", " info", " bogus", " a\\nb \\q", " gauge x"),
)
_fuzz_texts = st.builds(
    lambda lines, end: "\n".join(lines) + end,
    st.lists(st.one_of(_fuzz_samples, _fuzz_samples, _fuzz_comments, _pick("", "# EOF", "\r")), max_size=8),
    _pick("", "\n", "\n# EOF\n", "\n# EOF"),
)


# Mostly well-formed text whose lines reuse a few label sets, names and values, so that the fast path's caches hit
# and duplicates, a bucket's bound, DCGM blanks and OpenMetrics' contiguity meet them; one line in five is odd.
def _mostly(usual: st.SearchStrategy[str], *odd: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(usual, usual, usual, usual, st.one_of(*odd))


_written_label_values = st.lists(
    _pick("a", "1", "0.5", "+Inf", " ", "{", "}", ",", "=", "#", "\\\\", '\\"', "\\n"), max_size=4
)
_label_sets = st.builds(
    lambda pairs, sep, trailing: "{" + sep.join(f'{key}="{"".join(value)}"' for key, value in pairs) + trailing + "}",
    st.lists(
        st.tuples(_pick("a", "b", "le", "quantile"), _written_label_values), max_size=3, unique_by=lambda pair: pair[0]
    ),
    _mostly(st.just(","), _pick(", ", " , ")),
    _mostly(st.just(""), st.just(",")),
)
_series_names = _pick("m", "m_total", "h_bucket", "h_sum", "h_count", "h", "s", "s_sum", "DCGM_FI_X")
_line_ends = _mostly(
    st.builds(str.__add__, st.just(" "), _pick("1", "0", "2", "-2.5", "Nan", "+Inf", "-Inf", "9223372036854775794")),
    st.builds(
        lambda sep, value, timestamp, exemplar: f"{sep}{value}{timestamp}{exemplar}",
        _pick(" ", "  ", "\t", ""),
        _pick("1", "140737488355328.000000", "1_0", "1\t", "x", ""),
        _pick("", " 1712345678901", " 1.5", " x"),
        _pick("", ' # {t="1"} 0.5', " # x", "\r", " "),
    ),
)
_type_lines = st.builds(
    lambda kinds: [
        f"# TYPE {name} {kind}" for name, kind in zip(("h", "s", "m", "DCGM_FI_X"), kinds, strict=True) if kind
    ],
    st.tuples(*[_pick("", "gauge", "counter", "histogram", "summary")] * 4),
)


def assert_paths_agree(text: str, openmetrics: bool | None) -> None:
    """The fast and the careful path give the same samples and families, or the same error at the same line."""
    try:
        fast = _parse(text, "<fuzz>", openmetrics)
    except ExpositionError as e:
        fast_error: ExpositionError | None = e
    else:
        fast_error = None
    try:
        slow = _parse(text, "<fuzz>", openmetrics, fast=False)
    except ExpositionError as e:
        assert fast_error is not None, f"only the careful path failed: {e}"
        assert (fast_error.line_number, fast_error.reason) == (e.line_number, e.reason)
        return
    assert fast_error is None, f"only the fast path failed: {fast_error}"
    assert keys(fast[0]) == keys(slow[0])
    assert [(f.name, f.type, f.help, keys(f.samples)) for f in fast[1]] == [
        (f.name, f.type, f.help, keys(f.samples)) for f in slow[1]
    ]


class TestArbitraryInput:
    @settings(max_examples=500, deadline=None)
    @given(_fuzz_texts, st.sampled_from([None, True, False]))
    def test_only_exposition_errors_and_fast_path_agrees(self, text: str, openmetrics: bool | None) -> None:
        assert_paths_agree(text, openmetrics)

    @settings(max_examples=200, deadline=None)
    @given(st.data(), st.sampled_from([None, True, False]))
    def test_fast_path_agrees_when_series_repeat(self, data: st.DataObject, openmetrics: bool | None) -> None:
        label_sets = data.draw(
            st.lists(_mostly(_label_sets, _fuzz_label_sets, _pick("", "{", '{a="1"}}')), min_size=1, max_size=4)
        )
        names = _mostly(_series_names, _fuzz_names)
        sample_lines = st.builds(lambda *parts: "".join(parts), names, _pick(*label_sets), _line_ends)
        others = st.one_of(_fuzz_comments, _pick("", "\r", "# HELP m a\\nb \\q"))
        lines = data.draw(_type_lines) + data.draw(st.lists(_mostly(sample_lines, others), min_size=4, max_size=24))
        text = "\n".join(lines) + data.draw(_pick("", "\n", "\n# EOF\n"))
        assert_paths_agree(text, openmetrics)

    @settings(max_examples=200, deadline=None)
    @given(st.text(max_size=200))
    def test_any_text_gives_samples_or_an_exposition_error(self, text: str) -> None:
        with contextlib.suppress(ExpositionError):
            parse_samples(text)


@pytest.mark.parametrize("text", ['m{k",a="v"x"} 1', 'm{a="x"y",b="z"} 1', 'm{a="x",b="y"z"} 1', 'm{a b="x"} 1'])
def test_label_text_the_quick_cut_could_misread_is_refused(text):
    # NB: each cuts at '",' and '="' into pieces that look like pairs; only the careful reading finds the fault
    with pytest.raises(ExpositionError):
        parse_samples(text)


def test_label_values_may_hold_what_the_quick_cut_cuts_at():
    (sample,) = parse_samples('m{a="x=y,z",b="{}",c="",d="a,b=c"} 1')
    assert dict(sample.labels) == {"a": "x=y,z", "b": "{}", "c": "", "d": "a,b=c"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('DCGM_FI_X{a="1"} 9223372036854775794\nDCGM_FI_X{a="2"} 1', [("DCGM_FI_X", {"a": "2"}, 1.0)]),
        ('# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_bucket{le="x"} 2', "invalid 'le' label value 'x'"),
        ('# TYPE h histogram\nh_bucket{le="0.5"} 1\nh_bucket{a="1"} 2', "sample h_bucket has no 'le' label"),
        (
            '# TYPE s summary\ns{quantile="0.5"} Nan\ns{quantile="0.9"} 1',
            [("s", {"quantile": "0.5"}, "nan"), ("s", {"quantile": "0.9"}, 1.0)],
        ),
        ("n 1\nm{ 2", "missing '}' to close the label set"),
        ('m{a="1",b="2"} 1\nm{b="2",a="1"} 2', "duplicate series m{b='2',a='1'}"),
        ('m{a="1"} 1\nm{a="1",} 2', "duplicate series m{a='1'}"),
        ('m{a="x\\"y"} 1\nm{ a = "x\\"y" } 2', "duplicate series m{a='x\"y'}"),
        ("m 1\t\nn{} 2", [("m", {}, 1.0), ("n", {}, 2.0)]),
    ],
)
def test_fast_path_branches(text: str, expected: list[tuple[str, dict[str, str], float | str]] | str) -> None:
    """Each check the fast line cut makes itself (a DCGM blank, a bucket's or quantile's bound, NaN, an unclosed
    label set, a series written twice in another order or form) gives what the careful path gives."""
    assert_paths_agree(text, None)
    if isinstance(expected, str):
        with pytest.raises(ExpositionError) as caught:
            parse_samples(text)
        assert caught.value.reason.startswith(expected), caught.value.reason
    else:
        got = [(s.name, dict(s.labels), "nan" if math.isnan(s.value) else s.value) for s in parse_samples(text)]
        assert got == expected


def test_openmetrics_interleaving_is_caught_on_the_fast_path() -> None:
    text = "a 1\nb 1\na 2\n# EOF\n"
    assert_paths_agree(text, None)
    with pytest.raises(ExpositionError, match="samples of metric family a are not contiguous"):
        parse_samples(text)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(alphabet="aZ_:09-.é\u00b7\u0660 ", max_size=6), st.text(max_size=6)))
def test_metric_name_check_is_the_grammar(name: str) -> None:
    assert _is_metric_name(name) == (_METRIC_NAME_RE.fullmatch(name) is not None)


def test_a_label_text_has_one_mapping_whichever_path_meets_it() -> None:
    # NB: the first line takes the fast path, the second (a timestamp) the tokenisers', the third the fast path again
    first, second, third = parse_samples('m{a="1"} 1\nn{a="1"} 2 1712345678901\no{a="1"} 3\n')
    assert first.labels is second.labels is third.labels
