"""Secure serving as an aggregated API server: who may read metrics, proven over real TLS.

Scope: front-proxy (requestheader) authentication and the rule that identity headers count only on a connection
whose client certificate the current requestheader CA signed for an allowed CN; client-CA certificates; bearer
tokens through TokenReview; SubjectAccessReview attributes, answers and the kube-style 403; fail-closed when the
reviews are unavailable; the allow/deny/token caches (a fake clock, no sleeping) and request coalescing; CA
rotation through the watched ConfigMap (new connections and keep-alive ones); open health paths; the self-signed
serving certificate; and the real kubectl over HTTPS with a token.

Everything runs against the adapter's real app behind an aiohttp TLS listener on 127.0.0.1, the simulated
Kubernetes API (TokenReview, SubjectAccessReview, the ConfigMap), and throwaway CAs from trustme.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import ssl
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import trustme
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuscale.adapter.access_request import (
    ANONYMOUS,
    RequestAttributes,
    UserInfo,
    forbidden_message,
    request_attributes,
)
from gpuscale.adapter.app import make_app
from gpuscale.adapter.auth import DelegatedAuth
from gpuscale.adapter.auth_config import (
    AuthenticationConfigWatcher,
    AuthenticationFlags,
    config_from_configmap,
    flag_parts,
)
from gpuscale.adapter.discovery import Discovery
from gpuscale.adapter.fastpath import FAST_PATH
from gpuscale.adapter.provider import MetricsProvider
from gpuscale.adapter.selfmetrics import AdapterMetrics
from gpuscale.adapter.tls import (
    CABundle,
    CertificateRejected,
    ServerTLS,
    client_ssl_context,
    ensure_self_signed_cert,
    serving_cert_files,
)
from gpuscale.adapter.transport import AdapterRunner, RejectionLog
from gpuscale.errors import ConfigError
from gpuscale.metrics.catalogue import load_catalogue
from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources.cluster_index import PodInfo, StaticClusterObjects
from gpuscale.sources.kubeconfig import load_api_client
from tests.helpers import H100, H100_NODE, T0, fixture_store

KUBECTL = shutil.which("kubectl") or "/usr/bin/kubectl"
CUSTOM = "custom.metrics.k8s.io"
EXTERNAL = "external.metrics.k8s.io"
METRIC = f"/apis/{CUSTOM}/v1beta1/namespaces/ml-training/pods/*/gpu_utilization"
DISCOVERY = f"/apis/{CUSTOM}/v1beta1"
FRONT_PROXY_CN = "front-proxy-client"
AS_ALICE = {"X-Remote-User": "alice", "X-Remote-Group": "dev"}
DEADLINE_SECONDS = 10.0


class Clock:
    """A monotonic clock the test moves by hand (the caches' TTLs read it)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Pki:
    """Throwaway CAs: the front proxy's (requestheader), the cluster's client CA, and one nobody trusts."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.front_proxy_ca = trustme.CA(organization_name="front-proxy-ca")
        self.client_ca = trustme.CA(organization_name="client-ca")
        self.rogue_ca = trustme.CA(organization_name="rogue")
        self._count = 0

    def cert(self, ca: trustme.CA, common_name: str, *, organization: str | None = None) -> Path:
        """A client certificate (key + chain PEM) signed by ``ca``, written to a file."""
        leaf = ca.issue_cert(common_name, common_name=common_name, organization_name=organization)
        self._count += 1
        path = self.directory / f"client-{self._count}-{common_name}.pem"
        leaf.private_key_and_cert_chain_pem.write_to_path(str(path))
        return path

    def front_proxy(self) -> Path:
        return self.cert(self.front_proxy_ca, FRONT_PROXY_CN)


def pem(ca: trustme.CA) -> str:
    return ca.cert_pem.bytes().decode()


def auth_configmap(pki: Pki, *, requestheader_ca: trustme.CA | None = None, allowed=(FRONT_PROXY_CN,)) -> dict:
    """kube-system/extension-apiserver-authentication as kube-apiserver writes it (lists as JSON strings)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system"},
        "data": {
            "client-ca-file": pem(pki.client_ca),
            "requestheader-client-ca-file": pem(requestheader_ca or pki.front_proxy_ca),
            "requestheader-allowed-names": json.dumps(list(allowed)),
            "requestheader-username-headers": '["X-Remote-User"]',
            "requestheader-group-headers": '["X-Remote-Group"]',
            "requestheader-extra-headers-prefix": '["X-Remote-Extra-"]',
        },
    }


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path)


@pytest.fixture
async def sim(pki):
    api = SimKubeApi()
    api.add_token("alice-token", "alice", groups=["dev"])
    api.add_token("bob-token", "bob")
    api.add_token("root-token", "root", groups=["system:masters"])
    api.allow(users=["alice"], verbs=["get", "list"], api_groups=[CUSTOM, EXTERNAL], resources=["*"])
    api.allow(groups=["system:authenticated"], verbs=["get"], non_resource_urls=["/api", "/api/*", "/apis", "/apis/*"])
    api.create(auth_configmap(pki))
    await api.start()
    yield api
    await api.stop()


