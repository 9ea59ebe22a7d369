"""deploy/image/requirements.lock: the run-time dependencies the image and CI install (pip --require-hashes).

Fails when the lock is out of date with pyproject.toml: a dependency added, dropped or re-specified there and
not re-locked (deploy/image/lock). No network: the dependency graph comes from the metadata of the packages CI
installed from that very lock (.ci/setup), which the first test checks.
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "deploy" / "image" / "requirements.lock"
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def locked() -> dict[str, str]:
    """{canonical name: version} of the lock; every entry must be an exact pin carrying at least one hash."""
    pins: dict[str, str] = {}
    entry = ""
    for line in [*LOCK.read_text().splitlines(), ""]:
        if line.startswith((" ", "\t")) and entry:
            entry += line
            continue
        if entry:
            m = PIN.match(entry)
            assert m, f"{LOCK.name}: not an exact pin: {entry[:80]}"
            assert "--hash=sha256:" in entry, f"{LOCK.name}: {m[1]} has no hash (pip --require-hashes refuses it)"
            pins[canonicalize_name(m[1])] = m[2]
            entry = ""
        if line and not line.startswith("#"):
            entry = line
    return pins


def declared() -> list[Requirement]:
    return [Requirement(r) for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]


def test_ci_runs_on_the_locked_versions() -> None:
    drift = {
        name: f"locked {version}, installed {_installed(name) or 'nothing'}"
        for name, version in locked().items()
        if _installed(name) != version
    }
    assert not drift, f"this environment is not the lock (bash .ci/setup installs it): {drift}"


def test_every_declared_dependency_is_locked_within_its_specifier() -> None:
    pins = locked()
    for req in declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req} is in pyproject.toml but not in the lock: run deploy/image/lock"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"the lock pins {name}=={pins[name]}, outside pyproject.toml's {req}: run deploy/image/lock"
        )


def _closure(roots: list[Requirement]) -> set[str]:
    """Names of every distribution the roots need on this interpreter, through installed metadata."""
    seen: set[tuple[str, str]] = set()  # (name, extra): a requirement with extras brings those extras' needs
    todo = [(r, "") for r in roots]
    while todo:
        req, wanted_by = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": wanted_by}):
            continue
        name = canonicalize_name(req.name)
        for extra in ("", *sorted(req.extras)):
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            todo += [(Requirement(text), extra) for text in md.requires(name) or []]
    return {name for name, _ in seen}


def test_the_lock_is_exactly_what_pyproject_needs() -> None:
    """Nothing missing (pip --require-hashes would refuse the image build) and nothing left over (a dependency
    dropped from pyproject.toml but still shipped)."""
    pins = locked()
    if any(_installed(name) != version for name, version in pins.items()):
        pytest.fail("the environment is not the lock, so its metadata cannot judge it: bash .ci/setup")
    need = _closure(declared())
    assert need - set(pins) == set(), f"needed but not locked: {sorted(need - set(pins))}: run deploy/image/lock"
    assert set(pins) - need == set(), f"locked but not needed: {sorted(set(pins) - need)}: run deploy/image/lock"


def _installed(name: str) -> str | None:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return None


def test_the_lock_is_made_for_the_image_by_its_script() -> None:
    # The header names the command, so whoever edits pyproject.toml sees how to re-lock.
    assert LOCK.read_text().splitlines()[1].strip() == "#    deploy/image/lock"
    script = (ROOT / "deploy" / "image" / "lock").read_text()
    assert "--generate-hashes" in script and "--python-version 3.11" in script
