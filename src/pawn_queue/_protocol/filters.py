"""Subscription filters: which messages a subscription takes, decided from their attributes.

Every producer evaluates a subscription's filter when it publishes, so a message that does
not match is never written to that subscription (docs/protocol.md, "Subscriptions"). The
stored form (:meth:`Filter.to_json`) is canonical, so two filters that mean the same compare
equal, and every producer version that reads it decides the same.

A filter maps attribute names to conditions, all of which must hold:

- ``"eu"``: the attribute equals this string;
- ``["eu", "us"]``: it equals one of these strings (at least one);
- ``{"exists": True}`` / ``{"exists": False}``: the attribute is set / not set;
- ``{"prefix": "eu-"}``: it starts with this string.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pawn_queue.exceptions import ArgumentError

MAX_CONDITIONS = 32  # filters are evaluated per message by every producer: keep them small
MAX_VALUES = 100

Kind = Literal["equals", "any_of", "exists", "prefix"]


@dataclass(frozen=True, slots=True)
class Condition:
    kind: Kind
    values: tuple[str, ...] = ()  # equals: one; any_of: several, sorted; prefix: one
    exists: bool = True

    def holds(self, value: str | None) -> bool:
        if self.kind == "exists":
            return (value is not None) == self.exists
        if value is None:
            return False
        if self.kind == "prefix":
            return value.startswith(self.values[0])
        return value in self.values

    def to_json(self) -> Any:
        if self.kind == "equals":
            return self.values[0]
        if self.kind == "any_of":
            return list(self.values)
        if self.kind == "exists":
            return {"exists": self.exists}
        return {"prefix": self.values[0]}


@dataclass(frozen=True, slots=True)
class Filter:
    """Conditions on attributes, all of which must hold (an empty filter takes everything)."""

    conditions: tuple[tuple[str, Condition], ...] = ()

    def matches(self, attributes: Mapping[str, str]) -> bool:
        return all(c.holds(attributes.get(name)) for name, c in self.conditions)

    def to_json(self) -> dict[str, Any] | None:
        """The canonical stored form; None for a filter that takes everything."""
        if not self.conditions:
            return None
        return {name: condition.to_json() for name, condition in self.conditions}


EVERYTHING = Filter()


def parse_filter(given: object) -> Filter:
    """The filter ``given`` as a user wrote it (or as stored), or ArgumentError saying why not."""
    if given is None:
        return EVERYTHING
    if not isinstance(given, Mapping):
        raise ArgumentError(
            f"filter: got {reprlib.repr(given)}, must be a mapping of attribute name to a "
            "string, a list of strings, {'exists': bool} or {'prefix': str}"
        )
    if len(given) > MAX_CONDITIONS:
        raise ArgumentError(f"filter: {len(given)} conditions, at most {MAX_CONDITIONS}")
    conditions = []
    for name, value in given.items():
        if not isinstance(name, str) or not name:
            raise ArgumentError(f"filter: attribute names are non-empty strings, got {name!r}")
        conditions.append((name, _condition(name, value)))
    return Filter(tuple(sorted(conditions, key=lambda item: item[0])))


def _condition(name: str, value: object) -> Condition:
    where = f"filter[{name!r}]"
    if isinstance(value, str):
        return Condition("equals", (value,))
    if isinstance(value, list | tuple):
        if not value or not all(isinstance(v, str) for v in value):
            raise ArgumentError(f"{where}: a list must hold one or more strings, got {value!r}")
        if len(value) > MAX_VALUES:
            raise ArgumentError(f"{where}: {len(value)} values, at most {MAX_VALUES}")
        values = tuple(sorted(set(value)))
        # One of a single value is equality: stored as such, so the two compare equal.
        return Condition("equals" if len(values) == 1 else "any_of", values)
    if isinstance(value, Mapping) and len(value) == 1:
        [(operator, operand)] = value.items()
        if operator == "exists" and isinstance(operand, bool):
            return Condition("exists", exists=operand)
        if operator == "prefix" and isinstance(operand, str) and operand:
            return Condition("prefix", (operand,))
    raise ArgumentError(
        f"{where}: got {reprlib.repr(value)}; use a string (equals), a list of strings (any "
        "of), {'exists': True|False} or {'prefix': 'non-empty string'}"
    )
