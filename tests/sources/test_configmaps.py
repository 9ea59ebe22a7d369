"""ConfigMapWatch: one named ConfigMap list+watched through the Reflector, against the simulated API server.

Its data reaches the callback at the first list and at each change; a deletion hands None; another ConfigMap in
the same namespace is never seen (the list and the watch select the name); an absent one is None plus a warning.
"""

from __future__ import annotations

import asyncio
import logging

from gpuscale.sim.kubeapi import SimKubeApi
from gpuscale.sources.configmaps import ConfigMapWatch
from gpuscale.sources.kubeconfig import load_api_client


def configmap(name: str, data: dict[str, str]) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "kube-system"},
        "data": data,
    }


async def until(seen: list, expected, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not seen or seen[-1] != expected:
            await asyncio.sleep(0.02)


async def test_changes_and_deletion_of_the_named_configmap_reach_the_callback_and_no_other(tmp_path):
    api = SimKubeApi()
    api.create(configmap("watched", {"k": "1"}))
    await api.start()
    client = await load_api_client(api.write_kubeconfig(tmp_path / "kubeconfig"))
    seen: list = []
    watch = ConfigMapWatch(
        client, namespace="kube-system", name="watched", on_data=seen.append, watch_timeout_seconds=5
    )
    try:
        await watch.start()
        await watch.wait_synced(10)
        assert seen == [{"k": "1"}]
        api.create(configmap("other", {"k": "other"}))
        api.apply(configmap("watched", {"k": "2"}))
        await until(seen, {"k": "2"})
        api.delete("v1", "ConfigMap", "watched", namespace="kube-system")
        await until(seen, None)
        assert {"k": "other"} not in seen
        assert watch.last_error is None and watch.synced
    finally:
        await watch.stop()
        await client.close()
        await api.stop()


async def test_an_absent_configmap_is_none_and_a_warning_with_the_note(tmp_path, caplog):
    api = SimKubeApi()
    await api.start()
    client = await load_api_client(api.write_kubeconfig(tmp_path / "kubeconfig"))
    seen: list = []
    watch = ConfigMapWatch(client, namespace="kube-system", name="absent", on_data=seen.append, missing_note="so what")
    try:
        with caplog.at_level(logging.WARNING, logger="gpuscale.sources.configmaps"):
            await watch.refresh_once()
        assert seen == [None]
        assert "ConfigMap kube-system/absent not found: so what" in caplog.text
    finally:
        await client.close()
        await api.stop()
