"""Bytes on the wire: message, dead-letter and lease bodies.

Messages are compact JSON, the same shape pawn-queue 0.1.x writes::

    {"created_at": "...+00:00", "id": "<uuid4>", "payload": ...,
     "producer_id": "<uuid4>", "topic": "orders"}

Fields added by this version (``attributes``, ``dead_letter``, ...) are optional, so 0.1.x
reads our messages and we read theirs. A ``bytes`` payload is stored as ``PQB1\n``, a JSON
header line, and the raw bytes; 0.1.x cannot parse such a body and skips it.
"""

from __future__ import annotations

import base64
import operator
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pawn_queue._protocol import codec
from pawn_queue._protocol.layout import PRIORITIES, is_uuid
from pawn_queue.exceptions import ArgumentError, PayloadError

BINARY_MAGIC = b"PQB1\n"  # starts a body whose payload is raw bytes (not JSON)


class CorruptObject(ValueError):
    """An object in the bucket is not a valid message or lease."""


def now_utc() -> datetime:
    return datetime.now(UTC)


def check_attributes(attributes: object) -> dict[str, str]:
    """Message attributes as given to a publish: a mapping of str to str (None: none), else
    PayloadError."""
    if attributes is None:
        return {}
    if not isinstance(attributes, Mapping):
        raise PayloadError(f"attributes must be a mapping of str to str, got {type(attributes)}")
    for k, v in attributes.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise PayloadError(f"attributes must map str to str, got {k!r}: {v!r}")
    return dict(attributes)


def priority_argument(priority: object) -> int:
    """A publish's ``priority`` as an int from 0 to 9; ArgumentError (a ValueError) for
    anything else: a bool, a float, a string, NaN, out of range."""
    try:
        value = None if isinstance(priority, bool) else operator.index(priority)  # type: ignore[arg-type]
    except TypeError:
        value = None
    if value is None or value not in PRIORITIES:
        raise ArgumentError(
            f"priority: got {priority!r}, must be an int from 0 (the default, the lowest) "
            "to 9 (the highest)"
        )
    return value


def encode_json(value: Any) -> bytes:
    """Encode ``value`` as compact UTF-8 JSON, keeping key order; raise PayloadError if it
    cannot be (not serialisable, NaN or infinity, nested too deeply)."""
    try:
        return codec.dumps(value)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    except RecursionError:
        raise PayloadError("payload is nested too deeply to encode as JSON") from None


def parse_time(value: str) -> datetime:
    """Parse an ISO-8601 time; naive values are taken as UTC."""
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def encode_body(body: dict[str, Any]) -> bytes:
    """A message-shaped body as stored: JSON, or for a bytes payload a small JSON header
    and the raw bytes after it (no base64: a large payload is copied once, not inflated)."""
    payload = body.get("payload")
    if not isinstance(payload, bytes | bytearray | memoryview):
        return encode_json(body)
    header = {k: v for k, v in body.items() if k != "payload"}
    header["payload_encoding"] = "binary"
    return b"".join((BINARY_MAGIC, encode_json(header), b"\n", payload))


def _load_object(data: bytes, what: str) -> dict[str, Any]:
    if data.startswith(BINARY_MAGIC):
        end = data.find(b"\n", len(BINARY_MAGIC))
        if end < 0:
            raise CorruptObject(f"{what} has a binary marker but no header")
        header = _load_object(data[len(BINARY_MAGIC) : end], what)
        header["payload"] = data[end + 1 :]
        return header
    try:
        value = codec.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CorruptObject(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise CorruptObject(f"{what} is not a JSON object")
    return value


def _require_str(obj: dict[str, Any], name: str, what: str) -> str:
    value = obj.get(name)
    if not isinstance(value, str):
        raise CorruptObject(f"{what} has no string field {name!r}")
    return value


@dataclass(slots=True)
class Envelope:
    """A message as stored: identity, metadata and payload. Never changed once built (use
    ``dataclasses.replace``); not frozen because a frozen dataclass's ``__init__`` costs four
    times as much, and one is built per message received."""

    id: str
    topic: str
    producer_id: str
    created_at: str
    payload: Any
    attributes: dict[str, str] = field(default_factory=dict)
    prior_receives: int = 0  # receives before the message was moved (requeued batch member)
    group: str | None = None
    expires_at: str | None = None  # ISO 8601 UTC: never delivered after it (publish expires_in)
    priority: int = 0  # 0 (the default, the lowest) to 9: its key's band (not a group's)
    # ISO 8601 UTC: when it was first due, once it moved (a requeued member): the topic's
    # retention counts from it, not from its new key's time.
    first_due: str | None = None

    def expired(self, now: datetime) -> bool:
        """Past its own deadline at ``now``. A deadline that does not parse never expires the
        message: a garbled field must not drop it."""
        if self.expires_at is None:
            return False
        try:
            return parse_time(self.expires_at) <= now
        except ValueError:
            return False

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "topic": self.topic,
            "producer_id": self.producer_id,
            "created_at": self.created_at,
            "payload": self.payload,
        }
        if self.attributes:
            body["attributes"] = self.attributes
        if self.prior_receives:
            body["prior_receives"] = self.prior_receives
        if self.group is not None:
            body["group"] = self.group
        if self.expires_at is not None:
            body["expires_at"] = self.expires_at
        if self.priority:
            body["priority"] = self.priority
        if self.first_due is not None:
            body["first_due"] = self.first_due
        return body

    def encode(self) -> bytes:
        return encode_body(self.to_dict())

    @classmethod
    def from_dict(cls, obj: dict[str, Any], what: str = "message") -> Envelope:
        payload, attributes = _payload_and_attributes(obj, what)
        return cls(
            id=_require_str(obj, "id", what),
            topic=_require_str(obj, "topic", what),
            producer_id=_require_str(obj, "producer_id", what),
            created_at=_require_str(obj, "created_at", what),
            payload=payload,
            attributes=attributes,
            prior_receives=_positive_int(obj.get("prior_receives"), 0),
            group=obj["group"] if isinstance(obj.get("group"), str) else None,
            expires_at=obj["expires_at"] if isinstance(obj.get("expires_at"), str) else None,
            priority=_priority(obj.get("priority")),
            first_due=obj["first_due"] if isinstance(obj.get("first_due"), str) else None,
        )

    @classmethod
    def decode(cls, data: bytes, what: str = "message") -> Envelope:
        return cls.from_dict(_load_object(data, what), what)


