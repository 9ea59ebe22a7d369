"""Shared pytest fixtures."""

from __future__ import annotations

import pytest

from gpuscale.metrics.catalogue import load_catalogue


@pytest.fixture
def catalogue():
    return load_catalogue()


# --- the real Kubernetes control plane (tests/cluster/, docs/testing.md) ----------------------------------------

_control_plane_report: list[str] = []


@pytest.fixture(scope="session")
def control_plane():
    """etcd, kube-apiserver and kube-controller-manager of the pinned release, started once per session on
    loopback and stopped at its end. Without Go or a build the tests that need it skip with the reason; under
    CI (CI=true) they fail instead, so a green CI always means they ran."""
    import os
    import shutil

    from tests.cluster.controlplane import start_for_tests

    plane = start_for_tests()
    started = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in plane.timings.items())
    _control_plane_report.append(f"real control plane {plane.bin.name}: healthy after {started}")
    yield plane
    plane.stop()
    if os.environ.get("GPUSCALE_KEEP_CLUSTER"):
        _control_plane_report.append(f"real control plane: kept {plane.workdir} (logs, pki, kubeconfigs)")
    else:
        shutil.rmtree(plane.workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def helm():
    """The pinned helm (tests/cluster/build-helm, built by .ci/setup --test): the path of its binary. Without a
    build the chart's tests skip with the reason locally and fail under CI, as the control plane's do."""
    import os

    from tests.helm import HelmUnavailable, helm_binary

    try:
        return helm_binary()
    except HelmUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"helm unavailable under CI: {e}")
        pytest.skip(f"helm unavailable: {e}")


def pytest_terminal_summary(terminalreporter):
    for line in _control_plane_report:
        terminalreporter.write_line(line)
