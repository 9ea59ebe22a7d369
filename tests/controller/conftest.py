"""Shared fixtures: a simulated API server with namespace ``ml`` and the batch-scheduling CRDs installed."""

from __future__ import annotations

import pytest

from gpuscale.sim.crds import BATCH_SCHEDULING_CRDS
from gpuscale.sim.kubeapi import SimKubeApi


@pytest.fixture
def batch_sim() -> SimKubeApi:
    api = SimKubeApi()
    api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    for crd in BATCH_SCHEDULING_CRDS:
        api.create(crd)
    return api
