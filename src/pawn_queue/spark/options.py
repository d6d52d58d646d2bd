"""Options of the ``pawnqueue`` data source, parsed once into plain (picklable) values.

Connection: ``url`` (a store URL), or ``config`` (a YAML file), or the ``PAWNQUEUE_*``
environment. Every process that touches the store (the driver and each executor) builds its
configuration from these same options, so secrets never travel inside Spark's task closures.
What to read: ``topic`` or ``topics``, and optionally ``subscription``: that subscription of
each topic (its own queue) instead of the topics' own queues.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pawn_queue._protocol import layout
from pawn_queue.config import ENV_VARS, URL_ENV_VAR, PawnQueueConfig, load_config
from pawn_queue.exceptions import ConfigError

State = Literal["pending", "dead_letter"]

DEFAULT_NAME = "spark"
DEFAULT_LEASE_TIMEOUT = 60.0
DEFAULT_MESSAGES_PER_OBJECT = 1000
MAX_MESSAGES_PER_OBJECT = 100_000

# Option names as users write them; Spark hands them over lowercased.
OPTIONS = (
    "url",
    "config",
    "topic",
    "topics",
    "subscription",
    "name",
    "maxMessagesPerTrigger",
    "failOnDataLoss",
    "leaseTimeoutSeconds",
    "state",
    "messagesPerObject",
    "writeId",
    "batchId",
)
# Options Spark itself may add (``load(path)``, ``save(path)``, writeStream settings).
_SPARK_OPTIONS = ("path", "checkpointlocation", "queryname")
_KNOWN = {name.lower(): name for name in OPTIONS}


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """What the options say, validated; no I/O."""

    url: str | None
    config_path: str | None
    topics: tuple[str, ...]
    subscription: str | None = None
    name: str = DEFAULT_NAME
    max_messages: int | None = None
    fail_on_data_loss: bool = True
    lease_timeout: float = DEFAULT_LEASE_TIMEOUT
    state: State = "pending"
    messages_per_object: int = DEFAULT_MESSAGES_PER_OBJECT
    write_id: str | None = None
    batch_id: int = 0

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Validate ``options`` (case-insensitive keys); raise ConfigError naming the option."""
        given: dict[str, str] = {}
        for key, value in options.items():
            lowered = key.lower()
            if lowered in _SPARK_OPTIONS:
                continue
            if lowered not in _KNOWN:
                raise ConfigError(
                    f"pawnqueue: unknown option {key!r}; allowed: {', '.join(OPTIONS)}"
                )
            given[_KNOWN[lowered]] = str(value)
        url = given.get("url") or None
        config_path = given.get("config") or None
        if url and config_path:
            raise ConfigError("pawnqueue: give option 'url' or option 'config', not both")
        return cls(
            url=url,
            config_path=config_path,
            topics=_topics(given),
            subscription=_subscription(given),
            name=layout.validate_name(given.get("name", DEFAULT_NAME), "pawnqueue option 'name'"),
            max_messages=_optional_int(given, "maxMessagesPerTrigger", 1),
            fail_on_data_loss=_bool(given, "failOnDataLoss", True),
            lease_timeout=_positive_float(given, "leaseTimeoutSeconds", DEFAULT_LEASE_TIMEOUT),
            state=_state(given),
            messages_per_object=_bounded_int(
                given, "messagesPerObject", DEFAULT_MESSAGES_PER_OBJECT, MAX_MESSAGES_PER_OBJECT
            ),
            write_id=_write_id(given),
            batch_id=_optional_int(given, "batchId", 0) or 0,
        )

    @property
    def queues(self) -> tuple[str, ...]:
        """The queues a read takes messages from: each topic's own, or with option
        ``subscription``, that subscription's queue of each topic."""
        if self.subscription is None:
            return self.topics
        return tuple(layout.subscription_queue(t, self.subscription) for t in self.topics)

    @property
    def topic(self) -> str:
        """The one topic a writer publishes to."""
        if self.subscription is not None:
            raise ConfigError(
                "pawnqueue: option 'subscription' is for reads; a write goes to the topic, "
                "which copies it into each of its subscriptions whose filter matches"
            )
        if len(self.topics) != 1:
            raise ConfigError(
                f"pawnqueue: a write needs exactly one topic, got {len(self.topics)} "
                f"({', '.join(self.topics)})"
            )
        return self.topics[0]

    def config(self) -> PawnQueueConfig:
        """The queue configuration these options select, read in the calling process."""
        if self.url:
            config = PawnQueueConfig.from_url(self.url)
        elif self.config_path:
            config = load_config(self.config_path)
        elif any(os.environ.get(name) for name in (URL_ENV_VAR, *ENV_VARS)):
            config = PawnQueueConfig.from_env()
        else:
            raise ConfigError(
                "pawnqueue needs a store: option 'url' (file:///dir, s3://bucket/prefix?...), "
                f"option 'config' (a YAML file), or the environment ({URL_ENV_VAR} or "
                "PAWNQUEUE_* variables)"
            )
        if config.backend == "memory":
            raise ConfigError(
                "pawnqueue: the memory store lives in one process and Spark runs many; "
                "use a file:// or s3:// store"
            )
        if self.lease_timeout < 3 * config.concurrency.clock_skew_margin_seconds:
            raise ConfigError(
                f"pawnqueue option 'leaseTimeoutSeconds': got {self.lease_timeout:g}, must be at "
                "least 3 x concurrency.clock_skew_margin_seconds "
                f"({config.concurrency.clock_skew_margin_seconds:g}) so refreshes land in time"
            )
        return config


