"""The Azure store's configuration: the ``azure:`` section, ``az://`` URLs, ``PAWNQUEUE_AZURE_*``
variables and the builder; bad values are refused naming the setting, the key never shows."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr

from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.config import AZURE_URL_KEYS, AzureConfig, PawnQueueConfig, parse_url
from pawn_queue.store import open_store
from pawn_queue.store.azure import AzureStore
from pawn_queue.store.throttling import ThrottleBackoff
from tests.helpers.config_support import (  # no_pawnqueue_env: an autouse fixture
    AZURE_KEY,
    SECRET,
    config_error,
    no_pawnqueue_env,  # noqa: F401
    value_at,
)

BASE = {"container_name": "queue-1", "account_name": "myaccount"}


def test_az_url_parses_like_an_s3_url() -> None:
    url = (
        "az://queue-1/team/a?account_name=acct1&endpoint_url=http://127.0.0.1:10000/acct1"
        "&use_emulator=yes&max_retries=2&request_timeout_seconds=7.5"
    )
    assert parse_url(url) == {
        "backend": "azure",
        "azure": {
            "container_name": "queue-1",
            "prefix": "/team/a",
            "account_name": "acct1",
            "endpoint_url": "http://127.0.0.1:10000/acct1",
            "use_emulator": True,
            "max_retries": "2",
            "request_timeout_seconds": "7.5",
        },
    }
    config = PawnQueueConfig.from_url(url, environ={"PAWNQUEUE_AZURE_ACCOUNT_KEY": AZURE_KEY})
    assert config.backend == "azure" and config.azure is not None
    assert (config.azure.prefix, config.azure.max_retries) == ("team/a", 2)
    assert config.azure.request_timeout_seconds == 7.5
    assert value_at(config, "azure.account_key") == AZURE_KEY
    assert set(AZURE_URL_KEYS) == set(AzureConfig.model_fields) - {
        "container_name",
        "prefix",
        "account_key",
    }


@pytest.mark.parametrize(
    ("url", "fragments"),
    [
        ("az:///prefix-only", ["needs a container", "az://container/optional/prefix"]),
        ("az://Queue?account_name=a1b", ["azure.container_name", "'Queue'", "lowercase"]),
        ("az://q--1?account_name=a1b", ["azure.container_name", "no '--'"]),
        ("az://queue", ["azure.account_name", "required unless use_emulator"]),
        ("az://queue?account_name=My_Account", ["azure.account_name", "'My_Account'"]),
        ("az://queue?use_emulator=maybe", ["use_emulator", "'maybe'"]),
        ("az://queue?region_name=x", ["region_name", "endpoint_url", "use_emulator"]),
        ("az://queue?use_emulator=1&max_retries=-1", ["azure.max_retries", "-1"]),
        ("az://queue?use_emulator=1&retry_timeout_seconds=inf", ["azure.retry_timeout_seconds"]),
        ("az://queue?use_emulator=1&connect_timeout_seconds=nan", ["connect_timeout_seconds"]),
        ("az://queue?use_emulator=1&request_timeout_seconds=0", ["greater than 0"]),
        ("az://queue?use_emulator=1&endpoint_url=ftp://h", ["azure.endpoint_url", "http(s)"]),
        ("az://queue?use_emulator=1&endpoint_url=http://h/a?b", ["azure.endpoint_url"]),
        ("redis://host/0", ["s3, file, memory, az"]),
    ],
)
def test_az_url_errors(url: str, fragments: list[str]) -> None:
    message = config_error(PawnQueueConfig.from_url, url, environ={})
    for fragment in fragments:
        assert fragment in message, message


@pytest.mark.parametrize(
    "url",
    [
        f"az://queue?account_name=a1b&account_key={AZURE_KEY}",
        f"az://{AZURE_KEY}@queue?account_name=a1b",
        f"az://queue?account_name=a1b&endpoint_url=http://u:{SECRET}@h:1/a1b",
    ],
)
def test_keys_in_az_urls_are_refused_and_not_echoed(url: str) -> None:
    message = config_error(PawnQueueConfig.from_url, url, environ={})
    assert SECRET not in message and AZURE_KEY not in message
    assert "PAWNQUEUE_AZURE_ACCOUNT_KEY" in message


def test_section_values_are_checked_and_normalised() -> None:
    config = AzureConfig(
        **BASE, prefix="/a/b/", endpoint_url="https://myaccount.blob.core.windows.net/"
    )
    assert (config.prefix, config.endpoint_url) == (
        "a/b",
        "https://myaccount.blob.core.windows.net",
    )
    assert AzureConfig(container_name="a-1", use_emulator=True).account_name is None
    for name in ("ab", "a" * 64, "-ab", "ab-", "a--b", "a_b", "a.b", "ABC"):
        message = config_error(AzureConfig, **{**BASE, "container_name": name})
        assert "azure.container_name" in message and repr(name) in message, message
    assert "azure.prefix" in config_error(AzureConfig, **BASE, prefix="a/../b")
    message = config_error(AzureConfig, **BASE, account_key=SecretStr(SECRET))
    assert "azure.account_key" in message and "base64" in message and SECRET not in message
    message = config_error(PawnQueueConfig.from_dict, {"backend": "azure"})
    assert "azure" in message and "container_name" in message


def test_key_never_shows_in_reprs_or_errors() -> None:
    data: dict[str, Any] = {"azure": {**BASE, "account_key": AZURE_KEY}}
    config = PawnQueueConfig.from_dict(data)
    assert config.backend == "azure" and config.azure is not None
    opened = open_store(config)
    assert isinstance(opened, ThrottleBackoff) and repr(opened) == repr(opened.inner)
    store = opened.inner
    assert isinstance(store, AzureStore)
    for obj in (config, config.azure, store, vars(store), store._live()):
        assert AZURE_KEY not in repr(obj) and AZURE_KEY not in str(obj), type(obj)
    assert repr(store) == (
        "AzureStore(endpoint='https://myaccount.blob.core.windows.net', "
        "container='queue-1', prefix='')"
    )
    bad = {"azure": {**BASE, "account_key": AZURE_KEY, "container_name": "Bad", "max_retries": -1}}
    for attempt in (
        lambda: PawnQueueConfig.from_dict(bad),
        lambda: PawnQueueConfig.from_dict({"azure": {**BASE, "account_key": [AZURE_KEY]}}),
        lambda: PawnQueueConfig.from_env(
            {"PAWNQUEUE_AZURE_ACCOUNT_KEY": AZURE_KEY, "PAWNQUEUE_AZURE_CONTAINER_NAME": "Bad"}
        ),
    ):
        message = config_error(attempt)
        assert AZURE_KEY not in message and SECRET not in message, message
    builder = PawnQueueBuilder().azure(**BASE, account_key=AZURE_KEY)
    assert AZURE_KEY not in repr(vars(builder))
    assert value_at(builder.build_config(), "azure.account_key") == AZURE_KEY


def test_variables_select_azure_and_fill_the_section() -> None:
    env = {
        "PAWNQUEUE_AZURE_CONTAINER_NAME": "queue-1",
        "PAWNQUEUE_AZURE_ACCOUNT_NAME": "myaccount",
        "PAWNQUEUE_AZURE_ACCOUNT_KEY": AZURE_KEY,
        "PAWNQUEUE_S3_SECRET_KEY": SECRET,  # another store's variable: ignored
    }
    config = PawnQueueConfig.from_env(env)
    assert config.backend == "azure" and config.s3 is None and config.azure is not None
    assert value_at(config, "azure.account_key") == AZURE_KEY
    emulator = PawnQueueConfig.from_env(
        {"PAWNQUEUE_URL": "az://queue-1", "PAWNQUEUE_AZURE_USE_EMULATOR": "true"}
    )
    assert emulator.azure is not None and emulator.azure.use_emulator
    # A store chosen otherwise keeps its place: the Azure variables do no harm.
    other = PawnQueueConfig.from_env(env, base={"memory": {"name": "m"}})
    assert other.backend == "memory"


def test_emulator_defaults_reach_the_store() -> None:
    default = AzureStore(AzureConfig(container_name="queue-1", use_emulator=True))
    assert "endpoint='http://127.0.0.1:10000/devstoreaccount1'" in repr(default)
    on_port = AzureStore(
        AzureConfig(container_name="queue-1", use_emulator=True, endpoint_url="http://h:1")
    )
    assert "endpoint='http://h:1/devstoreaccount1'" in repr(on_port)
    with_path = AzureStore(AzureConfig(**BASE, endpoint_url="http://h:1/myaccount"))
    assert "endpoint='http://h:1/myaccount'" in repr(with_path)
