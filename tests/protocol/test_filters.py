"""Subscription filters (pawn_queue._protocol.filters): what a filter takes, its canonical
stored form, and why a filter is refused."""

from __future__ import annotations

from typing import Any

import pytest

from pawn_queue._protocol.filters import (
    EVERYTHING,
    MAX_CONDITIONS,
    MAX_VALUES,
    Filter,
    parse_filter,
)
from pawn_queue.exceptions import ArgumentError


@pytest.mark.parametrize(
    ("given", "attributes", "expected"),
    [
        ({"region": "eu"}, {"region": "eu"}, True),
        ({"region": "eu"}, {"region": "eu-west"}, False),
        ({"region": "eu"}, {"region": "EU"}, False),
        ({"region": "eu"}, {}, False),
        ({"region": "eu"}, {"other": "eu"}, False),
        ({"region": ["eu", "us"]}, {"region": "us"}, True),
        ({"region": ["eu", "us"]}, {"region": "eu"}, True),
        ({"region": ["eu", "us"]}, {"region": "ap"}, False),
        ({"region": ["eu", "us"]}, {}, False),
        ({"vip": {"exists": True}}, {"vip": ""}, True),
        ({"vip": {"exists": True}}, {"vip": "no"}, True),
        ({"vip": {"exists": True}}, {}, False),
        ({"vip": {"exists": False}}, {}, True),
        ({"vip": {"exists": False}}, {"other": "x"}, True),
        ({"vip": {"exists": False}}, {"vip": ""}, False),
        ({"sku": {"prefix": "eu-"}}, {"sku": "eu-1"}, True),
        ({"sku": {"prefix": "eu-"}}, {"sku": "eu-"}, True),
        ({"sku": {"prefix": "eu-"}}, {"sku": "us-eu-1"}, False),
        ({"sku": {"prefix": "eu-"}}, {"sku": "eu"}, False),
        ({"sku": {"prefix": "eu-"}}, {}, False),
    ],
)
def test_each_condition(given: dict[str, Any], attributes: dict[str, str], expected: bool) -> None:
    assert parse_filter(given).matches(attributes) is expected


def test_a_conjunction_holds_only_when_every_condition_does() -> None:
    f = parse_filter(
        {
            "region": ["eu", "us"],
            "kind": "order",
            "vip": {"exists": True},
            "test": {"exists": False},
            "sku": {"prefix": "A"},
        }
    )
    match = {"region": "eu", "kind": "order", "vip": "1", "sku": "A-7"}
    assert f.matches(match)
    assert f.matches({**match, "unrelated": "x"})
    for name in ("region", "kind", "vip", "sku"):
        assert not f.matches({k: v for k, v in match.items() if k != name}), name
    assert not f.matches({**match, "test": "1"})
    assert not f.matches({**match, "region": "ap"})
    assert not f.matches({**match, "kind": "refund"})
    assert not f.matches({**match, "sku": "B-7"})


def test_no_filter_and_an_empty_one_take_everything() -> None:
    assert parse_filter(None) == EVERYTHING == parse_filter({}) == Filter()
    assert EVERYTHING.matches({}) and EVERYTHING.matches({"a": "b"})
    assert EVERYTHING.to_json() is None and parse_filter({}).to_json() is None


