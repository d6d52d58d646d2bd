"""PawnQueueBuilder: the README's builder examples, precedence, stores and errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.client import PawnQueue
from pawn_queue.config import URL_ENV_VAR, FilesystemConfig
from pawn_queue.exceptions import ConfigError
from tests.helpers.config_support import (  # no_pawnqueue_env: an autouse fixture
    config_error,
    no_pawnqueue_env,  # noqa: F401
    value_at,
)


def readme_builder() -> PawnQueueBuilder:
    return PawnQueueBuilder().s3(
        endpoint_url="http://localhost:9000",
        bucket_name="my-queue",
        access_key="minioadmin",
        secret_key="minioadmin",
    )


def test_readme_builder_example() -> None:
    config = (
        readme_builder()
        .polling(interval_seconds=2, max_messages_per_poll=20)
        .concurrency(strategy="conditional_write")
        .build_config()
    )
    assert config.backend == "s3"
    assert config.s3 is not None
    assert config.s3.endpoint_url == "http://localhost:9000"
    assert config.s3.bucket_name == "my-queue"
    assert value_at(config, "s3.aws_access_key_id") == "minioadmin"
    assert value_at(config, "s3.aws_secret_access_key") == "minioadmin"
    assert config.s3.use_ssl is False
    assert config.polling.interval_seconds == 2
    assert config.polling.max_messages_per_poll == 20
    assert config.concurrency.strategy == "conditional_write"


async def test_build_returns_a_pawnqueue_with_the_config() -> None:
    builder = readme_builder().polling(interval_seconds=2)
    pawnqueue = await builder.build()
    assert isinstance(pawnqueue, PawnQueue)
    assert pawnqueue.config == builder.build_config()
    assert pawnqueue.config.polling.interval_seconds == 2


def test_readme_hybrid_example_builder_values_win() -> None:
    env = {
        "PAWNQUEUE_S3_ENDPOINT_URL": "http://env-host:9000",
        "PAWNQUEUE_S3_BUCKET_NAME": "env-bucket",
        "PAWNQUEUE_S3_REGION": "env-region",
        "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "3.5",
    }
    config = readme_builder().from_env(env).build_config()
    assert config.s3 is not None
    assert config.s3.endpoint_url == "http://localhost:9000"
    assert config.s3.bucket_name == "my-queue"
    assert config.s3.region_name == "env-region"
    assert config.polling.interval_seconds == 3.5


def test_builder_precedence_does_not_depend_on_call_order() -> None:
    env = {"PAWNQUEUE_POLLING_INTERVAL_SECONDS": "9", "PAWNQUEUE_POLLING_JITTER_MAX_MS": "7"}
    first = readme_builder().polling(interval_seconds=1).from_env(env).build_config()
    last = PawnQueueBuilder().from_env(env).polling(interval_seconds=1)
    last = last.s3(
        endpoint_url="http://localhost:9000",
        bucket_name="my-queue",
        access_key="minioadmin",
        secret_key="minioadmin",
    )
    assert first == last.build_config()
    assert first.polling.interval_seconds == 1
    assert first.polling.jitter_max_ms == 7


def test_builder_reads_os_environ_when_from_env_is_called(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL", "12")
    builder = readme_builder().from_env()
    monkeypatch.setenv("PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL", "99")
    assert builder.build_config().registry.heartbeat_interval_seconds == 12
    assert readme_builder().build_config().registry.heartbeat_interval_seconds == 60


def test_builder_store_beats_env_store() -> None:
    env = {URL_ENV_VAR: "file:///srv/queue", "PAWNQUEUE_BACKEND": "filesystem"}
    config = PawnQueueBuilder().memory("m").from_env(env).build_config()
    assert (config.backend, config.memory.name, config.filesystem) == ("memory", "m", None)
    config = PawnQueueBuilder().polling(interval_seconds=1).from_env(env).build_config()
    assert config.backend == "filesystem"


def test_builder_methods_return_the_builder() -> None:
    builder = PawnQueueBuilder()
    assert builder.s3(bucket_name="abc") is builder
    assert builder.filesystem("q") is builder
    assert builder.memory() is builder
    assert builder.url("memory://") is builder
    assert builder.polling(interval_seconds=1) is builder
    assert builder.concurrency(strategy="auto") is builder
    assert builder.registry(heartbeat_interval_seconds=1) is builder
    assert builder.from_env({}) is builder


def test_builder_stores(tmp_path: Path) -> None:
    config = PawnQueueBuilder().filesystem(tmp_path).build_config()
    assert config.backend == "filesystem" and config.filesystem == FilesystemConfig(
        path=str(tmp_path)
    )
    config = PawnQueueBuilder().memory("shared").build_config()
    assert (config.backend, config.memory.name) == ("memory", "shared")
    config = (
        PawnQueueBuilder().url("s3://abc/p?region_name=r").s3(access_key="AKIAKEY").build_config()
    )
    assert config.s3 is not None
    assert (config.s3.bucket_name, config.s3.prefix, config.s3.region_name) == ("abc", "p", "r")
    assert value_at(config, "s3.aws_access_key_id") == "AKIAKEY"


def test_builder_s3_extra_fields_and_none_means_unset() -> None:
    config = (
        PawnQueueBuilder()
        .s3(bucket_name="abc", region_name=None, prefix="x/y", verify_ssl=False)
        .build_config()
    )
    assert config.s3 is not None
    assert (config.s3.region_name, config.s3.prefix, config.s3.verify_ssl) == (
        "us-east-1",
        "x/y",
        False,
    )


def test_builder_concurrency_flat_or_nested() -> None:
    flat = readme_builder().concurrency(
        strategy="csprng_verify", jitter_min_ms=150, verify_retries=3
    )
    nested = readme_builder().concurrency(
        strategy="csprng_verify", csprng_verify={"jitter_min_ms": 150, "verify_retries": 3}
    )
    assert flat.build_config() == nested.build_config()
    csprng = flat.build_config().concurrency.csprng_verify
    assert (csprng.jitter_min_ms, csprng.verify_retries, csprng.jitter_max_ms) == (150, 3, 400)
    config = readme_builder().concurrency(clock_skew_margin_seconds=1).build_config()
    assert config.concurrency.clock_skew_margin_seconds == 1


def test_builder_errors() -> None:
    message = config_error(readme_builder().polling(intervall_seconds=1).build_config)
    assert "polling.intervall_seconds" in message and "'interval_seconds'" in message
    message = config_error(PawnQueueBuilder().s3, access_key="a", aws_access_key_id="b")
    assert "access_key" in message
    message = config_error(PawnQueueBuilder().polling(interval_seconds=1).build_config)
    assert "s3" in message and "bucket_name" in message


def test_producer_settings_through_the_builder() -> None:
    """The builder had a method for every section but the producer's."""
    config = (
        PawnQueueBuilder().memory().producer(group_commit=False, linger_seconds=0.01).build_config()
    )
    assert (config.producer.group_commit, config.producer.linger_seconds) == (False, 0.01)
    with pytest.raises(ConfigError, match=r"producer\.linger_seconds"):
        PawnQueueBuilder().memory().producer(linger_seconds=math.inf).build_config()
