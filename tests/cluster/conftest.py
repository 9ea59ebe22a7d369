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
