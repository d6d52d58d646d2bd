"""Defaults that depend on another setting follow it; only values that were set are checked
against each other."""

from __future__ import annotations

from typing import Any

import pytest

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.client import PawnQueue
from pawn_queue.config import (
    ConcurrencyConfig,
    CsprngVerifyConfig,
    PawnQueueConfig,
    PollingConfig,
    load_config,
)
from tests.helpers.config_support import (  # no_pawnqueue_env: an autouse fixture
    S3_BASE,
    config_error,
    no_pawnqueue_env,  # noqa: F401
)


def with_polling(**polling: Any) -> PawnQueueConfig:
    return PawnQueueConfig.from_dict({**S3_BASE, "polling": polling})


@pytest.mark.parametrize(
    ("visibility", "refresh", "margin"),
    [(2, 2 / 3, 0.5), (4, 4 / 3, 1.0), (8, 8 / 3, 2.0), (12, 4.0, 2.0), (30, 10.0, 2.0)],
)
def test_a_short_visibility_timeout_brings_its_own_refresh_and_margin(
    visibility: float, refresh: float, margin: float
) -> None:
    config = with_polling(visibility_timeout_seconds=visibility)
    assert config.polling.lease_refresh_interval_seconds == pytest.approx(refresh)
    assert config.concurrency.clock_skew_margin_seconds == pytest.approx(margin)


def test_defaults_are_unchanged_for_the_default_visibility_timeout() -> None:
    config = PawnQueueConfig.from_dict(S3_BASE)
    assert config.polling.visibility_timeout_seconds == 30
    assert config.polling.lease_refresh_interval_seconds == 10
    assert config.concurrency.clock_skew_margin_seconds == 2
    assert with_polling(visibility_timeout_seconds=60).polling.lease_refresh_interval_seconds == 10


def test_derived_defaults_follow_every_source() -> None:
    env = {"PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "2"}
    from_env = PawnQueueConfig.from_env(env, base=S3_BASE)
    # A config object as the base: its derived values are not taken as set.
    over_object = PawnQueueConfig.from_env(env, base=PawnQueueConfig.from_dict(S3_BASE))
    yaml_like = load_config({**S3_BASE, "polling": {"visibility_timeout_seconds": 5}}, environ=env)
    built = PawnQueueBuilder().memory().polling(visibility_timeout_seconds=2).build_config()
    url = PawnQueueConfig.from_url(
        "memory://", environ={}, polling={"visibility_timeout_seconds": 2}
    )
    for config in (from_env, over_object, yaml_like, built, url):
        assert config.polling.visibility_timeout_seconds == 2
        assert config.polling.lease_refresh_interval_seconds == pytest.approx(2 / 3)
        assert config.concurrency.clock_skew_margin_seconds == 0.5


def test_sections_alone_derive_what_they_can() -> None:
    polling = PollingConfig(visibility_timeout_seconds=3)
    assert polling.lease_refresh_interval_seconds == 1
    assert "lease_refresh_interval_seconds" not in polling.model_fields_set
    assert ConcurrencyConfig().clock_skew_margin_seconds == 2


def test_values_that_were_set_are_still_checked() -> None:
    message = config_error(
        with_polling, visibility_timeout_seconds=2, lease_refresh_interval_seconds=2
    )
    assert "polling.lease_refresh_interval_seconds" in message
    assert "visibility_timeout_seconds (2)" in message

    data = {
        **S3_BASE,
        "polling": {"visibility_timeout_seconds": 2},
        "concurrency": {"clock_skew_margin_seconds": 2},
    }
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "concurrency.clock_skew_margin_seconds" in message
    assert "polling.visibility_timeout_seconds (2)" in message


def test_a_set_value_against_the_default_visibility_timeout_says_so() -> None:
    message = config_error(with_polling, lease_refresh_interval_seconds=45)
    assert "visibility_timeout_seconds (30, the default)" in message
    data = {**S3_BASE, "concurrency": {"clock_skew_margin_seconds": 30}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "polling.visibility_timeout_seconds (30, the default)" in message


def test_csprng_jitter_default_makes_room_for_the_value_set() -> None:
    assert CsprngVerifyConfig(jitter_min_ms=500).jitter_max_ms == 500
    assert CsprngVerifyConfig(jitter_max_ms=50).jitter_min_ms == 50
    assert CsprngVerifyConfig(jitter_min_ms=50).jitter_max_ms == 400
    message = config_error(CsprngVerifyConfig, jitter_min_ms=500, jitter_max_ms=400)
    assert "jitter_min_ms" in message and "jitter_max_ms (400)" in message


def test_consumer_visibility_brings_its_own_refresh_interval() -> None:
    config = PawnQueueConfig.from_dict(S3_BASE)
    polling = config.consumer_polling(6)
    assert polling.visibility_timeout_seconds == 6
    assert polling.lease_refresh_interval_seconds == 2
    assert polling.interval_seconds == config.polling.interval_seconds

    message = config_error(config.consumer_polling, 1.5)
    assert "visibility_timeout" in message and "clock_skew_margin_seconds (2)" in message

    fixed = with_polling(lease_refresh_interval_seconds=5, max_messages_per_poll=3)
    message = config_error(fixed.consumer_polling, 5)
    assert "visibility_timeout" in message and "lease_refresh_interval_seconds (5)" in message
    assert fixed.consumer_polling(6).max_messages_per_poll == 3
    assert fixed.consumer_polling(6).lease_refresh_interval_seconds == 5


async def test_register_consumer_takes_a_visibility_below_the_default_refresh() -> None:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("t")
        await pq.register_consumer("short-leases", topics=["t"], visibility_timeout=6)
