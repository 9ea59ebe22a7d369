"""The control plane's certificates, made at start: what kubeadm writes to /etc/kubernetes/pki, for one run.

* a cluster CA that signs the API server's serving certificate and every client certificate (admin,
  kube-controller-manager, test users), so ``--client-ca-file`` authenticates them with CN = user, O = groups;
* a separate front-proxy CA and its ``front-proxy-client`` certificate: the aggregation layer presents it to an
  aggregated API server (gpuscale's adapter), which trusts the identity headers only over that connection;
* the service-account signing key pair (TokenRequest tokens are JWTs signed with it).

All files live in one directory of the run; nothing is written anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

__all__ = ["ClientCert", "Pki"]


@dataclass(frozen=True)
class ClientCert:
    cert: Path
    key: Path


class Pki:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._ca = trustme.CA(organization_name="gpuscale-test-cluster")
        self._front_proxy_ca = trustme.CA(organization_name="gpuscale-test-front-proxy")
        self.ca = self._write("ca.crt", self._ca.cert_pem.bytes())
        self.front_proxy_ca = self._write("front-proxy-ca.crt", self._front_proxy_ca.cert_pem.bytes())
        serving = self._ca.issue_cert(
            "127.0.0.1",
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            common_name="kube-apiserver",
        )
        self.serving = self._leaf("apiserver", serving)
        proxy = self._front_proxy_ca.issue_cert("front-proxy-client", common_name="front-proxy-client")
        self.front_proxy_client = self._leaf("front-proxy-client", proxy)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.sa_key = self._write(
            "sa.key",
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        self.sa_pub = self._write(
            "sa.pub",
            key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo),
        )

    def client(self, user: str, *groups: str) -> ClientCert:
        """A client certificate the API server authenticates as ``user`` in ``groups`` (CN and O)."""
        # NB: trustme puts one O per certificate; Kubernetes reads every O as a group, so more than one group
        # is not expressible here — no test needs it.
        assert len(groups) <= 1, "one group per client certificate"
        # NB: the SAN is only a placeholder trustme requires; Kubernetes reads the user from the CN.
        leaf = self._ca.issue_cert(
            f"{_safe(user).replace('_', '-')}.client.test",
            common_name=user,
            organization_name=groups[0] if groups else None,
        )
        return self._leaf(f"user-{_safe(user)}", leaf)

    def _leaf(self, stem: str, leaf: trustme.LeafCert) -> ClientCert:
        cert = self._write(f"{stem}.crt", b"".join(blob.bytes() for blob in leaf.cert_chain_pems[:1]))
        key = self._write(f"{stem}.key", leaf.private_key_pem.bytes())
        return ClientCert(cert=cert, key=key)

    def _write(self, name: str, data: bytes) -> Path:
        path = self.dir / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path


def _safe(user: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in user)