def metrics_app(*, middlewares) -> web.Application:
    pods = [
        PodInfo("ml-training", "llm-finetune-worker-0", {"app": "finetune"}, H100_NODE, "10.0.0.5", (), "Running", None)
    ]
    cluster = StaticClusterObjects(pods=pods, nodes={H100_NODE: {}}, namespaces=["ml-training"])
    store = fixture_store([("http://dcgm:9400/metrics", H100, T0)], now=T0)
    catalogue = load_catalogue()
    provider = MetricsProvider(catalogue, store, cluster, clock=lambda: T0 + 1)
    return make_app(
        provider, Discovery(catalogue), AdapterMetrics(lambda: []), ready=lambda: (True, ""), middlewares=middlewares
    )


class Secure:
    """The adapter served over HTTPS with delegated auth, and a client for it."""

    fast: Any  # the app's FastPath

    def __init__(self, url: str, ca_file: Path, auth: DelegatedAuth, clock: Clock) -> None:
        self.url, self.ca_file, self.auth, self.clock = url, ca_file, auth, clock

    def ssl(self, cert: Path | None = None) -> ssl.SSLContext:
        return client_ssl_context(ca_file=self.ca_file, cert_file=cert)

    async def get(
        self,
        path: str,
        *,
        cert: Path | None = None,
        headers: dict[str, str] | None = None,
        token: str | None = None,
        session: aiohttp.ClientSession | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> tuple[int, Any]:
        headers = dict(headers or {})
        if token:
            headers["Authorization"] = f"Bearer {token}"
        own = session is None
        session = session or aiohttp.ClientSession()
        try:
            async with session.get(self.url + path, ssl=ssl_context or self.ssl(cert), headers=headers) as resp:
                text = await resp.text()
                return resp.status, json.loads(text) if resp.content_type == "application/json" else text
        finally:
            if own:
                await session.close()


@pytest.fixture
async def start_secure(tmp_path, sim):
    """Start the adapter over HTTPS with DelegatedAuth(**options) against the simulated API."""
    cleanups: list[Callable[[], Awaitable[None]]] = []

    async def start(**options: Any) -> Secure:
        api = await load_api_client(sim.write_kubeconfig(tmp_path / "kubeconfig"))
        cleanups.append(api.close)
        clock = Clock()
        auth = DelegatedAuth(api, clock=clock, watch_timeout_seconds=30, **options)
        await auth.start(sync_timeout=DEADLINE_SECONDS)
        cleanups.append(auth.stop)
        files = ensure_self_signed_cert(tmp_path / "certs")
        server_tls = ServerTLS(files.cert_file, files.key_file)
        auth.serve_tls(server_tls)
        # NB: the adapter's runner, as `gpuscale adapter` serves: a URL asked before takes its fast path (fastpath.py),
        # so every test here also proves the fast path authenticates and authorizes exactly as the full path
        runner = AdapterRunner(metrics_app(middlewares=[auth.middleware()]), rejections=RejectionLog(), access_log=None)
        await runner.setup()
        cleanups.append(runner.cleanup)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls.context).start()
        assert files.ca_file is not None
        secure = Secure(f"https://127.0.0.1:{runner.addresses[0][1]}", files.ca_file, auth, clock)
        secure.fast = runner.app[FAST_PATH]
        return secure

    yield start
    for cleanup in reversed(cleanups):
        await cleanup()


@pytest.fixture
async def secure(start_secure):
    return await start_secure()


def assert_status(body: Any, code: int, reason: str) -> None:
    assert isinstance(body, dict) and body["kind"] == "Status" and body["apiVersion"] == "v1", body
    assert body["status"] == "Failure" and body["code"] == code and body["reason"] == reason, body


# --- the front proxy -----------------------------------------------------------------------------------


async def test_a_front_proxy_request_acts_as_the_user_in_its_headers(secure, pki, sim):
    headers = {**AS_ALICE, "X-Remote-Extra-Scopes": "metrics", "X-Remote-Extra-Acme.com%2Fproject": "p1"}
    status, body = await secure.get(METRIC, cert=pki.front_proxy(), headers=headers)
    assert status == 200, body
    assert body["kind"] == "MetricValueList" and body["items"]
    assert sim.token_reviews == []
    assert sim.access_reviews == [
        {
            "user": "alice",
            "groups": ["dev", "system:authenticated"],
            "extra": {"acme.com/project": ["p1"], "scopes": ["metrics"]},
            "resourceAttributes": {
                "verb": "get",
                "group": CUSTOM,
                "version": "v1beta1",
                "resource": "pods",
                "namespace": "ml-training",
                "subresource": "gpu_utilization",
                "name": "*",
            },
        }
    ]


