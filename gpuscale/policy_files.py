"""Where the policy files come from: the copies shipped in the package, or a directory that overrides them.

The shipped catalogue, diagnosis and health policies are package data (``gpuscale/policies`` is a link to
the repository's ``policies/``, which the wheel carries as files), found through ``importlib.resources`` so
an installed gpuscale works from any directory. A policies directory (``--policies DIR``; in a cluster a
ConfigMap mount) overrides a file by holding one of the same name; the files it does not hold stay the
shipped ones, so a ConfigMap with only ``metrics.yaml`` is enough to change the catalogue.
"""

from __future__ import annotations

import os
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from gpuscale.errors import ConfigError

CATALOGUE_FILE = "metrics.yaml"
DIAGNOSIS_FILE = "diagnosis.yaml"
HEALTH_FILE = "health.yaml"
PRICES_FILE = "prices.yaml"
RIGHTSIZING_FILE = "rightsizing.yaml"
GPUS_FILE = "gpus.yaml"
POOLS_FILE = "pools.yaml"
REMEDIATION_FILE = "remediation.yaml"
HINTS_FILE = "hints.yaml"
POLICY_FILES = (
    CATALOGUE_FILE,
    DIAGNOSIS_FILE,
    HEALTH_FILE,
    PRICES_FILE,
    POOLS_FILE,
    REMEDIATION_FILE,
    HINTS_FILE,
    RIGHTSIZING_FILE,
    GPUS_FILE,
)

PolicyPath = Path | Traversable
"""A policy file: a path on disk, or a shipped file (a path too unless the package is imported from a zip)."""


def shipped(name: str) -> PolicyPath:
    """The policy file ``name`` as shipped in the package."""
    return resources.files("gpuscale").joinpath("policies", name)


def policy_file(name: str, directory: str | Path | None = None) -> PolicyPath:
    """``directory/name`` when ``directory`` holds it, else the shipped file."""
    if directory is not None:
        candidate = Path(directory) / name
        if os.path.lexists(candidate):  # NB: a FIFO or a directory of that name is refused when read, not skipped
            return candidate
    return shipped(name)


def check_policies_dir(directory: str | Path, *, flag: str = "--policies") -> Path:
    """``directory`` as a Path, or ConfigError when it is not a directory or holds none of the policy files."""
    path = Path(directory)
    if not path.is_dir():
        raise ConfigError(f"{flag}: {path}: not a directory")
    if not any(os.path.lexists(path / name) for name in POLICY_FILES):
        raise ConfigError(f"{flag}: {path}: holds none of {', '.join(POLICY_FILES)}")
    return path
