"""Trace formats and the errors a bad trace gets (file, line, field)."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import numpy as np
import pytest

from gpuscale.errors import ConfigError
from gpuscale.replay.traces import parse_trace, read_trace

TRACES = Path(__file__).parents[1] / "fixtures" / "traces"


def test_shipped_traces_match_their_checksums_and_counts():
    """tests/fixtures/traces/SHA256SUMS pins the copies; counts as documented in its README."""
    sums = dict(line.split()[::-1] for line in (TRACES / "SHA256SUMS").read_text().splitlines())
    for name, digest in sums.items():
        assert hashlib.sha256((TRACES / name).read_bytes()).hexdigest() == digest, name
    counts = {
        "AzureLLMInferenceTrace_code.csv.gz": 8819,
        "AzureLLMInferenceTrace_conv.csv.gz": 19366,
        "conversation_trace.jsonl.gz": 12031,
    }
    for name, n in counts.items():
        trace = read_trace(TRACES / name)
        assert len(trace) == n
        assert trace.arrival_s[0] == 0 and np.all(np.diff(trace.arrival_s) >= 0)
        assert 3400 < trace.duration_s < 3600


def test_azure_timestamps_keep_their_seventh_digit():
    t = parse_trace(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,10,2\n2023-11-16 18:17:04.0319601,5,1",
        source="a.csv",
    )
    assert t.arrival_s[1] == pytest.approx(0.0520001, abs=1e-7)
    assert list(t.input_tokens) == [10, 5] and list(t.output_tokens) == [2, 1]


def test_plain_csv_seconds_and_iso(tmp_path):
    path = tmp_path / "t.csv.gz"
    path.write_bytes(gzip.compress(b"timestamp,input_tokens,output_tokens\n10.5,100,20\n11,50,5\n"))
    t = read_trace(path)
    assert list(t.arrival_s) == [0.0, 0.5] and t.name == "t.csv"
    iso = parse_trace(
        "timestamp,input_tokens,output_tokens\n2026-01-01T00:00:00,1,1\n2026-01-01T00:00:02.5,1,1\n", source="x"
    )
    assert list(iso.arrival_s) == [0.0, 2.5]


def test_mooncake_repeated_timestamps_are_the_format():
    t = parse_trace(
        '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [0]}\n'
        '{"timestamp": 0, "input_length": 6, "output_length": 2}\n'
        '{"timestamp": 1500, "input_length": 7, "output_length": 3}\n',
        source="m.jsonl",
    )
    assert list(t.arrival_s) == [0.0, 0.0, 1.5]


def test_repeated_timestamps_and_zero_costs_are_valid():
    t = parse_trace("timestamp,input_tokens,output_tokens\n1,0,0\n1,1,1\n2,5,0\n", source="t.csv")
    assert list(t.arrival_s) == [0.0, 0.0, 1.0]
    assert list(t.input_tokens) == [0, 1, 5]


def test_service_time_trace_with_models_any_column_order():
    t = parse_trace(
        "model,extra,service_time,timestamp\nsdxl,x,1.5,100\nlora-a,,0,100\nsdxl,y,2.25,101.5\n", source="img.csv"
    )
    assert list(t.arrival_s) == [0.0, 0.0, 1.5]
    assert list(t.service_s) == [1.5, 0.0, 2.25]
    assert t.models == ("sdxl", "lora-a") and t.name == "img.csv" and t.origin == 100.0
    assert list(t.model) == [0, 1, 0]
    w = t.window(start_s=1.0).scaled(2.0)
    assert list(w.service_s) == [2.25, 2.25] and list(w.model) == [0, 0]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("timestamp,input_tokens,output_tokens\n2,1,1\n1,1,1\n", "t.csv: line 3: timestamp goes back in time"),
        ("timestamp,service_time\n1,-0.5\n", "t.csv: line 2: service_time must be ≥ 0 seconds (got '-0.5')"),
        ("timestamp,service_time\n1,fast\n", "t.csv: line 2: service_time must be a number of seconds"),
        ("timestamp,service_time\n1,2\n2,inf\n", "t.csv: line 3: service_time must be ≥ 0 seconds (got 'inf')"),
        ("timestamp,service_time\n1,2\nnan,1\n", "t.csv: line 3: timestamp must be a finite number of seconds"),
        ("timestamp,service_time\n1,2\nlater,1\n", "t.csv: line 3: timestamp is not seconds or an ISO 8601"),
        ("model,timestamp,service_time\n,1,2\n", "t.csv: line 2: model is missing"),
        ("timestamp,input_tokens,output_tokens\n1,-5,1\n", "t.csv: line 2: input_tokens must not be negative (got -5)"),
        ("timestamp,input_tokens,output_tokens\n1,5\n", "t.csv: line 2: output_tokens is missing"),
        ("timestamp,input_tokens,output_tokens\n1,5,x\n", "t.csv: line 2: output_tokens must be a whole number"),
        ("timestamp,input_tokens,output_tokens\nyesterday,5,1\n", "line 2: timestamp is not seconds or an ISO 8601"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,,2\n", "line 2: ContextTokens is missing"),
        ("time,in,out\n1,1,1\n", "t.csv: line 1: unknown header 'time,in,out'"),
        ('{"timestamp": 0, "input_length": 5}\n', "t.csv: line 1: output_length is missing"),
        (
            '{"timestamp": 5, "input_length": 5, "output_length": 1}\n{"timestamp": 4, "input_length": 5, "output_length": 1}\n',
            "line 2: timestamp goes back in time",
        ),
        ("timestamp,input_tokens,output_tokens\n", "t.csv: no requests in the trace"),
    ],
)
def test_bad_traces_name_file_line_and_field(text, message):
    with pytest.raises(ConfigError) as err:
        parse_trace(text, source="t.csv")
    assert message in str(err.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "missing.csv")
    (tmp_path / "b.bin").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="line 1: not UTF-8 text"):
        read_trace(tmp_path / "b.bin")


def test_rate_scale_is_seeded_and_keeps_the_pattern():
    t = read_trace(TRACES / "AzureLLMInferenceTrace_code.csv.gz")
    a, b = t.scaled(2.5, seed=1), t.scaled(2.5, seed=1)
    assert np.array_equal(a.arrival_s, b.arrival_s) and abs(len(a) / len(t) - 2.5) < 0.05
    assert not np.array_equal(a.arrival_s, t.scaled(2.5, seed=2).arrival_s)
    assert np.all(np.diff(a.arrival_s) >= 0)
