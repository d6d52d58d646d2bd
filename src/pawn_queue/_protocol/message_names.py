"""The name of a message object under ``{queue}/messages/``: its priority band, timestamp,
delay mark and id (:mod:`pawn_queue._protocol.layout` builds the keys and re-exports these).

A name is ``[!{9-p}]{ts}[d]-{uuid}{suffix}``. The band mark (``!`` then a digit) is only in
the names of messages published with a priority ``p`` of 1 to 9; ``!`` sorts before every
digit, and so before every timestamp: one LIST of a queue's messages returns priority 9,
then 8 ... 1 (``!0`` to ``!8``), then the names with no band (priority 0, as pawn-queue 0.1.x
writes them), each band in timestamp order (FIFO).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from pawn_queue._protocol.names import is_uuid

# Follows the timestamp of a delayed message. 0.1.x reads the id from the name's end only.
DELAYED_MARK = "d"
BAND_MARK = "!"  # starts the name of a message with a priority of 1 to 9
_BAND_DIGITS = "012345678"  # 9 - priority, for priorities 9 to 1
PRIORITIES = range(10)  # 0 (the default, the lowest) to 9 (the highest)
_STAMP_RE = re.compile(r"[0-9]{8}T[0-9]{6}_[0-9]{6}")  # the timestamp, UTC
STAMP_LENGTH = 22
_SECOND_LENGTH = 15  # of a timestamp: YYYYMMDDTHHMMSS
RUN_MARK = "s"  # starts the id of a run's lease: the messages of one second
# A producer process names at most this many single messages of one second into one run
# (then into the second's next run), so a burst is shared among consumer processes this
# many at a time, as a poll's worth (polling.max_messages_per_poll's default).
RUN_SIZE = 10
MESSAGE_SUFFIX = ".json"
BATCH_SUFFIX = ".batch"
GROUP_SUFFIX = ".group"
RUN_SUFFIX = ".run"
_GROUP_HASH_RE = re.compile(r"^[0-9a-f]{32}$")


def stamp(at: datetime, delayed: bool) -> str:
    ts = at.astimezone(UTC).strftime("%Y%m%dT%H%M%S_%f")
    return ts + DELAYED_MARK if delayed else ts


def band(priority: int) -> str:
    """The band mark a name of ``priority`` (0 to 9) starts with: none for 0."""
    return f"{BAND_MARK}{9 - priority}" if priority else ""


def band_of_name(name: str) -> str:
    """The band mark ``name`` starts with (``""``: none, priority 0)."""
    banded = len(name) > 1 and name[0] == BAND_MARK and name[1] in _BAND_DIGITS
    return name[:2] if banded else ""


def unbanded(name: str) -> str:
    """``name`` without its band mark: what 0.1.x's names are."""
    return name[len(band_of_name(name)) :]


def priority_of(key: str) -> int:
    """The priority (0 to 9) the name of the message at ``key`` says."""
    mark = band_of_name(key.rsplit("/", 1)[-1])
    return 9 - int(mark[1]) if mark else 0


def band_of(key: str) -> str:
    """The band mark of the message at ``key`` (``""``: priority 0)."""
    return band_of_name(key.rsplit("/", 1)[-1])


def is_delayed_key(key: str) -> bool:
    """Whether the message at ``key`` was published (or requeued) with a delay."""
    name = unbanded(key.rsplit("/", 1)[-1])
    return name[STAMP_LENGTH : STAMP_LENGTH + len(DELAYED_MARK)] == DELAYED_MARK


def due_from_key(key: str) -> datetime | None:
    """When the message at ``key`` is due: the UTC timestamp its name starts with (after
    its band mark)."""
    name = unbanded(key.rsplit("/", 1)[-1])
    if not _STAMP_RE.match(name):
        return None
    # By hand: strptime costs ~20 µs a key, and polls look at every key of a page.
    try:
        return datetime(
            int(name[0:4]),
            int(name[4:6]),
            int(name[6:8]),
            int(name[9:11]),
            int(name[11:13]),
            int(name[13:15]),
            int(name[16:22]),
            tzinfo=UTC,
        )
    except ValueError:
        return None


