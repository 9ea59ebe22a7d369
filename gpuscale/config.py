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
from gpuscale.files import CONFIG_LIMIT_BYTES, read_text
from gpuscale.model import parse_duration

_M = TypeVar("_M", bound=BaseModel)


def _duration(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        raise ValueError('expected a duration such as "5s", "1m30s" or a number of seconds')
    try:
        seconds = parse_duration(value)
    except (TypeError, ValueError, OverflowError) as e:
        raise ValueError(str(e)) from e
    if not math.isfinite(seconds):  # NB: "1e400" parses as a float: infinity is no duration
        raise ValueError(f"{value!r} is not a finite duration")
    return seconds


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


MAX_YAML_NODES = 50_000
"""Nodes a YAML file may hold once its aliases are expanded (the shipped catalogue has ~400; a 9-line "billion
laughs" file expands to 10⁹): beyond it the file is refused instead of taking gigabytes."""
MAX_YAML_DEPTH = 64
"""Nesting a YAML file may have (a HorizontalPodAutoscaler nests 8 deep)."""


class _Refused(yaml.YAMLError):
    def __init__(self, mark: yaml.Mark | None, problem: str) -> None:
        super().__init__(problem)
        self.problem_mark = mark
        self.problem = problem


class _PyParser(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser):
    def __init__(self, text: str) -> None:
        yaml.reader.Reader.__init__(self, text)
        yaml.scanner.Scanner.__init__(self)
        yaml.parser.Parser.__init__(self)


try:  # NB: libyaml scans and parses ~30x faster than PyYAML's Python scanner (4 MiB scalar: 0.13 vs 3.9 s)
    from yaml._yaml import CParser as _Parser
except ImportError:  # pragma: no cover - PyYAML built without libyaml
    _Parser = _PyParser


class _BoundedComposer(yaml.composer.Composer):
    """PyYAML's composer, counting: each node's size with its aliases expanded (an alias costs what it names,
    so a bomb is refused when the counts pass MAX_YAML_NODES, before anything is constructed), the nesting
    depth, and keys given twice in one mapping (kube-apiserver's strict decoding refuses them; YAML loaders keep
    the last silently, so an edited threshold could be undone by a forgotten copy further down)."""

    def _start_counting(self) -> None:
        self._sizes: dict[int, int] = {}
        self._depth = 0
        self._composed = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if id(node) not in self._sizes:
                raise _Refused(mark, "an alias refers to a node that contains it (a recursive alias)")
            return node
        self._depth += 1
        self._composed += 1
        mark = self.peek_event().start_mark
        if self._depth > MAX_YAML_DEPTH:
            raise _Refused(mark, f"nested deeper than {MAX_YAML_DEPTH} levels")
        if self._composed > MAX_YAML_NODES:
            raise _Refused(mark, f"more than {MAX_YAML_NODES:,} nodes")
        node = super().compose_node(parent, index)
        self._depth -= 1
        self._sizes[id(node)] = size = 1 + self._children_size(node)
        if size > MAX_YAML_NODES:
            raise _Refused(mark, f"more than {MAX_YAML_NODES:,} nodes once its aliases are expanded")
        return node

    def _children_size(self, node: yaml.Node) -> int:
        if isinstance(node, yaml.SequenceNode):
            return sum(self._sizes[id(item)] for item in node.value)
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen:
                        first = seen[key.value]
                        raise _Refused(key.start_mark, f"key {key.value!r} appears twice (first on line {first})")
                    seen[key.value] = key.start_mark.line + 1
            return sum(self._sizes[id(k)] + self._sizes[id(v)] for k, v in node.value)
        return 0


class _Loader(_Parser, _BoundedComposer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):  # type: ignore[misc, valid-type]
    """yaml.safe_load's rules (plain data, no Python objects) with _BoundedComposer's limits."""

    def __init__(self, text: str) -> None:
        _Parser.__init__(self, text)
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)
        self._start_counting()

    # NB: libyaml's parser brings a composer of its own, without the limits: use PyYAML's, on its events
    check_node = yaml.composer.Composer.check_node
    get_node = yaml.composer.Composer.get_node
    get_single_node = yaml.composer.Composer.get_single_node


def _compose(text: str, path: str) -> tuple[_Loader, list[yaml.Node]]:
    """Every document's node tree, within the limits; ConfigError naming ``path`` and the line otherwise."""
    loader = _Loader(text)
    nodes = []
    try:
        while loader.check_node():
            nodes.append(loader.get_node())
    except yaml.YAMLError as e:
        loader.dispose()
        raise _yaml_error(e, path) from None
    return loader, nodes


def _yaml_error(e: yaml.YAMLError, path: str) -> ConfigError:
    mark = getattr(e, "problem_mark", None)
    problem = " ".join(str(getattr(e, "problem", None) or e).split())
    if isinstance(e, _Refused):  # NB: a limit or a key given twice: the line is enough
        return ConfigError(f"line {mark.line + 1}: {problem}" if mark else problem, path=path)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return ConfigError(f"{where}invalid YAML: {problem}", path=path)


def load_yaml_documents(text: str, *, path: str) -> list[tuple[Any, dict[tuple[Any, ...], int]]]:
    """Each document of ``text`` as plain data (what yaml.safe_load_all gives), with each field path's line;
    within MAX_YAML_NODES and MAX_YAML_DEPTH, no key twice in a mapping. ConfigError naming ``path`` otherwise."""
    loader, nodes = _compose(text, path)
    try:
        out = []
        for node in nodes:
            lines: dict[tuple[Any, ...], int] = {}
            _lines(node, (), lines)
            out.append((loader.construct_document(node), lines))
        return out
    except yaml.YAMLError as e:
        raise _yaml_error(e, path) from None
    except (ValueError, TypeError, OverflowError) as e:  # NB: e.g. a timestamp out of range
        raise ConfigError(f"invalid YAML: {' '.join(str(e).split())}", path=path) from None
    finally:
        loader.dispose()


def _lines(node: yaml.Node | None, path: tuple[Any, ...], out: dict[tuple[Any, ...], int]) -> None:
    """Each field path's line, into ``out`` (an alias's paths too: the composer bounded their number)."""
    if node is None:
        return
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            name: Any = key.value
            if isinstance(key, yaml.ScalarNode) and key.tag.endswith(":int"):
                with contextlib.suppress(ValueError):
                    name = int(key.value)
            out.setdefault((*path, name), key.start_mark.line + 1)
            _lines(value, (*path, name), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _lines(item, (*path, i), out)


def read_yaml(path: Path | Traversable, *, what: str = "file") -> dict[str, Any]:
    """A YAML mapping from ``path`` (at most CONFIG_LIMIT_BYTES, one document); ConfigError naming the file (and
    line/column) otherwise."""
    text = read_text(path, limit_bytes=CONFIG_LIMIT_BYTES, what=what)
    documents = load_yaml_documents(text, path=str(path))
    if len(documents) > 1:
        raise ConfigError(f"expected one YAML document, found {len(documents)}", path=str(path))
    data, lines = documents[0] if documents else (None, {})
    if not isinstance(data, dict):
        raise ConfigError("expected a mapping at the top level", path=str(path))
    located = YamlMapping(data)
    located.lines = lines
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
