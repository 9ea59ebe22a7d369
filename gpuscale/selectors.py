"""Kubernetes label and field selectors, with the semantics of k8s.io/apimachinery.

Label selectors follow ``labels.Parse`` exactly: the lexer (identifiers end at whitespace or at one of
``= ! ( ) , > <``), the grammar, the validation of keys (qualified names: an optional DNS-subdomain prefix, a
``/``, and a name of at most 63 characters) and values (at most 63 characters of ``[A-Za-z0-9._-]``, starting
and ending alphanumeric), and the canonical text form (requirements sorted by key, values sorted)::

    selector    := requirement ("," requirement)*
    requirement := ["!"] key
                 | key ("=" | "==" | "!=" | ">" | "<") value
                 | key ("in" | "notin") "(" value ("," value)* ")"

``x!=y`` and ``x notin (y)`` match objects that lack the label ``x``, as in Kubernetes. ``>`` and ``<``
compare integers and exist only in the text grammar (metav1.LabelSelector has no form for them).

Field selectors follow ``fields.ParseSelector``: ``path=value``, ``path==value``, ``path!=value`` joined by
commas, with ``\\,``, ``\\=`` and ``\\\\`` escaping those characters in values. ``matches`` reads dotted paths
out of an object dict; a missing field compares as ``""`` (the apiserver builds its field sets from the typed
object, where an unset string is empty), booleans as ``"true"``/``"false"``.

Both selector types are immutable, hashable and compare by their requirements. Every parse error is a
``SelectorError`` naming the offending token.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuscale.errors import SelectorError

__all__ = [
    "FieldRequirement",
    "FieldSelector",
    "LabelSelector",
    "Requirement",
    "field_value",
    "label_key_problem",
    "label_value_problem",
]

# --- operators --------------------------------------------------------------------------------------

IN = "in"
NOT_IN = "notin"
EQUALS = "="
DOUBLE_EQUALS = "=="
NOT_EQUALS = "!="
EXISTS = "exists"
DOES_NOT_EXIST = "!"
GREATER_THAN = "gt"
LESS_THAN = "lt"

_SET_OPERATORS = frozenset({IN, NOT_IN})
_EXACT_OPERATORS = frozenset({EQUALS, DOUBLE_EQUALS, NOT_EQUALS})
_NUMERIC_OPERATORS = frozenset({GREATER_THAN, LESS_THAN})
_UNARY_OPERATORS = frozenset({EXISTS, DOES_NOT_EXIST})

# metav1.LabelSelectorOperator ↔ selection operator.
_METAV1_OPERATORS = {"In": IN, "NotIn": NOT_IN, "Exists": EXISTS, "DoesNotExist": DOES_NOT_EXIST}
_OPERATOR_METAV1 = {v: k for k, v in _METAV1_OPERATORS.items()}

# --- validation (k8s.io/apimachinery/pkg/util/validation) ------------------------------------------

_QUALIFIED_NAME_MAX = 63
_LABEL_VALUE_MAX = 63
_DNS1123_SUBDOMAIN_MAX = 253
_QUALIFIED_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
_LABEL_VALUE_RE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
_DNS1123_SUBDOMAIN_RE = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def label_key_problem(key: str) -> str | None:
    """Why ``key`` is not a valid label key (a qualified name), or None when it is."""
    parts = key.split("/")
    if len(parts) == 1:
        name = parts[0]
    elif len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return "prefix part must be non-empty"
        if len(prefix) > _DNS1123_SUBDOMAIN_MAX:
            return f"prefix part must be no more than {_DNS1123_SUBDOMAIN_MAX} characters"
        if not _DNS1123_SUBDOMAIN_RE.fullmatch(prefix):
            return (
                "prefix part must be a lowercase RFC 1123 subdomain: lowercase alphanumerics, '-' and '.', "
                "starting and ending with an alphanumeric"
            )
    else:
        return "a qualified name must consist of an optional DNS subdomain prefix and a name, joined by '/'"
    if not name:
        return "name part must be non-empty"
    if len(name) > _QUALIFIED_NAME_MAX:
        return f"name part must be no more than {_QUALIFIED_NAME_MAX} characters"
    if not _QUALIFIED_NAME_RE.fullmatch(name):
        return "name part must consist of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
    return None


def label_value_problem(value: str) -> str | None:
    """Why ``value`` is not a valid label value, or None when it is."""
    if len(value) > _LABEL_VALUE_MAX:
        return f"must be no more than {_LABEL_VALUE_MAX} characters"
    if not _LABEL_VALUE_RE.fullmatch(value):
        return "must be empty or consist of alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric"
    return None


def _check_key(key: str) -> None:
    problem = label_key_problem(key)
    if problem:
        raise SelectorError(f"invalid label key {key!r}: {problem}")


def _check_value(value: str) -> None:
    problem = label_value_problem(value)
    if problem:
        raise SelectorError(f"invalid label value {value!r}: {problem}")


def _is_int64(text: str) -> bool:
    # NB: strconv.ParseInt(s, 10, 64): an optional sign and decimal digits only, within int64.
    if not re.fullmatch(r"[+-]?[0-9]+", text):
        return False
    # NB: int() refuses more than 4,300 digits (ValueError, not a selector error); int64 has at most 19.
    if len(text.lstrip("+-").lstrip("0")) > 19:
        return False
    return -(2**63) <= int(text) < 2**63


# --- requirements -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, order=True)
class Requirement:
    """One ``key operator values`` term. ``values`` is sorted and free of duplicates."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    @classmethod
    def make(cls, key: str, operator: str, values: Iterable[str] = ()) -> Requirement:
        """Validate like ``labels.NewRequirement`` and build the requirement."""
        _check_key(key)
        vals = tuple(sorted(set(values)))
        if operator in _SET_OPERATORS:
            if not vals:
                raise SelectorError(f"{key}: for 'in', 'notin' operators, values set can't be empty")
        elif operator in _EXACT_OPERATORS:
            if len(vals) != 1:
                raise SelectorError(f"{key}: exact-match compatibility requires one single value")
        elif operator in _UNARY_OPERATORS:
            if vals:
                raise SelectorError(f"{key}: values set must be empty for exists and does not exist")
        elif operator in _NUMERIC_OPERATORS:
            if len(vals) != 1 or not _is_int64(vals[0]):
                raise SelectorError(
                    f"{key}: for 'gt', 'lt' operators, the value must be an integer, not {','.join(vals)!r}"
                )
        else:
            raise SelectorError(f"{key}: operator {operator!r} is not recognized")
        for value in vals:
            _check_value(value)
        return cls(key, operator, vals)

    def matches(self, labels: Mapping[str, str]) -> bool:
        op = self.operator
        if op in (IN, EQUALS, DOUBLE_EQUALS):
            return self.key in labels and labels[self.key] in self.values
        if op in (NOT_IN, NOT_EQUALS):
            return self.key not in labels or labels[self.key] not in self.values
        if op == EXISTS:
            return self.key in labels
        if op == DOES_NOT_EXIST:
            return self.key not in labels
        # gt / lt: the label must exist and parse as an integer.
        value = labels.get(self.key)
        if value is None or not _is_int64(value):
            return False
        bound = int(self.values[0])
        return int(value) > bound if op == GREATER_THAN else int(value) < bound

    def __str__(self) -> str:
        op = self.operator
        if op == EXISTS:
            return self.key
        if op == DOES_NOT_EXIST:
            return f"!{self.key}"
        if op in _SET_OPERATORS:
            return f"{self.key} {op} ({','.join(self.values)})"
        symbol = {GREATER_THAN: ">", LESS_THAN: "<"}.get(op, op)
        return f"{self.key}{symbol}{self.values[0]}"


