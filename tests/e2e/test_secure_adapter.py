"""End to end over HTTPS: `gpuscale adapter --secure-port` as a user starts it, against the simulated
cluster's delegated auth (TokenReview, SubjectAccessReview, the extension-apiserver-authentication
ConfigMap), read by the real kubectl with a token and by a front proxy with a client certificate."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import sys
import time

import aiohttp
import pytest
import pytest_asyncio
import trustme

from gpuscale.sim.cluster import SimCluster
from tests.adapter import hpa
from tests.e2e.test_kubectl import KUBECTL, free_port, run

# NB: one event loop for the module: the shared adapter's simulated cluster is served in it during every test.
pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

HPA_USER = "system:serviceaccount:kube-system:horizontal-pod-autoscaler"
PATH = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/nim/pods/*/gpu_utilization"


@contextlib.asynccontextmanager
async def secure_adapter(tmp_path):
    front_proxy_ca = trustme.CA()
    proxy_cert = front_proxy_ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
    cluster = await SimCluster().start()
    cluster.api.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
            "data": {
                "requestheader-client-ca-file": front_proxy_ca.cert_pem.bytes().decode(),
                "requestheader-allowed-names": '["front-proxy-client"]',
                "requestheader-username-headers": '["X-Remote-User"]',
                "requestheader-group-headers": '["X-Remote-Group"]',
                "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
            },
        }
    )
    cluster.api.add_token("hpa-token", HPA_USER)
    cluster.api.add_token("intruder-token", "system:serviceaccount:default:intruder")
    cluster.api.allow(
        users=[HPA_USER], verbs=["get", "list"], api_groups=["custom.metrics.k8s.io", "external.metrics.k8s.io"]
    )
    cluster.api.allow(users=[HPA_USER], non_resource_urls=["*"], verbs=["get"])
    port = free_port()
    cert_dir = tmp_path / "certs"
    args = [
        sys.executable,
        "-m",
        "gpuscale.cli.main",
        "adapter",
        "--kubeconfig",
        cluster.kubeconfig,
        "--discover-exporters",
        "--secure-port",
        str(port),
        "--bind-address",
        "127.0.0.1",
        "--cert-dir",
        str(cert_dir),
        "--refresh-interval",
        "1s",
        "--tls-reload-interval",
        "200ms",
        "--log-level",
        "warning",
    ]
    proc = await asyncio.create_subprocess_exec(*args, stderr=asyncio.subprocess.PIPE)
    server = f"https://127.0.0.1:{port}"
    ca_file = cert_dir / "apiserver-ca.crt"
    deadline = time.monotonic() + 30
    while True:
        assert proc.returncode is None, (await proc.stderr.read()).decode()
        if ca_file.exists():
            code, _, _ = await run(
                KUBECTL,
                f"--server={server}",
                f"--certificate-authority={ca_file}",
                "--token=hpa-token",
                "get",
                "--raw",
                PATH,
            )
            if code == 0:
                break
        assert time.monotonic() < deadline, "secure adapter did not serve in time"
        await asyncio.sleep(0.3)
    proxy_ctx = ssl.create_default_context(cafile=str(ca_file))
    proxy_cert.configure_cert(proxy_ctx)
    try:
        yield {"server": server, "ca": str(ca_file), "cluster": cluster, "proxy_ctx": proxy_ctx, "cert_dir": cert_dir}
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 10)
        await cluster.stop()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def secure(tmp_path_factory):
    """One adapter for the tests that leave it as they found it (each start was ~1.7 s of CPU)."""
    async with secure_adapter(tmp_path_factory.mktemp("secure")) as s:
        yield s


@pytest_asyncio.fixture(loop_scope="module")
async def secure_alone(tmp_path):
    """An adapter of the test's own: its serving certificate is replaced."""
    async with secure_adapter(tmp_path) as s:
        yield s


async def kubectl_raw(s, token, path=PATH):
    return await run(
        KUBECTL,
        f"--server={s['server']}",
        f"--certificate-authority={s['ca']}",
        f"--token={token}",
        "get",
        "--raw",
        path,
    )


async def test_kubectl_with_a_token_reads_metrics_over_https(secure):
    code, out, err = await kubectl_raw(secure, "hpa-token")
    assert code == 0, err
    assert len(hpa.pod_metrics(json.loads(out))) == 2


async def test_bad_token_is_401_and_unauthorized_user_is_403(secure):
    code, _, err = await kubectl_raw(secure, "nope")
    assert code != 0 and "Unauthorized" in err
    code, _, err = await kubectl_raw(secure, "intruder-token")
    assert code != 0 and "Forbidden" in err and "intruder" in err


async def test_front_proxy_certificate_carries_the_user_and_spoofing_fails(secure):
    headers = {"X-Remote-User": HPA_USER}
    async with aiohttp.ClientSession() as session:
        async with session.get(secure["server"] + PATH, headers=headers, ssl=secure["proxy_ctx"]) as resp:
            assert resp.status == 200, await resp.text()
        # The same headers without the front proxy's client certificate authenticate nobody.
        plain = ssl.create_default_context(cafile=secure["ca"])
        async with session.get(secure["server"] + PATH, headers=headers, ssl=plain) as resp:
            body = await resp.json()
            assert resp.status == 401 and body["kind"] == "Status" and body["reason"] == "Unauthorized"
        # Health stays open without credentials.
        async with session.get(secure["server"] + "/readyz", ssl=plain) as resp:
            assert resp.status == 200


async def test_authorization_outage_fails_closed(secure):
    secure["cluster"].api.fail_reviews(503)
    try:
        # A new token (nothing cached) cannot be reviewed: 401, never served.
        secure["cluster"].api.add_token("fresh-token", HPA_USER)
        code, _, err = await kubectl_raw(secure, "fresh-token")
        assert code != 0 and ("Unauthorized" in err or "Forbidden" in err)
    finally:
        secure["cluster"].api.fail_reviews(None)


async def test_a_renewed_serving_certificate_is_picked_up_without_a_restart(secure_alone, tmp_path):
    secure = secure_alone
    # As cert-manager renews a mounted Secret: new files in place, here from a new CA, the key written first.
    new_ca = trustme.CA()
    renewed = new_ca.issue_cert("127.0.0.1", "localhost")
    renewed.private_key_pem.write_to_path(secure["cert_dir"] / "apiserver.key")
    renewed.cert_chain_pems[0].write_to_path(secure["cert_dir"] / "apiserver.crt")
    new_ca_file = tmp_path / "new-ca.crt"
    new_ca.cert_pem.write_to_path(new_ca_file)
    deadline = time.monotonic() + 15
    while True:
        code, out, err = await run(
            KUBECTL, f"--server={secure['server']}", f"--certificate-authority={new_ca_file}",
            "--token=hpa-token", "get", "--raw", PATH,
        )  # fmt: skip
        if code == 0:
            break
        assert "certificate" in err, err  # until the reload, the old certificate fails verification
        assert time.monotonic() < deadline, f"the renewed certificate was not served: {err}"
        await asyncio.sleep(0.2)
    assert len(hpa.pod_metrics(json.loads(out))) == 2
    # Clients that still trust only the old CA now fail the handshake: the old certificate is gone.
    code, _, err = await kubectl_raw(secure, "hpa-token")
    assert code != 0 and "certificate" in err
