"""Scrape targets: which pod serves an exporter URL (given explicitly, or found through the watch cache).

Shared by every command that scrapes (the adapter, `top`); kept apart from the commands so a light CLI
such as `top` does not import the adapter's HTTP stack to resolve a URL.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from gpuscale.errors import ConfigError
from gpuscale.metrics.attribution import Target
from gpuscale.model import ObjectRef, pod
from gpuscale.sources.cluster_index import ClusterObjects


def parse_scrape_targets(values: list[str]) -> dict[str, ObjectRef | None]:
    """'URL' or 'NAMESPACE/POD=URL' → {url: pod or None}; errors name the offending value."""
    out: dict[str, ObjectRef | None] = {}
    for value in values:
        owner: ObjectRef | None = None
        url = value
        if "=" in value and not value.startswith(("http://", "https://")):
            who, url = value.split("=", 1)
            ns, sep, name = who.partition("/")
            if not sep or not ns or not name:
                raise ConfigError(f"--scrape-url {value!r}: expected NAMESPACE/POD=URL")
            owner = pod(ns, name)
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"--scrape-url {value!r}: not an http(s) URL")
        out[url] = owner
    return out


def target_resolver(explicit: dict[str, ObjectRef | None], cluster: ClusterObjects | None) -> Callable[[str], Target]:
    """url → Target: the pod that serves it (given, or found by podIP:containerPort) and its node."""

    def resolve(url: str) -> Target:
        owner = explicit.get(url)
        info = None
        if cluster is not None:
            if owner is not None:
                info = cluster.pod(owner.namespace or "", owner.name)
            else:
                parts = urlsplit(url)
                port = parts.port or (443 if parts.scheme == "https" else 80)
                info = cluster.pod_at(parts.hostname or "", port)
                if info is not None:
                    owner = pod(info.namespace, info.name)
        return Target(url, owner, info.node_name if info else None)

    return resolve