async def test_a_front_proxy_certificate_from_an_intermediate_ca_is_accepted(start_secure, pki, sim, tmp_path):
    root = trustme.CA()
    intermediate = root.create_child_ca()
    leaf = intermediate.issue_cert(FRONT_PROXY_CN, common_name=FRONT_PROXY_CN)
    cert = tmp_path / "via-intermediate.pem"
    leaf.private_key_and_cert_chain_pem.write_to_path(str(cert))  # leaf + intermediate, as a proxy sends them
    sim.apply(auth_configmap(pki, requestheader_ca=root))
    secure = await start_secure()
    status, body = await secure.get(METRIC, cert=cert, headers=AS_ALICE)
    assert status == 200, body


async def test_any_cn_from_the_requestheader_ca_is_a_front_proxy_when_no_names_are_listed(start_secure, pki, tmp_path):
    ca_file = tmp_path / "front-proxy-ca.crt"
    pki.front_proxy_ca.cert_pem.write_to_path(str(ca_file))
    # NB: from flags this time: --requestheader-client-ca-file without --requestheader-allowed-names.
    secure = await start_secure(flags=AuthenticationFlags(requestheader_client_ca_file=str(ca_file)))
    status, body = await secure.get(METRIC, cert=pki.cert(pki.front_proxy_ca, "aggregator-2"), headers=AS_ALICE)
    assert status == 200, body


async def test_identity_headers_are_ignored_unless_a_trusted_front_proxy_sent_them(secure, pki, sim):
    # a certificate from the requestheader CA whose CN is not an allowed name
    status, body = await secure.get(METRIC, cert=pki.cert(pki.front_proxy_ca, "mallory"), headers=AS_ALICE)
    assert status == 401 and body["message"] == "Unauthorized"
    assert_status(body, 401, "Unauthorized")
    # plain TLS, no client certificate at all
    _, body = await secure.get(METRIC, headers=AS_ALICE)
    assert_status(body, 401, "Unauthorized")
    assert sim.access_reviews == []  # nobody was even asked about alice


async def test_a_client_ca_certificate_is_its_own_cn_whatever_the_headers_claim(secure, pki, sim):
    _, body = await secure.get(METRIC, cert=pki.cert(pki.client_ca, "bob", organization="ops"), headers=AS_ALICE)
    assert_status(body, 403, "Forbidden")
    assert 'User "bob" cannot get resource "pods/gpu_utilization"' in body["message"]
    assert [(s["user"], s["groups"]) for s in sim.access_reviews] == [("bob", ["ops", "system:authenticated"])]


async def test_a_certificate_from_an_unknown_ca_does_not_get_through_the_handshake(secure, pki):
    with pytest.raises(aiohttp.ClientError):
        await secure.get(METRIC, cert=pki.cert(pki.rogue_ca, FRONT_PROXY_CN), headers=AS_ALICE)


async def test_with_anonymous_allowed_a_spoofed_header_is_still_only_anonymous(start_secure, sim):
    secure = await start_secure(allow_anonymous=True)
    _, body = await secure.get(METRIC, headers=AS_ALICE)
    assert_status(body, 403, "Forbidden")
    assert 'User "system:anonymous" cannot get' in body["message"]
    assert [(s["user"], s["groups"]) for s in sim.access_reviews] == [(ANONYMOUS.name, list(ANONYMOUS.groups))]
    # a bad token is never downgraded to anonymous
    _, body = await secure.get(METRIC, token="forged")
    assert_status(body, 401, "Unauthorized")


# --- bearer tokens -------------------------------------------------------------------------------------


async def test_a_bearer_token_is_reviewed_then_authorized(secure, sim):
    status, body = await secure.get(METRIC, token="alice-token")
    assert status == 200, body
    assert sim.token_reviews == [{"token": "alice-token"}]
    assert sim.access_reviews[-1]["user"] == "alice"


async def test_an_unknown_bearer_token_is_401(secure, sim):
    _, body = await secure.get(METRIC, token="nobody-token")
    assert_status(body, 401, "Unauthorized")
    assert sim.access_reviews == []


# --- authorization -------------------------------------------------------------------------------------


async def test_a_denied_request_gets_kube_apiservers_forbidden_status(secure):
    _, body = await secure.get(METRIC, token="bob-token")
    assert_status(body, 403, "Forbidden")
    assert body["message"] == (
        'pods.custom.metrics.k8s.io "*" is forbidden: User "bob" cannot get resource "pods/gpu_utilization" '
        'in API group "custom.metrics.k8s.io" in the namespace "ml-training"'
    )
    assert body["details"] == {"group": CUSTOM, "kind": "pods", "name": "*"}


async def test_system_masters_are_allowed_without_asking(secure, sim):
    status, body = await secure.get(METRIC, token="root-token")
    assert status == 200, body
    assert sim.access_reviews == []


async def test_discovery_is_authorized_as_a_non_resource_path(secure, sim):
    status, body = await secure.get(DISCOVERY, token="alice-token")
    assert status == 200 and body["kind"] == "APIResourceList"
    assert sim.access_reviews == [
        {
            "user": "alice",
            "groups": ["dev", "system:authenticated"],
            "nonResourceAttributes": {"path": DISCOVERY, "verb": "get"},
        }
    ]


