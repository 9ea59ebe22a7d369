"""The container image: deploy/image/build-offline builds it (no base image pulled) and it runs as it must.

The image is built once for the module into a temporary buildah storage (overlay where the kernel mounts it, else vfs) and removed afterwards. The
module is skipped only where buildah cannot run at all; a failing build fails the tests. Reproducible: it holds
exactly the locked Python and Debian packages, and its wheel is byte-identical to the session's own build.
The mmdebstrap rootfs is kept between runs in ~/.cache/gpuscale (``rootfs_cache``; GPUSCALE_IMAGE_ROOTFS_CACHE=FILE
to put it elsewhere): everything gpuscale puts into the image is still built and installed on every run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name

from tests.deploy.test_lock import locked
from tests.e2e.locked_wheels import wheel_cache

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "deploy" / "image" / "build-offline"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
TAG = f"localhost/gpuscale:{VERSION}"  # no --tag given: the image is tagged with the version


class Image:
    def __init__(self, storage: Path, driver: str = "vfs"):
        self.storage, self.driver = storage, driver
        self.buildah = [
            "buildah",
            "--storage-driver",
            driver,
            "--root",
            str(storage / "root"),
            "--runroot",
            str(storage / "runroot"),
        ]
        self.ctr = ""

    def cmd(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.buildah, *args], capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )

    def run(self, *argv: str, options: tuple[str, ...] = (), timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """Run argv in the image's container with its configured user, env and workdir."""
        return self.cmd("run", "--isolation", "chroot", *options, self.ctr, "--", *argv, timeout=timeout)


def _cannot_run_buildah(tmp: Path) -> str | None:
    if shutil.which("buildah") is None:
        return "buildah is not on PATH (bash .ci/setup --test installs it)"
    probe = Image(tmp / "probe")
    try:
        out = probe.cmd("from", "--pull=never", "scratch", timeout=60)
        if out.returncode != 0:
            err = out.stderr.lower()
            if "permission denied" in err or "operation not permitted" in err or "not permitted" in err:
                return f"buildah cannot run here: {out.stderr.strip()[-300:]}"
            pytest.fail(f"buildah from scratch failed:\n{out.stderr}")
        probe.cmd("rm", "--all")
    finally:
        shutil.rmtree(tmp / "probe", ignore_errors=True)
    return None


def _storage_driver(tmp: Path) -> str:
    """overlay where this kernel mounts it for buildah, else vfs (which works everywhere). NB: the image is the
    same either way (the same image ID); vfs copies the whole 360 MB tree for each container and layer, which
    cost the suite ~25 s of CPU and 20 s of teardown."""
    probe = Image(tmp / "probe-overlay", "overlay")
    try:
        made = probe.cmd("from", "--pull=never", "scratch", timeout=60)
        if made.returncode != 0:
            return "vfs"
        ctr = made.stdout.strip().splitlines()[-1]
        mounted = probe.cmd("mount", ctr, timeout=60)
        probe.cmd("umount", ctr)
        probe.cmd("rm", "--all")
        return "overlay" if mounted.returncode == 0 else "vfs"
    finally:
        shutil.rmtree(tmp / "probe-overlay", ignore_errors=True)


