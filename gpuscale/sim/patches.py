"""The three PATCH bodies kube-apiserver takes, applied to plain JSON documents: JSON merge patch (RFC 7386),
strategic merge patch (list merge keys for the common core fields, ``$patch`` directives, kube's list order) and
JSON patch (RFC 6902, with kube's answers to a failed ``test`` or a bad path). Pure: no server state."""

from __future__ import annotations

import copy
from typing import Any

__all__ = [
    "PATCH_REJECTED",
    "PatchBodyError",
    "PatchError",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
    "strip_nulls",
]


class PatchBodyError(Exception):
    """The patch itself is malformed (not a list of operations, an unknown directive) → 400 BadRequest."""


def strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nulls(v) for v in value]
    return value


PATCH_REJECTED = "the server rejected our request due to an error in our request"


class PatchError(Exception):
    """A patch applied cleanly as JSON but failed (JSON patch test/path errors) → 422."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Strategic merge patch: the list fields of the served types that merge by key rather than replace
# (patchStrategy=merge in the Go types). "ports" merges by containerPort in containers, by port in services.
_SMP_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "volumes": "name",
    "imagePullSecrets": "name",
    "env": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "addresses": "type",
}
_SMP_PRIMITIVE_MERGE = frozenset({"finalizers"})
_DELETE = object()


def _smp_merge_key(field_name: str, items: list[Any]) -> str | None:
    if field_name == "ports":
        dicts = [i for i in items if isinstance(i, dict)]
        return "containerPort" if any("containerPort" in i for i in dicts) else "port"
    return _SMP_MERGE_KEYS.get(field_name)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch: JSON merge patch, plus merge-by-key lists and ``$patch`` directives.

    Lists named in ``_SMP_MERGE_KEYS`` merge element-wise by their key (``{"$patch": "delete", key: …}``
    removes one, ``{"$patch": "replace"}`` replaces the list); ``finalizers`` merges as a set;
    ``$deleteFromPrimitiveList/<field>``, ``$retainKeys`` and ``$patch: replace|delete`` on maps are honoured;
    ``$setElementOrder/<field>`` is accepted and ignored.
    """
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "delete":
        return _DELETE
    if directive == "replace":
        return _strip_directives(patch)
    if directive not in (None, "merge"):
        raise PatchBodyError(f"unknown patch type {directive!r} in strategic merge patch")
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    deferred: list[tuple[str, Any]] = []
    for key, value in patch.items():
        if key.startswith("$"):
            deferred.append((key, value))
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict):
            merged = strategic_merge_patch(result.get(key), value)
            if merged is _DELETE:
                result.pop(key, None)
            else:
                result[key] = merged
        elif isinstance(value, list):
            result[key] = _smp_list(key, result.get(key), value)
        else:
            result[key] = value
    for key, value in deferred:
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in value]
        elif key == "$retainKeys":
            keep = set(value or [])
            result = {k: v for k, v in result.items() if k in keep}
        # $patch handled above; $setElementOrder/… only orders lists, which we leave as merged.
    return result


def _strip_directives(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_directives(v) for k, v in value.items() if not k.startswith("$")}
    if isinstance(value, list):
        return [_strip_directives(v) for v in value]
    return value


