"""S3 client errors as the library's errors: status, S3 code and message only, never the
request URL, headers or response body (an AWS error body can echo the access key).

The kind of error comes from obstore's exception types where it has one: FileNotFoundError
(404), AlreadyExistsError, PreconditionError, PermissionDeniedError, UnauthenticatedError.
Everything else obstore raises as a GenericError, and its exceptions carry no fields: the
HTTP status, the S3 error code and message, whether an answer came at all, the retry count
and the URL of the request that failed are only in the message text. :func:`read_error_text`
is the one place that reads it; tests/test_s3_error_text.py pins the texts it depends on,
produced by obstore against a real server, so a release that rewords them fails there.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from obstore import exceptions as client

from pawn_queue.exceptions import (
    AccessDeniedError,
    AlreadyExistsError,
    BucketNotFoundError,
    NotFoundError,
    PreconditionFailedError,
    StoreError,
    StoreUnavailableError,
)
from pawn_queue.store.base import AnswerLost

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


class NoAnswer(S3ErrorDetail, AnswerLost):
    """The connection broke or timed out before an answer: the request may have landed."""


class Conflict(S3ErrorDetail):
    """HTTP 409 to a conditional write (AWS: ``ConditionalRequestConflict``, another
    conditional write to the key was in progress). The write was not applied."""


def redact_url(url: str) -> str:
    """The URL without user info (credentials some tools put in endpoints)."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, slots=True)
class ErrorText:
    """What an obstore error's message tells and its exception does not carry."""

    status: int | None
    """The HTTP status the server answered; None when no answer came."""
    code: str | None
    """The S3 error code of the answer's body (``NoSuchBucket``, ``SlowDown``...)."""
    message: str | None
    """The S3 error message of the answer's body (at most 200 characters)."""
    failures: frozenset[str]
    """The client's failure kinds when no answer came (``Connect``, ``ConnectionRefused``,
    ``Timeout``, ``Interrupted``...)."""
    sending_failed: bool
    """The client says it could not send the request (or read its answer)."""
    retries: int | None
    """How many times the client resent the request before giving up."""
    metadata_request: bool
    """The failed request went to the instance-metadata service, not to the store."""


def read_error_text(text: str) -> ErrorText:
    """Read what obstore says only in its error message (see the module docstring)."""
    status = re.search(r"status(?: code)?: (\d{3})", text)
    code = re.search(r"<Code>([A-Za-z0-9.]{1,64})</Code>", text)
    message = re.search(r"<Message>([^<]{0,200})</Message>", text)
    retries = re.search(r"after (\d+) retries", text)
    return ErrorText(
        status=int(status.group(1)) if status else None,
        code=code.group(1) if code else None,
        message=message.group(1).strip() if message else None,
        failures=frozenset(re.findall(r"kind: (\w+)", text)),
        sending_failed="error sending request" in text,
        retries=int(retries.group(1)) if retries else None,
        metadata_request=_METADATA_REQUEST.search(text) is not None,
    )


def _error_class(exc: Exception, told: ErrorText) -> type[StoreError]:
    """The library's error for a client exception: by its type, else by what its text told."""
    if told.code == "NoSuchBucket":  # a 404 typed like a missing key, or generic (a listing)
        return BucketNotFoundError
    if isinstance(exc, client.AlreadyExistsError):
        return AlreadyExistsError
    if isinstance(exc, client.PreconditionError):
        return PreconditionFailedError
    if isinstance(exc, FileNotFoundError) or told.status == 404:
        return NotFoundError
    if (
        isinstance(exc, client.PermissionDeniedError | client.UnauthenticatedError)
        or told.status in (401, 403)
        or told.code in _ACCESS_CODES
    ):
        return AccessDeniedError
    if told.status is not None:
        transient = told.status >= 500 or told.status == 429 or told.code in _TRANSIENT_CODES
    else:
        transient = (
            told.code in _TRANSIENT_CODES
            or bool(told.failures & _NETWORK_KINDS)
            or told.sending_failed
        )
    return StoreUnavailableError if transient else StoreError


def translate(
    exc: Exception, op: str, where: str, endpoint: str, *, keys_given: bool = True
) -> StoreError:
    """A client exception as a StoreError that carries only what is safe to show (see
    :class:`S3ErrorDetail`), with a sanitised ``__cause__``.

    ``keys_given``: whether the config had keys. Without them, a failed instance-metadata
    request means no credentials were found anywhere, and the error says so.
    """
    told = read_error_text(str(exc))
    name = type(exc).__name__
    cls = _error_class(exc, told)

    if told.status is not None:
        summary = f"HTTP {told.status}" + (f" {told.code}" if told.code else "")
    elif "ConnectionRefused" in told.failures:
        summary = "connection refused"
    elif "Timeout" in told.failures:
        summary = "timed out"
    elif cls is StoreUnavailableError:
        summary = "connection failed"
    else:
        summary = name
    if told.retries is not None:
        summary += f" after {told.retries} retries"

    detail = f"{name}: {summary}"
    if told.message is not None:
        detail += f": {told.message}"
    problem = summary
    if not keys_given and told.metadata_request:
        # The request never reached the store: every credential source came up empty and
        # the last one, the instance-metadata service, failed (what it answered is moot).
        cls = AccessDeniedError
        problem = (
            f"no S3 credentials found; looked in {CREDENTIAL_CHAIN} "
            f"(the instance-metadata lookup: {summary})"
        )
    error = cls(f"S3 {op} failed for {where} at {endpoint}: {problem}")
    # The failures obstore resends only for requests it deems idempotent.
    no_answer = told.status is None and bool(told.failures & {"Interrupted", "Timeout"})
    cause: type[S3ErrorDetail] = S3ErrorDetail
    if no_answer:
        cause = NoAnswer
    elif told.status == 409 and op == "put":
        cause = Conflict
    error.__cause__ = cause(detail)
    return error