def rootfs_cache() -> Path:
    """Where the Debian rootfs is kept between runs: a one-time build, like the Kubernetes binaries (it saves
    ~100 s and the Debian mirror on later runs). Keyed on build-offline's rootfs part, so a changed package list makes a new one;
    GPUSCALE_IMAGE_ROOTFS_CACHE=FILE names another place. The gpuscale wheel and its dependencies are built
    and installed into the image afresh on every run."""
    if os.environ.get("GPUSCALE_IMAGE_ROOTFS_CACHE"):
        return Path(os.environ["GPUSCALE_IMAGE_ROOTFS_CACHE"])
    text = BUILD.read_text()
    rootfs_part = text[text.index("# --- rootfs") : text.index("# --- image")]  # what makes the rootfs
    key = hashlib.sha256(rootfs_part.encode()).hexdigest()[:12]
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "gpuscale" / f"image-rootfs-{key}.tar"


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("image")
    reason = _cannot_run_buildah(tmp)
    if reason:
        pytest.skip(reason)
    img = Image(tmp / "storage", _storage_driver(tmp))
    args = [str(BUILD), "--storage-root", str(img.storage), "--storage-driver", img.driver]
    args += ["--rootfs-cache", str(rootfs_cache()), "--wheel-cache", str(wheel_cache())]
    try:
        build = subprocess.run(args, capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
        assert build.returncode == 0, f"build-offline failed ({build.returncode}):\n{build.stderr[-4000:]}"
        assert build.stdout.strip().splitlines()[-1] == TAG, build.stdout
        out = img.cmd("from", "--pull=never", TAG)
        assert out.returncode == 0, out.stderr
        img.ctr = out.stdout.strip().splitlines()[-1]
        yield img
    finally:
        img.cmd("rm", "--all")
        img.cmd("rmi", "--all", "--force", timeout=120)
        shutil.rmtree(tmp, ignore_errors=True)


def test_image_config_is_non_root_with_gpuscale_entrypoint(image):
    out = image.cmd("inspect", "--type", "image", TAG)
    assert out.returncode == 0, out.stderr
    config = json.loads(out.stdout)["OCIv1"]["config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/opt/gpuscale/bin/gpuscale"]
    assert config["WorkingDir"] == "/tmp"
    assert "PYTHONDONTWRITEBYTECODE=1" in config["Env"]
    assert "HOME=/tmp" in config["Env"]
    assert config["Labels"]["org.opencontainers.image.licenses"] == "Apache-2.0"


def test_the_image_holds_exactly_the_locked_python_packages(image):
    probe = "import importlib.metadata as m, json; print(json.dumps([[d.metadata['Name'], d.version] for d in m.distributions()]))"
    out = image.run("/opt/gpuscale/bin/python", "-c", probe)
    assert out.returncode == 0, out.stderr
    installed = {canonicalize_name(name): version for name, version in json.loads(out.stdout)}
    assert installed == locked() | {"gpuscale": VERSION}


# What build-offline purges after the install (the venv's seeds): the rest of the rootfs is the Debian lock.
PURGED = {"python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl"}


def test_the_image_holds_exactly_the_locked_debian_packages(image):
    out = image.run("dpkg-query", "-W", "-f", "${db:Status-Status} ${Package}=${Version}\n")
    assert out.returncode == 0, out.stderr
    installed = {line.split()[1] for line in out.stdout.splitlines() if line.startswith("installed ")}
    lock = (REPO / "deploy" / "image" / "debian-packages.lock").read_text().splitlines()
    want = {line for line in lock if line and not line.startswith("#") and line.split("=")[0] not in PURGED}
    assert installed == want


def test_the_images_wheel_is_byte_identical_to_another_build(image, gpuscale_wheel):
    """Two builds of the wheel (the image's, the session's: other directories, other times) are the same bytes."""
    out = image.cmd("inspect", "--type", "image", TAG)
    assert out.returncode == 0, out.stderr
    label = json.loads(out.stdout)["OCIv1"]["config"]["Labels"]["io.gpuscale.wheel.sha256"]
    assert label == hashlib.sha256(gpuscale_wheel.read_bytes()).hexdigest()


def test_adapter_help_runs_in_the_image(image):
    # `gpuscale` by name: the Deployment's `command: [gpuscale, adapter]` relies on PATH.
    out = image.run("gpuscale", "adapter", "--help")
    assert out.returncode == 0, out.stderr
    assert "usage: gpuscale adapter" in out.stdout


def test_process_runs_as_uid_65532(image):
    out = image.run("id", "-u")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "65532"
    out = image.run("id", "-g")
    assert out.stdout.strip() == "65532"


def test_demo_runs_in_the_image(image):
    out = image.run("gpuscale", "demo", "--duration", "10s", "--port", "0", "--no-keep-running", timeout=90)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "What the HPA sees" in out.stdout


def test_no_build_tools_in_the_image(image):
    out = image.run(
        "/bin/sh",
        "-c",
        "ls /opt/gpuscale/bin; ls /opt/gpuscale/lib/python3.11/site-packages; ls /usr/share/python-wheels 2>&1;"
        " command -v gcc cc pip pip3 || true",
    )
    assert out.returncode == 0, out.stderr
    names = out.stdout.split()
    assert "pip" not in names and "pip3" not in names, out.stdout
    assert not [n for n in names if n.startswith(("pip-", "setuptools", "wheel-"))], out.stdout
    assert not [n for n in names if n.endswith(".whl")], out.stdout
    assert "/usr/bin/gcc" not in names and "/usr/bin/cc" not in names
    assert image.run("test", "-e", "/opt/gpuscale/bin/pip").returncode == 1


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every path under the container's rootfs, but the run-time mounts and /tmp (an emptyDir)."""
    skip = {"tmp", "proc", "sys", "dev", "run"}
    seen: dict[str, tuple[int, int]] = {}
    for top in root.iterdir():
        if top.name in skip:
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                seen[os.path.relpath(path, root)] = (st.st_mtime_ns, st.st_size)
        st = os.lstat(top)
        seen[top.name] = (st.st_mtime_ns, st.st_size)
    return seen


def test_demo_writes_nothing_outside_tmp_even_as_root_with_bytecode_writing_on(image):
    """readOnlyRootFilesystem: the demo (adapter, simulator, client) writes nothing but /tmp.

    Run as root and with byte-code writing re-enabled, so that a missing or stale .pyc, a cache under $HOME
    or a file written anywhere in the rootfs shows up as a change.
    """
    assert image.run("true", options=("--user", "0:0")).returncode == 0  # buildah's own mount points, first
    out = image.cmd("mount", image.ctr)
    assert out.returncode == 0, out.stderr
    root = Path(out.stdout.strip().splitlines()[-1])
    try:
        before = _snapshot(root)
        run = image.run(
            "gpuscale",
            "demo",
            "--duration",
            "5s",
            "--port",
            "0",
            "--no-keep-running",
            options=("--user", "0:0", "--env", "PYTHONDONTWRITEBYTECODE="),
            timeout=90,
        )
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        after = _snapshot(root)
    finally:
        image.cmd("umount", image.ctr)
    created = sorted(set(after) - set(before))
    changed = sorted(p for p in set(after) & set(before) if after[p] != before[p])
    removed = sorted(set(before) - set(after))
    assert not created and not changed and not removed, {
        "created": created[:50],
        "changed": changed[:50],
        "removed": removed[:50],
    }
