"""The container image: built offline with deploy/image/build-offline (mmdebstrap + buildah) and run.

No base image can be pulled here, so the image is built from Debian packages the way build-offline
does it for users without registry access; deploy/image/Containerfile describes the same layout.
Skipped only where buildah cannot run at all (not installed, or no permission to create a container);
any other failure of the build is a failure of the test.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "image" / "build-offline"
IMAGE = "localhost/gpuscale-test:e2e"


class Image:
    def __init__(self, storage: Path) -> None:
        self.buildah = [
            "buildah",
            "--storage-driver",
            "vfs",
            "--root",
            str(storage / "root"),
            "--runroot",
            str(storage / "runroot"),
        ]
        self.container: str | None = None

    def cmd(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([*self.buildah, *args], capture_output=True, text=True, timeout=timeout)

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``args`` in the image's container, as its configured user, with its environment."""
        assert self.container is not None
        return self.cmd("run", "--isolation", "chroot", self.container, "--", *args, timeout=timeout)


def _buildah_can_run(storage: Path) -> str | None:
    """Why buildah cannot run here, or None."""
    if shutil.which("buildah") is None:
        return "buildah is not installed (bash .ci/setup --test installs it)"
    probe = Image(storage)
    done = probe.cmd("from", "--pull=never", "scratch", timeout=60)
    if done.returncode != 0:
        if "permission" in done.stderr.lower() or "operation not permitted" in done.stderr.lower():
            return f"buildah cannot create a container here: {done.stderr.strip()[:200]}"
        pytest.fail(f"buildah from scratch failed: {done.stderr}")
    probe.cmd("rm", done.stdout.strip())
    return None


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Image:
    storage = tmp_path_factory.mktemp("buildah")
    why = _buildah_can_run(storage)
    if why is not None:
        pytest.skip(why)
    started = time.monotonic()
    build = subprocess.run(
        [str(BUILD), "--storage-root", str(storage), IMAGE], capture_output=True, text=True, timeout=900
    )
    assert build.returncode == 0, build.stderr[-4000:]
    assert build.stdout.strip().splitlines()[-1] == IMAGE
    print(f"\nbuild-offline: {time.monotonic() - started:.0f} s")
    built = Image(storage)
    created = built.cmd("from", "--pull=never", IMAGE)
    assert created.returncode == 0, created.stderr
    built.container = created.stdout.strip()
    yield built
    built.cmd("rm", "--all")
    built.cmd("rmi", "--all", "--force")
    shutil.rmtree(storage, ignore_errors=True)


def test_the_image_runs_as_uid_65532_with_the_entrypoint_gpuscale(image):
    done = image.run("id", "-u")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "65532"
    config = image.cmd(
        "inspect", "--type", "image", "--format", "{{.OCIv1.Config.User}} {{.OCIv1.Config.Entrypoint}}", IMAGE
    )
    assert config.returncode == 0, config.stderr
    assert config.stdout.strip() == "65532:65532 [/opt/gpuscale/bin/gpuscale]"


def test_adapter_help_runs_in_the_image(image):
    done = image.run("gpuscale", "adapter", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: gpuscale adapter")


def test_no_build_tools_in_the_image(image):
    done = image.run("/bin/sh", "-c", "ls /opt/gpuscale/bin; /opt/gpuscale/bin/python -c 'import pip' 2>&1; true")
    assert done.returncode == 0, done.stderr
    names = set(done.stdout.split())
    assert "gpuscale" in names and "kubectl-gpu" in names
    assert not {"pip", "pip3", "easy_install"} & names
    assert "No module named 'pip'" in done.stdout
    for tool in ("gcc", "cc", "make"):
        assert image.run("/bin/sh", "-c", f"command -v {tool}").returncode != 0, tool


def test_the_demo_runs_in_the_image_writing_only_to_tmp(image):
    mounted = image.cmd("mount", image.container)
    assert mounted.returncode == 0, mounted.stderr
    root = Path(mounted.stdout.strip())
    marker = time.time()
    time.sleep(1.1)  # NB: file times have 1 s granularity on some filesystems; what is newer was written by the run
    done = image.run("gpuscale", "demo", "--duration", "6s", "--port", "0", "--refresh-interval", "1s", timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "What the HPA sees" in done.stdout
    assert "100.0" in done.stdout  # the LLM pods' util trap, served from inside the image
    # readOnlyRootFilesystem: outside /tmp (an emptyDir in the Deployment) nothing may be written.
    # buildah itself bind-mounts these into every container it runs (a kubelet does the same).
    runtime = {"etc", "etc/hosts", "etc/resolv.conf", "etc/hostname", "run", "run/.containerenv", "."}
    written = [
        name
        for top in root.iterdir()
        if top.name not in ("tmp", "proc", "sys", "dev")
        for p in ([top, *top.rglob("*")] if top.is_dir() and not top.is_symlink() else [top])
        if not p.is_symlink()
        and p.lstat().st_mtime > marker
        and (name := str(p.relative_to(root))) not in runtime
        and not name.startswith("run/")
    ]
    assert written == [], written[:20]
    assert not list((root / "opt" / "gpuscale").rglob("*.pyc.*")), "byte-code written at run time"