@pytest.mark.parametrize("path", ["/healthz", "/livez", "/readyz"])
async def test_health_paths_are_open_without_credentials(secure, sim, path):
    status, body = await secure.get(path)
    assert (status, body) == (200, "ok")
    assert sim.token_reviews == [] and sim.access_reviews == []


@pytest.mark.parametrize("path", ["/metrics", "/apis", "/version", METRIC])
async def test_everything_else_needs_credentials(secure, path):
    _, body = await secure.get(path)
    assert_status(body, 401, "Unauthorized")


# --- when the reviews cannot be made -------------------------------------------------------------------


async def test_reviews_unavailable_fail_closed_and_are_not_cached(secure, pki, sim):
    sim.fail_reviews(503)
    _, body = await secure.get(METRIC, token="alice-token")
    assert_status(body, 401, "Unauthorized")  # as kube-apiserver: a token that cannot be checked is no identity
    front_proxy = pki.front_proxy()
    _, body = await secure.get(METRIC, cert=front_proxy, headers=AS_ALICE)
    assert_status(body, 403, "Forbidden")
    assert body["message"].startswith(
        'pods.custom.metrics.k8s.io "*" is forbidden: User "alice" cannot get resource "pods/gpu_utilization"'
    )
    assert "the authorization check could not be completed (SubjectAccessReview unavailable)" in body["message"]
    sim.fail_reviews(None)  # no time passes: nothing of the failure was cached
    assert (await secure.get(METRIC, token="alice-token"))[0] == 200
    assert (await secure.get(METRIC, cert=front_proxy, headers=AS_ALICE))[0] == 200


# --- caches --------------------------------------------------------------------------------------------


async def test_answers_are_cached_for_the_ttl_then_asked_again(secure, sim):
    for _ in range(3):
        assert (await secure.get(METRIC, token="alice-token"))[0] == 200
    assert (len(sim.token_reviews), len(sim.access_reviews)) == (1, 1)
    secure.clock.advance(9.9)
    assert (await secure.get(METRIC, token="alice-token"))[0] == 200
    assert (len(sim.token_reviews), len(sim.access_reviews)) == (1, 1)
    secure.clock.advance(0.2)
    assert (await secure.get(METRIC, token="alice-token"))[0] == 200
    assert (len(sim.token_reviews), len(sim.access_reviews)) == (2, 2)


async def test_a_bad_token_is_cached_too(secure, sim):
    for _ in range(3):
        assert (await secure.get(METRIC, token="nobody-token"))[0] == 401
    assert len(sim.token_reviews) == 1
    sim.add_token("nobody-token", "alice", groups=["dev"])
    assert (await secure.get(METRIC, token="nobody-token"))[0] == 401  # still the cached "no"
    secure.clock.advance(10.1)
    assert (await secure.get(METRIC, token="nobody-token"))[0] == 200


async def test_allow_and_deny_are_each_cached_until_their_ttl(start_secure, pki, sim):
    secure = await start_secure(authz_cache_ttl_seconds=5)
    front_proxy = pki.front_proxy()
    as_bob = {"X-Remote-User": "bob"}
    assert (await secure.get(METRIC, cert=front_proxy, headers=as_bob))[0] == 403
    rule = sim.allow(users=["bob"], api_groups=[CUSTOM])
    assert (await secure.get(METRIC, cert=front_proxy, headers=as_bob))[0] == 403  # the deny is cached
    secure.clock.advance(5.1)
    assert (await secure.get(METRIC, cert=front_proxy, headers=as_bob))[0] == 200
    sim.access_rules.remove(rule)
    assert (await secure.get(METRIC, cert=front_proxy, headers=as_bob))[0] == 200  # the allow is cached
    secure.clock.advance(5.1)
    assert (await secure.get(METRIC, cert=front_proxy, headers=as_bob))[0] == 403
    assert len(sim.access_reviews) == 3
    # NB: METRIC was answered once by the full path, so the last two requests were the fast path's: it denied too
    assert secure.fast.served == 2


async def test_concurrent_identical_requests_share_one_review(secure, pki, sim):
    sim.review_delay_seconds = 0.2
    front_proxy = secure.ssl(pki.front_proxy())
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(secure.get(METRIC, headers=AS_ALICE, session=session, ssl_context=front_proxy) for _ in range(5))
        )
    assert [status for status, _ in results] == [200] * 5
    assert len(sim.access_reviews) == 1


# --- rotation ------------------------------------------------------------------------------------------


