"""obstore client errors as the library's errors: status, error code and message only, never
the request URL, headers or response body (an AWS error body can echo the access key).

Shared by the S3 and the Azure store: what differs between them (error codes, where
credentials come from, whether a 409 is a lost race) is a :class:`Service`, defined beside
each store (``s3.S3``, ``azure.AZURE``).

The kind of error comes from obstore's exception types where it has one: FileNotFoundError
(404), AlreadyExistsError, PreconditionError, PermissionDeniedError, UnauthenticatedError.
Everything else obstore raises as a GenericError, and its exceptions carry no fields: the
HTTP status, the error code and message, whether an answer came at all, the retry count
and the URL of the request that failed are only in the message text. :func:`read_error_text`
is the one place that reads it; tests/store/test_s3_error_text.py pins the texts it depends on,
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
    StoreThrottledError,
    StoreUnavailableError,
)
from pawn_queue.store.base import AnswerLost

_NETWORK_KINDS = frozenset({"Connect", "Timeout", "Request", "Io", "Interrupted", "Body"})


class ClientErrorDetail(Exception):
    """The sanitised client failure kept as ``__cause__`` of a translated error.

    Holds the client's exception type, HTTP status, error code and message only: never the
    request URL, headers or response body (an error body can echo the access key).
    """


class NoAnswer(ClientErrorDetail, AnswerLost):
    """The connection broke or timed out before an answer: the request may have landed."""


class Conflict(ClientErrorDetail):
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
class Service:
    """What a store's error texts mean: the words its errors start with and its codes."""

    name: str
    """``S3`` or ``Azure``: the first word of every error."""
    missing_container: frozenset[str]
    """Codes of a missing bucket or container (a 404 that is not about the key)."""
    access_codes: frozenset[str]
    transient_codes: frozenset[str]
    throttle_codes: frozenset[str]
    """Codes of an answer refused for the request rate (besides any HTTP 429)."""
    credential_lookup: re.Pattern[str]
    """A request of the client's last credential source (an instance-metadata service)."""
    credential_chain: str
    """Where credentials are looked for, for the error that says none were found."""
    conflict_on_put: bool = True
    """Whether a 409 to a put is a lost race to resend (AWS); Azure answers 409 to a
    create-only put on an existing blob, which obstore already types as AlreadyExists."""


@dataclass(frozen=True, slots=True)
class ErrorText:
    """What an obstore error's message tells and its exception does not carry."""

    status: int | None
    """The HTTP status the server answered; None when no answer came."""
    code: str | None
    """The error code of the answer's body (``NoSuchBucket``, ``SlowDown``...)."""
    message: str | None
    """The error message of the answer's body (its first line, at most 200 characters)."""
    failures: frozenset[str]
    """The client's failure kinds when no answer came (``Connect``, ``ConnectionRefused``,
    ``Timeout``, ``Interrupted``...)."""
    sending_failed: bool
    """The client says it could not send the request (or read its answer)."""
    retries: int | None
    """How many times the client resent the request before giving up."""
    metadata_request: bool
    """The failed request went to the instance-metadata service, not to the store."""


def read_error_text(text: str, service: Service) -> ErrorText:
    """Read what obstore says only in its error message (see the module docstring)."""
    # A key's answer in an Azure batch delete: "... for key k: reason (code: 404)".
    status = re.search(r"status(?: code)?: (\d{3})", text) or re.search(r"\(code: (\d{3})\)", text)
    code = re.search(r"<Code>([A-Za-z0-9.]{1,64})</Code>", text)
    # Azure's message goes on with "RequestId:..." and "Time:..." lines: the first line only.
    message = re.search(r"<Message>([^<\n]{0,200})(?:</Message>|\n)", text)
    retries = re.search(r"after (\d+) retries", text)
    return ErrorText(
        status=int(status.group(1)) if status else None,
        code=code.group(1) if code else None,
        message=message.group(1).strip() if message else None,
        failures=frozenset(re.findall(r"kind: (\w+)", text)),
        sending_failed="error sending request" in text,
        retries=int(retries.group(1)) if retries else None,
        metadata_request=service.credential_lookup.search(text) is not None,
    )


def _error_class(exc: Exception, told: ErrorText, service: Service) -> type[StoreError]:
    """The library's error for a client exception: by its type, else by what its text told."""
    if told.code in service.missing_container:  # a 404 typed like a missing key, or generic
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
        or told.code in service.access_codes
    ):
        return AccessDeniedError
    if told.status == 429 or told.code in service.throttle_codes:
        return StoreThrottledError
    if told.status is not None:
        transient = told.status >= 500 or told.code in service.transient_codes
    else:
        transient = (
            told.code in service.transient_codes
            or bool(told.failures & _NETWORK_KINDS)
            or told.sending_failed
        )
    return StoreUnavailableError if transient else StoreError


def translate(
    exc: Exception,
    op: str,
    where: str,
    endpoint: str,
    *,
    keys_given: bool,
    service: Service,
) -> StoreError:
    """A client exception as a StoreError that carries only what is safe to show (see
    :class:`ClientErrorDetail`), with a sanitised ``__cause__``.

    ``keys_given``: whether the config had keys. Without them, a failed instance-metadata
    request means no credentials were found anywhere, and the error says so.
    """
    told = read_error_text(str(exc), service)
    name = type(exc).__name__
    cls = _error_class(exc, told, service)

    if told.status is not None:
        summary = f"HTTP {told.status}" + (f" {told.code}" if told.code else "")
    elif "ConnectionRefused" in told.failures:
        summary = "connection refused"
    elif "Timeout" in told.failures:
        summary = "timed out"
    elif issubclass(cls, StoreUnavailableError):
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
            f"no {service.name} credentials found; looked in {service.credential_chain} "
            f"(the instance-metadata lookup: {summary})"
        )
    error = cls(f"{service.name} {op} failed for {where} at {endpoint}: {problem}")
    # The failures obstore resends only for requests it deems idempotent.
    no_answer = told.status is None and bool(told.failures & {"Interrupted", "Timeout"})
    cause: type[ClientErrorDetail] = ClientErrorDetail
    if no_answer:
        cause = NoAnswer
    elif told.status == 409 and op == "put" and service.conflict_on_put:
        cause = Conflict
    error.__cause__ = cause(detail)
    return error
