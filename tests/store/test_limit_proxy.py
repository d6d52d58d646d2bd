"""The request-limiting S3 proxy (``tests/servers/limit_proxy.py``) before the session's
SeaweedFS, through raw HTTP (SeaweedFS without identities takes unsigned requests)."""

from __future__ import annotations

import http.client
import uuid
from urllib.parse import urlsplit

import pytest

from pawn_queue.config import S3Config
from tests.servers.limit_proxy import LimitProxy, Limits
from tests.servers.seaweedfs import SeaweedFS


@pytest.fixture
def bucket(seaweedfs: SeaweedFS, s3_config: S3Config) -> str:
    return s3_config.bucket_name


def request(
    proxy: LimitProxy, method: str, path: str, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    host = urlsplit(proxy.endpoint)
    conn = http.client.HTTPConnection(host.hostname or "", host.port, timeout=10)
    try:
        conn.request(method, path, body=body if method in ("PUT", "POST") else None)
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_second_write_to_a_key_within_a_second_is_refused(
    seaweedfs: SeaweedFS, bucket: str
) -> None:
    key = f"/{bucket}/hot-{uuid.uuid4().hex[:8]}"
    limits = Limits(per_key_write_interval_seconds=1.0, retry_after_seconds=1)
    with LimitProxy(seaweedfs.endpoint, limits, max_lifetime_seconds=60) as proxy:
        assert request(proxy, "PUT", key, b"first")[0] == 200
        status, headers, body = request(proxy, "PUT", key, b"second")
        assert status == 429
        assert headers["Retry-After"] == "1"
        assert b"<Code>SlowDown</Code>" in body
        assert request(proxy, "DELETE", key)[0] == 429  # a delete is a write too
        assert request(proxy, "GET", key)[2] == b"first"  # reads are not limited
        report = proxy.report()
    assert report.counts["per_key_429"] == 2
    assert report.counts["refused"] == 2
    assert report.counts["forwarded"] == 2
    assert report.hottest[0].key == key.lstrip("/")
    assert (report.hottest[0].writes, report.hottest[0].peak_per_second) == (1, 1)


def test_count_only_refuses_nothing_but_counts(seaweedfs: SeaweedFS, bucket: str) -> None:
    key = f"/{bucket}/hot/{uuid.uuid4().hex[:8]}"
    limits = Limits(1.0, bucket_requests_per_second=2.0, enforce=False)
    with LimitProxy(seaweedfs.endpoint, limits, max_lifetime_seconds=60) as proxy:
        assert [request(proxy, "PUT", key, b"%d" % i)[0] for i in range(3)] == [200] * 3
        assert request(proxy, "GET", key)[2] == b"2"
        report = proxy.report()
    assert report.by_family == {"put hot/*": 3, "get hot/*": 1}
    assert report.counts.get("refused", 0) == 0
    assert report.counts["forwarded"] == report.counts["requests"] == 4
    assert report.counts["over_key_interval"] == 2  # the 2nd and 3rd PUT
    assert report.over_key == {key.lstrip("/"): 2}
    assert report.counts["over_bucket_rate"] >= 1  # 4 requests against a burst of 2
    hottest = report.hottest[0]
    assert hottest.key == key.lstrip("/") and hottest.writes == 3
    assert hottest.peak_per_second >= 2  # 3 writes within ~ms: at most one second boundary
    assert report.peak_requests_per_second >= 2


def test_beyond_the_bucket_rate_is_503(seaweedfs: SeaweedFS, bucket: str) -> None:
    limits = Limits(bucket_requests_per_second=2.0, retry_after_seconds=3)
    with LimitProxy(seaweedfs.endpoint, limits, max_lifetime_seconds=60) as proxy:
        answers = [request(proxy, "HEAD", f"/{bucket}/missing-{i}") for i in range(4)]
        report = proxy.report()
    statuses = [status for status, _, _ in answers]
    assert statuses[:2] == [404, 404]  # forwarded: the burst of one second's worth
    assert 503 in statuses[2:]
    refused = answers[statuses.index(503)]
    assert refused[1]["Retry-After"] == "3" and refused[2] == b""  # a HEAD answer: no body
    assert report.counts["bucket_503"] == statuses.count(503)
