"""Configuration: the README's YAML, PAWNQUEUE_* variables, store URLs, the builder, checks."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.client import PawnQueue
from pawn_queue.config import (
    ENV_VARS,
    S3_URL_KEYS,
    URL_ENV_VAR,
    CsprngVerifyConfig,
    FilesystemConfig,
    PawnQueueConfig,
    PollingConfig,
    S3Config,
    load_config,
    parse_url,
)
from pawn_queue.exceptions import ConfigError

REPO = Path(__file__).resolve().parent.parent
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"  # never allowed in a message or a repr

# Word for word from the README's "Configuration" section.
README_YAML = """\
s3:
  endpoint_url: "https://fsn1.your-objectstorage.com"   # Hetzner FSN1
  bucket_name: "my-queue-bucket"
  aws_access_key_id: "..."
  aws_secret_access_key: "..."
  region_name: "eu-central-1"
  use_ssl: true

polling:
  interval_seconds: 5            # how often consumer.poll() loops in listen() mode
  max_messages_per_poll: 10      # max messages returned per poll() call
  visibility_timeout_seconds: 30 # lease TTL — message reappears if not acked within this time
  lease_refresh_interval_seconds: 10  # background task renews lease at this interval
  jitter_max_ms: 200             # unused in csprng_verify (has its own jitter config)

concurrency:
  strategy: "auto"               # auto | conditional_write | csprng_verify
  csprng_verify:
    jitter_min_ms: 100           # minimum write→verify sleep
    jitter_max_ms: 400           # maximum write→verify sleep
    verify_retries: 2            # number of additional HEAD re-checks
    verify_retry_delay_ms: 150   # sleep between re-checks

registry:
  heartbeat_interval_seconds: 60 # how often last_seen is updated in _registry/