def test_the_stored_form_is_canonical() -> None:
    given = {
        "z": ["b", "a", "b"],
        "a": "x",
        "m": {"exists": False},
        "p": {"prefix": "pre"},
    }
    f = parse_filter(given)
    stored = f.to_json()
    assert stored == {"a": "x", "m": {"exists": False}, "p": {"prefix": "pre"}, "z": ["a", "b"]}
    assert stored is not None and list(stored) == ["a", "m", "p", "z"]  # sorted by name
    # Read back, it is the same filter; written again, the same form.
    assert parse_filter(stored) == f
    assert parse_filter(stored).to_json() == stored


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"a": "x", "b": "y"}, {"b": "y", "a": "x"}),  # order of conditions
        ({"a": ["x", "y"]}, {"a": ["y", "x"]}),  # order of values
        ({"a": ["x", "y", "x"]}, {"a": ("y", "x")}),  # repeats, tuple or list
        ({"a": ["x"]}, {"a": "x"}),  # one of one value: equals it
        ({"a": ["x", "x"]}, {"a": "x"}),
        ({}, None),
    ],
)
def test_filters_that_mean_the_same_compare_equal(one: Any, other: Any) -> None:
    assert parse_filter(one) == parse_filter(other)
    assert parse_filter(one).to_json() == parse_filter(other).to_json()
    assert hash(parse_filter(one)) == hash(parse_filter(other))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"a": "x"}, {"a": "y"}),
        ({"a": "x"}, {"b": "x"}),
        ({"a": ["x", "y"]}, {"a": "x"}),
        ({"a": {"exists": True}}, {"a": {"exists": False}}),
        ({"a": {"prefix": "x"}}, {"a": "x"}),
        ({"a": "x"}, {"a": "x", "b": "y"}),
        ({"a": "x"}, None),
    ],
)
def test_filters_that_differ_compare_unequal(one: Any, other: Any) -> None:
    assert parse_filter(one) != parse_filter(other)
    assert parse_filter(one).to_json() != parse_filter(other).to_json()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (["region", "eu"], "filter: got ['region', 'eu'], must be a mapping"),
        ("region=eu", "filter: got 'region=eu', must be a mapping"),
        (42, "filter: got 42, must be a mapping"),
        ({"": "eu"}, "filter: attribute names are non-empty strings, got ''"),
        ({1: "eu"}, "filter: attribute names are non-empty strings, got 1"),
        ({"r": []}, "filter['r']: a list must hold one or more strings, got []"),
        ({"r": ["eu", 1]}, "filter['r']: a list must hold one or more strings, got ['eu', 1]"),
        ({"r": None}, "filter['r']: got None; use a string (equals)"),
        ({"r": 1}, "filter['r']: got 1; use a string (equals)"),
        ({"r": True}, "filter['r']: got True; use a string (equals)"),
        ({"r": {"exists": 1}}, "filter['r']: got {'exists': 1}; use a string"),
        ({"r": {"exists": "yes"}}, "filter['r']: got {'exists': 'yes'}; use a string"),
        ({"r": {"prefix": ""}}, "filter['r']: got {'prefix': ''}; use a string"),
        ({"r": {"prefix": 3}}, "filter['r']: got {'prefix': 3}; use a string"),
        ({"r": {"suffix": "x"}}, "filter['r']: got {'suffix': 'x'}; use a string"),
        ({"r": {}}, "filter['r']: got {}; use a string"),
        (
            {"r": {"exists": True, "prefix": "x"}},
            "filter['r']: got {'exists': True, 'prefix': 'x'}; use a string",
        ),
    ],
)
def test_invalid_filters_are_refused_saying_why(given: Any, message: str) -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_filter(given)
    assert str(caught.value).startswith(message), str(caught.value)


def test_the_refusal_of_an_unknown_operator_lists_the_forms() -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_filter({"r": {"suffix": "x"}})
    text = str(caught.value)
    for form in ("a string (equals)", "a list of strings (any of)", "'exists'", "'prefix'"):
        assert form in text


def test_size_limits() -> None:
    parse_filter({f"a{n}": "x" for n in range(MAX_CONDITIONS)})
    with pytest.raises(ArgumentError, match=f"at most {MAX_CONDITIONS}"):
        parse_filter({f"a{n}": "x" for n in range(MAX_CONDITIONS + 1)})
    parse_filter({"a": [str(n) for n in range(MAX_VALUES)]})
    with pytest.raises(ArgumentError, match=f"at most {MAX_VALUES}"):
        parse_filter({"a": [str(n) for n in range(MAX_VALUES + 1)]})


def test_a_huge_refused_value_is_shown_shortened() -> None:
    with pytest.raises(ArgumentError) as caught:
        parse_filter({"r": {"prefix": 7, "x": "y" * 10_000}})
    assert len(str(caught.value)) < 400