def encode_batch(batch_id: str, members: list[Envelope]) -> bytes:
    """A batch object: the shared fields once (the priority too: one object, one band),
    then each member's id, payload, attributes."""
    first = members[0]
    body: dict[str, Any] = {
        "id": batch_id,
        "topic": first.topic,
        "producer_id": first.producer_id,
        "created_at": first.created_at,
        **({"priority": first.priority} if first.priority else {}),
        "batch": [
            {
                "id": m.id,
                "payload": m.payload,
                **({"attributes": m.attributes} if m.attributes else {}),
                **({"expires_at": m.expires_at} if m.expires_at is not None else {}),
            }
            for m in members
        ],
    }
    return encode_json(body)


def decode_batch(data: bytes) -> list[Envelope]:
    """The members of a batch object, in order."""
    obj = _load_object(data, "batch")
    members = obj.get("batch")
    if not isinstance(members, list) or not members:
        raise CorruptObject("batch has no list 'batch' of messages")
    shared = {k: _require_str(obj, k, "batch") for k in ("topic", "producer_id", "created_at")}
    topic, producer_id, created_at = shared["topic"], shared["producer_id"], shared["created_at"]
    priority = _priority(obj.get("priority"))
    out = []
    for member in members:
        if not isinstance(member, dict):
            raise CorruptObject("batch member is not a JSON object")
        plain = len(member) == 2 or (len(member) == 3 and "attributes" in member)
        if not (plain and "payload" in member and isinstance(member.get("id"), str)):
            # Fields beyond the ones encode_batch writes override the shared ones.
            member = {**shared, "priority": priority, **member}
            out.append(Envelope.from_dict(member, "batch member"))
            continue
        payload, attributes = _payload_and_attributes(member, "batch member")
        out.append(
            Envelope(
                member["id"], topic, producer_id, created_at, payload, attributes, priority=priority
            )
        )
    return out


def _payload_and_attributes(obj: dict[str, Any], what: str) -> tuple[Any, dict[str, str]]:
    if "payload" not in obj:
        raise CorruptObject(f"{what} has no field 'payload'")
    attributes = obj.get("attributes")
    if not attributes:  # the common case, checked without a generator: it is per message
        return obj["payload"], {}
    if not isinstance(attributes, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in attributes.items()
    ):
        raise CorruptObject(f"{what} has invalid 'attributes'")
    return obj["payload"], attributes


def decode_pending(data: bytes, topic: str, object_id: str, *, batch: bool) -> list[Envelope]:
    """The messages of the object ``object_id`` found among ``topic``'s pending messages.

    Where the object lies decides where its messages belong: a body that names another topic
    is delivered as this topic's, so its dead letter or redrive stays here. A message id that
    is not the key's (in a batch: not a UUID, or repeated) makes the object corrupt, since
    dead-letter keys are built from it.
    """
    envelopes = decode_batch(data) if batch else [Envelope.decode(data)]
    ids = [e.id for e in envelopes]
    if batch:
        if not all(is_uuid(i) for i in ids) or len(set(ids)) != len(ids):
            raise CorruptObject("batch has a member whose id is not a UUID or is repeated")
    elif ids != [object_id]:
        raise CorruptObject(f"message id {ids[0][:40]!r} is not the id in its key")
    return [e if e.topic == topic else replace(e, topic=topic) for e in envelopes]


@dataclass(frozen=True, slots=True)
class DeadLetterInfo:
    """Why and when a message was dead-lettered."""

    reason: str
    error: str | None
    dead_lettered_at: str
    source_key: str
    receive_count: int = 0
    redrive_key: str = ""  # where a redrive under way writes the message back


