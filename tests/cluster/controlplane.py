"""The real Kubernetes control plane on loopback: etcd, kube-apiserver and kube-controller-manager.

Built once per machine by ``tests/cluster/build`` (cached outside the clone), started once per test session by
the ``control_plane`` fixture (tests/conftest.py), stopped by PID at the end. See docs/testing.md.

Layout of one run (a temporary directory; ``GPUSCALE_KEEP_CLUSTER=1`` keeps it and prints where)::

    pki/          cluster CA, serving cert, front-proxy CA + client, service-account keys (tests/cluster/pki.py)
    etcd/         etcd's data (--unsafe-no-fsync: a test cluster, thrown away)
    admin.kubeconfig, kube-controller-manager.kubeconfig
    etcd.log, kube-apiserver.log, kube-controller-manager.log

What is not here, and what the tests do instead: no kubelet, no scheduler, no kube-proxy. Nodes and pods are
made Ready through their status subresources and pods bound through the binding subresource
(tests/cluster/kubelet.py). Services get ClusterIPs from a loopback range (127.1.0.0/16): with aggregator
routing off, kube-apiserver dials an APIService's Service at its ClusterIP, and an aggregated server (the
adapter) listening on that loopback address is reached without kube-proxy. Endpoints may not hold loopback
addresses, which is why routing by endpoints is not used.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster.pki import ClientCert, Pki
from tests.cluster.rest import Rest
from tests.ports import free_port

__all__ = [
    "BUILD",
    "ControlPlane",
    "ControlPlaneUnavailable",
    "cached_binaries",
    "start_control_plane",
    "start_for_tests",
]

BUILD = Path(__file__).parent / "build"
SERVICE_CIDR = "127.1.0.0/16"
# The controllers the tests need and nothing else (each one costs start time and CPU): the workload
# controllers the HPA acts through, the HPA itself, PodDisruptionBudget status for evictions, namespaces and
# service accounts for RBAC, the garbage collector for owner references. No node lifecycle controller: without
# kubelets it would mark every node unreachable after its grace period; tests add such taints themselves.
CONTROLLERS = (
    "deployment",
    "replicaset",
    "statefulset",
    "horizontalpodautoscaling",
    "disruption",
    "namespace",
    "serviceaccount",
    "garbagecollector",
)
HPA_SYNC_PERIOD = "1s"


class ControlPlaneUnavailable(RuntimeError):
    """The control plane cannot run on this machine (no Go, no build) or did not come up."""


def cached_binaries() -> Path:
    """The directory holding the built binaries, building nothing; ``ControlPlaneUnavailable`` says why not."""
    if shutil.which("go") is None and not os.environ.get("GPUSCALE_KUBE_BIN"):
        raise ControlPlaneUnavailable(
            "no Go toolchain: the real control plane is built from source (tests/cluster/build)"
        )
    if override := os.environ.get("GPUSCALE_KUBE_BIN"):
        return Path(override)
    answer = subprocess.run(["bash", str(BUILD), "--cached"], capture_output=True, text=True, check=False)
    if answer.returncode != 0:
        raise ControlPlaneUnavailable(
            f"the real control plane is not built yet (run: bash tests/cluster/build): {answer.stderr.strip()}"
        )
    return Path(answer.stdout.strip().splitlines()[-1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: no orphans if pytest dies


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def tail(self, lines: int = 25) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        self.popen.send_signal(signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout)


@dataclass
class ControlPlane:
    """A running control plane. ``server`` is kube-apiserver's URL; ``admin`` a system:masters kubeconfig."""

    bin: Path
    workdir: Path
    pki: Pki
    server: str
    admin: Path
    etcd_url: str
    timings: dict[str, float] = field(default_factory=dict)
    _processes: list[_Process] = field(default_factory=list)

    @property
    def kubectl_binary(self) -> str:
        return str(self.bin / "kubectl")

    def kubectl(self, *args: str, kubeconfig: Path | None = None, input: str | None = None, timeout: float = 60):
        """Run the real kubectl of the same release (``CompletedProcess``, text)."""
        return subprocess.run(
            [self.kubectl_binary, "--kubeconfig", str(kubeconfig or self.admin), *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def rest(self, user: str = "admin", *groups: str) -> Rest:
        """A REST client authenticated as ``user`` by a client certificate (admin: system:masters)."""
        cert = self._admin_cert if user == "admin" else self.pki.client(user, *groups)
        return Rest(self.server, ca_file=str(self.pki.ca), cert=(str(cert.cert), str(cert.key)))

    def token_rest(self, token: str) -> Rest:
        return Rest(self.server, ca_file=str(self.pki.ca), token=token)

    def kubeconfig_for(self, user: str, *groups: str) -> Path:
        """A kubeconfig for ``user`` (client certificate), written into the run's directory."""
        cert = self.pki.client(user, *groups)
        return write_kubeconfig(self.workdir / f"{_file_safe(user)}.kubeconfig", self.server, self.pki.ca, cert=cert)

    def service_account_token(self, namespace: str, name: str, *, seconds: int = 3600) -> str:
        """A bound token for the ServiceAccount (TokenRequest), as a pod projecting it would receive."""
        body = {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": seconds},
        }
        answer = self.rest().post(f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token", body)
        return answer.expect(201)["status"]["token"]

    def service_account_kubeconfig(self, namespace: str, name: str) -> Path:
        token = self.service_account_token(namespace, name)
        path = self.workdir / f"sa-{namespace}-{name}.kubeconfig"
        return write_kubeconfig(path, self.server, self.pki.ca, token=token)

    def process_alive(self, name: str) -> bool:
        return any(p.name == name and p.popen.poll() is None for p in self._processes)

    def logs(self, name: str, lines: int = 40) -> str:
        return next((p.tail(lines) for p in self._processes if p.name == name), "")

    def stop(self) -> None:
        for process in reversed(self._processes):
            process.stop()
        self._processes.clear()

    @property
    def _admin_cert(self) -> ClientCert:
        return ClientCert(cert=self.pki.dir / "user-admin.crt", key=self.pki.dir / "user-admin.key")


def write_kubeconfig(
    path: Path, server: str, ca: Path, *, cert: ClientCert | None = None, token: str | None = None
) -> Path:
    user: dict[str, str] = {}
    if cert:
        user = {"client-certificate": str(cert.cert), "client-key": str(cert.key)}
    if token:
        user = {"token": token}
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": "user"}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def _file_safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def _spawn(name: str, args: list[str], workdir: Path) -> _Process:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=workdir,
            preexec_fn=_die_with_parent,
        )
    return _Process(name, popen, log)


def _wait_healthy(process: _Process, url: str, *, context: ssl.SSLContext | None, timeout: float) -> None:
    """Poll ``url`` until it answers 200; fail with the log's tail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if process.popen.poll() is not None:
            raise ControlPlaneUnavailable(f"{process.name} exited with {process.popen.returncode}:\n{process.tail()}")
        try:
            with urllib.request.urlopen(url, context=context, timeout=2) as answer:
                if answer.status == 200:
                    return
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read()[:300]!r}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise ControlPlaneUnavailable(
        f"{process.name} not healthy at {url} after {timeout:.0f} s ({last}):\n{process.tail()}"
    )


def start_control_plane(
    bin_dir: Path,
    workdir: Path | None = None,
    *,
    apiserver_args: Sequence[str] = (),
    controllers: Sequence[str] = CONTROLLERS,
) -> ControlPlane:
    """Start etcd, kube-apiserver and kube-controller-manager; return once each is healthy.

    ``apiserver_args`` are added to kube-apiserver's (e.g. an audit log for a benchmark that counts each
    client's requests); ``controllers`` replaces the controller-manager's set."""
    started = time.monotonic()
    workdir = workdir or Path(tempfile.mkdtemp(prefix="gpuscale-kube-"))
    pki = Pki(workdir / "pki")
    admin_cert = pki.client("admin", "system:masters")
    etcd_port, peer_port, api_port, kcm_port = free_port(), free_port(), free_port(), free_port()
    etcd_url = f"http://127.0.0.1:{etcd_port}"
    server = f"https://127.0.0.1:{api_port}"
    admin = write_kubeconfig(workdir / "admin.kubeconfig", server, pki.ca, cert=admin_cert)
    kcm_cert = pki.client("system:kube-controller-manager")
    kcm_config = write_kubeconfig(workdir / "kube-controller-manager.kubeconfig", server, pki.ca, cert=kcm_cert)
    plane = ControlPlane(bin=bin_dir, workdir=workdir, pki=pki, server=server, admin=admin, etcd_url=etcd_url)
    try:
        etcd = _spawn(
            "etcd",
            [
                str(bin_dir / "etcd"),
                "--name=test",
                f"--data-dir={workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
                f"--initial-cluster=test=http://127.0.0.1:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
            workdir,
        )
        plane._processes.append(etcd)
        _wait_healthy(etcd, f"{etcd_url}/health", context=None, timeout=30)
        plane.timings["etcd"] = time.monotonic() - started

        apiserver = _spawn(
            "kube-apiserver",
            [
                str(bin_dir / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={api_port}",
                f"--cert-dir={workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki.serving.cert}",
                f"--tls-private-key-file={pki.serving.key}",
                f"--client-ca-file={pki.ca}",
                "--authorization-mode=Node,RBAC",
                f"--service-account-key-file={pki.sa_pub}",
                f"--service-account-signing-key-file={pki.sa_key}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # The aggregation layer: the front-proxy client certificate it presents to aggregated servers,
                # and the settings it publishes in kube-system/extension-apiserver-authentication for them.
                f"--requestheader-client-ca-file={pki.front_proxy_ca}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki.front_proxy_client.cert}",
                f"--proxy-client-key-file={pki.front_proxy_client.key}",
                "--enable-aggregator-routing=false",
                # NB: the `kubernetes` Service's endpoints would be the advertise address, 127.0.0.1, which
                # Endpoints validation rejects; nothing in the tests reaches the API through that Service.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
                *apiserver_args,
            ],
            workdir,
        )
        plane._processes.append(apiserver)
        context = ssl.create_default_context(cafile=str(pki.ca))
        context.load_cert_chain(str(admin_cert.cert), str(admin_cert.key))
        _wait_healthy(apiserver, f"{server}/readyz", context=context, timeout=90)
        plane.timings["kube-apiserver"] = time.monotonic() - started

        manager = _spawn(
            "kube-controller-manager",
            [
                str(bin_dir / "kube-controller-manager"),
                f"--kubeconfig={kcm_config}",
                f"--authentication-kubeconfig={kcm_config}",
                f"--authorization-kubeconfig={kcm_config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={kcm_port}",
                f"--cert-dir={workdir / 'kcm-certs'}",
                "--leader-elect=false",
                # Each controller acts as its own ServiceAccount (kube-system/horizontal-pod-autoscaler …) with
                # its bootstrap RBAC role, as in a kubeadm cluster: the HPA reads metrics with its own rights.
                "--use-service-account-credentials=true",
                f"--controllers={','.join(controllers)}",
                f"--horizontal-pod-autoscaler-sync-period={HPA_SYNC_PERIOD}",
                f"--root-ca-file={pki.ca}",
                "--profiling=false",
                "--v=2",
            ],
            workdir,
        )
        plane._processes.append(manager)
        _wait_healthy(manager, f"https://127.0.0.1:{kcm_port}/healthz", context=_insecure(), timeout=60)
        plane.timings["kube-controller-manager"] = time.monotonic() - started
    except BaseException:
        plane.stop()
        raise
    return plane


def start_for_tests() -> ControlPlane:
    """A started control plane, or the test skips with the reason (no Go, no build); under CI (CI=true) it fails
    instead, so a green CI always means the real-control-plane tests ran."""
    import pytest

    try:
        return start_control_plane(cached_binaries())
    except ControlPlaneUnavailable as e:
        if os.environ.get("CI"):
            pytest.fail(f"real control plane unavailable under CI: {e}")
        pytest.skip(f"real control plane unavailable: {e}")


def _insecure() -> ssl.SSLContext:
    # kube-controller-manager serves /healthz with a self-signed certificate it makes at start.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context
