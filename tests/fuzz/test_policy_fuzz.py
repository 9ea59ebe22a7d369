"""Policy files fail cleanly: every shipped policy file, mutated (encoding damage, truncation, random bytes, values
of the wrong type, deleted and unknown keys), either loads or raises the one clean error — a ConfigError naming
the file, on one line, with the field (and line) for a well-formed YAML file whose content is wrong. Then every
command that reads a policy file, given a broken one: exit 2, one line on stderr, no traceback."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscale.cli.main import main
from gpuscale.controller.hints import load_hints_policy
from gpuscale.controller.pools import load_pools_policy
from gpuscale.controller.remediation_policy import load_remediation_policy
from gpuscale.errors import ConfigError
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.metrics.diagnosis import load_policy
from gpuscale.policy_files import POLICY_FILES, shipped
from gpuscale.pricing import load_prices
from gpuscale.report.policy import load_report_policy

LOADERS: dict[str, Callable[[Path], Any]] = {
    "metrics.yaml": lambda d: load_catalogue(policies=d),
    "diagnosis.yaml": load_policy,
    "health.yaml": load_policy,
    "prices.yaml": load_prices,
    "pools.yaml": load_pools_policy,
    "remediation.yaml": load_remediation_policy,
    "hints.yaml": load_hints_policy,
    "rightsizing.yaml": load_report_policy,
    "gpus.yaml": load_report_policy,
}
SHIPPED = {name: shipped(name).read_bytes() for name in LOADERS}


def test_every_policy_file_has_a_loader_here():
    assert set(LOADERS) == set(POLICY_FILES)


def _paths(data: Any, path: tuple = ()) -> list[tuple]:
    out = [path]
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(_paths(v, (*path, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(_paths(v, (*path, i)))
    return out


def _mutate(data: Any, path: tuple, op: str, value: Any) -> Any:
    if not path:
        return value if op == "replace" else data
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "replace":
        parent[last] = value
    elif op == "delete":
        del parent[last]
    elif op == "unknown" and isinstance(parent, dict):
        parent[f"no_such_key_{len(parent)}"] = value
    return data


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**12), max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["5s", "1m30s", "-1", "0", "1e400", "abc", "{}", ".*(", "NaN"]),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)


@st.composite
def damaged(draw) -> tuple[str, bytes, bool]:
    """(file name, its mutated bytes, whether the bytes are still well-formed YAML)."""
    name = draw(st.sampled_from(sorted(LOADERS)))
    raw = SHIPPED[name]
    kind = draw(st.sampled_from(["bytes", "utf16", "truncate", "structure", "structure", "structure"]))
    if kind == "bytes":
        at = draw(st.integers(0, len(raw)))
        return name, raw[:at] + draw(st.binary(min_size=1, max_size=4)) + raw[at:], False
    if kind == "utf16":
        return name, raw.decode().encode("utf-16"), False
    if kind == "truncate":
        return name, raw[: draw(st.integers(0, len(raw)))], False
    data = yaml.safe_load(raw)
    path = draw(st.sampled_from(_paths(data)))
    op = draw(st.sampled_from(["replace", "delete", "unknown"]))
    data = _mutate(data, path, op, draw(VALUES))
    return name, yaml.safe_dump(data, allow_unicode=True).encode(), True


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged())
def test_a_damaged_policy_file_loads_or_fails_with_one_clean_line(case):
    name, raw, well_formed = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        path.write_bytes(raw)
        try:
            LOADERS[name](Path(tmp))
        except ConfigError as e:
            message = str(e)
            assert message.startswith(f"{path}: "), message
            assert "\n" not in message, message
            assert "Traceback" not in message
            if well_formed and isinstance(yaml.safe_load(raw), dict):
                detail = message.removeprefix(f"{path}: ")
                # the field is named (a path like "breaker.window" or "metrics[3] (gpu_x).unit") or the top level
                assert ":" in detail, message


BROKEN = {
    # the shipped policy with one duration given as a mapping
    "remediation.yaml": SHIPPED["remediation.yaml"].decode().replace("\nwindow: 10m\n", "\nwindow: {minutes: 10}\n"),
    "metrics.yaml": b"version: 1\nmetrics:\n  - name: gpu_\xff\n",  # invalid UTF-8
    "rightsizing.yaml": "headroom: [1, 2]\n",
    "prices.yaml": "\ufeff\x00\x01",
}


def _policies(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name.removesuffix(".yaml")
    directory.mkdir()
    text = BROKEN[name]
    (directory / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    return directory


@pytest.mark.parametrize(
    ("name", "argv"),
    [
        ("remediation.yaml", ["controller", "--kubeconfig", "/nonexistent", "--scrape-url", "http://127.0.0.1:9"]),
        ("metrics.yaml", ["top", "pods", "--adapter-url", "http://127.0.0.1:9"]),
        ("metrics.yaml", ["adapter", "--kubeconfig", "/nonexistent", "--scrape-url", "http://127.0.0.1:9"]),
        ("rightsizing.yaml", ["report", "--from-file", "/nonexistent.json"]),
        ("prices.yaml", ["report", "--from-file", "/nonexistent.json"]),
    ],
)
def test_every_command_given_a_broken_policy_says_one_line_and_exits_2(tmp_path, capsys, name, argv):
    directory = _policies(tmp_path, name)
    code = main([*argv, "--policies", str(directory)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1, err
    assert str(directory / name) in err and "Traceback" not in err, err


def test_the_process_prints_no_traceback(tmp_path):
    directory = _policies(tmp_path, "remediation.yaml")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuscale.cli.main",
            "controller",
            "--policies",
            str(directory),
            "--kubeconfig",
            "/x",
            "--scrape-url",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    line = BROKEN["remediation.yaml"].splitlines().index("window: {minutes: 10}") + 1
    assert proc.stderr.strip().endswith(
        f'remediation.yaml: window: expected a duration such as "5s", "1m30s" or a number of seconds (line {line})'
    ), proc.stderr
