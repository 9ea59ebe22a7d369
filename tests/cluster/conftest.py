"""Fixtures shared by the real-control-plane tests (the control plane itself: tests/conftest.py)."""

from __future__ import annotations

import contextlib
import os

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


@pytest.fixture(scope="session")
def box():
    """The cluster in a box (tests/cluster/box.py): kube-scheduler, kwok and Karpenter on a control plane of their
    own, started once per run; skips locally when a part is not built, fails under CI."""
    import shutil

    from tests.cluster.box import start_box_for_tests
    from tests.conftest import _control_plane_report

    started = start_box_for_tests()
    timings = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in started.timings.items())
    _control_plane_report.append(f"cluster in a box (kube-scheduler, kwok, Karpenter): up after {timings}")
    yield started
    started.plane.stop()
    if not os.environ.get("GPUSCALE_KEEP_CLUSTER"):
        shutil.rmtree(started.plane.workdir, ignore_errors=True)