def run_id(name: str, number: int) -> str:
    """The lease id of the run the message named ``name`` (a ``.run`` object of the second's
    run ``number``) belongs to: its band, the second of its timestamp, its delay mark and
    the run's number if not the first (docs/protocol.md, "Runs")."""
    rest = unbanded(name)
    delayed = rest[STAMP_LENGTH : STAMP_LENGTH + len(DELAYED_MARK)] == DELAYED_MARK
    return (
        f"{RUN_MARK}{band_of_name(name)}{rest[:_SECOND_LENGTH]}"
        f"{DELAYED_MARK if delayed else ''}{f'-{number}' if number else ''}"
    )


def run_suffix(number: int) -> str:
    """How the name of a message of the second's run ``number`` (0: the first) ends."""
    return f".{number}{RUN_SUFFIX}" if number else RUN_SUFFIX


def _run_number(name: str) -> int:
    """The run number a ``.run`` name holds (``{uuid}.{n}.run``; 0 without one)."""
    number = name[: -len(RUN_SUFFIX)].rpartition(".")[2]
    return int(number) if number.isdigit() and len(number) <= 6 else 0


def run_end(lease_id: str) -> datetime | None:
    """When the second of the run ``lease_id`` ends (its last message's timestamp is before
    it); None if ``lease_id`` is no run's."""
    if not lease_id.startswith(RUN_MARK):
        return None
    second = unbanded(lease_id[len(RUN_MARK) :])[:_SECOND_LENGTH]
    due = due_from_key(f"{second}_000000")
    return None if due is None else due + timedelta(seconds=1)


@dataclass(frozen=True, slots=True)
class PendingKey:
    """What a key under ``{topic}/messages/`` holds."""

    object_id: str
    kind: Literal["message", "batch", "group", "run"]
    shared_id: str = ""  # a group's hash, or a run's lease id

    def lease_id(self) -> str:
        """The lease that covers it: its own, its group's (one message of a group at a
        time) or its run's (every message of its second)."""
        if self.kind == "group":
            return f"g{self.shared_id}"
        return self.shared_id if self.kind == "run" else self.object_id


def pending_of_name(name: str) -> PendingKey | None:
    """What the object named ``name`` under ``{topic}/messages/`` holds; None if no message."""
    shared = ""
    if name.endswith(MESSAGE_SUFFIX):
        kind, stem = "message", name[: -len(MESSAGE_SUFFIX)]
    elif name.endswith(BATCH_SUFFIX):
        kind, stem = "batch", name[: -len(BATCH_SUFFIX)]
    elif name.endswith(RUN_SUFFIX):
        kind, stem, number = "run", name[: -len(RUN_SUFFIX)], _run_number(name)
        shared = run_id(name, number)
        if number:
            stem = stem.rpartition(".")[0]
    elif name.endswith(GROUP_SUFFIX):
        kind = "group"
        stem, _, shared = name[: -len(GROUP_SUFFIX)].rpartition(".")
        if not _GROUP_HASH_RE.match(shared):
            return None
    else:
        return None
    candidate = stem[-36:]
    if not is_uuid(candidate):
        return None
    return PendingKey(candidate, kind, shared)  # type: ignore[arg-type]


class RunNumbers:
    """The run each single message a producer publishes goes into: the first
    ``RUN_SIZE`` of a second's messages (per topic, band and delay) into run 0, the next
    ones into run 1, and so on. Counted per second of the wall clock (messages published in
    another second start again at run 0)."""

    def __init__(self) -> None:
        self._second = ""
        self._counts: dict[str, int] = {}

    def next(self, queue: str, at: datetime, now: datetime, *, delayed: bool, priority: int) -> int:
        """The run number of the next message of ``queue`` stamped ``at``, published ``now``."""
        second = stamp(now, False)[:_SECOND_LENGTH]
        if second != self._second:
            self._second, self._counts = second, {}
        run = f"{queue}/{band(priority)}{stamp(at, delayed)[:_SECOND_LENGTH]}{delayed}"
        count = self._counts.get(run, 0)
        self._counts[run] = count + 1
        return count // RUN_SIZE
