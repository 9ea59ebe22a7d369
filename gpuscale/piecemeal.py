"""Freeing a large structure a little at a time, so that the event loop keeps running meanwhile.

Dropping the last reference to a 10,000-GPU snapshot frees its ~10⁵ objects in one C-level cascade of
deallocations: started on the event loop at the swap, it held every request for 10–40 ms. Emptying the containers
one item at a time from Python code frees the same objects in steps (metrics/steps.py), which the pipeline runs on
the event loop a time slice at a time, between requests.

Only containers nobody else holds are emptied, as their reference count says: a container some reader still holds
(a store view, a cache) is left whole and unchanged, and is freed whenever that reader lets it go.
"""

from __future__ import annotations

import sys
from typing import Any

from gpuscale.metrics.steps import Steps

__all__ = ["free_piecemeal"]

_getrefcount = sys.getrefcount

# NB: items popped between two yields: one may hold a few more objects (a device list, a body and its entry)
POPS_PER_STEP = 64


def free_piecemeal(owner: Any, names: tuple[str, ...]) -> Steps[int]:
    """Empty ``owner``'s containers ``names`` (dicts and lists, and the dicts and lists only they hold, all the way
    down) item by item, in steps; run it once nothing reads ``owner`` any more. How many items went."""
    freed = 0
    for name in names:
        container = getattr(owner, name, None)
        # NB: held by owner's attribute, this name and getrefcount's argument: nobody else
        if isinstance(container, (dict, list)) and _getrefcount(container) == 3:
            freed += yield from _empty(container)
        container = None
    return freed


def _empty(container: dict | list) -> Steps[int]:
    freed = popped = 0
    pop = container.popitem if isinstance(container, dict) else container.pop
    while container:
        item = pop()
        value = item[1] if isinstance(container, dict) else item
        item = None
        # NB: held by this name and getrefcount's argument alone: emptied step by step too
        if isinstance(value, (dict, list)) and _getrefcount(value) == 2:
            freed += yield from _empty(value)
        value = None  # NB: the item is freed here, one at a time
        freed += 1
        popped += 1
        if not popped % POPS_PER_STEP:
            yield
    return freed
