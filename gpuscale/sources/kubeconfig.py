"""Reaching the API server: an ApiClient from a kubeconfig (read within files.py's limits, the files it names
inlined) or from the in-cluster service account, and an aiohttp session with the same credentials for the requests
kubernetes-asyncio has no method for."""

from __future__ import annotations

import base64
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config

from gpuscale.config import read_yaml
from gpuscale.errors import SourceUnavailable
from gpuscale.files import named_by
from gpuscale.sources.credentials import read_pem, read_token
from gpuscale.sources.reflector import SOURCE

__all__ = [
    "ApiServerSession",
    "check_kubeconfig",
    "current_context",
    "load_api_client",
    "read_kubeconfig",
]


async def load_api_client(kubeconfig: str | os.PathLike[str] | None) -> client.ApiClient:
    """An ApiClient from a kubeconfig file, else from the in-cluster service account.

    Raises SourceUnavailable saying which was tried and why it failed, ConfigError naming the file when the
    kubeconfig (or a file it names) is not one to read (``read_kubeconfig``). The caller closes the client.
    """
    if kubeconfig is not None:
        path = os.fspath(kubeconfig)
        if not os.path.lexists(path):
            raise SourceUnavailable(SOURCE, f"kubeconfig {path} does not exist")
        data = _with_files_inlined(read_kubeconfig(path), path)
        try:
            return await config.new_client_from_config_dict(config_dict=data)
        except (config.ConfigException, AssertionError, AttributeError, ValueError, KeyError, TypeError) as e:
            # NB: the client asserts that the current context exists, and indexes whatever types it is given
            reason = " ".join(str(e).split()) or "the current context, its cluster or its user is missing"
            raise SourceUnavailable(SOURCE, f"cannot load kubeconfig {path}: {reason}") from e
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as e:
        raise SourceUnavailable(
            SOURCE,
            f"no kubeconfig given and not running in a cluster ({e}); pass a kubeconfig or run in a pod with a "
            "service account",
        ) from e
    return client.ApiClient(configuration)


def read_kubeconfig(path: str) -> dict[str, Any]:
    """The kubeconfig at ``path`` as plain data, read as every config file is (files.py, config.read_yaml: a
    regular file of at most 4 MiB, YAML aliases and nesting bounded, no key twice); ConfigError naming the file.

    NB: kubernetes-asyncio reads it itself, whole, with PyYAML's pure-Python yaml.safe_load (a 100 MB kubeconfig
    was still being parsed after 20 s), takes a "billion laughs" file (its aliases stay shared references until
    something walks them) and opens the files it names with open().read() (a FIFO tokenFile blocked the command
    for good, past SIGTERM)."""
    with named_by("--kubeconfig"):
        return dict(read_yaml(Path(path), what="kubeconfig"))


def check_kubeconfig(path: str) -> None:
    """What load_api_client reads of a kubeconfig (the file, and the files its current context names) is readable
    within limits; ConfigError naming the file otherwise. For a command that reaches the API late (report, after
    its fetch): a bad --kubeconfig is refused at once rather than after minutes of work."""
    _with_files_inlined(read_kubeconfig(path), path)


_FILE_KEYS = {
    "clusters": (("certificate-authority", "certificate-authority-data", "CA bundle"),),
    "users": (
        ("client-certificate", "client-certificate-data", "client certificate"),
        ("client-key", "client-key-data", "client key"),
    ),
}
"""Per kubeconfig list, the keys naming a PEM file, the key the client prefers holding it inline (base64), and
what the file is."""


def _with_files_inlined(data: dict[str, Any], path: str) -> dict[str, Any]:
    """``data`` with the files its current context's cluster and user name (CA, client certificate and key, token
    file) read within files.py's limits and put inline, so that the client opens none of them itself. A relative
    name is relative to the kubeconfig's directory, as for kubectl. Entries of other contexts are not read: a
    missing file there is no error, as for kubectl; what does not have the expected shape is left to the client
    to refuse."""
    context = current_context(data)
    if context is None:
        return data
    base = os.path.dirname(os.path.abspath(path))
    out = dict(data)
    for section, ref in (("clusters", "cluster"), ("users", "user")):
        entry = _named_entry(data.get(section), context.get(ref), ref)
        if not isinstance(entry, dict):
            continue
        inlined = dict(entry)
        where = f"of {ref} {context.get(ref)!r} in --kubeconfig {path}"
        for file_key, data_key, what in _FILE_KEYS[section]:
            name = entry.get(file_key)
            if isinstance(name, str) and name and not entry.get(data_key):
                pem = read_pem(os.path.join(base, name), flag=f"{file_key} {where}", what=what)
                inlined[data_key] = base64.standard_b64encode(pem).decode("ascii")
        token_file = entry.get("tokenFile")
        if section == "users" and isinstance(token_file, str) and token_file and not entry.get("token"):
            inlined["token"] = read_token(os.path.join(base, token_file), flag=f"tokenFile {where}")
        out[section] = [
            {**item, ref: inlined} if isinstance(item, dict) and item.get("name") == context.get(ref) else item
            for item in data[section]
        ]
    return out


def current_context(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``context`` of a kubeconfig's current context (cluster, user, namespace), else None."""
    context = _named_entry(data.get("contexts"), data.get("current-context"), "context")
    return context if isinstance(context, dict) else None


def _named_entry(items: Any, name: Any, key: str) -> Any:
    """``items[i][key]`` where ``items[i]["name"] == name`` (a kubeconfig's clusters, users, contexts), else None."""
    if not isinstance(items, list) or name is None:
        return None
    return next((item.get(key) for item in items if isinstance(item, dict) and item.get("name") == name), None)


class ApiServerSession:
    """An aiohttp session that talks to the API server as an ApiClient does — its CA, client certificate and
    bearer token — for the requests kubernetes-asyncio has no method for, such as a pod's ``proxy`` subresource
    (``gpuscale top --discover-exporters`` scrapes exporters through it). ``refresh_token`` before a round of
    requests picks up a token an exec plugin or a projected service-account token has renewed."""

    def __init__(self, api: client.ApiClient) -> None:
        import ssl

        configuration = api.configuration
        self.host = configuration.host.rstrip("/")
        self._configuration = configuration
        ssl_context: ssl.SSLContext | bool = False
        if self.host.startswith("https"):
            ssl_context = ssl.create_default_context(cafile=configuration.ssl_ca_cert)
            if configuration.cert_file:
                ssl_context.load_cert_chain(configuration.cert_file, keyfile=configuration.key_file)
            if not configuration.verify_ssl:
                ssl_context.check_hostname = False
                ssl_context.verify_mode = ssl.CERT_NONE
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_context))

    async def refresh_token(self) -> None:
        token = await self._configuration.get_api_key_with_prefix("BearerToken")
        if token:
            self.session.headers["Authorization"] = token

    async def close(self) -> None:
        await self.session.close()