def _smp_list(field_name: str, current: Any, patch: list[Any]) -> list[Any]:
    if field_name in _SMP_PRIMITIVE_MERGE:
        merged = list(current) if isinstance(current, list) else []
        merged.extend(v for v in patch if v not in merged)
        return merged
    key = _smp_merge_key(field_name, patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        return _strip_directives(patch)
    if any(i.get("$patch") == "replace" for i in patch):
        return [_strip_directives(i) for i in patch if "$patch" not in i]
    merged = copy.deepcopy(current) if isinstance(current, list) else []
    server_order = [old.get(key) if isinstance(old, dict) else None for old in merged]
    patched: list[Any] = []
    for item in patch:
        position = next(
            (n for n, old in enumerate(merged) if isinstance(old, dict) and key in item and old.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
            continue
        if position is None:
            merged.append(strip_nulls(_strip_directives(item)))
        else:
            merged[position] = strategic_merge_patch(merged[position], item)
        patched.append(item.get(key))
    return _smp_order(merged, key, patched, server_order)


def _smp_order(merged: list[Any], key: str, patched: list[Any], server_order: list[Any]) -> list[Any]:
    """The order strategicpatch.normalizeElementOrder gives a merged list: the patch's items in the patch's order,
    with the items only on the server slotted in by their server order (mergeSortedSlice) — so a new item
    comes before the ones the server already had."""

    def key_of(item: Any) -> Any:
        return item.get(key) if isinstance(item, dict) else None

    in_patch = [
        next(i for i in merged if key_of(i) == k) for k in dict.fromkeys(patched) if any(key_of(i) == k for i in merged)
    ]
    server_only = [i for i in merged if key_of(i) not in set(patched)]
    out: list[Any] = []
    left, right = 0, 0
    while left < len(server_only) or right < len(in_patch):
        if left >= len(server_only):
            out.append(in_patch[right])
            right += 1
        elif right >= len(in_patch):
            out.append(server_only[left])
            left += 1
        else:
            lk, rk = key_of(server_only[left]), key_of(in_patch[right])
            if lk in server_order and rk in server_order and server_order.index(lk) < server_order.index(rk):
                out.append(server_only[left])
                left += 1
            else:
                out.append(in_patch[right])
                right += 1
    return out


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise PatchError(f"JSON pointer {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve_parent(doc: Any, tokens: list[str], path: str) -> tuple[Any, str]:
    node = doc
    for token in tokens[:-1]:
        if isinstance(node, dict) and token in node:
            node = node[token]
        elif isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        else:
            raise PatchError(f"path {path!r} does not exist")
    return node, tokens[-1]


def _get_at(doc: Any, path: str, *, missing_is_null: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return doc
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, dict) and missing_is_null:
        return None
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise PatchError(f"path {path!r} does not exist")


def _remove_at(doc: Any, path: str) -> Any:
    tokens = _pointer(path)
    if not tokens:
        raise PatchError("cannot remove the whole document")
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise PatchError(f"unable to remove nonexistent key {path!r}")


def _add_at(doc: Any, path: str, value: Any, *, replace: bool = False) -> Any:
    tokens = _pointer(path)
    if not tokens:
        return value
    parent, last = _resolve_parent(doc, tokens, path)
    if isinstance(parent, dict):
        # NB: kube-apiserver's JSON patch lets `replace` add a missing key of an existing object.
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and (int(last) < len(parent) or (not replace and int(last) == len(parent))):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise PatchError(f"index out of range in path {path!r}")
    else:
        raise PatchError(f"path {path!r} does not point into an object or array")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test). Malformed operations → 400."""
    if not isinstance(operations, list):
        raise PatchBodyError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for index, op in enumerate(operations):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise PatchBodyError(f"JSON patch operation {index} must be an object with 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind in ("add", "replace", "test") and "value" not in op:
            raise PatchBodyError(f"JSON patch operation {index} ({kind}) is missing 'value'")
        if kind in ("move", "copy") and "from" not in op:
            raise PatchBodyError(f"JSON patch operation {index} ({kind}) is missing 'from'")
        if kind == "add":
            doc = _add_at(doc, path, copy.deepcopy(op["value"]))
        elif kind == "remove":
            _remove_at(doc, path)
        elif kind == "replace":
            doc = _add_at(doc, path, copy.deepcopy(op["value"]), replace=True)
        elif kind == "move":
            doc = _add_at(doc, path, _remove_at(doc, op["from"]))
        elif kind == "copy":
            doc = _add_at(doc, path, copy.deepcopy(_get_at(doc, op["from"])))
        elif kind == "test":
            # NB: an absent member of an existing object reads as null, so testing it for null passes.
            if _get_at(doc, path, missing_is_null=True) != op["value"]:
                raise PatchError(f"testing value {path} failed: test failed")
        else:
            raise PatchError(f"unexpected JSON patch operation {kind!r}")
    return doc
