"""Landing a new message or batch object once, even when the store's answer is lost.

With ``conditional_write`` the object is written create-only. An S3 client does not resend
such a write when its connection broke or timed out (the server may have applied it), so
pawn-queue decides itself: it looks for the object, then for a lease naming it (a consumer
may have claimed and acked it meanwhile: the lease of an acked message stays a while, see
:mod:`pawn_queue._protocol.tombstones`), and writes again only if it finds neither. A create refused
because the key exists is an earlier attempt of ours that landed: every such key is the
object's own (a fresh id, or the same message written again by a dedup retry or a redrive).
On ``csprng_verify`` stores the write is unconditional and the client resends it itself, as
before. docs/protocol.md, "Publish": the requests, and what is left to chance.
"""

from __future__ import annotations

import asyncio
import logging

from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, Envelope, LeaseBody
from pawn_queue._protocol.runtime import Runtime
from pawn_queue.config import AzureConfig, S3Config
from pawn_queue.exceptions import (
    AlreadyExists,
    NotFound,
    PublishError,
    StoreError,
    StoreUnavailable,
)
from pawn_queue.store.base import AnswerLost, Store, answer_lost

logger = logging.getLogger(__name__)

_RESEND_BACKOFF_SECONDS = 0.1  # as the S3 client's first backoff


async def write_new(runtime: Runtime, key: str, body: bytes) -> None:
    """Write the new object ``body`` at ``key`` (under ``{topic}/messages/``); return once it
    is durable. An answer lost on the way is resent at most ``s3.max_retries`` times, each
    only after a look found the object neither stored nor claimed. Given up after
    :func:`publish_deadline` seconds: StoreUnavailable, with its outcome unknown."""
    deadline = publish_deadline(runtime)
    try:
        async with asyncio.timeout(deadline):
            await _write_new(runtime, key, body)
    except TimeoutError:
        raise StoreUnavailable(
            f"write of {key!r} given up at its deadline of {deadline:g} s "
            "(request_timeout_seconds x (max_retries + 1) of the store's settings)"
        ) from AnswerLost("deadline")


async def write_message(
    runtime: Runtime, envelope: Envelope, key: str, body: bytes | None = None
) -> str:
    """Write one message object at ``key`` (whose timestamp says when it becomes visible),
    once even if an answer is lost (:func:`~pawn_queue._protocol.landing.write_new`); return its id.
    ``body`` is ``envelope`` encoded, when the caller has it already."""
    if body is None:
        body = envelope.encode()
    try:
        await write_new(runtime, key, body)
    except StoreError as exc:
        raise publish_failed(envelope.topic, exc) from exc
    queue = layout.queue_of(key)
    runtime.signals.published(queue, key)
    logger.debug("published message=%s queue=%s", envelope.id, queue)
    return envelope.id


def publish_deadline(runtime: Runtime) -> float | None:
    """How long a publish's write may take in all, looks and resends included: one request
    timeout per attempt the config allows. None (no bound) for a local directory or memory,
    which always answer."""
    remote = _remote_store(runtime)
    if remote is None:
        return None
    return remote.request_timeout_seconds * (remote.max_retries + 1)


def _remote_store(runtime: Runtime) -> S3Config | AzureConfig | None:
    """The settings of the store a request can time out on (S3, Azure), if it is one."""
    config = runtime.config
    return (
        config.s3 if config.backend == "s3" else config.azure if config.backend == "azure" else None
    )


def publish_failed(topic: str, exc: StoreError, what: str = "") -> PublishError:
    """The PublishError of a failed write, saying so when its outcome is unknown."""
    text = f"could not publish {what}to topic {topic!r}: {exc}"
    if answer_lost(exc):
        text += (
            "; outcome unknown: the write may still land (publishing again with a dedup_id "
            "writes the message once either way)"
        )
    error = PublishError(text)
    error.__cause__ = exc
    return error


async def _write_new(runtime: Runtime, key: str, body: bytes) -> None:
    store = runtime.store
    if runtime.leases.strategy != "conditional_write":
        await store.put(key, body, "overwrite")
        return
    remote = _remote_store(runtime)
    resends = remote.max_retries if remote is not None else 0
    attempt = 0
    while True:
        try:
            await store.put(key, body, "create")
            return
        except AlreadyExists:
            # Our own earlier attempt (resent by the client after a 5xx, or by us), unless
            # the store refused a write it did not apply: AWS answers 409 to conditional
            # writes it deems concurrent, which the S3 store reports as the race lost.
            if await landed(store, key):
                return
            if attempt >= resends:
                raise StoreUnavailable(
                    f"write of {key!r} refused as a conflict, and not stored: not written"
                ) from None
        except StoreUnavailable as exc:
            if not answer_lost(exc):
                raise  # an answer (a 5xx), after the client's own resends
            if not attempt:
                # The write may have landed: say so now, not once the looks are over (a
                # consumer may be what the look waits for; a signal is only a hint).
                runtime.signals.published(layout.queue_of(key))
            if attempt:
                # At once the first time: the sooner the look, the less a consumer can have
                # done with the message meanwhile.
                await asyncio.sleep(_RESEND_BACKOFF_SECONDS * 2 ** (attempt - 1))
            if await landed(store, key):
                logger.info("write landed though its answer was lost key=%s", key)
                return
            if attempt >= resends:
                raise
        attempt += 1


async def landed(store: Store, key: str) -> bool:
    """Whether the object at ``key`` was written: it is there, or a lease names it (it was
    claimed, and maybe settled and deleted since). ``HEAD`` the object, then ``GET`` its
    lease; a lease naming another key (an earlier life of the same message id, redriven
    since) or none says nothing."""
    try:
        await store.head(key)
        return True
    except NotFound:
        pass
    pending = layout.parse_pending_key(key)
    if pending is None:
        return False
    try:
        stored = await store.get(layout.lease_key(layout.queue_of(key), pending.lease_id()))
        return LeaseBody.decode(stored.data).message_key == key
    except (NotFound, CorruptObject):
        return False
