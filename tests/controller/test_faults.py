"""The controller's fault-injection suite on gpuscale/sim (the same bodies run on kube-apiserver in
tests/cluster/test_controller_faults_real.py): a concurrent writer with dropped watches and an API outage, the
breaker across SIGKILLed leaders with its ConfigMap deleted, and a gang pod under two PDBs."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscale.sim.kubeapi import SimKubeApi
from tests.cluster.rest import Rest
from tests.controller import fault_suite
from tests.controller.fault_suite import Backend, point_kubeconfig

pytestmark = pytest.mark.e2e

TOKEN = "sim-token"


@pytest.fixture
async def sim(tmp_path):
    api = SimKubeApi()
    url = await api.start()
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpuscale"}})
    source = Path(api.write_kubeconfig(tmp_path / "sim.kubeconfig", token=TOKEN))
    host, port = url.removeprefix("http://").split(":")
    backend = Backend(
        name="gpuscale/sim",
        admin=Rest(url, token=TOKEN),
        upstream=(host, int(port)),
        scheme="http",
        kubeconfig=lambda server: point_kubeconfig(
            tmp_path / "sim.kubeconfig", server, tmp_path / f"c-{abs(hash(server))}.kubeconfig"
        ),
    )
    del source
    yield backend
    await api.stop()


async def test_a_concurrent_writer_dropped_watches_and_an_outage_lose_nothing_and_repeat_nothing(sim, tmp_path):
    counts = await fault_suite.concurrent_writer_outage(sim, tmp_path)
    print(sim.name, counts)


async def test_the_breaker_holds_across_killed_leaders_and_a_deleted_configmap(sim, tmp_path):
    counts = await fault_suite.breaker_across_leaders(sim, tmp_path)
    print(sim.name, counts)


async def test_a_gang_pod_under_two_budgets_holds_the_whole_drain(sim, tmp_path):
    counts = await fault_suite.gang_under_two_budgets(sim, tmp_path)
    print(sim.name, counts)