async def test_a_new_requestheader_ca_in_the_configmap_applies_without_a_restart(secure, pki, sim):
    old = secure.ssl(pki.front_proxy())
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as kept_alive:
        assert (await secure.get(METRIC, headers=AS_ALICE, session=kept_alive, ssl_context=old))[0] == 200
        rotated = asyncio.Event()
        secure.auth.config.subscribe(lambda config: rotated.set())
        new_ca = trustme.CA(organization_name="front-proxy-ca-2")
        sim.apply(auth_configmap(pki, requestheader_ca=new_ca))
        await asyncio.wait_for(rotated.wait(), DEADLINE_SECONDS)

        # the connection opened before the rotation is checked per request against the new CA
        _, body = await secure.get(METRIC, headers=AS_ALICE, session=kept_alive, ssl_context=old)
        assert_status(body, 401, "Unauthorized")
    # a new connection with the old certificate no longer passes the handshake
    with pytest.raises(aiohttp.ClientError):
        await secure.get(METRIC, headers=AS_ALICE, ssl_context=old)
    status, body = await secure.get(METRIC, cert=pki.cert(new_ca, FRONT_PROXY_CN), headers=AS_ALICE)
    assert status == 200, body
    # the client CA was not rotated and still works
    status, body = await secure.get(METRIC, cert=pki.cert(pki.client_ca, "alice"))
    assert status == 200, body


async def test_an_unparseable_configmap_keeps_the_previous_config(tmp_path, sim, pki):
    api = await load_api_client(sim.write_kubeconfig(tmp_path / "kubeconfig"))
    try:
        watcher = AuthenticationConfigWatcher(api)
        await watcher.refresh_once()
        before = watcher.current
        assert before.request_header is not None and before.request_header.allowed_names == (FRONT_PROXY_CN,)
        broken = auth_configmap(pki)
        broken["data"]["requestheader-allowed-names"] = "front-proxy-client"  # not JSON
        sim.apply(broken)
        await watcher.refresh_once()
        assert watcher.current is before
        sim.delete("v1", "ConfigMap", "extension-apiserver-authentication", namespace="kube-system")
        await watcher.refresh_once()
        assert watcher.current.request_header is None and watcher.current.client_ca.empty
    finally:
        await api.close()


# --- kubectl -------------------------------------------------------------------------------------------


