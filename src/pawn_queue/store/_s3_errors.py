"""S3 client errors as the library's errors: status, S3 code and message only, never the
request URL, headers or response body (an AWS error body can echo the access key)."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from obstore.exceptions import (
    AlreadyExistsError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)

from pawn_queue.exceptions import (
    AccessDenied,
    AlreadyExists,
    BucketNotFound,
    NotFound,
    PreconditionFailed,
    StoreError,
    StoreUnavailable,
)

_ACCESS_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AuthorizationHeaderMalformed",
        "MissingSecurityHeader",
        "InvalidSecurity",
        "AccountProblem",
    }
)
_TRANSIENT_CODES = frozenset(
    {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling"}
)
_NETWORK_KINDS = frozenset({"Connect", "Timeout", "Request", "Io", "Interrupted", "Body"})
# A request of the client's last credential source, the instance-metadata service (IMDS).
_METADATA_REQUEST = re.compile(r"https?://[^\s/]+/latest/(?:api/token|meta-data/)")

CREDENTIAL_CHAIN = (
    "the config (s3.aws_access_key_id, s3.aws_secret_access_key), "
    "PAWNQUEUE_S3_ACCESS_KEY / PAWNQUEUE_S3_SECRET_KEY, "
    "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, "
    "AWS_WEB_IDENTITY_TOKEN_FILE with AWS_ROLE_ARN, "
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, "
    "then the instance-metadata service (an instance role)"
)
"""Where credentials are looked for, in order (the README's "Credentials")."""


class S3ErrorDetail(Exception):
    """The sanitised client failure kept as ``__cause__`` of a translated error.

    Holds the client's exception type, HTTP status, S3 error code and message only: never the
    request URL, headers or response body (an error body can echo the access key).
    """


class NoAnswer(S3ErrorDetail):
    """The connection broke or timed out before an answer: the request may have landed."""


def redact_url(url: str) -> str:
    """The URL without user info (credentials some tools put in endpoints)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def translate(
    exc: Exception, op: str, where: str, endpoint: str, *, keys_given: bool = True
) -> StoreError:
    """A client exception as a StoreError that carries only what is safe to show (see
    :class:`S3ErrorDetail`), with a sanitised ``__cause__``.

    ``keys_given``: whether the config had keys. Without them, a failed instance-metadata
    request means no credentials were found anywhere, and the error says so.
    """
    text = str(exc)
    status_match = re.search(r"status(?: code)?: (\d{3})", text)
    status = int(status_match.group(1)) if status_match else None
    code_match = re.search(r"<Code>([A-Za-z0-9.]{1,64})</Code>", text)
    code = code_match.group(1) if code_match else None
    message_match = re.search(r"<Message>([^<]{0,200})</Message>", text)
    kinds = set(re.findall(r"kind: (\w+)", text))
    name = type(exc).__name__

    cls: type[StoreError]
    if code == "NoSuchBucket":
        cls = BucketNotFound
    elif isinstance(exc, AlreadyExistsError):
        cls = AlreadyExists
    elif isinstance(exc, PreconditionError):
        cls = PreconditionFailed
    elif isinstance(exc, FileNotFoundError) or status == 404:  # obstore's NotFound
        cls = NotFound
    elif (
        isinstance(exc, PermissionDeniedError | UnauthenticatedError)
        or status in (401, 403)
        or code in _ACCESS_CODES
    ):
        cls = AccessDenied
    elif (
        (status is not None and (status >= 500 or status == 429))
        or code in _TRANSIENT_CODES
        or (status is None and (kinds & _NETWORK_KINDS or "error sending request" in text))
    ):
        cls = StoreUnavailable
    else:
        cls = StoreError

    if status is not None:
        summary = f"HTTP {status}" + (f" {code}" if code else "")
    elif "ConnectionRefused" in kinds:
        summary = "connection refused"
    elif "Timeout" in kinds:
        summary = "timed out"
    elif cls is StoreUnavailable:
        summary = "connection failed"
    else:
        summary = name
    retries = re.search(r"after (\d+) retries", text)
    if retries:
        summary += f" after {retries.group(1)} retries"

    detail = f"{name}: {summary}"
    if message_match:
        detail += f": {message_match.group(1).strip()}"
    problem = summary
    if not keys_given and _METADATA_REQUEST.search(text):
        # The request never reached the store: every credential source came up empty and
        # the last one, the instance-metadata service, failed (what it answered is moot).
        cls = AccessDenied
        problem = (
            f"no S3 credentials found; looked in {CREDENTIAL_CHAIN} "
            f"(the instance-metadata lookup: {summary})"
        )
    error = cls(f"S3 {op} failed for {where} at {endpoint}: {problem}")
    # The failures obstore resends only for requests it deems idempotent.
    no_answer = status is None and bool(kinds & {"Interrupted", "Timeout"})
    error.__cause__ = (NoAnswer if no_answer else S3ErrorDetail)(detail)
    return error