def _topics(given: Mapping[str, str]) -> tuple[str, ...]:
    if "topic" in given and "topics" in given:
        raise ConfigError("pawnqueue: give option 'topic' or option 'topics', not both")
    raw = given.get("topic", given.get("topics", ""))
    names = [name.strip() for name in raw.split(",") if name.strip()]
    if not names:
        raise ConfigError(
            "pawnqueue needs option 'topic' (one topic) or 'topics' (a comma-separated list)"
        )
    if "topic" in given and len(names) > 1:
        raise ConfigError("pawnqueue option 'topic' takes one topic; use 'topics' for a list")
    checked = [layout.validate_name(name, "pawnqueue topic") for name in names]
    if len(set(checked)) != len(checked):
        raise ConfigError("pawnqueue option 'topics' names a topic twice")
    return tuple(checked)


def _subscription(given: Mapping[str, str]) -> str | None:
    if "subscription" not in given:
        return None
    name = given["subscription"].strip()
    if not name:
        raise ConfigError(
            "pawnqueue option 'subscription': empty; give the name of a subscription of the "
            "topic(s), or leave the option out to read the topics' own queues"
        )
    return layout.validate_name(name, "pawnqueue option 'subscription'")


def _write_id(given: Mapping[str, str]) -> str | None:
    if "writeId" not in given:
        if "batchId" in given:
            raise ConfigError("pawnqueue option 'batchId' goes with option 'writeId'")
        return None
    return layout.validate_name(given["writeId"], "pawnqueue option 'writeId'")


def _optional_int(given: Mapping[str, str], name: str, minimum: int) -> int | None:
    if name not in given:
        return None
    try:
        value = int(given[name])
    except ValueError:
        raise ConfigError(
            f"pawnqueue option {name!r}: got {given[name]!r}, not an integer"
        ) from None
    if value < minimum:
        raise ConfigError(f"pawnqueue option {name!r}: got {value}, must be >= {minimum}")
    return value


def _bounded_int(given: Mapping[str, str], name: str, default: int, maximum: int) -> int:
    value = _optional_int(given, name, 1)
    if value is None:
        return default
    if value > maximum:
        raise ConfigError(f"pawnqueue option {name!r}: got {value}, must be <= {maximum}")
    return value


def _positive_float(given: Mapping[str, str], name: str, default: float) -> float:
    if name not in given:
        return default
    try:
        value = float(given[name])
    except ValueError:
        raise ConfigError(f"pawnqueue option {name!r}: got {given[name]!r}, not a number") from None
    if not value > 0 or value == float("inf"):
        raise ConfigError(f"pawnqueue option {name!r}: got {given[name]!r}, must be > 0")
    return value


def _bool(given: Mapping[str, str], name: str, default: bool) -> bool:
    if name not in given:
        return default
    value = given[name].strip().lower()
    if value in ("true", "1", "yes"):
        return True
    if value in ("false", "0", "no"):
        return False
    raise ConfigError(f"pawnqueue option {name!r}: got {given[name]!r}, expected true or false")


def _state(given: Mapping[str, str]) -> State:
    value = given.get("state", "pending").strip().lower()
    if value == "pending":
        return "pending"
    if value in ("dead_letter", "dead-letter"):
        return "dead_letter"
    raise ConfigError(
        f"pawnqueue option 'state': got {given['state']!r}, allowed: 'pending', 'dead_letter'"
    )
