"""Fuzzing the label selector parser (gpuscale/selectors.py).

Generated selectors (``=``, ``==``, ``!=``, ``in``, ``notin``, exists, ``!`` and ``>``/``<``, with qualified keys,
empty values, and blanks wherever the lexer allows them) must parse to exactly the generated requirements,
re-parse from their canonical text and from their metav1 form, and match exactly the label sets a reference
evaluator written here (from k8s.io/apimachinery's labels.Requirement.Matches) says. Arbitrary strings, and
strings built from selector tokens, must parse or raise ``SelectorError`` — nothing else.
"""

from __future__ import annotations

import contextlib
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.errors import SelectorError
from gpuscale.selectors import FieldSelector, LabelSelector, Requirement
from tests.fuzz import fuzz_settings

EXAMPLES_GENERATED_SELECTORS = 400
"""Generated valid selectors, each matched against 8 generated label sets."""
EXAMPLES_TOKEN_SOUP = 800
"""Strings built from selector tokens (keywords, operators, parentheses, keys, values, long integers)."""
EXAMPLES_ARBITRARY_TEXT = 500
"""Arbitrary Unicode strings, as label and as field selectors."""

# --- keys and values, valid by construction (k8s.io/apimachinery/pkg/util/validation) ------------------------

_dns_label = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
_prefix = st.lists(_dns_label, min_size=1, max_size=3).map(".".join)
_name = st.one_of(
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,12}[A-Za-z0-9])?", fullmatch=True),
    st.sampled_from(["app", "in", "notin", "a", "x.y", "A-b_c", "1"]),
    st.just("k" * 63),
)
_keys = st.one_of(_name, _name, st.builds(lambda p, n: f"{p}/{n}", _prefix, _name))
_values = st.one_of(
    st.just(""),
    st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,12}[A-Za-z0-9])?", fullmatch=True),
    st.sampled_from(["in", "notin", "0", "007", "v" * 63]),
)
_INT64_MAX = 2**63 - 1
_integer_values = st.one_of(
    st.integers(min_value=0, max_value=_INT64_MAX).map(str),
    st.integers(min_value=0, max_value=999).map(lambda n: f"{n:05d}"),  # leading zeros are still integers
)

_OPERATORS = ["=", "==", "!=", "in", "notin", "exists", "!", "gt", "lt"]
_blank = st.sampled_from(["", "", " ", "  ", "\t", " \n ", "\r"])
_gap = st.sampled_from([" ", "  ", "\t", "\n", " \r\n "])  # where a blank is required (before in/notin)


@st.composite
def _requirement(draw: st.DrawFn) -> tuple[tuple[str, str, tuple[str, ...]], str]:
    """((key, operator, values), text)."""
    key = draw(_keys)
    op = draw(st.sampled_from(_OPERATORS))
    b = draw(_blank)
    if op == "exists":
        return (key, op, ()), key
    if op == "!":
        return (key, op, ()), f"!{b}{key}"
    if op in ("=", "==", "!="):
        value = draw(_values)
        return (key, op, (value,)), f"{key}{b}{op}{draw(_blank)}{value}"
    if op in ("gt", "lt"):
        value = draw(_integer_values)
        return (key, op, (value,)), f"{key}{b}{'>' if op == 'gt' else '<'}{draw(_blank)}{value}"
    values = draw(st.lists(_values, min_size=1, max_size=4))
    present = [v for v in values if v]
    if "" in values or not present:
        # Empty elements stand for the empty value; apimachinery's list grammar accepts one at either end or
        # between two values (and "()" alone), not every placement of commas.
        where = draw(st.integers(min_value=0, max_value=len(present)))
        elements = [*present[:where], "", *present[where:]] if present else [""]
    else:
        elements = present
    if elements == [""]:
        listed = draw(st.sampled_from(["", ","]))
    else:
        listed = ",".join(f"{draw(_blank)}{e}{draw(_blank)}" for e in elements)
    return (key, op, tuple(values)), f"{key}{draw(_gap)}{op}{b}({listed})"


@st.composite
def selectors(draw: st.DrawFn) -> tuple[list[tuple[str, str, tuple[str, ...]]], str]:
    parts = draw(st.lists(_requirement(), max_size=5))
    text = ",".join(f"{draw(_blank)}{t}{draw(_blank)}" for _, t in parts)
    return [r for r, _ in parts], text


# --- the reference: labels.Requirement.Matches ----------------------------------------------------------------


def _int64(text: str) -> int | None:
    if re.fullmatch(r"[+-]?[0-9]+", text) and len(text) < 25:
        number = int(text)
        if -(2**63) <= number <= _INT64_MAX:
            return number
    return None


def reference_matches(requirements: list[tuple[str, str, tuple[str, ...]]], labels: dict[str, str]) -> bool:
    for key, op, values in requirements:
        has = key in labels
        value = labels.get(key)
        if op in ("=", "==", "in"):
            ok = has and value in values
        elif op in ("!=", "notin"):
            ok = not has or value not in values
        elif op == "exists":
            ok = has
        elif op == "!":
            ok = not has
        else:
            number = _int64(value) if has else None
            bound = _int64(values[0])
            assert bound is not None
            ok = number is not None and (number > bound if op == "gt" else number < bound)
        if not ok:
            return False
    return True