"""

# The README's "Environment Variable Overrides" table, with the path each name always meant.
README_ENV_TABLE = {
    "PAWNQUEUE_S3_ENDPOINT_URL": "s3.endpoint_url",
    "PAWNQUEUE_S3_BUCKET_NAME": "s3.bucket_name",
    "PAWNQUEUE_S3_ACCESS_KEY": "s3.aws_access_key_id",
    "PAWNQUEUE_S3_SECRET_KEY": "s3.aws_secret_access_key",
    "PAWNQUEUE_S3_REGION": "s3.region_name",
    "PAWNQUEUE_S3_USE_SSL": "s3.use_ssl",
    "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "polling.interval_seconds",
    "PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL": "polling.max_messages_per_poll",
    "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "polling.visibility_timeout_seconds",
    "PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL": "polling.lease_refresh_interval_seconds",
    "PAWNQUEUE_POLLING_JITTER_MAX_MS": "polling.jitter_max_ms",
    "PAWNQUEUE_CONCURRENCY_STRATEGY": "concurrency.strategy",
    "PAWNQUEUE_CSPRNG_JITTER_MIN_MS": "concurrency.csprng_verify.jitter_min_ms",
    "PAWNQUEUE_CSPRNG_JITTER_MAX_MS": "concurrency.csprng_verify.jitter_max_ms",
    "PAWNQUEUE_CSPRNG_VERIFY_RETRIES": "concurrency.csprng_verify.verify_retries",
    "PAWNQUEUE_CSPRNG_RETRY_DELAY_MS": "concurrency.csprng_verify.verify_retry_delay_ms",
    "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": "registry.heartbeat_interval_seconds",
}

# One sample per variable: the text to set and the value it must produce.
ENV_SAMPLES: dict[str, tuple[str, Any]] = {
    "PAWNQUEUE_S3_ENDPOINT_URL": ("http://minio:9000", "http://minio:9000"),
    "PAWNQUEUE_S3_BUCKET_NAME": ("env-bucket", "env-bucket"),
    "PAWNQUEUE_S3_ACCESS_KEY": ("AKIAENVKEY", "AKIAENVKEY"),
    "PAWNQUEUE_S3_SECRET_KEY": (SECRET, SECRET),
    "PAWNQUEUE_S3_REGION": ("eu-central-1", "eu-central-1"),
    "PAWNQUEUE_S3_USE_SSL": ("false", False),
    "PAWNQUEUE_POLLING_INTERVAL_SECONDS": ("1.5", 1.5),
    "PAWNQUEUE_POLLING_MAX_MESSAGES_PER_POLL": ("25", 25),
    "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": ("45", 45.0),
    "PAWNQUEUE_POLLING_LEASE_REFRESH_INTERVAL": ("8", 8.0),
    "PAWNQUEUE_POLLING_JITTER_MAX_MS": ("150", 150),
    "PAWNQUEUE_CONCURRENCY_STRATEGY": ("csprng_verify", "csprng_verify"),
    "PAWNQUEUE_CSPRNG_JITTER_MIN_MS": ("50", 50),
    "PAWNQUEUE_CSPRNG_JITTER_MAX_MS": ("600", 600),
    "PAWNQUEUE_CSPRNG_VERIFY_RETRIES": ("4", 4),
    "PAWNQUEUE_CSPRNG_RETRY_DELAY_MS": ("250", 250),
    "PAWNQUEUE_REGISTRY_HEARTBEAT_INTERVAL": ("90", 90.0),
    "PAWNQUEUE_BACKEND": ("memory", "memory"),
    "PAWNQUEUE_FILESYSTEM_PATH": ("/var/lib/queue", "/var/lib/queue"),
    "PAWNQUEUE_S3_PREFIX": ("team-a/", "team-a"),
    "PAWNQUEUE_S3_VERIFY_SSL": ("no", False),
    "PAWNQUEUE_S3_SESSION_TOKEN": ("session-token-value", "session-token-value"),
    "PAWNQUEUE_S3_ADDRESSING_STYLE": ("virtual", "virtual"),
    "PAWNQUEUE_CLOCK_SKEW_MARGIN_SECONDS": ("5", 5.0),
    "PAWNQUEUE_NOTIFY_ENABLED": ("false", False),
    "PAWNQUEUE_NOTIFY_CHECK_INTERVAL_SECONDS": ("0.5", 0.5),
    "PAWNQUEUE_NOTIFY_IDLE_CHECK_INTERVAL_SECONDS": ("5", 5.0),
    "PAWNQUEUE_NOTIFY_BACKFILL_INTERVAL_SECONDS": ("120", 120.0),
}

S3_BASE = {"s3": {"bucket_name": "base-bucket"}}
# A config with every section, to show that each sample differs from what is there already.
REFERENCE = PawnQueueConfig.from_dict(
    {**S3_BASE, "backend": "s3", "filesystem": {"path": "./queue"}}
)


@pytest.fixture(autouse=True)
def _no_pawnqueue_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry points that read os.environ must not see the developer's or CI's variables."""
    import os

    for name in list(os.environ):
        if name.startswith("PAWNQUEUE_"):
            monkeypatch.delenv(name)


