"""Configuration: the README's YAML, load_config, the checks on every value, and secrets."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.config import (
    CsprngVerifyConfig,
    PawnQueueConfig,
    PollingConfig,
    S3Config,
    load_config,
)
from tests.helpers.config_support import (  # no_pawnqueue_env: an autouse fixture
    README_YAML,
    S3_BASE,
    SECRET,
    config_error,
    no_pawnqueue_env,  # noqa: F401
    value_at,
)

REPO = Path(__file__).resolve().parent.parent


# --- YAML and load_config -------------------------------------------------------------------


def test_readme_yaml_loads_as_s3(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(README_YAML, encoding="utf-8")
    config = PawnQueueConfig.from_yaml(path)

    assert config.backend == "s3"
    assert config.s3 is not None
    assert config.s3.endpoint_url == "https://fsn1.your-objectstorage.com"
    assert config.s3.bucket_name == "my-queue-bucket"
    assert config.s3.aws_access_key_id == SecretStr("...")
    assert config.s3.aws_secret_access_key == SecretStr("...")
    assert config.s3.region_name == "eu-central-1"
    assert config.s3.use_ssl is True
    assert config.polling == PollingConfig(
        interval_seconds=5,
        max_messages_per_poll=10,
        visibility_timeout_seconds=30,
        lease_refresh_interval_seconds=10,
        jitter_max_ms=200,
    )
    assert config.concurrency.strategy == "auto"
    assert config.concurrency.csprng_verify == CsprngVerifyConfig(
        jitter_min_ms=100, jitter_max_ms=400, verify_retries=2, verify_retry_delay_ms=150
    )
    assert config.registry.heartbeat_interval_seconds == 60


def test_example_file_holds_the_readme_example(tmp_path: Path) -> None:
    readme = tmp_path / "readme.yaml"
    readme.write_text(README_YAML, encoding="utf-8")
    assert PawnQueueConfig.from_yaml(REPO / "config.example.yaml") == PawnQueueConfig.from_yaml(
        readme
    )


def test_load_config_accepts_path_str_mapping_and_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(README_YAML, encoding="utf-8")
    expected = PawnQueueConfig.from_yaml(path)

    assert load_config(path) == expected
    assert load_config(str(path)) == expected
    assert load_config(expected.model_dump()) == expected
    assert load_config(expected) is expected
    assert "not int" in config_error(load_config, 42)


def test_load_config_applies_env_over_yaml_and_dict(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(README_YAML, encoding="utf-8")
    env = {"PAWNQUEUE_S3_SECRET_KEY": SECRET, "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "1"}

    config = load_config(path, environ=env)
    assert value_at(config, "s3.aws_secret_access_key") == SECRET
    assert config.polling.interval_seconds == 1
    assert config.s3 is not None and config.s3.bucket_name == "my-queue-bucket"

    config = load_config(
        {"backend": "memory"}, environ={"PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": "7"}
    )
    assert config.registry.heartbeat_interval_seconds == 7
    assert load_config(path, environ={}).polling.interval_seconds == 5


def test_load_config_reads_os_environ_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PAWNQUEUE_S3_BUCKET_NAME", "from-os-environ")
    config = load_config({"s3": {"bucket_name": "from-dict"}})
    assert config.s3 is not None and config.s3.bucket_name == "from-os-environ"


def test_load_config_leaves_a_config_object_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    config = PawnQueueConfig.from_dict({"backend": "memory"})
    monkeypatch.setenv("PAWNQUEUE_POLLING_INTERVAL_SECONDS", "1")
    assert load_config(config).polling.interval_seconds == 5


def test_yaml_errors_name_the_file_and_hide_the_text(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    assert str(missing) in config_error(PawnQueueConfig.from_yaml, missing)

    broken = tmp_path / "broken.yaml"
    broken.write_text(f's3:\n  aws_secret_access_key: "{SECRET}\n  bucket_name: x\n')
    message = config_error(PawnQueueConfig.from_yaml, broken)
    assert "invalid YAML" in message and "broken.yaml" in message and "line" in message
    assert SECRET not in message

    listing = tmp_path / "list.yaml"
    listing.write_text("- s3\n")
    assert "mapping" in config_error(PawnQueueConfig.from_yaml, listing)

    bad_value = tmp_path / "bad.yaml"
    bad_value.write_text("backend: memory\npolling:\n  interval_seconds: -1\n")
    message = config_error(PawnQueueConfig.from_yaml, bad_value)
    assert "bad.yaml" in message and "polling.interval_seconds" in message and "-1" in message


def test_empty_yaml_file_needs_a_store(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert "s3" in config_error(PawnQueueConfig.from_yaml, empty)


# --- validation ---------------------------------------------------------------------------------


def test_unknown_keys_suggest_and_list_allowed() -> None:
    message = config_error(PawnQueueConfig.from_dict, {**S3_BASE, "poling": {}})
    assert "poling" in message and "'polling'" in message and "registry" in message

    data = {**S3_BASE, "polling": {"interval_secs": 1}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "polling.interval_secs" in message and "'interval_seconds'" in message
    assert "max_messages_per_poll" in message

    data = {"backend": "memory", "concurrency": {"csprng_verify": {"jiter_min_ms": 1}}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "concurrency.csprng_verify.jiter_min_ms" in message and "'jitter_min_ms'" in message


@pytest.mark.parametrize(
    "path",
    [
        "polling.interval_seconds",
        "polling.visibility_timeout_seconds",
        "polling.lease_refresh_interval_seconds",
        "registry.heartbeat_interval_seconds",
        "s3.connect_timeout_seconds",
        "s3.request_timeout_seconds",
        "s3.retry_timeout_seconds",
    ],
)
@pytest.mark.parametrize("bad", [0, -1.5])
def test_intervals_must_be_positive(path: str, bad: float) -> None:
    data: dict[str, Any] = {"s3": {"bucket_name": "abc"}}
    section, key = path.split(".")
    data.setdefault(section, {})[key] = bad
    message = config_error(PawnQueueConfig.from_dict, data)
    assert path in message and f"(got {bad!r})" in message and "greater than 0" in message


def test_lease_refresh_must_be_shorter_than_visibility_timeout() -> None:
    for refresh in (30, 45):
        polling = {"visibility_timeout_seconds": 30, "lease_refresh_interval_seconds": refresh}
        message = config_error(PawnQueueConfig.from_dict, {**S3_BASE, "polling": polling})
        assert "polling.lease_refresh_interval_seconds" in message
        assert (
            f"(got {float(refresh)!r})" in message and "visibility_timeout_seconds (30)" in message
        )
    ok = PollingConfig(visibility_timeout_seconds=30, lease_refresh_interval_seconds=29.9)
    assert ok.lease_refresh_interval_seconds == 29.9
    # The rule also holds across sources: a base value against an env value.
    env = {"PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "5"}
    base = {**S3_BASE, "polling": {"lease_refresh_interval_seconds": 10}}
    message = config_error(PawnQueueConfig.from_env, env, base=base)
    assert "polling.lease_refresh_interval_seconds" in message and "(5)" in message


def test_jitter_min_must_not_exceed_max() -> None:
    message = config_error(CsprngVerifyConfig, jitter_min_ms=500, jitter_max_ms=400)
    assert (
        "concurrency.csprng_verify.jitter_min_ms" in message
        and "500" in message
        and "400" in message
    )
    assert CsprngVerifyConfig(jitter_min_ms=400, jitter_max_ms=400).jitter_min_ms == 400


def test_clock_skew_margin_must_be_less_than_visibility_timeout() -> None:
    data = {
        **S3_BASE,
        "polling": {"visibility_timeout_seconds": 10, "lease_refresh_interval_seconds": 5},
        "concurrency": {"clock_skew_margin_seconds": 10},
    }
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "concurrency.clock_skew_margin_seconds" in message and "10" in message
    data["concurrency"] = {"clock_skew_margin_seconds": 9.5}
    assert PawnQueueConfig.from_dict(data).concurrency.clock_skew_margin_seconds == 9.5


def test_max_messages_per_poll_at_least_one() -> None:
    message = config_error(
        PawnQueueConfig.from_dict, {**S3_BASE, "polling": {"max_messages_per_poll": 0}}
    )
    assert "polling.max_messages_per_poll" in message and "greater than or equal to 1" in message


def test_store_sections_are_required_for_their_backend() -> None:
    message = config_error(PawnQueueConfig.from_dict, {"s3": {"endpoint_url": "http://h:1"}})
    assert "s3.bucket_name: required" in message
    message = config_error(PawnQueueConfig.from_dict, {"backend": "s3"})
    assert "s3" in message and "bucket_name" in message
    message = config_error(PawnQueueConfig.from_dict, {"backend": "filesystem"})
    assert "filesystem.path" in message
    message = config_error(
        PawnQueueConfig.from_dict, {"backend": "filesystem", "filesystem": {"path": ""}}
    )
    assert "filesystem.path" in message


def test_backend_inferred_from_the_one_store_section() -> None:
    assert PawnQueueConfig.from_dict({"filesystem": {"path": "q"}}).backend == "filesystem"
    assert PawnQueueConfig.from_dict({"memory": {"name": "n"}}).backend == "memory"
    data = {"s3": {"bucket_name": "abc"}, "filesystem": {"path": "q"}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "backend" in message and "s3, filesystem" in message
    assert PawnQueueConfig.from_dict({**data, "backend": "filesystem"}).backend == "filesystem"


def test_enumerations_list_allowed_values() -> None:
    message = config_error(PawnQueueConfig.from_dict, {"backend": "redis"})
    assert "backend" in message and "'filesystem'" in message and "'redis'" in message
    data = {**S3_BASE, "concurrency": {"strategy": "optimistic"}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert "concurrency.strategy" in message and "'csprng_verify'" in message


@pytest.mark.parametrize(
    "name",
    ["ab", "a" * 64, "My-Bucket", "bucket_name", "-bucket", "bucket-", "buck et", "bucket.", ""],
)
def test_invalid_bucket_names(name: str) -> None:
    message = config_error(S3Config, bucket_name=name)
    assert "s3.bucket_name" in message and repr(name) in message and "3-63" in message


@pytest.mark.parametrize("name", ["abc", "a.b-c", "a" * 63, "t-0123456789abcdef", "123"])
def test_valid_bucket_names(name: str) -> None:
    assert S3Config(bucket_name=name).bucket_name == name


@pytest.mark.parametrize(
    "endpoint",
    [
        "localhost:9000",
        "ftp://host",
        "http://",
        "http://host/path",
        "http://host?x=1",
        "http://host#f",
        "http://host:99999",
        "http://host:port",
    ],
)
def test_invalid_endpoints(endpoint: str) -> None:
    message = config_error(S3Config, bucket_name="abc", endpoint_url=endpoint)
    assert (
        "s3.endpoint_url" in message
        and repr(endpoint) in message
        and "http(s)://host[:port]" in message
    )


def test_endpoint_is_normalised_and_decides_use_ssl(caplog: pytest.LogCaptureFixture) -> None:
    config = S3Config(bucket_name="abc", endpoint_url="HTTP://Host:9000/")
    assert (config.endpoint_url, config.use_ssl) == ("http://Host:9000", False)
    assert S3Config(bucket_name="abc").use_ssl is True
    with caplog.at_level(logging.WARNING, logger="pawn_queue.config"):
        config = S3Config(bucket_name="abc", endpoint_url="http://h:1", use_ssl=True)
    assert config.use_ssl is False
    assert "use_ssl" in caplog.text


def test_prefix_is_normalised_and_checked() -> None:
    assert S3Config(bucket_name="abc", prefix="/a/b/").prefix == "a/b"
    for bad in ("a//b", "a/../b", "./a"):
        message = config_error(S3Config, bucket_name="abc", prefix=bad)
        assert "s3.prefix" in message and repr(bad) in message


def test_every_way_of_building_raises_config_error() -> None:
    config_error(S3Config, bucket_name="x")
    config_error(PollingConfig, interval_seconds=-1)
    config_error(PollingConfig.model_validate, {"interval_seconds": -1})
    config_error(
        PawnQueueConfig.model_validate, {"backend": "memory", "polling": {"interval_seconds": 0}}
    )
    config = PawnQueueConfig.from_dict({"backend": "memory"})
    message = config_error(setattr, config.polling, "interval_seconds", 1.0)
    assert "polling.interval_seconds" in message and "immutable" in message


def test_several_problems_are_reported_together() -> None:
    data = {"s3": {"bucket_name": "abc", "region_name": ""}, "polling": {"interval_seconds": 0}}
    message = config_error(PawnQueueConfig.from_dict, data)
    assert (
        "2 problems" in message
        and "s3.region_name" in message
        and "polling.interval_seconds" in message
    )


# --- secrets ------------------------------------------------------------------------------------


def secret_config() -> PawnQueueConfig:
    return PawnQueueConfig.from_dict(
        {
            "s3": {
                "bucket_name": "abc",
                "aws_access_key_id": SECRET + "-id",
                "aws_secret_access_key": SECRET,
                "aws_session_token": SECRET + "-token",
            }
        }
    )


def test_repr_and_str_never_show_secrets() -> None:
    config = secret_config()
    assert config.s3 is not None
    for obj in (config, config.s3):
        assert SECRET not in repr(obj) and SECRET not in str(obj)
    assert value_at(config, "s3.aws_secret_access_key") == SECRET


def test_errors_never_show_secrets() -> None:
    cases: list[dict[str, Any]] = [
        {"s3": {"bucket_name": "abc", "aws_secret_access_key": ["not", "a", SECRET]}},
        {"s3": {"bucket_name": "abc", "secret_key": SECRET}},
        {"s3": {"bucket_name": "abc", "access_key": SECRET}},
        {"s3": {"bucket_name": "Bad_Name", "aws_secret_access_key": SECRET}},
        {
            "s3": {"bucket_name": "abc", "aws_secret_access_key": SECRET},
            "polling": {"password": SECRET},
        },
        {"s3": {"bucket_name": "abc", "aws_secret_access_key": SECRET, "max_retries": -1}},
    ]
    for data in cases:
        message = config_error(PawnQueueConfig.from_dict, data)
        assert SECRET not in message, message

    message = config_error(S3Config, bucket_name="abc", aws_session_token=12345)
    assert "s3.aws_session_token" in message and "12345" not in message


def test_env_errors_never_show_secrets() -> None:
    env = {"PAWNQUEUE_S3_SECRET_KEY": SECRET, "PAWNQUEUE_S3_BUCKET_NAME": "Bad_Name"}
    message = config_error(PawnQueueConfig.from_env, env)
    assert "PAWNQUEUE_S3_BUCKET_NAME" in message and SECRET not in message


def test_builder_state_never_shows_secrets() -> None:
    builder = PawnQueueBuilder().s3(bucket_name="abc", secret_key=SECRET, aws_session_token=SECRET)
    assert SECRET not in repr(vars(builder))
    assert value_at(builder.build_config(), "s3.aws_secret_access_key") == SECRET
