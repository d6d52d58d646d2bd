"""Every number at every boundary is finite and of the right type, or the error names it.

``visibility_timeout_seconds: .inf`` (YAML), ``PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT=inf`` and
``register_consumer(..., visibility_timeout=math.inf)`` were accepted, and then every poll
logged "cannot convert float infinity to integer" and returned nothing; ``true`` was read as
1 second."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import ArgumentError, ConfigError, PawnQueue
from pawn_queue.config import PawnQueueConfig


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "true", "1e400"])
def test_yaml_numbers_are_finite_and_not_booleans(tmp_path: Path, value: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"backend: memory\npolling:\n  visibility_timeout_seconds: {value}\n")
    with pytest.raises(ConfigError, match=r"polling\.visibility_timeout_seconds"):
        PawnQueueConfig.from_yaml(path)


@pytest.mark.parametrize("value", ["inf", "nan", "1e400"])
def test_environment_numbers_are_finite(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("PAWNQUEUE_URL", "memory://")
    monkeypatch.setenv("PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT", value)
    with pytest.raises(ConfigError, match=r"polling\.visibility_timeout_seconds"):
        PawnQueueConfig.from_env()


@pytest.mark.parametrize("key", ["max_messages_per_poll", "interval_seconds"])
def test_a_boolean_is_no_number(key: str) -> None:
    with pytest.raises(ConfigError, match=f"polling.{key}: must be a number, not true"):
        PawnQueueConfig.from_dict({"backend": "memory", "polling": {key: True}})


@pytest.mark.parametrize("value", [math.inf, math.nan, True, 0, -1, "30"])
async def test_api_seconds_are_finite_numbers(value: Any) -> None:
    async with PawnQueue.from_url("memory://") as pq:
        await pq.create_topic("t")
        with pytest.raises(ArgumentError, match=r"^visibility_timeout: got"):
            await pq.register_consumer("c", ["t"], visibility_timeout=value)
        await (await pq.register_producer("p")).publish("t", {"n": 1})
        [message] = await (await pq.register_consumer("c", ["t"])).poll()
        with pytest.raises(ArgumentError, match=r"^extend: got"):
            await message.extend(value)
        if value != 0:  # a requeue without delay is fine
            with pytest.raises(ArgumentError, match=r"^delay: got"):
                await message.nack(requeue=True, delay=value if value != -1 else math.inf)
        await message.ack()