def value_at(config: PawnQueueConfig, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = getattr(node, part)
    return node.get_secret_value() if isinstance(node, SecretStr) else node


def config_error(call: Any, *args: Any, **kwargs: Any) -> str:
    """The message of the ConfigError ``call`` raises; also checks it hides its cause."""
    with pytest.raises(ConfigError) as info:
        call(*args, **kwargs)
    assert not isinstance(info.value, ValidationError)
    assert info.value.__cause__ is None
    return str(info.value)


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


# --- environment variables --------------------------------------------------------------------


def test_readme_table_is_mapped_exactly() -> None:
    assert {name: ENV_VARS[name] for name in README_ENV_TABLE} == README_ENV_TABLE


def test_every_variable_has_a_sample() -> None:
    assert set(ENV_SAMPLES) == set(ENV_VARS)


@pytest.mark.parametrize("name", list(ENV_VARS))
def test_each_variable_takes_effect(name: str) -> None:
    raw, expected = ENV_SAMPLES[name]
    path = ENV_VARS[name]
    assert value_at(REFERENCE, path) != expected, "the sample must differ from the default"
    # The filesystem variable picks its store only when nothing else chose one.
    base: dict[str, Any] = {} if name == "PAWNQUEUE_FILESYSTEM_PATH" else S3_BASE

    config = PawnQueueConfig.from_env({name: raw}, base=base)
    assert value_at(config, path) == expected


def test_every_config_path_in_the_table_exists() -> None:
    for path in ENV_VARS.values():
        value_at(REFERENCE, path)  # AttributeError if a path names no field


def test_readme_docker_example_env_only() -> None:
    env = {
        "PAWNQUEUE_S3_ENDPOINT_URL": "http://minio:9000",
        "PAWNQUEUE_S3_BUCKET_NAME": "queues",
        "PAWNQUEUE_S3_ACCESS_KEY": "minioadmin",
        "PAWNQUEUE_S3_SECRET_KEY": "minioadmin",
        "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "1",
        "PAWNQUEUE_CONCURRENCY_STRATEGY": "csprng_verify",
    }
    config = PawnQueueBuilder().from_env(env).build_config()
    assert config == PawnQueueConfig.from_env(env)
    assert config.backend == "s3"
    assert config.s3 is not None
    assert config.s3.endpoint_url == "http://minio:9000"
    assert config.s3.use_ssl is False  # follows the http:// endpoint
    assert config.s3.bucket_name == "queues"
    assert value_at(config, "s3.aws_access_key_id") == "minioadmin"
    assert value_at(config, "s3.aws_secret_access_key") == "minioadmin"
    assert config.polling.interval_seconds == 1
    assert config.concurrency.strategy == "csprng_verify"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        *[("true", True), ("TRUE", True), ("1", True), ("Yes", True)],
        *[("false", False), ("False", False), ("0", False), ("NO", False), (" no ", False)],
    ],
)
def test_boolean_variables(raw: str, expected: bool) -> None:
    config = PawnQueueConfig.from_env({"PAWNQUEUE_S3_VERIFY_SSL": raw}, base=S3_BASE)
    assert config.s3 is not None and config.s3.verify_ssl is expected


@pytest.mark.parametrize("raw", ["maybe", "2", "on", "t"])
def test_bad_boolean_names_the_variable(raw: str) -> None:
    message = config_error(PawnQueueConfig.from_env, {"PAWNQUEUE_S3_USE_SSL": raw}, base=S3_BASE)
    assert "PAWNQUEUE_S3_USE_SSL" in message and repr(raw) in message and "yes" in message


def test_bad_number_names_the_variable_and_path() -> None:
    env = {"PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT": "soon"}
    message = config_error(PawnQueueConfig.from_env, env, base=S3_BASE)
    assert "polling.visibility_timeout_seconds" in message
    assert "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT" in message and "'soon'" in message


def test_empty_variables_count_as_unset() -> None:
    config = PawnQueueConfig.from_env(
        {"PAWNQUEUE_S3_REGION": " ", "PAWNQUEUE_S3_USE_SSL": ""}, base=S3_BASE
    )
    assert config.s3 is not None and config.s3.region_name == "us-east-1"