def _dead_letter_body(envelope: Envelope, info: DeadLetterInfo) -> dict[str, Any]:
    body = envelope.to_dict()
    body["dead_letter"] = {
        "reason": info.reason,
        "error": info.error,
        "dead_lettered_at": info.dead_lettered_at,
        "source_key": info.source_key,
        "receive_count": info.receive_count,
    }
    if info.redrive_key:
        body["dead_letter"]["redrive_key"] = info.redrive_key
    return body


def encode_dead_letter(envelope: Envelope, info: DeadLetterInfo) -> bytes:
    return encode_body(_dead_letter_body(envelope, info))


def encode_unreadable(object_id: str, topic: str, data: bytes, info: DeadLetterInfo) -> bytes:
    """A dead letter for an object that is not a valid message: its raw bytes, base64."""
    envelope = Envelope(id=object_id, topic=topic, producer_id="", created_at="", payload=None)
    body = _dead_letter_body(envelope, info)
    body["dead_letter"]["raw_base64"] = base64.b64encode(data).decode("ascii")
    return encode_json(body)


def decode_dead_letter(data: bytes) -> tuple[Envelope, DeadLetterInfo | None]:
    """A dead letter's message and, when written by this version, why it was dead-lettered."""
    obj = _load_object(data, "dead letter")
    envelope = Envelope.from_dict(obj, "dead letter")
    meta = obj.get("dead_letter")
    if not isinstance(meta, dict):
        return envelope, None
    error = meta.get("error")
    return envelope, DeadLetterInfo(
        reason=str(meta.get("reason", "")),
        error=error if isinstance(error, str) else None,
        dead_lettered_at=str(meta.get("dead_lettered_at", "")),
        source_key=str(meta.get("source_key", "")),
        receive_count=_positive_int(meta.get("receive_count"), 0),
        redrive_key=str(meta.get("redrive_key", "")),
    )


def dead_letter_reason(data: bytes) -> str:
    """Why the dead letter ``data`` was dead-lettered, as its listing says: ``corrupt`` for
    one that cannot be read or whose id makes no message key, ``nack`` for one written
    before reasons were stored."""
    try:
        envelope, info = decode_dead_letter(data)
    except CorruptObject:
        return "corrupt"
    if not is_uuid(envelope.id):
        return "corrupt"
    return info.reason if info is not None else "nack"


@dataclass(frozen=True, slots=True)
class LeaseBody:
    """A lease as stored; the field names are the ones pawn-queue 0.1.x reads."""

    consumer_id: str
    message_id: str
    claimed_at: str
    expires_at: str
    nonce: str
    message_key: str = ""
    settled: tuple[int, ...] = ()  # batch members already acked or dead-lettered
    receive_count: int = 1  # deliveries so far, this one included
    # Given up by its holder (a requeue, a shutdown): free at ``expires_at`` exactly, since no
    # holder is left whose clock the skew margin would have to allow for.
    released: bool = False
    # ``expires_at`` parsed once: every ack and refresh check reads it.
    _expires: datetime = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_expires", parse_time(self.expires_at))

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "consumer_id": self.consumer_id,
            "message_id": self.message_id,
            "claimed_at": self.claimed_at,
            "expires_at": self.expires_at,
            "nonce": self.nonce,
        }
        if self.message_key:
            body["message_key"] = self.message_key
        if self.settled:
            body["settled"] = list(self.settled)
        if self.receive_count != 1:
            body["receive_count"] = self.receive_count
        if self.released:
            body["released"] = True
        return encode_json(body)

    @property
    def expires(self) -> datetime:
        return self._expires

    @classmethod
    def decode(cls, data: bytes) -> LeaseBody:
        obj = _load_object(data, "lease")
        try:
            expires_at = _require_str(obj, "expires_at", "lease")
            parse_time(expires_at)
        except ValueError as exc:
            raise CorruptObject(f"lease has an invalid expires_at: {exc}") from None
        return cls(
            consumer_id=_require_str(obj, "consumer_id", "lease"),
            message_id=_require_str(obj, "message_id", "lease"),
            claimed_at=str(obj.get("claimed_at", "")),
            expires_at=expires_at,
            nonce=str(obj.get("nonce", "")),
            message_key=str(obj.get("message_key", "")),
            settled=_settled(obj.get("settled")),
            # 0: released by a stop before any delivery counted.
            receive_count=_count(obj.get("receive_count"), 1),
            released=obj.get("released") is True,
        )


def _settled(value: Any) -> tuple[int, ...]:
    """A lease's settled batch members; anything but a list of indexes counts as none."""
    if not isinstance(value, list):
        return ()
    return tuple(i for i in value if isinstance(i, int) and not isinstance(i, bool) and i >= 0)


def _count(value: Any, default: int) -> int:
    """``value`` if it is an int >= 0, else ``default``."""
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default
    )


def _priority(value: Any) -> int:
    """A stored priority: an int from 0 to 9, else 0 (a garbled field must not drop it)."""
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 9 else 0
    )


def _positive_int(value: Any, default: int) -> int:
    """``value`` if it is a positive int, else ``default``."""
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else default
    )
