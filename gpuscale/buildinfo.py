"""``gpuscale_build_info``: which gpuscale (and Python) a scraped process runs, for every /metrics.

Dashboards and alerts join on it to tell which version served a value; its version is the one the image is
tagged with and ``gpuscale --version`` prints.
"""

from __future__ import annotations

import platform

from prometheus_client import CollectorRegistry, Gauge

from gpuscale import __version__


def register_build_info(registry: CollectorRegistry) -> None:
    Gauge(
        "gpuscale_build_info",
        "Always 1; the labels say which gpuscale and Python this process runs.",
        ["version", "python_version"],
        registry=registry,
    ).labels(__version__, platform.python_version()).set(1)
