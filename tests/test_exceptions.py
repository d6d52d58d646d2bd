"""The error tree of pawn_queue.exceptions: one root, ``…Error`` names (the shorter names as
aliases), argument errors apart from configuration errors, the docstring's tree complete."""

from __future__ import annotations

import math
import re

import pytest

import pawn_queue
from pawn_queue import ArgumentError, ConfigError, PawnQueue, PawnQueueError, Retry, exceptions

ALIASES = {
    "NotFound": "NotFoundError",
    "AlreadyExists": "AlreadyExistsError",
    "PreconditionFailed": "PreconditionFailedError",
    "StoreUnavailable": "StoreUnavailableError",
    "AccessDenied": "AccessDeniedError",
    "BucketNotFound": "BucketNotFoundError",
    "RootNotFound": "RootNotFoundError",
    "RateLimited": "RateLimitedError",
}


def error_classes() -> dict[str, type[BaseException]]:
    """The classes defined in pawn_queue.exceptions, by their own name."""
    return {
        value.__name__: value
        for value in vars(exceptions).values()
        if isinstance(value, type) and issubclass(value, BaseException)
        if value.__module__ == exceptions.__name__
    }


def test_every_error_has_an_error_name_under_one_root() -> None:
    classes = error_classes()
    assert {"ArgumentError", "DataLossError", *ALIASES.values()} <= set(classes)
    for name, cls in classes.items():
        assert name.endswith("Error"), name
        assert issubclass(cls, PawnQueueError)


def test_the_shorter_names_are_the_same_classes() -> None:
    for old, new in ALIASES.items():
        assert getattr(exceptions, old) is getattr(exceptions, new)
    assert issubclass(exceptions.RootNotFound, exceptions.NotFoundError)
    assert issubclass(exceptions.RootNotFoundError, exceptions.BucketNotFound)


def test_the_docstring_tree_names_every_class() -> None:
    doc = exceptions.__doc__ or ""
    tree = doc.split("::", 1)[1].split("\n\n", 2)[1]
    drawn = set(re.findall(r"[─ ]([A-Z][A-Za-z]+Error)\b", tree))
    assert drawn == set(error_classes())


def test_argument_errors_are_not_configuration_errors() -> None:
    assert issubclass(ArgumentError, ValueError) and issubclass(ConfigError, ValueError)
    assert not issubclass(ArgumentError, ConfigError)
    assert not issubclass(ConfigError, ArgumentError)
    assert pawn_queue.ArgumentError is exceptions.ArgumentError
    assert "ArgumentError" in pawn_queue.__all__


@pytest.mark.parametrize(
    "fields",
    [
        {"max_receives": 0},
        {"max_receives": "5"},
        {"max_receives": True},
        {"max_receives": 2.5},
        {"base_delay": -1},
        {"base_delay": math.nan},
        {"base_delay": "1"},
        {"factor": 0.5},
        {"factor": math.inf},
        {"max_delay": -1},
        {"max_delay": math.inf},
        {"jitter": 1.5},
        {"jitter": math.nan},
        {"jitter": True},
    ],
)
def test_a_bad_retry_policy_is_an_argument_error(fields: dict[str, object]) -> None:
    with pytest.raises(ArgumentError, match="Retry"):
        Retry(**fields)  # type: ignore[arg-type]


async def test_a_bad_registry_role_is_an_argument_error() -> None:
    async with PawnQueue.from_url("memory://") as pq:
        with pytest.raises(ArgumentError, match="role"):
            await pq.registry.list("workers")  # type: ignore[arg-type]


def test_data_loss_error_lives_in_the_tree_and_at_its_old_path() -> None:
    pytest.importorskip("pyspark")
    from pawn_queue.spark.reading import DataLossError

    assert DataLossError is exceptions.DataLossError
