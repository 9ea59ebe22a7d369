"""Test plumbing for planners against the simulated API: a ClusterView read from it, and writes applied to it.

``apply_in_process`` is a stand-in for the controller's actuator until that lands: it applies each ``Write``
through the simulated server's in-process helpers (the same code, validation and resourceVersions as HTTP),
with the actuator's contract: AlreadyExists on a create and NotFound on a delete count as done.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gpuscale.controller.writes import Create, Delete, Emit, Evict, Patch, StaticClusterView, Write
from gpuscale.sim.kubeapi import ApiStatusError, SimKubeApi


def sim_view(sim: SimKubeApi, kinds: Iterable[tuple[str, str]]) -> StaticClusterView:
    """What the controller's caches would hold of ``kinds`` now (kinds whose CRD is not installed: nothing)."""
    items = []
    for api_version, kind in dict.fromkeys([*kinds, ("v1", "Event")]):
        try:
            items.extend(sim.list(api_version, kind))
        except ApiStatusError as e:
            if e.code != 404:
                raise
    return StaticClusterView(items)


def apply_in_process(sim: SimKubeApi, writes: Sequence[Write]) -> list[str]:
    """Apply ``writes`` in order; returns one word per write: applied or already-done."""
    outcomes = []
    for write in writes:
        try:
            if isinstance(write, Create):
                sim.create(write.obj, preserve_identity=False)
            elif isinstance(write, Patch):
                key = write.key
                sim.patch(
                    key.api_version,
                    key.kind,
                    key.name,
                    write.patch,
                    namespace=key.namespace,
                    patch_type=write.patch_type,
                    subresource=write.subresource,
                )
            elif isinstance(write, Delete):
                sim.delete(write.key.api_version, write.key.kind, write.key.name, namespace=write.key.namespace)
            elif isinstance(write, Emit):
                sim.create(
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {
                            "generateName": f"{write.regarding.name}.",
                            "namespace": write.regarding.namespace or "default",
                        },
                        "involvedObject": {
                            "apiVersion": write.regarding.api_version,
                            "kind": write.regarding.kind,
                            "name": write.regarding.name,
                            "namespace": write.regarding.namespace,
                        },
                        "type": write.type,
                        "reason": write.reason,
                        "message": write.message,
                        "source": {"component": "gpuscale-controller"},
                    }
                )
            elif isinstance(write, Evict):
                raise AssertionError("the gang planners never evict")
            outcomes.append("applied")
        except ApiStatusError as e:
            if (isinstance(write, Create) and e.reason == "AlreadyExists") or (
                isinstance(write, Delete) and e.code == 404
            ):
                outcomes.append("already-done")
            else:
                raise
    return outcomes
