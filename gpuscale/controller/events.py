"""Whether an Event was already recorded, so a planner that warns plans nothing on an unchanged cluster."""

from __future__ import annotations

from gpuscale.controller.writes import ClusterView, ObjectKey

__all__ = ["EVENT", "already_reported"]

EVENT = ("v1", "Event")


def already_reported(view: ClusterView, regarding: ObjectKey, reason: str, message: str) -> bool:
    """True when the view holds a core v1 Event about ``regarding`` with this reason and message.

    NB: needs Events in the view (the controller's caches watch them); without them a warning is planned again
    each reconcile and the actuator folds the repeats into one Event's ``count``.
    """
    for event in view.objects(*EVENT, namespace=regarding.namespace or "default"):
        involved = event.get("involvedObject") or {}
        if (
            event.get("reason") == reason
            and event.get("message") == message
            and involved.get("kind") == regarding.kind
            and involved.get("name") == regarding.name
            and (involved.get("namespace") or None) == regarding.namespace
        ):
            return True
    return False