def test_env_overrides_base_unless_told_to_fill_only() -> None:
    base = {"s3": {"bucket_name": "base-bucket", "region_name": "base-region"}}
    env = {"PAWNQUEUE_S3_REGION": "env-region", "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "2"}

    over = PawnQueueConfig.from_env(env, base=base)
    assert value_at(over, "s3.region_name") == "env-region"
    fill = PawnQueueConfig.from_env(env, base=base, override=False)
    assert value_at(fill, "s3.region_name") == "base-region"
    assert fill.polling.interval_seconds == 2
    assert PawnQueueConfig.from_env(env, base=PawnQueueConfig.from_dict(base)) == over


def test_env_url_selects_the_store_and_variables_refine_it() -> None:
    env = {
        URL_ENV_VAR: "s3://url-bucket/pre?endpoint_url=http://127.0.0.1:8333&region_name=r1",
        "PAWNQUEUE_S3_REGION": "r2",
        "PAWNQUEUE_S3_ACCESS_KEY": "AKIAENVKEY",
        "PAWNQUEUE_S3_SECRET_KEY": SECRET,
    }
    config = PawnQueueConfig.from_env(env)
    assert config.s3 is not None
    assert (config.s3.bucket_name, config.s3.prefix) == ("url-bucket", "pre")
    assert config.s3.endpoint_url == "http://127.0.0.1:8333"
    assert config.s3.region_name == "r2"
    assert value_at(config, "s3.aws_secret_access_key") == SECRET

    config = PawnQueueConfig.from_env({URL_ENV_VAR: "memory://shared"}, base=S3_BASE)
    assert (config.backend, config.memory.name) == ("memory", "shared")


def test_other_stores_variables_do_no_harm() -> None:
    env = {URL_ENV_VAR: "file:///srv/queue", "PAWNQUEUE_S3_SECRET_KEY": SECRET}
    config = PawnQueueConfig.from_env(env)
    assert config.backend == "filesystem" and config.s3 is None
    assert config.filesystem == FilesystemConfig(path="/srv/queue")

    yaml_like = {"backend": "filesystem", "filesystem": {"path": "q"}}
    assert load_config(yaml_like, environ={"PAWNQUEUE_S3_REGION": "x"}).s3 is None


def test_env_backend_errors() -> None:
    message = config_error(PawnQueueConfig.from_env, {"PAWNQUEUE_BACKEND": "redis"})
    assert "PAWNQUEUE_BACKEND" in message and "'redis'" in message and "filesystem" in message

    env = {"PAWNQUEUE_BACKEND": "s3", URL_ENV_VAR: "memory://"}
    message = config_error(PawnQueueConfig.from_env, env)
    assert "PAWNQUEUE_BACKEND" in message and URL_ENV_VAR in message

    message = config_error(PawnQueueConfig.from_env, {URL_ENV_VAR: "redis://host"})
    assert message.startswith(URL_ENV_VAR) and "s3, file, memory" in message


def test_env_only_without_store_says_what_is_missing() -> None:
    message = config_error(PawnQueueConfig.from_env, {})
    assert "PAWNQUEUE_S3_BUCKET_NAME" in message and "s3://" in message


def test_readme_lists_every_variable() -> None:
    readme = REPO / "README.md"
    documented = set(re.findall(r"PAWNQUEUE_[A-Z0-9_]+", readme.read_text(encoding="utf-8")))
    known = {*ENV_VARS, URL_ENV_VAR}
    assert documented - known == set(), "README names variables the code does not know"
    assert known - documented == set(), "variables missing from the README"


# --- builder ------------------------------------------------------------------------------------


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


# --- store URLs ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "s3://bucket/optional/prefix?endpoint_url=http://127.0.0.1:8333&region_name=us-east-1",
            {
                "backend": "s3",
                "s3": {
                    "bucket_name": "bucket",
                    "prefix": "/optional/prefix",
                    "endpoint_url": "http://127.0.0.1:8333",
                    "region_name": "us-east-1",
                },
            },
        ),
        ("s3://bucket", {"backend": "s3", "s3": {"bucket_name": "bucket"}}),
        (
            "s3://b1?use_ssl=false&verify_ssl=No&addressing_style=virtual",
            {
                "backend": "s3",
                "s3": {
                    "bucket_name": "b1",
                    "use_ssl": False,
                    "verify_ssl": False,
                    "addressing_style": "virtual",
                },
            },
        ),
        ("file:///abs/dir", {"backend": "filesystem", "filesystem": {"path": "/abs/dir"}}),
        ("file://./rel/dir", {"backend": "filesystem", "filesystem": {"path": "./rel/dir"}}),
        ("file://../up/dir", {"backend": "filesystem", "filesystem": {"path": "../up/dir"}}),
        ("file://.", {"backend": "filesystem", "filesystem": {"path": "."}}),
        ("file://localhost/abs", {"backend": "filesystem", "filesystem": {"path": "/abs"}}),
        ("file://name/x", {"backend": "filesystem", "filesystem": {"path": "name/x"}}),
        ("file:///with%20space", {"backend": "filesystem", "filesystem": {"path": "/with space"}}),
        ("memory://", {"backend": "memory", "memory": {"name": ""}}),
        ("memory://shared", {"backend": "memory", "memory": {"name": "shared"}}),
    ],
)
def test_parse_url(url: str, expected: dict[str, Any]) -> None:
    assert parse_url(url) == expected