# --- lexer and parser (labels.Lexer / labels.Parser) -------------------------------------------------

_ID, _BANG, _EQ, _EQEQ, _NEQ, _IN, _NOTIN, _OPEN, _CLOSE, _COMMA, _GT, _LT, _END = range(13)
_SYMBOLS = {
    "!": _BANG,
    "!=": _NEQ,
    "(": _OPEN,
    ")": _CLOSE,
    ",": _COMMA,
    "=": _EQ,
    "==": _EQEQ,
    ">": _GT,
    "<": _LT,
}
_KEYWORDS = {"in": _IN, "notin": _NOTIN}
_SPECIAL = frozenset("=!(),><")
_WHITESPACE = frozenset(" \t\r\n")
_BINARY = {
    _IN: IN,
    _NOTIN: NOT_IN,
    _EQ: EQUALS,
    _EQEQ: DOUBLE_EQUALS,
    _NEQ: NOT_EQUALS,
    _GT: GREATER_THAN,
    _LT: LESS_THAN,
}


def _lex(text: str) -> list[tuple[int, str]]:
    tokens: list[tuple[int, str]] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WHITESPACE:
            i += 1
        if i >= n:
            tokens.append((_END, ""))
            return tokens
        if text[i] in _SPECIAL:
            # Longest run of special characters that is still a known symbol ("!=" beats "!").
            j = i + 1
            while j < n and text[j] in _SPECIAL and text[i : j + 1] in _SYMBOLS:
                j += 1
            symbol = text[i:j]
            tokens.append((_SYMBOLS[symbol], symbol))
            i = j
        else:
            j = i
            while j < n and text[j] not in _SPECIAL and text[j] not in _WHITESPACE:
                j += 1
            word = text[i:j]
            tokens.append((_KEYWORDS.get(word, _ID), word))
            i = j


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = _lex(text)
        self.pos = 0

    # In "values" context the keywords in/notin are plain identifiers (``x in (in)`` is legal).
    def _peek(self, *, values: bool = True) -> tuple[int, str]:
        tok, lit = self.tokens[self.pos]
        if values and tok in (_IN, _NOTIN):
            tok = _ID
        return tok, lit

    def _next(self, *, values: bool = True) -> tuple[int, str]:
        token = self._peek(values=values)
        if token[0] != _END:
            self.pos += 1
        return token

    def _fail(self, found: str, expected: str) -> SelectorError:
        shown = found if found else "end of string"
        return SelectorError(f"unable to parse selector {self.text!r}: found {shown!r}, expected: {expected}")

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            tok, lit = self._peek()
            if tok == _END:
                return requirements
            if tok not in (_ID, _BANG):
                raise self._fail(lit, "!, identifier, or 'end of string'")
            requirements.append(self._requirement())
            tok, lit = self._next()
            if tok == _END:
                return requirements
            if tok != _COMMA:
                raise self._fail(lit, "',' or 'end of string'")
            tok, lit = self._peek()
            if tok not in (_ID, _BANG):
                raise self._fail(lit, "identifier after ','")

    def _requirement(self) -> Requirement:
        negated = False
        tok, lit = self._next()
        if tok == _BANG:
            negated = True
            tok, lit = self._next()
        if tok != _ID:
            raise self._fail(lit, "identifier" + (" after '!'" if negated else ""))
        key = lit
        _check_key(key)
        if self._peek()[0] in (_END, _COMMA):
            return Requirement.make(key, DOES_NOT_EXIST if negated else EXISTS)
        if negated:
            raise self._fail(self._peek()[1], "',' or 'end of string' after '!" + key + "'")
        tok, lit = self._next(values=False)
        operator = _BINARY.get(tok)
        if operator is None:
            raise self._fail(lit, "'=', '!=', '==', 'in', 'notin', '>' or '<'")
        values = self._set_values() if operator in _SET_OPERATORS else self._exact_value()
        return Requirement.make(key, operator, values)

    def _exact_value(self) -> list[str]:
        tok, lit = self._peek()
        if tok in (_END, _COMMA):
            return [""]  # "x=" selects the empty value
        tok, lit = self._next()
        if tok != _ID:
            raise self._fail(lit, "identifier")
        return [lit]

    def _set_values(self) -> list[str]:
        tok, lit = self._next()
        if tok != _OPEN:
            raise self._fail(lit, "'('")
        tok, lit = self._peek()
        if tok == _CLOSE:
            self._next()
            return [""]  # "x in ()" is the empty value, as in apimachinery
        if tok not in (_ID, _COMMA):
            raise self._fail(lit, "',', ')' or identifier")
        values: list[str] = []
        while True:
            tok, lit = self._next()
            if tok == _ID:
                values.append(lit)
                tok2, lit2 = self._peek()
                if tok2 == _COMMA:
                    continue
                if tok2 == _CLOSE:
                    break
                raise self._fail(lit2, "',' or ')'")
            elif tok == _COMMA:
                # NB: empty elements ("(,a)", "(a,,b)", "(a,)") stand for the empty value.
                if not values:
                    values.append("")
                tok2, _ = self._peek()
                if tok2 == _CLOSE:
                    values.append("")
                    break
                if tok2 == _COMMA:
                    self._next()
                    values.append("")
            else:
                raise self._fail(lit, "',', or identifier")
        tok, lit = self._next()
        if tok != _CLOSE:
            raise self._fail(lit, "')'")
        return values


