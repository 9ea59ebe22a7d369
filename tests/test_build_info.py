"""`gpuscale --version` and the gpuscale_build_info metric on the adapter's and the controller's /metrics."""

import platform
import subprocess
import sys

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import gpuscale
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.controller.metrics import ControllerMetrics


def test_version_flag_prints_the_package_version() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuscale.cli.main", "--version"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith(f" {gpuscale.__version__}")
    assert done.stdout.split()[0] in {"gpuscale", "main.py"}


def _build_info(registry) -> list[dict[str, str]]:
    text = generate_latest(registry).decode()
    return [
        s.labels | {"value": str(s.value)}
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "gpuscale_build_info"
    ]


def test_adapter_and_controller_expose_build_info() -> None:
    want = [{"version": gpuscale.__version__, "python_version": platform.python_version(), "value": "1.0"}]
    assert _build_info(AdapterMetrics(lambda: []).registry) == want
    assert _build_info(ControllerMetrics().registry) == want
