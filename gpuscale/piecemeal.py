"""Freeing a large structure a little at a time, so that the event loop keeps running meanwhile.

Dropping the last reference to a 10,000-GPU snapshot frees its ~10⁵ objects in one C-level cascade of
deallocations, and the interpreter switches threads only between bytecodes: however it is started — on the event
loop at the swap, or in a worker thread — the loop cannot run until the cascade ends. Emptying the containers one
item at a time from Python code frees the same objects in steps of one item, between which the interpreter hands
the lock to the loop every switch interval.

Only containers nobody else holds are emptied, as their reference count says: a container some reader still holds
(a store view, a cache) is left whole and unchanged, and is freed whenever that reader lets it go.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["free_piecemeal"]

_getrefcount = sys.getrefcount


def free_piecemeal(owner: Any, names: tuple[str, ...]) -> int:
    """Empty ``owner``'s containers ``names`` (dicts and lists, and the dicts and lists only they hold, all the way
    down) item by item; call it in a worker thread once nothing reads ``owner`` any more. How many items went."""
    freed = 0
    for name in names:
        container = getattr(owner, name, None)
        # NB: held by owner's attribute, this name and getrefcount's argument: nobody else
        if isinstance(container, (dict, list)) and _getrefcount(container) == 3:
            freed += _empty(container)
        container = None
    return freed


def _empty(container: dict | list) -> int:
    freed = 0
    pop = container.popitem if isinstance(container, dict) else container.pop
    while container:
        item = pop()
        value = item[1] if isinstance(container, dict) else item
        item = None
        # NB: held by this name and getrefcount's argument alone: emptied step by step too
        if isinstance(value, (dict, list)) and _getrefcount(value) == 2:
            freed += _empty(value)
        value = None  # NB: the item is freed here, one at a time
        freed += 1
    return freed
