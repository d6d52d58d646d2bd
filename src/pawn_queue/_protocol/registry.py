"""The registry of producers and consumers: stable ids by name, and which processes run them.

A name's id and entry (``_registry/{role}/{id}.json``, as pawn-queue 0.1.x writes it) are
written once, when the name is first registered. Liveness is per process: each process that
registers a consumer, or runs past its first heartbeat, keeps one record
(``_registry/instances/{id}.json``: host, pid, start, last heartbeat, what it registered),
one write per heartbeat whatever the number of its consumers, and marks it stopped when it
stops cleanly. So the processes of ``worker --processes N`` are told apart, a clean stop
shows at once, and a one-shot publisher writes nothing but its name's entry, the first time.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import socket
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Literal, TypeVar

from pawn_queue._internal.aio import gather_limited
from pawn_queue._internal.durations import seconds_argument
from pawn_queue._protocol import codec, layout
from pawn_queue._protocol.envelope import encode_json, now_utc
from pawn_queue._protocol.layout import ROLES, Role
from pawn_queue._protocol.shares import Shares
from pawn_queue.exceptions import (
    AlreadyExists,
    ArgumentError,
    NotFound,
    PreconditionFailed,
    RootNotFound,
    StoreError,
)
from pawn_queue.store.base import IfMatch, Store

logger = logging.getLogger(__name__)

_T = TypeVar("_T")


@dataclass(slots=True)
class RegistryEntry:
    """One registered producer or consumer (the shape pawn-queue 0.1.x writes)."""

    role: str
    name: str
    entity_id: str
    registered_at: str
    last_seen: str


def _decode(data: bytes) -> RegistryEntry | None:
    try:
        raw = codec.loads(data)
        return RegistryEntry(
            **{k: str(raw[k]) for k in ("role", "name", "entity_id", "registered_at", "last_seen")}
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


@dataclass(slots=True)
class Instance:
    """One process: where it runs, when it was last seen, and the names it registered."""

    instance_id: str
    host: str
    pid: int
    started_at: str
    last_seen: str
    stopped_at: str | None = None
    members: list[dict[str, str]] = field(default_factory=list)  # role, name, entity_id
    consuming: list[str] = field(default_factory=list)  # the queues listen() reads there


Status = Literal["alive", "stopped", "dead", "unknown"]


@dataclass(frozen=True, slots=True)
class Liveness:
    """A registered name as one process runs it (or, with no process record, as its
    entry says: pawn-queue 0.1.x heartbeats the entry itself)."""

    entry: RegistryEntry
    instance: Instance | None
    status: Status
    last_seen_seconds_ago: float | None


_SHARE_REFRESH_SPACING_SECONDS = 2.0

FORGET_SECONDS = 86_400.0
"""Records of processes stopped, or not seen, for this long are deleted (by the next
process that registers a consumer)."""


class Registry:
    """Registration is idempotent by name across processes: a create-only name index decides."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._entries: dict[tuple[str, str], RegistryEntry] = {}
        started = now_utc().isoformat()
        self._instance = Instance(
            str(uuid.uuid4()), socket.gethostname(), os.getpid(), started, started
        )
        self._instance_written = False
        self.shares = Shares(self._instance.instance_id)
        """Who else consumes this process's queues (refreshed at each heartbeat)."""
        self._alive_seconds = 120.0  # a record is live within 2 heartbeats (the default's)
        self._listening: Counter[str] = Counter()  # queue -> listen() calls running here
        self.on_listeners_changed: Callable[[], None] | None = None
        """Told once this process's record says a listener started or ended here (the
        other processes are signalled to read the records again)."""
        # process record key -> (its etag when read, what it said): re-read when rewritten
        self._records: dict[str, tuple[str, Instance | None]] = {}

    async def register(self, role: Role, name: str) -> RegistryEntry:
        """Register ``name`` (or find its existing id) and return its entry."""
        _check_role(role)
        layout.validate_name(name, f"{role[:-1]} name")
        if (role, name) in self._entries:
            return self._entries[(role, name)]
        entity_id = await self._lookup(role, name)
        if entity_id is None:
            entity_id = await self._scan_legacy(role, name) or str(uuid.uuid4())
            index = encode_json({"name": name, "entity_id": entity_id})
            name_key = layout.registry_name_key(role, name)
            try:
                await self._store.put(name_key, index, "create")
            except AlreadyExists:
                # Another process registered the same name first: use its id. An index that
                # cannot be read is replaced first (if-match: one repair wins).
                found = await self._lookup(role, name)
                if found is None:
                    await self._replace_unreadable(name_key, index)
                    found = await self._lookup(role, name)
                entity_id = found or entity_id
        try:
            entry = _decode((await self._store.get(layout.registry_key(role, entity_id))).data)
        except NotFound:
            entry = None
        if entry is None:  # new (or unreadable): written once, liveness is the instance's
            now = now_utc().isoformat()
            entry = RegistryEntry(role, name, entity_id, now, now)
            await self._write(entry)
        self._entries[(role, name)] = entry
        self._instance.members.append({"role": role, "name": name, "entity_id": entity_id})
        if role == "consumers":
            await self._write_instance()
        logger.info("registered role=%s name=%s id=%s", role, name, entity_id)
        return entry

    async def listening(self, queues: Iterable[str], started: bool) -> None:
        """A ``listen()`` of ``queues`` starts (or ends) here: this process's record says
        which queues it listens to, so the listeners of a queue share its new messages
        (:attr:`shares`). A write that fails is logged: the process is then left out of the
        others' view, or kept in it, until its next heartbeat."""
        if self._instance.stopped_at is not None:
            return  # the queue was torn down under a listener: its record says stopped
        before = set(self._listening)
        self._listening.update({queue: 1 if started else -1 for queue in queues})
        self._listening = +self._listening  # drop the queues no listener reads any more
        if set(self._listening) == before:
            return
        self._instance.consuming = sorted(self._listening)
        try:
            await self._write_instance()
        except (StoreError, RootNotFound) as exc:
            logger.warning(
                "registry write failed instance=%s error=%s", self._instance.instance_id, exc
            )
            return
        if self.on_listeners_changed is not None:
            self.on_listeners_changed()
        if started:
            await self.refresh_shares()
        else:
            self.shares.update({}, own=self._instance.consuming)

    async def list(self, role: Role) -> list[RegistryEntry]:
        """Every entry of ``role`` ("producers" or "consumers"), by name."""
        _check_role(role)
        entries = await self._read_all(layout.registry_prefix(role), _decode)
        return sorted(entries, key=lambda e: (e.name, e.entity_id))

    async def instances(self) -> builtins.list[Instance]:
        """Every process record, oldest start first."""
        found = await self._read_all(layout.INSTANCES, _decode_instance)
        return sorted(found, key=lambda i: (i.started_at, i.instance_id))

    async def _read_all(
        self, prefix: str, decode: Callable[[bytes], _T | None]
    ) -> builtins.list[_T]:
        """The readable ``.json`` objects under ``prefix`` (one deleted meanwhile is skipped)."""
        metas = await self._store.list(prefix)
        keys = [m.key for m in metas if m.key.endswith(".json")]
        results = await gather_limited(16, (self._store.get(k) for k in keys))
        found = []
        for result in results:
            if isinstance(result, NotFound):
                continue
            if isinstance(result, BaseException):
                raise result
            decoded = decode(result.data)
            if decoded is not None:
                found.append(decoded)
        return found

    async def liveness(self, role: Role, window: float) -> builtins.list[Liveness]:
        """Each entry of ``role`` once per process that registered it (alive: seen within
        ``window`` seconds; stopped: it stopped cleanly; dead: neither), by name. An entry
        no process record names is judged by its own ``last_seen`` (pawn-queue 0.1.x
        heartbeats it), or ``unknown`` if that never moved (a one-shot publisher's)."""
        seconds_argument("window", window)
        entries = await self.list(role)
        instances = await self.instances()
        now = now_utc()
        rows = []
        for entry in entries:
            runs: builtins.list[Instance | None] = [
                i for i in instances if any(m["entity_id"] == entry.entity_id for m in i.members)
            ]
            for instance in runs or [None]:
                seen = instance.last_seen if instance is not None else entry.last_seen
                ago = _seconds_since(now, seen)
                status: Status = "alive" if ago is not None and ago <= window else "dead"
                if instance is not None and instance.stopped_at is not None:
                    status = "stopped"
                elif instance is None and entry.last_seen == entry.registered_at:
                    status = "unknown"  # no heartbeat ever: a one-shot process, long gone
                rows.append(Liveness(entry, instance, status, ago))
        return rows

    async def heartbeat(self) -> None:
        """One write: this process's record, with its last-seen time."""
        if not self._entries:
            return
        try:
            await self._write_instance()
        except StoreError as exc:
            logger.warning("heartbeat failed instance=%s error=%s", self._instance.instance_id, exc)

    async def refresh_shares(self) -> None:
        """Tell :attr:`shares` which live processes consume the queues consumed here: a LIST
        of the process records, and a GET of each written since it was last read. A failure
        keeps the last view."""
        if not self._instance.consuming:
            return
        try:
            metas = [m for m in await self._store.list(layout.INSTANCES) if m.key.endswith(".json")]
            own = layout.instance_key(self._instance.instance_id)  # known here: not read
            changed = [
                m
                for m in metas
                if m.key != own and m.etag != self._records.get(m.key, ("", None))[0]
            ]
            results = await gather_limited(16, (self._store.get(m.key) for m in changed))
        except (StoreError, RootNotFound) as exc:
            logger.warning("reading the consumer processes failed error=%s", exc)
            return
        listed = {m.key for m in metas}
        self._records = {k: v for k, v in self._records.items() if k in listed}
        for meta, result in zip(changed, results, strict=True):
            if isinstance(result, NotFound):
                self._records.pop(meta.key, None)
            elif isinstance(result, BaseException):
                logger.warning("reading a consumer process failed error=%s", result)
            else:
                self._records[meta.key] = (result.meta.etag, _decode_instance(result.data))
        now = now_utc()
        consuming: dict[str, list[str]] = {}
        for _, record in self._records.values():
            if record is None or record.stopped_at is not None:
                continue
            ago = _seconds_since(now, record.last_seen)
            if ago is not None and ago <= self._alive_seconds:
                for queue in record.consuming:
                    consuming.setdefault(queue, []).append(record.instance_id)
        self.shares.update(consuming, own=self._instance.consuming)

    async def stop(self) -> None:
        """Mark this process's record stopped (a clean stop shows at once). A failure is
        logged: the record then ages out as a dead process's does."""
        if not self._instance_written:
            return
        self._instance.stopped_at = now_utc().isoformat()
        try:
            await self._write_instance()
        except StoreError as exc:
            logger.warning(
                "registry stop failed instance=%s error=%s", self._instance.instance_id, exc
            )

    async def run_heartbeat(self, interval: float) -> None:
        """Heartbeat every ``interval`` seconds; meanwhile keep :attr:`shares` fresh."""
        self._alive_seconds = 2 * interval
        sharing = asyncio.create_task(self._run_share_refresh(interval))
        try:
            while True:
                await asyncio.sleep(interval)
                await self.heartbeat()
        finally:
            sharing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sharing

    async def _run_share_refresh(self, interval: float) -> None:
        """Read the process records again once per ``interval``, and soon (at most every
        ``_SHARE_REFRESH_SPACING_SECONDS``) after a change signal said a listener started
        or ended elsewhere, or a claim found the view stale (:meth:`Shares.stale`)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.shares.stale_seen.wait(), interval)
            self.shares.stale_seen.clear()
            await self.refresh_shares()
            await asyncio.sleep(_SHARE_REFRESH_SPACING_SECONDS)

    async def _write_instance(self) -> None:
        if not self._instance_written:
            await self._forget_old_instances()
        self._instance.last_seen = now_utc().isoformat()
        key = layout.instance_key(self._instance.instance_id)
        await self._store.put(key, encode_json(asdict(self._instance)), "overwrite")
        self._instance_written = True

    async def _forget_old_instances(self) -> None:
        """Delete the records of processes stopped or unseen for FORGET_SECONDS."""
        try:
            records = await self.instances()
        except (StoreError, RootNotFound):
            return
        now = now_utc()
        old = [
            layout.instance_key(i.instance_id)
            for i in records
            if (ago := _seconds_since(now, i.stopped_at or i.last_seen)) is None
            or ago > FORGET_SECONDS
        ]
        if old:
            with contextlib.suppress(StoreError):
                await self._store.delete_many(old)

    async def _write(self, entry: RegistryEntry) -> None:
        key = layout.registry_key(entry.role, entry.entity_id)  # type: ignore[arg-type]
        await self._store.put(key, encode_json(asdict(entry)), "overwrite")

    async def _lookup(self, role: Role, name: str) -> str | None:
        try:
            data = (await self._store.get(layout.registry_name_key(role, name))).data
        except NotFound:
            return None
        return _index_id(data)

    async def _replace_unreadable(self, key: str, index: bytes) -> None:
        try:
            current = await self._store.get(key)
            if _index_id(current.data) is None:
                await self._store.put(key, index, IfMatch(current.meta.etag))
                logger.warning("replaced an unreadable registry name index key=%s", key)
        except (NotFound, PreconditionFailed):
            pass  # changed meanwhile: the lookup that follows reads what is there now

    async def _scan_legacy(self, role: Role, name: str) -> str | None:
        """An id registered for ``name`` by pawn-queue 0.1.x, which keeps no name index."""
        try:
            entries = await self.list(role)
        except RootNotFound:
            return None  # a local directory not created yet: registering creates it
        for entry in entries:
            if entry.name == name and layout.is_uuid(entry.entity_id):
                return entry.entity_id
        return None


def _decode_instance(data: bytes) -> Instance | None:
    try:
        raw = codec.loads(data)
        members = [{k: str(m[k]) for k in ("role", "name", "entity_id")} for m in raw["members"]]
        stopped = raw.get("stopped_at")
        consuming = raw.get("consuming", [])
        if not isinstance(consuming, list) or not all(isinstance(q, str) for q in consuming):
            consuming = []  # written by another version, or damaged: not a consumer of any
        return Instance(
            str(raw["instance_id"]),
            str(raw["host"]),
            int(raw["pid"]),
            str(raw["started_at"]),
            str(raw["last_seen"]),
            None if stopped is None else str(stopped),
            members,
            consuming,
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        return None


def _seconds_since(now: datetime, when: str) -> float | None:
    try:
        return (now - datetime.fromisoformat(when)).total_seconds()
    except (ValueError, TypeError):
        return None


def _index_id(data: bytes) -> str | None:
    """The id a name index holds; None if it is unreadable."""
    try:
        entity_id = codec.loads(data)["entity_id"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return None
    return entity_id if isinstance(entity_id, str) and layout.is_uuid(entity_id) else None


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ArgumentError(f"role: got {role!r}, allowed: 'producers', 'consumers'")