# --- LabelSelector ----------------------------------------------------------------------------------


class LabelSelector:
    """An immutable set of label requirements (AND). The empty selector matches everything.

    ``LabelSelector.nothing()`` (what ``from_dict(None)`` returns, like ``metav1.LabelSelectorAsSelector(nil)``)
    matches no object; its text form is ``""`` as in apimachinery, so check ``matches_nothing`` before
    serializing one.
    """

    __slots__ = ("_hash", "_nothing", "_requirements")

    def __init__(self, requirements: Iterable[Requirement] = (), *, nothing: bool = False) -> None:
        self._requirements: tuple[Requirement, ...] = tuple(sorted(requirements))
        self._nothing = nothing
        # NB: once: selectors are dictionary keys on every metrics request (adapter/answers.py)
        self._hash = hash((LabelSelector, nothing, self._requirements))

    # -- construction

    @classmethod
    def everything(cls) -> LabelSelector:
        return cls()

    @classmethod
    def nothing(cls) -> LabelSelector:
        return cls(nothing=True)

    @classmethod
    def parse(cls, text: str) -> LabelSelector:
        """Parse the text form (``"app=x,tier in (a,b),!canary"``); ``""`` selects everything."""
        if not isinstance(text, str):
            raise SelectorError(f"label selector must be a string, not {type(text).__name__}")
        return cls(_Parser(text).parse())

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> LabelSelector:
        """The selector ``k1=v1,k2=v2`` matching exactly these labels (``labels.SelectorFromSet``)."""
        return cls(Requirement.make(k, EQUALS, [v]) for k, v in labels.items())

    @classmethod
    def from_dict(cls, spec: Mapping[str, Any] | None) -> LabelSelector:
        """Convert a metav1.LabelSelector dict. None matches nothing; ``{}`` matches everything."""
        if spec is None:
            return cls.nothing()
        if not isinstance(spec, Mapping):
            raise SelectorError(f"label selector must be an object, not {type(spec).__name__}")
        unknown = set(spec) - {"matchLabels", "matchExpressions"}
        if unknown:
            raise SelectorError(f"unknown label selector field(s): {', '.join(sorted(unknown))}")
        match_labels = spec.get("matchLabels") or {}
        expressions = spec.get("matchExpressions") or []
        if not isinstance(match_labels, Mapping):
            raise SelectorError("matchLabels must be an object of label key to value")
        if not isinstance(expressions, list):
            raise SelectorError("matchExpressions must be a list")
        requirements: list[Requirement] = []
        for key, value in match_labels.items():
            if not isinstance(value, str):
                raise SelectorError(f"matchLabels[{key!r}]: value must be a string, not {type(value).__name__}")
            requirements.append(Requirement.make(str(key), EQUALS, [value]))
        for index, expr in enumerate(expressions):
            if not isinstance(expr, Mapping):
                raise SelectorError(f"matchExpressions[{index}] must be an object")
            operator = _METAV1_OPERATORS.get(expr.get("operator"))  # type: ignore[arg-type]
            if operator is None:
                raise SelectorError(
                    f"matchExpressions[{index}]: {expr.get('operator')!r} is not a valid label selector "
                    f"operator (use one of {', '.join(_METAV1_OPERATORS)})"
                )
            values = expr.get("values") or []
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise SelectorError(f"matchExpressions[{index}]: values must be a list of strings")
            requirements.append(Requirement.make(str(expr.get("key", "")), operator, values))
        return cls(requirements)

    # -- queries

    @property
    def requirements(self) -> tuple[Requirement, ...]:
        return self._requirements

    @property
    def is_empty(self) -> bool:
        """True when the selector has no requirements and so matches everything."""
        return not self._requirements and not self._nothing

    @property
    def matches_nothing(self) -> bool:
        return self._nothing

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        if self._nothing:
            return False
        labels = labels or {}
        return all(r.matches(labels) for r in self._requirements)

    def to_dict(self) -> dict[str, Any] | None:
        """The metav1.LabelSelector form, or None when the selector is empty (matches everything).

        ``=``/``==`` become matchLabels (a second equality on the same key becomes ``In``), ``!=`` becomes
        ``NotIn``. Raises SelectorError for ``>``/``<`` and for the nothing selector, which metav1 cannot
        express (``from_dict(None)`` is the only way to spell "nothing").
        """
        if self._nothing:
            raise SelectorError("the selector that matches nothing has no metav1.LabelSelector form")
        if not self._requirements:
            return None
        match_labels: dict[str, str] = {}
        expressions: list[dict[str, Any]] = []
        for r in self._requirements:
            if r.operator in (EQUALS, DOUBLE_EQUALS) and r.key not in match_labels:
                match_labels[r.key] = r.values[0]
                continue
            if r.operator in _NUMERIC_OPERATORS:
                raise SelectorError(f"{r}: metav1.LabelSelector has no form for '>' or '<'")
            operator = {EQUALS: IN, DOUBLE_EQUALS: IN, NOT_EQUALS: NOT_IN}.get(r.operator, r.operator)
            expr: dict[str, Any] = {"key": r.key, "operator": _OPERATOR_METAV1[operator]}
            if operator in _SET_OPERATORS:
                expr["values"] = list(r.values)
            expressions.append(expr)
        out: dict[str, Any] = {}
        if match_labels:
            out["matchLabels"] = match_labels
        if expressions:
            out["matchExpressions"] = expressions
        return out

    def __str__(self) -> str:
        return ",".join(str(r) for r in self._requirements)

    def __repr__(self) -> str:
        if self._nothing:
            return "LabelSelector.nothing()"
        return f"LabelSelector.parse({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LabelSelector):
            return NotImplemented
        return self._nothing == other._nothing and self._requirements == other._requirements

    def __hash__(self) -> int:
        return self._hash


