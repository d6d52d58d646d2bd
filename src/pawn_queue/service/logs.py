"""The worker's log: one line per settled message, and the library's own lines, as text or
JSON (one object per line).

A message line carries ``message_id``, ``topic`` (and ``subscription``, for a message read
from one), ``receive_count``, ``duration`` (seconds its handler ran) and ``outcome``
(``ack``, ``nack_requeue`` or ``dead_letter``, with the dead letter's ``reason``). A failed
handler is logged by the consumer with its traceback (``traceback`` in JSON).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from datetime import UTC, datetime
from typing import Literal

from pawn_queue._protocol.delivery import Message
from pawn_queue.observe import Observer, Outcome

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

logger = logging.getLogger("pawn_queue.worker")

# Fields of a message line, in the order text shows them.
_FIELDS = (
    "message_id",
    "topic",
    "subscription",
    "receive_count",
    "duration",
    "outcome",
    "reason",
)
# A record's own attributes, and those a formatter adds to it (another handler's, too).
_RECORD_ATTRIBUTES = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_SPACE = re.compile(r"\s")


class MessageLog(Observer):
    """Logs each settled message at INFO (a dead letter at WARNING)."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}  # id(message) -> perf_counter at start
        self._ran: dict[int, float] = {}  # id(message) -> seconds, handler done, not settled

    def handler_started(self, message: Message) -> None:
        self._started[id(message)] = time.perf_counter()

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        if self._started.pop(id(message), None) is not None and not message.settled:
            self._ran[id(message)] = seconds  # settled next (a retry, a dead letter)

    def settled(self, message: Message, outcome: Outcome, reason: str | None) -> None:
        started = self._started.pop(id(message), None)
        duration = self._ran.pop(id(message), None)
        level = logging.WARNING if outcome == "dead_letter" else logging.INFO
        if not logger.isEnabledFor(level):
            return
        if duration is None and started is not None:
            duration = time.perf_counter() - started
        fields = {
            "message_id": message.id,
            "topic": message.topic,
            "subscription": message.subscription,
            "receive_count": message.receive_count,
            "duration": None if duration is None else round(duration, 6),
            "outcome": outcome,
            "reason": reason,
        }
        logger.log(level, "message %s", outcome, extra=fields)


class TextFormatter(logging.Formatter):
    """``time level logger text key=value...`` with the message fields appended."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        if getattr(record, "outcome", None) is None:  # not a message line
            return line
        extra = " ".join(
            f"{name}={_text(getattr(record, name))}"
            for name in _FIELDS
            if getattr(record, name, None) is not None
        )
        first, newline, rest = line.partition("\n")  # a traceback follows the first line
        return f"{first} {extra}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``time``, ``level``, ``logger``, ``message``, the message
    fields, ``traceback`` for an exception, and any other ``extra``.

    The library logs events as ``"lease lost key=%s"``: each ``name=%s`` of the format
    becomes the field ``name`` with its argument (``message=`` is ``message_id``), and
    ``message`` is the event's text without them (``"lease lost"``)."""

    def format(self, record: logging.LogRecord) -> str:
        text, fields = _fields_of(record)
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": text,
        }
        entry.update(fields)
        for name, value in vars(record).items():
            if name not in _RECORD_ATTRIBUTES and not name.startswith("_") and value is not None:
                entry[name] = value
        if record.exc_info:
            entry["traceback"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def _fields_of(record: logging.LogRecord) -> tuple[str, dict[str, object]]:
    """The event's text and its ``name=%s`` fields (see JsonFormatter)."""
    args = record.args
    if not isinstance(record.msg, str) or not isinstance(args, tuple) or not args:
        return record.getMessage(), {}
    fields: dict[str, object] = {}
    plain: list[object] = []  # the arguments of conversions that are not fields
    conversions = list(_CONVERSION.finditer(record.msg))
    if len(conversions) != len(args):
        return record.getMessage(), {}  # not the library's shape: leave it as it is
    for match, value in zip(conversions, args, strict=True):
        name = match.group("name")
        if name is None:
            plain.append(value)
            continue
        name = _RENAMED.get(name, name)
        fields[name] = repr(value) if match.group("kind") == "r" else value
    template = _CONVERSION.sub(lambda m: "" if m.group("name") else m.group(0), record.msg)
    try:
        text = " ".join(template.split()) % tuple(plain)
    except (TypeError, ValueError):
        return record.getMessage(), {}
    return text, fields


# A %-conversion, with the field name before it when it reads "name=%s".
_CONVERSION = re.compile(
    r"(?:(?P<name>[A-Za-z_]\w*)=)?%[-#0 +]*\d*(?:\.\d+)?(?P<kind>[sdrifgeExX])"
)
# Field names that would overwrite an entry of the line itself.
_RENAMED = {"message": "message_id", "time": "at", "level": "log_level", "logger": "logger_name"}


def _text(value: object) -> str:
    text = str(value)
    return repr(text) if not text or _SPACE.search(text) else text


def setup_logging(log_format: LogFormat, level: str) -> None:
    """The library's and the worker's lines to stderr, in ``log_format``, from ``level`` up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger("pawn_queue")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
