"""Each way of pointing the queue at the wrong place gives one clear PawnQueueError."""

from __future__ import annotations

import socket
import traceback
import uuid

import pytest

from pawn_queue import ConfigError, PawnQueue, PawnQueueConfig
from pawn_queue.config import S3Config
from pawn_queue.exceptions import BucketNotFound, PawnQueueError, StoreUnavailable

SECRET = "do-not-print-this-secret-value"


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
