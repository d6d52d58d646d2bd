"""Shared by the configuration tests: a secret to look for, a base config, helpers, and the
fixture that keeps the developer's or CI's ``PAWNQUEUE_*`` variables out."""

from __future__ import annotations

import base64
import os
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from pawn_queue.config import PawnQueueConfig
from pawn_queue.exceptions import ConfigError

SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCY"  # never allowed in a message or a repr
S3_BASE = {"s3": {"bucket_name": "base-bucket"}}
# An Azure account key is base64; this one holds SECRET.
AZURE_KEY = base64.b64encode(SECRET.encode()).decode()

# Word for word from docs/configuration/index.md, "A configuration file".
README_YAML = """\
s3:
  endpoint_url: "https://fsn1.your-objectstorage.com"   # Hetzner FSN1
  bucket_name: "my-queue-bucket"
  aws_access_key_id: "..."
  aws_secret_access_key: "..."
  region_name: "eu-central-1"
  use_ssl: true

polling:
  interval_seconds: 5            # idle consumers' full-poll period when notify is off
  max_messages_per_poll: 10      # max messages returned per poll() call
  visibility_timeout_seconds: 30 # lease TTL — message reappears if not acked within this time
  lease_refresh_interval_seconds: 10  # background task renews lease at this interval
  jitter_max_ms: 200             # accepted from 0.1 configs; has no effect

concurrency:
  strategy: "auto"               # auto | conditional_write | csprng_verify
  csprng_verify:
    jitter_min_ms: 100           # minimum write→verify sleep
    jitter_max_ms: 400           # maximum write→verify sleep
    verify_retries: 2            # number of additional HEAD re-checks
    verify_retry_delay_ms: 150   # sleep between re-checks

registry:
  heartbeat_interval_seconds: 60 # how often a process's record in _registry/instances/ is rewritten
"""


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