async def kubectl(*args: str) -> tuple[int, str, str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/nonexistent", "KUBECONFIG": "/dev/null"}
    proc = await asyncio.create_subprocess_exec(
        KUBECTL,
        *args,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_kubectl_reads_over_https_with_a_token_and_never_prompts(secure):
    server = [f"--server={secure.url}", f"--certificate-authority={secure.ca_file}"]
    code, out, err = await kubectl(*server, "--token=alice-token", "get", "--raw", DISCOVERY)
    assert code == 0, err
    body = json.loads(out)
    assert body["kind"] == "APIResourceList" and body["groupVersion"] == f"{CUSTOM}/v1beta1"
    code, out, err = await kubectl(*server, "--token=alice-token", "get", "--raw", METRIC)
    assert code == 0, err
    assert json.loads(out)["items"][0]["describedObject"]["name"] == "llm-finetune-worker-0"
    assert "Please enter" not in out
    # a token the cluster does not know: a clean Unauthorized, still no prompt
    code, out, err = await kubectl(*server, "--token=forged", "get", "--raw", DISCOVERY)
    assert code != 0 and "Unauthorized" in err and "Please enter" not in out
    # NB: without any credentials kubectl falls back to asking for a username on stdin (closed here)
    code, out, err = await kubectl(*server, "get", "--raw", DISCOVERY)
    assert code != 0 and "Please enter Username" in out


# --- the self-signed serving certificate ----------------------------------------------------------------


def load_chain(path: Path) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(path.read_bytes())


def test_a_self_signed_certificate_is_generated_into_the_cert_dir(tmp_path):
    now = dt.datetime.now(dt.UTC)
    files = ensure_self_signed_cert(tmp_path / "certs", now=now)
    assert files.cert_file == tmp_path / "certs" / "apiserver.crt"
    assert files.key_file.stat().st_mode & 0o777 == 0o600
    leaf, ca = load_chain(files.cert_file)
    assert load_chain(files.ca_file) == [ca]
    leaf.verify_directly_issued_by(ca)
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(san.get_values_for_type(x509.DNSName)) == {"localhost", socket.gethostname()}
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert dt.timedelta(days=364) < leaf.not_valid_after_utc - now <= dt.timedelta(days=365)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    key = serialization.load_pem_private_key(files.key_file.read_bytes(), password=None)
    assert key.public_key() == leaf.public_key()


def test_a_valid_self_signed_certificate_is_reused(tmp_path):
    first = ensure_self_signed_cert(tmp_path)
    cert, key = first.cert_file.read_bytes(), first.key_file.read_bytes()
    again = ensure_self_signed_cert(tmp_path, now=dt.datetime.now(dt.UTC) + dt.timedelta(days=300))
    assert again == first and (again.cert_file.read_bytes(), again.key_file.read_bytes()) == (cert, key)


def _replace_key(files) -> None:
    other = ec.generate_private_key(ec.SECP256R1())
    files.key_file.write_bytes(
        other.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )


REGENERATE = [
    ("expired", lambda files: None, {"now": dt.datetime.now(dt.UTC) + dt.timedelta(days=400)}),
    ("expiring within a day", lambda files: None, {"now": dt.datetime.now(dt.UTC) + dt.timedelta(days=364, hours=12)}),
    ("a host it does not cover", lambda files: None, {"hosts": ["localhost", "127.0.0.1", "gpuscale.gpuscale.svc"]}),
    ("a key that is not its own", _replace_key, {}),
    ("garbage", lambda files: files.cert_file.write_text("not a certificate"), {}),
    # NB: read within files.py's limits: a FIFO would block the start, 100 MB be read whole
    ("a FIFO for its key", lambda files: (files.key_file.unlink(), os.mkfifo(files.key_file)), {}),
    ("a 100 MB key", lambda files: os.truncate(files.key_file, 100 * 2**20), {}),
]


@pytest.mark.parametrize(("case", "damage", "options"), REGENERATE, ids=[c[0] for c in REGENERATE])
def test_a_self_signed_certificate_is_replaced_when_not_valid(tmp_path, case, damage, options):
    first = ensure_self_signed_cert(tmp_path)
    damage(first)
    before = first.cert_file.read_bytes()
    again = ensure_self_signed_cert(tmp_path, **options)
    assert again.cert_file.read_bytes() != before, case
    leaf = load_chain(again.cert_file)[0]
    key = serialization.load_pem_private_key(again.key_file.read_bytes(), password=None)
    assert key.public_key() == leaf.public_key()


def test_given_serving_files_are_used_as_they_are(tmp_path):
    generated = ensure_self_signed_cert(tmp_path / "a")
    files = serving_cert_files(cert_file=generated.cert_file, key_file=generated.key_file, cert_dir=tmp_path / "b")
    assert (files.cert_file, files.key_file) == (generated.cert_file, generated.key_file)
    assert not (tmp_path / "b").exists()
    with pytest.raises(ConfigError, match="together"):
        serving_cert_files(cert_file=generated.cert_file, key_file=None, cert_dir=tmp_path)
    with pytest.raises(ConfigError, match=r"missing.key: --tls-private-key-file: cannot read private key: No such"):
        serving_cert_files(cert_file=generated.cert_file, key_file=tmp_path / "missing.key", cert_dir=tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with open(tmp_path / "huge.crt", "wb") as f:
        f.truncate(100 * 2**20)
    hostile = [  # NB: OpenSSL's load_cert_chain would block on the FIFO and read /dev/zero until memory ran out
        ("/dev/zero", "key", r"/dev/zero: --tls-private-key-file: cannot read private key: a character device"),
        (tmp_path / "fifo", "cert", r"fifo: --tls-cert-file: cannot read certificate: a FIFO"),
        (tmp_path / "huge.crt", "cert", r"huge.crt: --tls-cert-file: certificate larger than the 4 MiB limit"),
        (tmp_path, "key", r"--tls-private-key-file: cannot read private key: a directory"),
    ]
    for path, which, says in hostile:
        given = {"cert_file": generated.cert_file, "key_file": generated.key_file, which + "_file": path}
        with pytest.raises(ConfigError, match=says):
            serving_cert_files(**given, cert_dir=tmp_path)
    with pytest.raises(ConfigError, match="cannot load the serving certificate"):
        ServerTLS(generated.cert_file, generated.cert_file)


async def served_certificate(port: int) -> bytes:
    """The DER of the leaf certificate a TLS server on 127.0.0.1:port presents now (not verified)."""
    pem = await asyncio.to_thread(ssl.get_server_certificate, ("127.0.0.1", port))
    return ssl.PEM_cert_to_DER_cert(pem)


async def test_a_renewed_serving_certificate_is_served_without_a_restart(tmp_path, caplog):
    ca = trustme.CA()
    first, second = ca.issue_cert("127.0.0.1"), ca.issue_cert("127.0.0.1")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    first.cert_chain_pems[0].write_to_path(cert_file)
    first.private_key_pem.write_to_path(key_file)
    server_tls = ServerTLS(cert_file, key_file)
    runner = web.AppRunner(web.Application(), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_tls.context).start()
    port = runner.addresses[0][1]

    def der(leaf: trustme.LeafCert) -> bytes:
        return x509.load_pem_x509_certificate(leaf.cert_chain_pems[0].bytes()).public_bytes(serialization.Encoding.DER)

    try:
        assert await served_certificate(port) == der(first)
        assert server_tls.reload_serving_cert() is False  # unchanged files: nothing to do
        # Mid-renewal: the new certificate is written before its key. The old pair keeps serving, and the
        # mismatch is logged once however often the files are checked.
        second.cert_chain_pems[0].write_to_path(cert_file)
        with caplog.at_level("WARNING", logger="gpuscale.adapter.tls"):
            assert server_tls.reload_serving_cert() is False
            assert server_tls.reload_serving_cert() is False
        warnings = [r.getMessage() for r in caplog.records if "keeping the previous" in r.getMessage()]
        assert len(warnings) == 1 and "cannot load the serving certificate" in warnings[0], warnings
        assert await served_certificate(port) == der(first)
        second.private_key_pem.write_to_path(key_file)
        assert server_tls.reload_serving_cert() is True
        assert await served_certificate(port) == der(second)
        # A client that trusts the CA still verifies the renewed certificate.
        client = ssl.create_default_context()
        ca.configure_trust(client)
        async with aiohttp.ClientSession() as session, session.get(f"https://127.0.0.1:{port}/", ssl=client) as resp:
            assert resp.status == 404  # the empty app: the TLS handshake is what is tested
    finally:
        await runner.cleanup()


async def test_a_serving_certificate_rotated_into_something_unreadable_keeps_the_old_pair(tmp_path, caplog):
    """A mounted Secret swapped for a FIFO, a directory, /dev/zero or 100 MB: each reload returns at once, the pair
    that was loaded keeps serving, and each state is logged once."""
    generated = ensure_self_signed_cert(tmp_path / "good")
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(generated.cert_file.read_bytes())
    key_file.write_bytes(generated.key_file.read_bytes())
    server_tls = ServerTLS(cert_file, key_file)
    serving = server_tls._current

    def make_fifo(path: Path) -> None:
        os.mkfifo(path)

    def make_huge(path: Path) -> None:
        with open(path, "wb") as f:
            f.truncate(100 * 2**20)

    rotations = [
        (make_fifo, "a FIFO"),
        (lambda path: path.mkdir(), "a directory"),
        (lambda path: path.symlink_to("/dev/zero"), "a character device"),
        (make_huge, "larger than the 4 MiB limit"),
    ]
    for make, says in rotations:
        caplog.clear()
        cert_file.unlink()
        if key_file.is_dir() and not key_file.is_symlink():
            key_file.rmdir()
        else:
            key_file.unlink()
        make(key_file)
        cert_file.write_bytes(generated.cert_file.read_bytes())
        with caplog.at_level("WARNING", logger="gpuscale.adapter.tls"):
            start = time.monotonic()
            assert server_tls.reload_serving_cert() is False
            assert server_tls.reload_serving_cert() is False
            assert time.monotonic() - start < 1.0
        warnings = [r.getMessage() for r in caplog.records if "keeping the previous" in r.getMessage()]
        assert len(warnings) == 1 and says in warnings[0] and str(key_file) in warnings[0], warnings
        assert server_tls._current is serving


# --- units: request attributes, messages, config ---------------------------------------------------------

C1 = f"/apis/{CUSTOM}/v1beta1"
ATTRIBUTES = [
    (
        f"{C1}/namespaces/ns/pods/*/gpu_util",
        {},
        dict(verb="get", resource="pods", namespace="ns", name="*", subresource="gpu_util", api_group=CUSTOM),
    ),
    (
        f"/apis/{CUSTOM}/v1beta2/namespaces/ns/pods/p-1/gpu_util",
        {},
        dict(verb="get", resource="pods", namespace="ns", name="p-1", subresource="gpu_util", api_version="v1beta2"),
    ),
    (f"{C1}/namespaces/ns/metrics/queue", {}, dict(verb="get", resource="metrics", namespace="ns", name="queue")),
    (
        f"{C1}/namespaces/ns/deployments.apps/triton/queue",
        {},
        dict(resource="deployments.apps", namespace="ns", name="triton", subresource="queue"),
    ),
    (f"{C1}/nodes/*/gpu_util", {}, dict(verb="get", resource="nodes", name="*", subresource="gpu_util", namespace="")),
    (
        f"/apis/{EXTERNAL}/v1beta1/namespaces/ns/queue_depth",
        {"labelSelector": "model=bert"},
        dict(verb="list", resource="queue_depth", namespace="ns", name="", api_group=EXTERNAL),
    ),
    (f"{C1}/namespaces/ns/pods", {"watch": "true"}, dict(verb="watch", resource="pods", namespace="ns")),
    (
        f"{C1}/namespaces/ns/pods",
        {"fieldSelector": "metadata.name=p1"},
        dict(verb="list", resource="pods", namespace="ns", name="p1"),
    ),
    (f"{C1}/namespaces/ns", {}, dict(verb="get", resource="namespaces", name="ns", namespace="ns")),
]


@pytest.mark.parametrize(("path", "query", "expected"), ATTRIBUTES, ids=[a[0] for a in ATTRIBUTES])
def test_resource_requests_get_apiserver_request_info(path, query, expected):
    attributes = request_attributes("GET", path, query)
    assert attributes.resource_request and attributes.path == path
    for key, value in expected.items():
        assert getattr(attributes, key) == value, key


@pytest.mark.parametrize("path", ["/apis", "/apis/", f"/apis/{CUSTOM}", C1, f"{C1}/", "/api", "/version", "/metrics"])
def test_everything_else_is_a_non_resource_request(path):
    assert request_attributes("GET", path, {}) == RequestAttributes(verb="get", path=path)


def test_forbidden_messages_read_like_kube_apiservers():
    user = UserInfo("alice")
    nodes = request_attributes("GET", f"{C1}/nodes/gpu-1/gpu_util", {})
    assert forbidden_message(user, nodes) == (
        'nodes.custom.metrics.k8s.io "gpu-1" is forbidden: User "alice" cannot get resource "nodes/gpu_util" '
        'in API group "custom.metrics.k8s.io" at the cluster scope'
    )
    external = request_attributes("GET", f"/apis/{EXTERNAL}/v1beta1/namespaces/ns/queue", {})
    assert forbidden_message(user, external, "no rule") == (
        'queue.external.metrics.k8s.io is forbidden: User "alice" cannot list resource "queue" '
        'in API group "external.metrics.k8s.io" in the namespace "ns": no rule'
    )
    assert forbidden_message(user, request_attributes("GET", C1, {})) == (
        f'forbidden: User "alice" cannot get path "{C1}"'
    )


def test_the_configmap_is_parsed_like_kube_apiserver_writes_it(pki):
    config = config_from_configmap(auth_configmap(pki)["data"])
    assert (
        config.client_ca.certificates[0].subject
        == x509.load_pem_x509_certificate(pki.client_ca.cert_pem.bytes()).subject
    )
    header = config.request_header
    assert header is not None
    assert header.allowed_names == (FRONT_PROXY_CN,)
    assert (header.username_headers, header.group_headers, header.extra_headers_prefixes, header.uid_headers) == (
        ("X-Remote-User",),
        ("X-Remote-Group",),
        ("X-Remote-Extra-",),
        (),
    )
    assert pem(pki.client_ca).strip() in config.trusted_pem and pem(pki.front_proxy_ca).strip() in config.trusted_pem
    assert config_from_configmap({}).request_header is None


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("requestheader-allowed-names", "front-proxy-client", "requestheader-allowed-names: not a JSON list"),
        ("requestheader-group-headers", '{"a": 1}', "requestheader-group-headers: not a JSON list"),
        (
            "client-ca-file",
            "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n",
            "client-ca-file: not a PEM",
        ),
    ],
)
def test_a_broken_configmap_value_names_its_key(pki, key, value, message):
    data = auth_configmap(pki)["data"] | {key: value}
    with pytest.raises(ConfigError, match=message):
        config_from_configmap(data)


def test_flags_override_their_part_and_leave_the_rest_to_the_cluster(tmp_path, pki):
    ca_file = tmp_path / "client-ca.crt"
    pki.rogue_ca.cert_pem.write_to_path(str(ca_file))
    watcher = AuthenticationConfigWatcher(None, flags=AuthenticationFlags(client_ca_file=str(ca_file)))
    assert watcher.synced  # nothing to watch without an ApiClient
    assert watcher.current.client_ca == CABundle.parse(pem(pki.rogue_ca), source="x")
    assert watcher.current.request_header is None
    with pytest.raises(ConfigError, match=r"missing: --client-ca-file: cannot read CA bundle: No such file"):
        flag_parts(AuthenticationFlags(client_ca_file=str(tmp_path / "missing")))
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "latin1.pem").write_bytes(b"\xe9t\xe9\n")
    for path, says in [
        (tmp_path / "fifo", r"fifo: --requestheader-client-ca-file: cannot read CA bundle: a FIFO"),
        ("/dev/zero", r"/dev/zero: --requestheader-client-ca-file: cannot read CA bundle: a character device"),
        (tmp_path / "latin1.pem", r"--requestheader-client-ca-file .*latin1.pem: not a PEM certificate bundle"),
    ]:
        with pytest.raises(ConfigError, match=says):
            flag_parts(AuthenticationFlags(requestheader_client_ca_file=str(path)))


