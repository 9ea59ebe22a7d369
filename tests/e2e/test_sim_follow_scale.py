"""The simulated Deployment controller: `kubectl scale` (the scale subresource, as the HPA writes it) gives the
workload that many pods, each with its Triton endpoint, and the API's pods follow."""

from __future__ import annotations

import pytest

from gpuscale.sim.cluster import SimCluster
from tests.e2e.test_kubectl import KUBECTL, run

pytestmark = pytest.mark.e2e


async def test_kubectl_scale_is_followed():
    async with SimCluster() as cluster:
        assert await cluster.follow_scale() == []
        code, _, err = await run(
            KUBECTL,
            f"--kubeconfig={cluster.kubeconfig}",
            "-n",
            "inference",
            "scale",
            "deployment/triton-bert",
            "--replicas=5",
        )
        assert code == 0, err
        assert await cluster.follow_scale() == [("inference/triton-bert", 3, 5)]
        pods = cluster.api.list("v1", "Pod", namespace="inference", label_selector="app=triton-bert")
        assert len(pods) == 5
        assert len([k for k in cluster.exporters.triton_urls if k[1].startswith("triton-bert-")]) == 5
        code, _, err = await run(
            KUBECTL,
            f"--kubeconfig={cluster.kubeconfig}",
            "-n",
            "inference",
            "scale",
            "deployment/triton-bert",
            "--replicas=2",
        )
        assert code == 0, err
        assert await cluster.follow_scale() == [("inference/triton-bert", 5, 2)]
        assert await cluster.follow_scale() == []