# --- FieldSelector ----------------------------------------------------------------------------------

_FIELD_OPERATORS = (NOT_EQUALS, DOUBLE_EQUALS, EQUALS)  # order matters: "!=" and "==" before "="


@dataclass(frozen=True, slots=True, order=True)
class FieldRequirement:
    """``path op value`` where op is ``=``, ``==`` or ``!=``."""

    field: str
    operator: str
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return self.matches_value(field_value(obj, self.field))

    def matches_value(self, value: str) -> bool:
        equal = value == self.value
        return not equal if self.operator == NOT_EQUALS else equal

    def __str__(self) -> str:
        return f"{self.field}{self.operator}{_escape_field_value(self.value)}"


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string an apiserver field set would hold for ``path`` (dotted) in ``obj``; missing → ``""``."""
    current: Any = obj
    for part in path.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return ""
        current = current[part]
    if current is None:
        return ""
    if isinstance(current, bool):
        return "true" if current else "false"
    if isinstance(current, str):
        return current
    if isinstance(current, int | float):
        return str(current)
    return ""  # lists and maps have no field-selector value


def _escape_field_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _unescape_field_value(value: str, term: str) -> str:
    out: list[str] = []
    escaped = False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"invalid field selector term {term!r}: invalid escape sequence '\\{ch}'")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise SelectorError(f"invalid field selector term {term!r}: unescaped {ch!r} in value")
        else:
            out.append(ch)
    if escaped:
        raise SelectorError(f"invalid field selector term {term!r}: unterminated escape sequence")
    return "".join(out)


def _split_field_terms(text: str) -> list[str]:
    terms: list[str] = []
    start = 0
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == ",":
            terms.append(text[start:i])
            start = i + 1
    terms.append(text[start:])
    return terms


class FieldSelector:
    """An immutable AND of field requirements. The empty selector matches everything."""

    __slots__ = ("_requirements",)

    def __init__(self, requirements: Iterable[FieldRequirement] = ()) -> None:
        self._requirements: tuple[FieldRequirement, ...] = tuple(sorted(requirements))

    @classmethod
    def parse(cls, text: str) -> FieldSelector:
        """Parse ``"metadata.name=x,status.phase!=Failed"``; ``""`` selects everything."""
        if not isinstance(text, str):
            raise SelectorError(f"field selector must be a string, not {type(text).__name__}")
        requirements: list[FieldRequirement] = []
        for term in _split_field_terms(text):
            if not term:
                continue
            for i in range(len(term)):
                op = next((o for o in _FIELD_OPERATORS if term.startswith(o, i)), None)
                if op is not None:
                    field, raw = term[:i], term[i + len(op) :]
                    break
            else:
                raise SelectorError(f"invalid field selector {text!r}: can't understand {term!r}")
            if not field:
                raise SelectorError(f"invalid field selector {text!r}: term {term!r} has no field name")
            requirements.append(FieldRequirement(field, op, _unescape_field_value(raw, term)))
        return cls(requirements)

    @property
    def requirements(self) -> tuple[FieldRequirement, ...]:
        return self._requirements

    @property
    def is_empty(self) -> bool:
        return not self._requirements

    @property
    def fields(self) -> frozenset[str]:
        """The field paths this selector reads (an apiserver checks them against the supported set)."""
        return frozenset(r.field for r in self._requirements)

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Match dotted paths read out of ``obj`` (see ``field_value``)."""
        return all(r.matches(obj) for r in self._requirements)

    def matches_fields(self, fields: Mapping[str, str]) -> bool:
        """Match a flat field set (apimachinery ``fields.Set``); a field absent from it reads as ``""``."""
        return all(r.matches_value(fields.get(r.field, "")) for r in self._requirements)

    def __str__(self) -> str:
        return ",".join(str(r) for r in self._requirements)

    def __repr__(self) -> str:
        return f"FieldSelector.parse({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FieldSelector):
            return NotImplemented
        return self._requirements == other._requirements

    def __hash__(self) -> int:
        return hash((FieldSelector, self._requirements))