# --- units: chain verification ---------------------------------------------------------------------------


def der_chain(leaf: trustme.LeafCert) -> list[bytes]:
    return [
        x509.load_pem_x509_certificate(blob.bytes()).public_bytes(serialization.Encoding.DER)
        for blob in leaf.cert_chain_pems
    ]


def test_a_chain_is_verified_against_its_bundle_only():
    root = trustme.CA()
    intermediate = root.create_child_ca()
    leaf = intermediate.issue_cert("x", common_name="proxy")
    bundle = CABundle.parse(pem(root), source="test")
    assert bundle.verify(der_chain(leaf)).subject.rfc4514_string().startswith("CN=proxy,")
    with pytest.raises(CertificateRejected, match="not signed by a trusted CA"):
        bundle.verify(der_chain(leaf)[:1])  # the intermediate is needed to reach the root
    with pytest.raises(CertificateRejected, match="not signed by a trusted CA"):
        CABundle.parse(pem(trustme.CA()), source="test").verify(der_chain(leaf))
    with pytest.raises(CertificateRejected, match="not now"):
        bundle.verify(der_chain(leaf), now=dt.datetime(1990, 1, 1, tzinfo=dt.UTC))  # before it was valid
    with pytest.raises(CertificateRejected, match="no CA configured"):
        CABundle().verify(der_chain(leaf))
