"""Each way of pointing the queue at the wrong place gives one clear PawnQueueError."""

from __future__ import annotations

import os
import re
import socket
import traceback
import uuid
from pathlib import Path

import pytest

from pawn_queue import ConfigError, PawnQueue, PawnQueueConfig
from pawn_queue.config import S3Config
from pawn_queue.exceptions import AccessDenied, BucketNotFound, PawnQueueError, StoreUnavailable
from pawn_queue.store.s3 import CREDENTIAL_CHAIN

SECRET = "do-not-print-this-secret-value"
REPO = Path(__file__).resolve().parent.parent


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def assert_clean(error: BaseException) -> None:
    """One of our errors, no secret in it, no storage-client exception in what is printed."""
    assert isinstance(error, PawnQueueError)
    printed = "".join(traceback.format_exception(error))
    assert SECRET not in printed
    assert "obstore" not in printed.lower().replace("pawn_queue/store", "")


@pytest.mark.parametrize(
    "url",
    ["ftp://bucket", "s3://", "s3://ab/x?nope=1", "s3://key:secret@bucket", "redis://x", "file://"],
)
def test_bad_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError) as info:
        PawnQueue.from_url(url)
    assert "secret" not in str(info.value).replace("aws_secret_access_key", "")


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        PawnQueueConfig.from_dict({"backend": "redis"})
    assert "backend" in str(info.value) and "redis" in str(info.value)


async def test_missing_bucket(s3_config: S3Config) -> None:
    config = {
        "backend": "s3",
        "s3": {
            "endpoint_url": s3_config.endpoint_url,
            "bucket_name": f"missing-{uuid.uuid4().hex[:10]}",
            "aws_access_key_id": "key",
            "aws_secret_access_key": SECRET,
        },
    }
    pq = await PawnQueue.from_config(config)
    with pytest.raises(BucketNotFound) as info:
        await pq.setup()
    assert_clean(info.value)
    assert "missing-" in str(info.value)


async def test_unreachable_endpoint() -> None:
    config = {
        "backend": "s3",
        "s3": {
            "endpoint_url": f"http://127.0.0.1:{closed_port()}",
            "bucket_name": "some-bucket",
            "aws_access_key_id": "key",
            "aws_secret_access_key": SECRET,
            "max_retries": 0,
            "connect_timeout_seconds": 1,
            "request_timeout_seconds": 2,
        },
    }
    pq = await PawnQueue.from_config(config)
    with pytest.raises(StoreUnavailable) as info:
        await pq.setup()
    assert_clean(info.value)


async def test_no_credentials_says_where_they_were_looked_for(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in list(os.environ):
        if name.startswith(("AWS_", "PAWNQUEUE_")):
            monkeypatch.delenv(name)
    # The client's last resort, the instance-metadata service, answers nothing here, as on
    # any host that is not a cloud VM (a closed port, so the test does not wait for a timeout).
    monkeypatch.setenv("AWS_METADATA_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    url = f"s3://some-bucket?endpoint_url=http://127.0.0.1:{closed_port()}&max_retries=0"
    pq = PawnQueue.from_url(url)
    with pytest.raises(AccessDenied) as info:
        await pq.setup()
    assert_clean(info.value)
    message = str(info.value)
    assert "no S3 credentials found" in message
    for place in ("PAWNQUEUE_S3_AWS_ACCESS_KEY_ID", "s3.aws_access_key_id", "AWS_ACCESS_KEY_ID"):
        assert place in message
    assert "instance" in message and "\n" not in message
    assert "connection refused" in message  # what the last lookup got


async def test_session_token_without_keys_is_a_config_error() -> None:
    config = {
        "backend": "s3",
        "s3": {
            "endpoint_url": "http://127.0.0.1:1",
            "bucket_name": "abc",
            "aws_session_token": SECRET,
        },
    }
    pq = await PawnQueue.from_config(config)
    with pytest.raises(ConfigError) as info:
        await pq.setup()
    assert_clean(info.value)
    assert "aws_session_token" in str(info.value) and "aws_access_key_id" in str(info.value)


def test_docs_document_the_credential_chain() -> None:
    page = (REPO / "docs" / "configuration" / "index.md").read_text(encoding="utf-8")
    section = page.split("\n## Credentials\n", 1)[1].split("\n## ", 1)[0]
    names = re.findall(r"[A-Z][A-Z0-9_]{2,}|s3\.[a-z_]+", CREDENTIAL_CHAIN)
    assert len(names) >= 9
    for name in names:
        assert name in section, name
    assert "instance" in section and "AccessDenied" in section
