"""Where the locked dependency wheels are kept between test runs, shared by the image build and the installed wheel."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def wheel_cache() -> Path:
    """build-offline --wheel-cache's directory, keyed on the lock, so a new lock starts an empty one. Asking PyPI for
    the 35 of them took 15 s of CPU and up to a minute of the image fixture on a loaded machine; pip checks every
    cached wheel against the lock's hashes before build-offline uses it."""
    key = hashlib.sha256((REPO / "deploy" / "image" / "requirements.lock").read_bytes()).hexdigest()[:12]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuscale" / f"image-wheels-{key}"