def test_from_url_builds_a_full_config() -> None:
    env = {"PAWNQUEUE_S3_ACCESS_KEY": "AKIAENVKEY", "PAWNQUEUE_S3_SECRET_KEY": SECRET}
    config = PawnQueueConfig.from_url(
        "s3://bucket/optional/prefix/?endpoint_url=http://127.0.0.1:8333&region_name=us-east-1",
        environ=env,
        polling={"interval_seconds": 1},
    )
    assert config.s3 is not None
    assert config.s3.prefix == "optional/prefix"
    assert config.s3.use_ssl is False  # not given, and the endpoint is http://
    assert value_at(config, "s3.aws_access_key_id") == "AKIAENVKEY"
    assert value_at(config, "s3.aws_secret_access_key") == SECRET
    assert config.polling.interval_seconds == 1

    https = PawnQueueConfig.from_url("s3://bucket?endpoint_url=https://s3.example.com", environ={})
    assert https.s3 is not None and https.s3.use_ssl is True
    assert PawnQueueConfig.from_url("file://./q", environ={}).filesystem == FilesystemConfig(
        path="./q"
    )


def test_from_url_values_beat_env() -> None:
    env = {"PAWNQUEUE_S3_REGION": "env-region", "PAWNQUEUE_POLLING_INTERVAL_SECONDS": "4"}
    config = PawnQueueConfig.from_url("s3://bucket?region_name=url-region", environ=env)
    assert value_at(config, "s3.region_name") == "url-region"
    assert config.polling.interval_seconds == 4


@pytest.mark.parametrize(
    "url",
    [
        f"s3://AKIAKEY:{SECRET}@bucket/prefix",
        f"s3://{SECRET}@bucket",
        f"s3://bucket?aws_secret_access_key={SECRET}",
        f"s3://bucket?aws_access_key_id={SECRET}",
        f"s3://bucket?aws_session_token={SECRET}",
        f"s3://bucket?endpoint_url=http://k:{SECRET}@host:9000",
        f"s3://bucket?endpoint_url=http://k:{SECRET}@host:notaport",
    ],
)
def test_credentials_in_urls_are_refused_and_not_echoed(url: str) -> None:
    message = config_error(PawnQueueConfig.from_url, url, environ={})
    assert SECRET not in message
    assert "PAWNQUEUE_S3_ACCESS_KEY" in message and "PAWNQUEUE_S3_SECRET_KEY" in message


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("redis://host/0", ["'redis'", "s3, file, memory"]),
        ("/just/a/path", ["no scheme", "s3, file, memory"]),
        ("s3://bucket?endpoint=http://h", ["endpoint", "endpoint_url", "region_name", "use_ssl"]),
        ("s3://bucket?region_name=a&region_name=b", ["region_name", "more than once"]),
        ("s3:///prefix-only", ["needs a bucket"]),
        ("s3://Not_A_Bucket", ["s3.bucket_name", "'Not_A_Bucket'", "lowercase"]),
        ("s3://bucket?use_ssl=maybe", ["use_ssl", "'maybe'"]),
        ("s3://bucket?max_retries=-1", ["s3.max_retries", "-1"]),
        ("s3://bucket#frag", ["fragment"]),
        ("file://", ["needs a directory"]),
        ("file:///q?x=1", ["x", "allowed: none"]),
        ("memory://name/path", ["memory://name"]),
        ("memory://?a=1", ["allowed: none"]),
    ],
)
def test_url_errors(url: str, fragments: list[str]) -> None:
    message = config_error(PawnQueueConfig.from_url, url, environ={})
    for fragment in fragments:
        assert fragment in message


def test_s3_url_keys_are_s3_fields_without_credentials() -> None:
    assert set(S3_URL_KEYS) <= set(S3Config.model_fields)
    assert {"endpoint_url", "region_name", "use_ssl", "verify_ssl", "addressing_style"} <= set(
        S3_URL_KEYS
    )
    assert not {"aws_access_key_id", "aws_secret_access_key", "aws_session_token"} & set(
        S3_URL_KEYS
    )


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
    message = config_error(PawnQueueConfig.from_env, env, base=S3_BASE)
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
