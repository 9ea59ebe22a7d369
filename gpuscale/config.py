"""Loading and validating configuration files (catalogue, policies) and duration settings.

One place for the rules every config file follows: YAML read with the line and column of a syntax
error; pydantic validation errors turned into one line per problem naming the field path
(``metrics[3] (gpu_x).aggregate``, ``sm_active.effective``) and the reason, with the allowed keys when a
key is unknown; durations written as "5s", "1m30s" or seconds; points in time as Unix seconds, RFC 3339
or "now-2h".
"""

from __future__ import annotations

import contextlib
import math
import re
import time
import types
import typing
from collections.abc import Sequence
from datetime import UTC, datetime
from importlib.abc import Traversable
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import yaml
from pydantic import AfterValidator, BaseModel, BeforeValidator, ValidationError
from pydantic.fields import FieldInfo

from gpuscale.errors import ConfigError
from gpuscale.model import parse_duration

_M = TypeVar("_M", bound=BaseModel)


def _duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('expected a duration such as "5s", "1m30s" or a number of seconds')
    try:
        return parse_duration(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(str(e)) from e


Seconds = Annotated[float, BeforeValidator(_duration)]
"""A duration field: accepts "250ms", "5s", "1m30s", "2h" or a number of seconds; holds seconds."""


def parse_instant(value: Any, *, now: float | None = None) -> float:
    """A point in time as Unix seconds: a number of seconds since the epoch, RFC 3339 ("2026-12-01T08:00:00Z",
    "2026-12-01T09:00:00+01:00"; a date alone is its midnight UTC), "now", or "now-DURATION" ("now-2h",
    "now-1d12h"). ``now`` is the clock the relative forms count back from (default: the wall clock)."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('expected Unix seconds, RFC 3339 ("2026-12-01T08:00:00Z"), "now" or "now-2h"')
    text = str(value) if isinstance(value, int | float) else value.strip()
    current = time.time() if now is None else now
    if text == "now":
        return current
    if text.startswith("now-"):
        try:
            return current - parse_duration(text.removeprefix("now-"))
        except (TypeError, ValueError, OverflowError):
            raise ValueError(f'{text!r}: "now-" takes a duration such as 2h, 1d or 90m') from None
    with contextlib.suppress(ValueError):
        seconds = float(text)
        if math.isfinite(seconds):
            return seconds
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(
            f'{text!r} is not Unix seconds, RFC 3339 ("2026-12-01T08:00:00Z"), "now" or "now-DURATION" ("now-2h")'
        ) from None
    if parsed.tzinfo is None:
        if "T" in text or " " in text:  # NB: a time without its offset would silently be this machine's zone
            raise ValueError(f"{text!r} has no time zone: end it with Z or an offset such as +02:00")
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


Instant = Annotated[float, BeforeValidator(parse_instant)]
"""A point-in-time field: Unix seconds, RFC 3339, "now" or "now-DURATION"; holds Unix seconds."""


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as e:
        raise ValueError(f"not a regular expression: {e}") from None
    return text


Regex = Annotated[str, AfterValidator(_regex)]
"""A regular-expression field: the file is rejected, naming the field, when the expression does not compile."""


def _http_url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http:// or https:// URL with a host (e.g. http://prometheus:9090)")
    return text


HttpUrl = Annotated[str, AfterValidator(_http_url)]
"""A server's base URL, checked when it is given: "prometheus:9090" is refused at once rather than retried."""


def is_duration(field: FieldInfo) -> bool:
    """Whether a settings field is a ``Seconds`` duration (so --help can show its default as "5s")."""
    metadata = [*field.metadata]
    for arg in typing.get_args(field.annotation):
        metadata.extend(getattr(arg, "__metadata__", ()))
    return any(isinstance(m, BeforeValidator) and m.func is _duration for m in metadata)


def _allowed_keys(model: type[BaseModel], loc: Sequence[int | str]) -> list[str] | None:
    """The keys allowed at ``loc`` inside ``model`` (for "unknown key" messages), or None if unclear."""
    ann: Any = model
    for part in loc:
        ann = _unwrap(ann)
        origin = typing.get_origin(ann)
        if origin in (list, tuple, dict):
            ann = typing.get_args(ann)[-1]
        elif isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(part, str):
            field = {f.alias or n: f for n, f in ann.model_fields.items()}.get(part) or ann.model_fields.get(part)
            if field is None:
                return None
            ann = field.annotation
        else:
            return None
    ann = _unwrap(ann)
    if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
        return None
    return [f.alias or n for n, f in ann.model_fields.items()]  # NB: the spelling a user writes


def _unwrap(ann: Any) -> Any:
    if typing.get_origin(ann) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(ann) if a is not type(None)]
        return args[0] if len(args) == 1 else ann
    return ann


