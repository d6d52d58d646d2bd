"""Shared by the configuration tests: a secret to look for, a base config, helpers, and the
fixture that keeps the developer's or CI's ``PAWNQUEUE_*`` variables out."""

from __future__ import annotations

import os
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import ConfigError

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"  # never allowed in a message or a repr
S3_BASE = {"s3": {"bucket_name": "base-bucket"}}


@pytest.fixture(autouse=True)
def no_pawnqueue_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Entry points that read os.environ must not see the developer's or CI's variables
    (autouse in every module that imports it)."""
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
