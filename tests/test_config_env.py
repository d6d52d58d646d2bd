"""Configuration from PAWNQUEUE_* variables and from store URLs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.client import PawnQueue
from pawn_queue.config import (
    ENV_ALIASES,
    ENV_NAMES,
    ENV_VARS,
    OTHER_ENV_VARS,
    S3_URL_KEYS,
    URL_ENV_VAR,
    FilesystemConfig,
    PawnQueueConfig,
    S3Config,
    config_paths,
    load_config,
    parse_url,
)
from tests.helpers.config_support import (  # no_pawnqueue_env: an autouse fixture
    AZURE_KEY,
    S3_BASE,
    SECRET,
    config_error,
    no_pawnqueue_env,  # noqa: F401
    value_at,
)
from tests.helpers.environment_table import environment_table

REPO = Path(__file__).resolve().parent.parent

# The README's "Environment variables" table, with the path each name always meant.
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

# One sample per key: the text to set and the value it must produce.
PATH_SAMPLES: dict[str, tuple[str, Any]] = {
    "s3.endpoint_url": ("http://minio:9000", "http://minio:9000"),
    "s3.bucket_name": ("env-bucket", "env-bucket"),
    "s3.aws_access_key_id": ("AKIAENVKEY", "AKIAENVKEY"),
    "s3.aws_secret_access_key": (SECRET, SECRET),
    "s3.aws_session_token": ("session-token-value", "session-token-value"),
    "s3.region_name": ("eu-central-1", "eu-central-1"),
    "s3.use_ssl": ("false", False),
    "s3.verify_ssl": ("no", False),
    "s3.prefix": ("team-a/", "team-a"),
    "s3.addressing_style": ("virtual", "virtual"),
    "s3.connect_timeout_seconds": ("2.5", 2.5),
    "s3.request_timeout_seconds": ("12", 12.0),
    "s3.max_retries": ("1", 1),
    "s3.retry_timeout_seconds": ("9", 9.0),
    "s3.throttle_timeout_seconds": ("90", 90.0),
    "polling.interval_seconds": ("1.5", 1.5),
    "polling.max_messages_per_poll": ("25", 25),
    "polling.visibility_timeout_seconds": ("45", 45.0),
    "polling.lease_refresh_interval_seconds": ("8", 8.0),
    "polling.jitter_max_ms": ("150", 150),
    "polling.shutdown_grace_seconds": ("3", 3.0),
    "concurrency.strategy": ("csprng_verify", "csprng_verify"),
    "concurrency.csprng_verify.jitter_min_ms": ("50", 50),
    "concurrency.csprng_verify.jitter_max_ms": ("600", 600),
    "concurrency.csprng_verify.verify_retries": ("4", 4),
    "concurrency.csprng_verify.verify_retry_delay_ms": ("250", 250),
    "concurrency.clock_skew_margin_seconds": ("5", 5.0),
    "registry.heartbeat_interval_seconds": ("90", 90.0),
    "backend": ("memory", "memory"),
    "filesystem.path": ("/var/lib/queue", "/var/lib/queue"),
    "memory.name": ("shared", "shared"),
    "notify.enabled": ("false", False),
    "notify.check_interval_seconds": ("0.5", 0.5),
    "notify.idle_check_interval_seconds": ("5", 5.0),
    "notify.backfill_interval_seconds": ("120", 120.0),
    "notify.sweep_interval_seconds": ("300", 300.0),
    "notify.sweep_pace_seconds": ("2.5", 2.5),
    "notify.signal_interval_seconds": ("0.2", 0.2),
    "notify.shared_check_interval_seconds": ("0.3", 0.3),
    "notify.slot_signals": ("true", True),
    "producer.group_commit": ("no", False),
    "producer.linger_seconds": ("0.01", 0.01),
    "producer.max_batch_messages": ("50", 50),
    "producer.max_batch_bytes": ("65536", 65536),
    "azure.container_name": ("env-container", "env-container"),
    "azure.prefix": ("/team-b/", "team-b"),
    "azure.account_name": ("envaccount", "envaccount"),
    "azure.account_key": (AZURE_KEY, AZURE_KEY),
    "azure.endpoint_url": (
        "http://127.0.0.1:10000/envaccount",
        "http://127.0.0.1:10000/envaccount",
    ),
    "azure.use_emulator": ("true", True),
    "azure.connect_timeout_seconds": ("2.5", 2.5),
    "azure.request_timeout_seconds": ("12", 12.0),
    "azure.max_retries": ("1", 1),
    "azure.retry_timeout_seconds": ("9", 9.0),
    "azure.throttle_timeout_seconds": ("90", 90.0),
}
# One per variable, new names and old alike.
ENV_SAMPLES: dict[str, tuple[str, Any]] = {
    name: PATH_SAMPLES[path] for name, path in ENV_VARS.items()
}
AZURE_BASE = {"azure": {"container_name": "base-container", "account_name": "baseaccount"}}


# A config with every section, to show that each sample differs from what is there already.
REFERENCE = PawnQueueConfig.from_dict(
    {**S3_BASE, **AZURE_BASE, "backend": "s3", "filesystem": {"path": "./queue"}}
)


# --- environment variables --------------------------------------------------------------------


def test_readme_table_is_mapped_exactly() -> None:
    assert {name: ENV_VARS[name] for name in README_ENV_TABLE} == README_ENV_TABLE


def test_every_key_has_a_variable_named_after_it() -> None:
    """PAWNQUEUE_<SECTION>_<KEY> for every key (some had none, others no section or no
    _SECONDS); the older names stay as aliases of the same keys."""
    assert set(PATH_SAMPLES) == set(ENV_NAMES.values()) == set(config_paths())
    assert (
        ENV_NAMES["PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT_SECONDS"]
        == (ENV_ALIASES["PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT"])
    )
    for name, path in ENV_NAMES.items():
        assert name == "PAWNQUEUE_" + path.replace(".", "_").upper()
    assert set(ENV_ALIASES.values()) <= set(ENV_NAMES.values())


def test_a_new_name_and_an_old_one_that_disagree_are_refused() -> None:
    same = {"PAWNQUEUE_S3_REGION": "eu-west-1", "PAWNQUEUE_S3_REGION_NAME": "eu-west-1"}
    assert PawnQueueConfig.from_env(same, base=S3_BASE).s3.region_name == "eu-west-1"  # type: ignore[union-attr]
    differ = {**same, "PAWNQUEUE_S3_REGION_NAME": "us-east-2"}
    message = config_error(PawnQueueConfig.from_env, differ, base=S3_BASE)
    assert "PAWNQUEUE_S3_REGION" in message and "PAWNQUEUE_S3_REGION_NAME" in message


@pytest.mark.parametrize("name", list(ENV_VARS))
def test_each_variable_takes_effect(name: str) -> None:
    raw, expected = ENV_SAMPLES[name]
    path = ENV_VARS[name]
    assert value_at(REFERENCE, path) != expected, "the sample must differ from the default"
    # The filesystem variable picks its store only when nothing else chose one.
    base: dict[str, Any] = {} if name == "PAWNQUEUE_FILESYSTEM_PATH" else S3_BASE
    if name.startswith("PAWNQUEUE_AZURE_"):
        base = AZURE_BASE  # variables of another store than the one chosen are ignored
    if name.startswith("PAWNQUEUE_MEMORY_"):
        base = {"backend": "memory"}

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


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        (
            "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT_SECOND",
            "PAWNQUEUE_POLLING_VISIBILITY_TIMEOUT_SECONDS",
        ),
        ("PAWNQUEUE_S3_SECRET_ACCESS_KEY", "PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY"),
        ("PAWNQUEUE_NOTIFY_ENABLE", "PAWNQUEUE_NOTIFY_ENABLED"),
        ("PAWNQUEUE_BUCKET", None),
    ],
)
def test_unknown_variable_is_an_error_with_a_suggestion(typo: str, meant: str | None) -> None:
    env = {typo: SECRET}
    for call in (
        lambda: PawnQueueConfig.from_env(env, base=S3_BASE),
        lambda: load_config(S3_BASE, environ=env),
        lambda: PawnQueueConfig.from_url("memory://", environ=env),
        lambda: PawnQueueBuilder().memory().from_env(env).build_config(),
    ):
        message = config_error(call)
        assert typo in message and "unknown" in message and SECRET not in message
        assert "\n" not in message
        if meant is not None:
            assert f"did you mean {meant}?" in message


def test_unknown_variables_are_all_named_and_empty_ones_ignored() -> None:
    env = {"PAWNQUEUE_A_TYPO": "1", "PAWNQUEUE_B_TYPO": "2", "PAWNQUEUE_EMPTY": " "}
    message = config_error(PawnQueueConfig.from_env, env, base=S3_BASE)
    assert "PAWNQUEUE_A_TYPO" in message and "PAWNQUEUE_B_TYPO" in message
    assert "PAWNQUEUE_EMPTY" not in message
    assert PawnQueueConfig.from_env({"PAWNQUEUE_EMPTY": ""}, base=S3_BASE).s3 is not None


def test_every_variable_the_project_reads_is_accepted() -> None:
    """A name read anywhere in the repository (the test suite's included) is not a typo."""
    files = [
        *(
            path
            for part in ("src", "tests", "bench", "examples")
            for path in (REPO / part).rglob("*.py")
        ),
        *(REPO / name for name in ("Makefile", "README.md", "config.example.yaml")),
    ]
    read: set[str] = set()
    for path in files:
        if path != Path(__file__):  # this module writes typos on purpose
            read |= set(re.findall(r"PAWNQUEUE_[A-Z0-9_]*[A-Z0-9]", path.read_text("utf-8")))
    assert {"PAWNQUEUE_COMPAT_PYTHON", URL_ENV_VAR, "PAWNQUEUE_S3_SECRET_KEY"} <= read
    env = dict.fromkeys(read, "")  # empty counts as unset, but the name is still checked
    env.update({"PAWNQUEUE_COMPAT_PYTHON": "/usr/bin/python3", URL_ENV_VAR: "memory://"})
    assert PawnQueueConfig.from_env(env).backend == "memory"


def test_docs_name_only_variables_there_are() -> None:
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    documented = {
        name
        for page in pages
        for name in re.findall(r"PAWNQUEUE_[A-Z0-9_]+", page.read_text(encoding="utf-8"))
    }
    # Variables of the project's tools (the dashboard's token) are documented where used.
    assert documented - {*ENV_VARS, URL_ENV_VAR} - OTHER_ENV_VARS == set()


def test_the_generated_table_lists_every_variable() -> None:
    """docs/environment.md is generated from the config model: run
    ``python -m tests.helpers.environment_table > docs/environment.md`` after a change."""
    assert (REPO / "docs" / "environment.md").read_text(encoding="utf-8") == environment_table()


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


async def test_home_directory_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    home_queue = str(tmp_path / "home" / "pq")
    assert PawnQueueConfig.from_url("file://~/pq", environ={}).filesystem == FilesystemConfig(
        path=home_queue
    )
    assert FilesystemConfig(path="~/pq").path == home_queue
    env = {"PAWNQUEUE_FILESYSTEM_PATH": "~/pq"}
    assert value_at(PawnQueueConfig.from_env(env), "filesystem.path") == home_queue
    assert FilesystemConfig(path="./~/pq").path == "./~/pq"  # only a leading ~ is the home

    async with PawnQueue.from_url("file://~/pq") as pq:
        await pq.create_topic("t")  # the first write creates the directory
    assert (tmp_path / "home" / "pq").is_dir()
    assert not (tmp_path / "~").exists()


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
    assert "PAWNQUEUE_S3_AWS_ACCESS_KEY_ID" in message
    assert "PAWNQUEUE_S3_AWS_SECRET_ACCESS_KEY" in message


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
