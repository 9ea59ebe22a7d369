"""Fixtures shared by the real-control-plane tests (the control plane itself: tests/conftest.py)."""

from __future__ import annotations

import contextlib

import pytest

from tests.cluster.metrics_stack import start_metrics_stack


@pytest.fixture(scope="session")
def metrics_stack(control_plane, tmp_path_factory):
    """The adapter behind the real aggregator with moving GPU and inference telemetry (tests/cluster/metrics_stack.py)."""
    with contextlib.contextmanager(start_metrics_stack)(control_plane, tmp_path_factory.mktemp("adapter")) as stack:
        yield stack


@pytest.fixture(scope="session")
def operator_stack(control_plane, helm, tmp_path_factory):
    """prometheus-operator and the Prometheus 3 it configures, scraping a real adapter and controller through
    gpuscale's ServiceMonitor and PodMonitors (tests/cluster/operator_stack.py)."""
    from tests.cluster.operator_stack import start_operator_stack
    from tests.cluster.parts import part_for_tests

    operator_dir, prometheus_dir = part_for_tests("prometheus-operator"), part_for_tests("prometheus")
    work = tmp_path_factory.mktemp("operator")
    with contextlib.contextmanager(start_operator_stack)(control_plane, helm, operator_dir, prometheus_dir, work) as s:
        yield s
