"""The pinned helm and gpuscale's chart (deploy/charts/gpuscale), for the chart's tests.

helm is built from the Go module proxy by ``tests/cluster/build-helm`` (``.ci/setup --test`` runs it) and cached
outside the clone. Every call gets its own HELM_*_HOME directories, so nothing is read from or written to the
user's helm configuration.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "charts" / "gpuscale"
BUILD_HELM = ROOT / "tests" / "cluster" / "build-helm"
RELEASE = "gpuscale"
NAMESPACE = "gpuscale"
_HOME = Path(tempfile.gettempdir()) / f"gpuscale-helm-home-{os.getuid()}"


class HelmUnavailable(RuntimeError):
    """helm is not built on this machine (or cannot be: no Go toolchain)."""


def helm_binary() -> str:
    done = subprocess.run(["bash", str(BUILD_HELM), "--cached"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HelmUnavailable(f"{done.stderr.strip()} (run: bash tests/cluster/build-helm)")
    return done.stdout.strip().splitlines()[-1]


def run_helm(helm: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(_HOME / "cache"),
        "HELM_CONFIG_HOME": str(_HOME / "config"),
        "HELM_DATA_HOME": str(_HOME / "data"),
        "KUBECONFIG": os.environ.get("KUBECONFIG", "/dev/null"),
    }
    return subprocess.run([helm, *args], capture_output=True, text=True, env=env, timeout=timeout, check=False)


def values_file(values: dict[str, Any], directory: Path) -> Path:
    path = directory / f"values-{abs(hash(json.dumps(values, sort_keys=True)))}.json"
    path.write_text(json.dumps(values))
    return path


def template(helm: str, values: dict[str, Any], directory: Path, *, chart: Path = CHART) -> list[dict[str, Any]]:
    """`helm template` of the chart with these values (namespace gpuscale, Kubernetes 1.30): the objects (a fresh
    copy each call; one helm run per chart and values)."""
    return copy.deepcopy(_template(helm, json.dumps(values, sort_keys=True), directory, chart))


@functools.cache
def _template(helm: str, values: str, directory: Path, chart: Path) -> list[dict[str, Any]]:
    done = run_helm(
        helm, "template", RELEASE, str(chart), "--namespace", NAMESPACE, "--kube-version", "1.30.0",
        "--values", str(values_file(json.loads(values), directory)),
    )  # fmt: skip
    assert done.returncode == 0, f"helm template {values} failed:\n{done.stderr}"
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]
