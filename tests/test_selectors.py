"""Label and field selectors behave like k8s.io/apimachinery: grammar, validation, matching, canonical text,
the metav1.LabelSelector form, and errors that name the offending token.

The tables below are the behaviour; each row is (input, expected).
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuscale.errors import SelectorError
from gpuscale.selectors import FieldSelector, LabelSelector

# --- label selectors: parsing to canonical text -----------------------------------------------------

CANONICAL = [
    ("", ""),
    ("app=web", "app=web"),
    ("app==web", "app==web"),
    ("app!=web", "app!=web"),
    ("  app = web  ", "app=web"),
    ("tier,app=web", "app=web,tier"),  # sorted by key
    ("!canary", "!canary"),
    ("x in (b,a,b)", "x in (a,b)"),  # values sorted, deduplicated
    ("x notin (a)", "x notin (a)"),
    ("x in(a, b)", "x in (a,b)"),
    ("app.kubernetes.io/name=triton", "app.kubernetes.io/name=triton"),
    ("x=", "x="),  # the empty value
    ("x in ()", "x in ()"),
    ("x in (,a)", "x in (,a)"),
    ("x in (a,)", "x in (,a)"),
    ("in in (in,notin)", "in in (in,notin)"),  # keywords are plain identifiers as keys and values
    ("gpus>2", "gpus>2"),
    ("gpus<10", "gpus<10"),
    ("a=b,a=c", "a=b,a=c"),
    ("A_b.c-d=Val_1.x-y", "A_b.c-d=Val_1.x-y"),
    ("k8s.io/x\t=\ty", "k8s.io/x=y"),
]


@pytest.mark.parametrize(("text", "canonical"), CANONICAL)
def test_parse_gives_canonical_text(text, canonical):
    selector = LabelSelector.parse(text)
    assert str(selector) == canonical
    assert LabelSelector.parse(canonical) == selector


# --- label selectors: matching ----------------------------------------------------------------------

WEB = {"app": "web", "tier": "frontend", "gpus": "4"}
MATCHES = [
    ("", WEB, True),
    ("", {}, True),
    ("app=web", WEB, True),
    ("app==web", WEB, True),
    ("app=db", WEB, False),
    ("app!=db", WEB, True),
    ("app!=web", WEB, False),
    ("missing!=x", WEB, True),  # != matches objects without the label
    ("missing notin (x)", WEB, True),  # so does notin
    ("missing in (x)", WEB, False),
    ("app in (web,db)", WEB, True),
    ("app notin (web,db)", WEB, False),
    ("tier", WEB, True),
    ("!tier", WEB, False),
    ("!missing", WEB, True),
    ("app=web,tier=frontend", WEB, True),
    ("app=web,tier=backend", WEB, False),
    ("gpus>2", WEB, True),
    ("gpus>4", WEB, False),
    ("gpus<5", WEB, True),
    ("app>1", WEB, False),  # a non-integer label never compares
    ("missing<9", WEB, False),
    ("x=", {"x": ""}, True),
    ("x=", {}, False),
    ("x in ()", {"x": ""}, True),
]


@pytest.mark.parametrize(("text", "labels", "expected"), MATCHES)
def test_matches(text, labels, expected):
    assert LabelSelector.parse(text).matches(labels) is expected


# --- label selectors: errors name the token ---------------------------------------------------------

ERRORS = [
    ("a=b=c", "'='"),
    ("a in b", "'b'"),
    ("a in (b c)", "'c'"),
    ("a notin", "end of string"),
    ("!a=b", "'='"),
    ("a,", "identifier after ','"),
    (",a", "','"),
    ("a b", "'b'"),
    ("a!", "'!'"),
    ("(", "'('"),
    ("a in (x,,)", "')'"),  # apimachinery rejects this too
    ("a>x", "'x'"),
    ("a>1.5", "'1.5'"),
    ("a<-1", "'-1'"),  # the value must also be a valid label value, as in apimachinery
    ("A/b=c", "'A/b'"),  # prefix must be a lowercase DNS subdomain
    ("/b=c", "'/b'"),
    ("a/b/c=d", "'a/b/c'"),
    ("-a=b", "'-a'"),
    ("a=b@", "'b@'"),
    ("a=-b", "'-b'"),
    ("x" * 64 + "=y", "'" + "x" * 64 + "'"),
    ("a=" + "v" * 64, "'" + "v" * 64 + "'"),
    ("p" * 254 + "/a=b", "prefix part must be no more than 253"),
]


@pytest.mark.parametrize(("text", "named"), ERRORS)
def test_parse_errors_name_the_offending_token(text, named):
    with pytest.raises(SelectorError) as info:
        LabelSelector.parse(text)
    assert named in str(info.value)


def test_parse_rejects_non_strings():
    with pytest.raises(SelectorError):
        LabelSelector.parse(None)  # type: ignore[arg-type]


# --- label selectors: the metav1.LabelSelector form -------------------------------------------------

TO_DICT = [
    ("", None),
    ("app=web", {"matchLabels": {"app": "web"}}),
    ("app==web", {"matchLabels": {"app": "web"}}),
    ("app!=web", {"matchExpressions": [{"key": "app", "operator": "NotIn", "values": ["web"]}]}),
    (
        "app=web,tier in (a,b),!canary,gpu",
        {
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "canary", "operator": "DoesNotExist"},
                {"key": "gpu", "operator": "Exists"},
                {"key": "tier", "operator": "In", "values": ["a", "b"]},
            ],
        },
    ),
    ("a=b,a=c", {"matchLabels": {"a": "b"}, "matchExpressions": [{"key": "a", "operator": "In", "values": ["c"]}]}),
]


@pytest.mark.parametrize(("text", "expected"), TO_DICT)
def test_to_dict(text, expected):
    selector = LabelSelector.parse(text)
    assert selector.to_dict() == expected
    # and back: from_dict of the metav1 form selects the same objects
    back = LabelSelector.from_dict(expected or {})
    for labels in ({}, {"app": "web"}, {"app": "web", "tier": "a"}, {"app": "web", "gpu": "1", "tier": "b"}):
        assert back.matches(labels) == selector.matches(labels)


@pytest.mark.parametrize("text", ["gpus>2", "gpus<2"])
def test_to_dict_refuses_numeric_comparisons(text):
    with pytest.raises(SelectorError, match="no form"):
        LabelSelector.parse(text).to_dict()


FROM_DICT = [
    ({}, "", True),
    ({"matchLabels": {"app": "web"}}, "app=web", False),
    (
        {"matchLabels": {"app": "web"}, "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["b"]}]},
        "app=web,tier notin (b)",
        False,
    ),
    ({"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, "gpu", False),
    ({"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}, "!gpu", False),
    ({"matchLabels": None, "matchExpressions": None}, "", True),
]


@pytest.mark.parametrize(("spec", "text", "empty"), FROM_DICT)
def test_from_dict(spec, text, empty):
    selector = LabelSelector.from_dict(spec)
    assert selector == LabelSelector.parse(text)
    assert selector.is_empty is empty


def test_from_dict_none_matches_nothing_and_empty_matches_everything():
    # metav1.LabelSelectorAsSelector: nil selects nothing, {} selects everything.
    nothing = LabelSelector.from_dict(None)
    assert not nothing.matches({}) and not nothing.matches({"app": "web"})
    assert not nothing.is_empty and nothing.matches_nothing
    assert nothing != LabelSelector.parse("")
    with pytest.raises(SelectorError):
        nothing.to_dict()
    assert LabelSelector.from_dict({}).matches({"anything": "x"})


FROM_DICT_ERRORS = [
    ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}, "'Equals'"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}, "can't be empty"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}, "must be empty"),
    ({"matchLabels": {"a": "b c"}}, "'b c'"),
    ({"matchLabels": {"a b": "c"}}, "'a b'"),
    ({"matchLabels": {"a": 1}}, "must be a string"),
    ({"matchLabel": {"a": "b"}}, "matchLabel"),
    ("app=web", "must be an object"),
]


@pytest.mark.parametrize(("spec", "named"), FROM_DICT_ERRORS)
def test_from_dict_errors(spec, named):
    with pytest.raises(SelectorError) as info:
        LabelSelector.from_dict(spec)
    assert named in str(info.value)


def test_selectors_are_hashable_values():
    a, b = LabelSelector.parse("b=2,a=1"), LabelSelector.parse("a=1, b=2")
    assert a == b and hash(a) == hash(b)
    assert len({a, b, LabelSelector.parse("a=1")}) == 2
    assert LabelSelector.from_labels({"b": "2", "a": "1"}) == a
    assert repr(a) == "LabelSelector.parse('a=1,b=2')"


# --- hypothesis: the canonical text re-parses to an equal selector ---------------------------------

_name = st.from_regex(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,10}[A-Za-z0-9])?", fullmatch=True)
_prefix = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,6}[a-z0-9])?(\.[a-z0-9]{1,5}){0,2}", fullmatch=True)
_key = st.one_of(_name, st.builds(lambda p, n: f"{p}/{n}", _prefix, _name))
_value = st.one_of(st.just(""), _name)
_requirement = st.one_of(
    st.builds(lambda k, op, v: f"{k}{op}{v}", _key, st.sampled_from(["=", "==", "!="]), _value),
    st.builds(
        lambda k, op, vs: f"{k} {op} ({','.join(vs)})",
        _key,
        st.sampled_from(["in", "notin"]),
        st.lists(_name, min_size=1, max_size=4),
    ),
    _key,
    st.builds(lambda k: f"!{k}", _key),
    st.builds(lambda k, op, n: f"{k}{op}{n}", _key, st.sampled_from([">", "<"]), st.integers(0, 1000)),
)
_selector_text = st.lists(_requirement, max_size=5).map(", ".join)


@given(_selector_text)
def test_canonical_text_round_trips(text):
    selector = LabelSelector.parse(text)
    assert LabelSelector.parse(str(selector)) == selector
    assert str(LabelSelector.parse(str(selector))) == str(selector)


@given(_selector_text, st.dictionaries(_key, _value, max_size=4))
def test_metav1_form_selects_the_same_objects(text, labels):
    selector = LabelSelector.parse(text)
    if any(r.operator in ("gt", "lt") for r in selector.requirements):
        return
    assert LabelSelector.from_dict(selector.to_dict() or {}).matches(labels) == selector.matches(labels)


# --- field selectors --------------------------------------------------------------------------------

POD = {
    "metadata": {"name": "triton-0", "namespace": "ml"},
    "spec": {"nodeName": "gpu-1", "hostNetwork": False},
    "status": {"phase": "Running", "podIP": "10.0.0.5"},
}
FIELD_MATCHES = [
    ("", True),
    ("metadata.name=triton-0", True),
    ("metadata.name==triton-0", True),
    ("metadata.name!=triton-0", False),
    ("metadata.namespace=ml,status.phase=Running", True),
    ("status.phase!=Failed,spec.nodeName=gpu-1", True),
    ("spec.nodeName=gpu-2", False),
    ("spec.schedulerName=", True),  # a missing field reads as ""
    ("spec.schedulerName!=", False),
    ("spec.hostNetwork=false", True),  # booleans read as true/false
    ("status.podIP=10.0.0.5", True),
    ("metadata.name=triton-0,", True),  # empty terms are skipped
]


@pytest.mark.parametrize(("text", "expected"), FIELD_MATCHES)
def test_field_selector_matches(text, expected):
    assert FieldSelector.parse(text).matches(POD) is expected


def test_field_selector_escapes_and_canonical_text():
    selector = FieldSelector.parse(r"metadata.name=a\,b\=c\\d,spec.nodeName!=x")
    assert selector.matches({"metadata": {"name": "a,b=c\\d"}, "spec": {"nodeName": "y"}})
    assert str(selector) == r"metadata.name=a\,b\=c\\d,spec.nodeName!=x"
    assert FieldSelector.parse(str(selector)) == selector
    assert selector.fields == {"metadata.name", "spec.nodeName"}


def test_field_selector_matches_flat_field_sets():
    selector = FieldSelector.parse("spec.nodeName=gpu-1,status.phase!=Failed")
    assert selector.matches_fields({"spec.nodeName": "gpu-1", "status.phase": "Running"})
    assert not selector.matches_fields({"status.phase": "Running"})


FIELD_ERRORS = [
    ("metadata.name", "'metadata.name'"),
    ("a=b,c", "'c'"),
    (r"a=b\x", r"'\x'"),
    ("a=b=c", "unescaped '='"),
    ("=x", "no field name"),
    ("a=b\\", "unterminated"),
]


@pytest.mark.parametrize(("text", "named"), FIELD_ERRORS)
def test_field_selector_errors(text, named):
    with pytest.raises(SelectorError) as info:
        FieldSelector.parse(text)
    assert named in str(info.value)
