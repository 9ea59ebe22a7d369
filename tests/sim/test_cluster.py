"""The simulated cluster's objects are as old as they are in it: kubectl's AGE counts from the start of the
simulation, or from the scale-up that added a pod, not from the scenario's fixed date (a demo showed 335d)."""

from __future__ import annotations

import json

from gpuscale.model import rfc3339
from gpuscale.sim.cluster import SimCluster
from gpuscale.sim.exporters import ManualClock
from gpuscale.sim.kube_manifests import CREATION_TIMESTAMP

START = 1_800_000_000.0  # 2027-01-15T08:00:00Z, far from the scenario's placeholder


def _pods(cluster: SimCluster) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in cluster.api.list("v1", "Pod", namespace="inference")}


async def test_objects_are_stamped_when_they_appear_and_keep_their_age() -> None:
    clock = ManualClock(START)
    async with SimCluster(clock=clock) as cluster:
        # The scenario renders its placeholder time everywhere; none of it reaches the API.
        assert CREATION_TIMESTAMP not in json.dumps(cluster.api.list("v1", "Pod"))
        assert CREATION_TIMESTAMP not in json.dumps(cluster.api.list("v1", "Node"))
        first = _pods(cluster)
        for pod in first.values():
            assert pod["metadata"]["creationTimestamp"] == rfc3339(START)
            assert pod["status"]["startTime"] == rfc3339(START)
        clock.advance(125)
        await cluster.exporters.set_replicas("inference/triton-bert", 5)
        later = _pods(cluster)
        added = set(later) - set(first)
        assert added, later.keys()
        for name, pod in later.items():
            expected = rfc3339(START + 125) if name in added else rfc3339(START)
            assert pod["metadata"]["creationTimestamp"] == expected, name
            ready = next(c for c in pod["status"]["conditions"] if c["type"] == "Ready")
            assert ready["lastTransitionTime"] == expected, name