@st.composite
def _label_sets(draw: st.DrawFn, requirements: list[tuple[str, str, tuple[str, ...]]]) -> list[dict[str, str]]:
    keys = [k for k, _, _ in requirements] + ["other", "example.com/other"]
    values = [v for _, _, vs in requirements for v in vs] + ["", "zzz", "1", "-5", "9223372036854775808"]
    label_sets = []
    for _ in range(8):
        chosen = draw(st.lists(st.sampled_from(keys), unique=True, max_size=len(keys)))
        label_sets.append({k: draw(st.sampled_from(values) | _values | _integer_values) for k in chosen})
    return label_sets


@fuzz_settings(EXAMPLES_GENERATED_SELECTORS)
@given(st.data())
def test_generated_selectors_parse_round_trip_and_match_like_the_reference(data: st.DataObject) -> None:
    requirements, text = data.draw(selectors(), label="selector")
    selector = LabelSelector.parse(text)

    expected = sorted(Requirement(k, op, tuple(sorted(set(vs)))) for k, op, vs in requirements)
    assert list(selector.requirements) == expected, text
    canonical = str(selector)
    assert LabelSelector.parse(canonical) == selector, canonical
    assert str(LabelSelector.parse(canonical)) == canonical

    metav1 = None
    if not any(op in ("gt", "lt") for _, op, _ in requirements) and requirements:
        metav1 = LabelSelector.from_dict(selector.to_dict())

    for labels in data.draw(_label_sets(requirements), label="label sets"):
        want = reference_matches(requirements, labels)
        assert selector.matches(labels) == want, (text, labels)
        if metav1 is not None:
            assert metav1.matches(labels) == want, (text, selector.to_dict(), labels)


# --- anything else: a selector or a SelectorError --------------------------------------------------------------

_TOKENS = [
    "a",
    "b",
    "app",
    "x/y",
    "example.com/k",
    "-a",
    "a.",
    "in",
    "notin",
    "(",
    ")",
    ",",
    "!",
    "=",
    "==",
    "!=",
    ">",
    "<",
    " ",
    "\t",
    "",
    "0",
    "-1",
    "+1",
    "9223372036854775808",
    "é",
    "/",
    "k" * 64,
]


# NB: integer strings up to and past Python's int() digit limit (4300 digits by default).
_long_integers = st.one_of(st.integers(min_value=1, max_value=6000), st.sampled_from([19, 20, 4300, 4301, 5000])).map(
    lambda n: "1" * n
)
_piece = st.one_of(st.sampled_from(_TOKENS), _keys, _values, _long_integers)


@st.composite
def _token_soup(draw: st.DrawFn) -> str:
    shape = draw(st.sampled_from(["pieces", "triples", "numeric"]))
    if shape == "pieces":
        return "".join(draw(st.lists(_piece, max_size=12)))
    if shape == "numeric":  # '>'/'<' take integers: any length, any sign, after a valid key
        sign = draw(st.sampled_from(["", "-", "+"]))
        number = draw(_integer_values | _long_integers)
        return f"{draw(_keys)}{draw(st.sampled_from(['>', '<']))}{sign}{number}"
    # Near-valid: requirement-shaped triples, any operator token, any value-shaped piece.
    triples = draw(
        st.lists(
            st.tuples(
                st.one_of(_keys, st.sampled_from(_TOKENS)),
                st.sampled_from(["=", "==", "!=", ">", "<", " in ", " notin ", "!", ""]),
                st.one_of(_values, _integer_values, _long_integers, st.sampled_from(_TOKENS), st.just("(a,b)")),
            ),
            min_size=1,
            max_size=3,
        )
    )
    return ",".join(a + op + b for a, op, b in triples)


def _parses_or_selector_error(text: str) -> None:
    try:
        selector = LabelSelector.parse(text)
    except SelectorError:
        return
    canonical = str(selector)
    assert LabelSelector.parse(canonical) == selector, (text, canonical)
    selector.matches({"a": "1", "app": "x"})


@fuzz_settings(EXAMPLES_TOKEN_SOUP)
@given(_token_soup())
def test_token_soup_parses_or_raises_selector_error(text: str) -> None:
    _parses_or_selector_error(text)


@fuzz_settings(EXAMPLES_ARBITRARY_TEXT)
@given(st.text(max_size=80))
def test_arbitrary_text_parses_or_raises_selector_error(text: str) -> None:
    _parses_or_selector_error(text)
    with contextlib.suppress(SelectorError):
        FieldSelector.parse(text)


# --- dictionary entries, checked every run ----------------------------------------------------------------------
# NB: the generated properties reach these only now and then (how often depends on everything hypothesis sees,
# including the constants of every loaded module); known-hostile inputs are also checked deterministically.

HOSTILE = [
    "a>" + "9" * 19,  # past int64
    "a>" + "1" * 4300,  # at Python's int() digit limit (4300 digits)
    "0>" + "1" * 4301,  # past it
    "a<-" + "9" * 5000,
    "a in (" + ",".join(f"v{i}" for i in range(1500)) + ")",
    ",".join(f"k{i}" for i in range(400)),
    "a=" + "b" * 64,
    "(" * 200,
    "!" * 200,
]


@pytest.mark.parametrize(
    "text", HOSTILE, ids=[re.sub(r"(.)\1{9,}", lambda m: f"{m.group(1)}*{len(m.group(0))}", t)[:40] for t in HOSTILE]
)
def test_hostile_selectors_parse_or_raise_selector_error(text: str) -> None:
    _parses_or_selector_error(text)
