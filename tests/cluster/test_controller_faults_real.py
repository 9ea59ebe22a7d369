"""The controller's fault-injection suite (tests/controller/fault_suite.py) on the real kube-apiserver v1.37, with
`gpuscale controller` as its ServiceAccount under deploy/controller's RBAC (with the drain component): a concurrent
writer with dropped watches and an API outage, the breaker across SIGKILLed leaders with its ConfigMap deleted, and
a gang pod under two PDBs. The same bodies run on gpuscale/sim in tests/controller/test_faults.py."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.controller import fault_suite
from tests.controller.fault_suite import Backend, point_kubeconfig

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def real(control_plane, tmp_path_factory):
    plane = control_plane
    work = tmp_path_factory.mktemp("controller-faults")
    deploy = REPO / "deploy/controller"
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(deploy, work)],
        "components": [os.path.relpath(deploy / "components/drain", work)],
    }
    (work / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    applied = plane.kubectl("apply", "--server-side", "--field-manager=gpuscale-test", "-k", str(work))
    assert applied.returncode == 0, applied.stderr
    account = plane.service_account_kubeconfig("gpuscale", "gpuscale-controller")
    url = urlsplit(plane.server)
    return Backend(
        name="kube-apiserver v1.37",
        admin=plane.rest(),
        upstream=(url.hostname, url.port),
        scheme="https",
        kubeconfig=lambda server: point_kubeconfig(account, server, work / f"{server.rsplit(':', 1)[1]}.kubeconfig"),
    )


async def test_a_concurrent_writer_dropped_watches_and_an_outage_lose_nothing_and_repeat_nothing(real, tmp_path):
    print(real.name, await fault_suite.concurrent_writer_outage(real, tmp_path))


async def test_the_breaker_holds_across_killed_leaders_and_a_deleted_configmap(real, tmp_path):
    print(real.name, await fault_suite.breaker_across_leaders(real, tmp_path))


async def test_a_gang_pod_under_two_budgets_holds_the_whole_drain(real, tmp_path):
    print(real.name, await fault_suite.gang_under_two_budgets(real, tmp_path))