def describe(error: ValidationError, model: type[BaseModel], data: Any = None) -> str:
    """One "field.path: reason" per problem, joined by "; "."""
    out = []
    for err in error.errors():
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        where = _field_path(loc, data)
        if err["type"] == "extra_forbidden":
            allowed = _allowed_keys(model, loc[:-1])
            reason = "unknown key" + (f" (allowed: {', '.join(allowed)})" if allowed else "")
        else:
            reason = err["msg"].removeprefix("Value error, ")
            if err["type"] != "missing" and not isinstance(err.get("input"), dict | list):
                reason += f" (got {err.get('input')!r})"
        line = _line_of(loc, data)
        out.append(f"{where}: {reason}{f' (line {line})' if line else ''}")
    return "; ".join(out)


def _line_of(loc: tuple[Any, ...], data: Any) -> int | None:
    """The line of the deepest part of ``loc`` the YAML file has (the key itself when it is there)."""
    lines = getattr(data, "lines", None)
    if not lines:
        return None
    for end in range(len(loc), -1, -1):
        line = lines.get(tuple(loc[:end]))
        if line is not None and end > 0:
            return line
    return None


class YamlMapping(dict[str, Any]):
    """A YAML file's top-level mapping that remembers the line of every value (``lines``: path → line), so a
    validation error names the line as well as the field."""

    lines: dict[tuple[Any, ...], int]


class _DuplicateKey(Exception):
    pass


def _lines(node: yaml.Node | None, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    """Each field path's line, into ``out``; _DuplicateKey for a key given twice in one mapping (YAML loaders keep
    the last silently, so an edited threshold could be undone by a forgotten copy further down)."""
    if node is None:
        return
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name: Any = key.value
            if isinstance(key, yaml.ScalarNode) and key.tag.endswith(":int"):
                with contextlib.suppress(ValueError):
                    name = int(key.value)
            line = key.start_mark.line + 1
            if (*path, name) in out:
                first = out[(*path, name)]
                raise _DuplicateKey(f"line {line}: key {key.value!r} appears twice (first on line {first})")
            out[(*path, name)] = line
            _lines(value, (*path, name), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def read_yaml(path: Path | Traversable) -> dict[str, Any]:
    """A YAML mapping from ``path``; ConfigError naming the file (and line/column) otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise ConfigError(f"cannot read file: {e.strerror}", path=str(path)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x} at offset {e.start}); save the file as UTF-8",
            path=str(path),
        ) from None
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = " ".join(str(getattr(e, "problem", None) or e).split())
        raise ConfigError(f"{where}invalid YAML: {problem}", path=str(path)) from None
    except (ValueError, TypeError, RecursionError) as e:  # NB: e.g. a timestamp out of range, deep nesting
        raise ConfigError(f"invalid YAML: {' '.join(str(e).split())}", path=str(path)) from None
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=str(path))
    located = YamlMapping(data)
    located.lines = {}
    try:
        _lines(node, (), located.lines)
    except _DuplicateKey as e:
        raise ConfigError(str(e), path=str(path)) from None
    return located


def validate(model: type[_M], data: Any, path: Path | Traversable | str) -> _M:
    """``model`` from ``data`` or ConfigError naming ``path``, each field path (and line) and reason."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise ConfigError(describe(e, model, data), path=str(path)) from None


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    """('metrics', 3, 'aggregate') → 'metrics[3] (gpu_x).aggregate' (list items named by their 'name')."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            item = node[part] if isinstance(node, list) and part < len(node) else None
            name = item.get("name") if isinstance(item, dict) else None
            out += f"[{part}]" + (f" ({name})" if name else "")
            node = item
        else:
            out += ("." if out else "") + str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "(top level)"
