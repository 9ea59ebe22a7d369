"""Shared pytest fixtures."""

from __future__ import annotations

import os
import signal
import sys

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


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    if not hasattr(session.config, "workeroutput"):
        return
    # Under pytest-xdist each worker starts its own control plane: its line travels to the controller's summary.
    session.config.workeroutput["control_plane_report"] = _control_plane_report
    # NB: once every worker has said it finished, the controller tells each to exit, and execnet sends a worker still
    # busy 5 s later (pytest's unconfigure gc.collect of a big heap on a loaded machine) a SIGINT: the
    # KeyboardInterrupt lands in whatever Python runs then — during gc, hypothesis' gc callback — and prints a
    # traceback after a green "[100%]" (issue 34). Its tests and fixtures are done (trylast: after the teardown),
    # so the worker ignores it and finishes; execnet still ends a worker that hangs, 10 s later, with os._exit.
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    _control_plane_report.extend(getattr(node, "workeroutput", {}).get("control_plane_report", []))


def pytest_terminal_summary(terminalreporter):
    for line in _control_plane_report:
        terminalreporter.write_line(line)


# --- the whole suite runs in parallel (docs/testing.md, "Suite time") -------------------------------------------

# NB: 4 on 2 cores: most of the slow tests wait on other processes (Prometheus, kube-controller-manager, Karpenter,
# buildah); with 3, the suite's 1,766 s of test time took 625 s once the cluster in a box and Thanos came in
WORKERS = 4

# Started first: the longest modules (the image build alone is ~40 % of one worker's share), so that no worker
# is left running one of them after the others have drained the queue.
SLOW_FIRST = (
    "tests/e2e/test_image.py",
    "tests/e2e/test_installed_wheel.py",
    "tests/e2e/test_faults.py",
    "tests/cluster/test_karpenter_box.py",
    "tests/e2e/test_report_thanos.py",
)


def pytest_configure(config):
    """Bytecode caches (``__pycache__``, gitignored) are written even where PYTHONDONTWRITEBYTECODE is set: without
    them each of the suite's ~700 Python processes compiles every gpuscale module it imports from source, and each
    worker every test module it collects (docs/testing.md, "Suite time"). Before the workers start, so that they and
    every process the tests start inherit it."""
    if os.environ.pop("PYTHONDONTWRITEBYTECODE", None) is not None:
        sys.dont_write_bytecode = False


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`pytest` with no paths (the whole suite, what .ci/run does) runs on WORKERS pytest-xdist workers; a run
    of chosen files stays in one process (-s, --pdb). -n N or GPUSCALE_TEST_WORKERS=N (0: serial) decide
    otherwise. Each test module runs whole on one worker, so its fixtures (the image, the installed wheel, a
    Prometheus) are made once, and every tests/cluster module on one worker, so that they share one real
    control plane as in a serial run (the scheduler below)."""
    if not config.pluginmanager.hasplugin("xdist") or config.option.numprocesses is not None:
        return
    if hasattr(config, "workerinput") or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # a worker itself: never workers of its own
    if getattr(config.option, "collectonly", False) or config.option.usepdb:
        return
    workers = os.environ.get("GPUSCALE_TEST_WORKERS")
    if workers is None and config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    config.option.numprocesses = int(workers) if workers is not None else WORKERS
    if config.option.numprocesses and config.option.dist == "no":
        config.option.dist = "loadfile"


# tests/cluster modules that do not use the shared control plane (the cluster in a box has its own): a unit of
# their own, so their minutes of Karpenter consolidation overlap the shared plane's modules on another worker.
OWN_PLANE = ("tests/cluster/test_karpenter_box.py",)


def _work_unit(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "tests/cluster/" if path.startswith("tests/cluster/") and path not in OWN_PLANE else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile, but with tests/cluster as one unit and in collection order (SLOW_FIRST first), not
    xdist's largest-count-first. NB: not --dist loadgroup with xdist_group marks: xdist 3.8 renames a grouped
    test's node id through Node._nodeid, which pytest 9 no longer reads, so the groups are silently lost."""
    if config.option.dist != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False
    return ModuleScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker collects, and sorts, alike
        items.sort(key=lambda item: item.nodeid.split("::")[0] not in SLOW_FIRST)
