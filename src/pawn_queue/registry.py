"""The registry of producers and consumers: stable ids by name, and a last-seen heartbeat."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import asdict, dataclass

from pawn_queue import codec, layout
from pawn_queue._aio import gather_limited
from pawn_queue.envelope import encode_json, now_utc
from pawn_queue.exceptions import (
    AlreadyExists,
    ArgumentError,
    NotFound,
    PreconditionFailed,
    RootNotFound,
    StoreError,
)
from pawn_queue.layout import ROLES, Role
from pawn_queue.store.base import IfMatch, Store

logger = logging.getLogger(__name__)


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


class Registry:
    """Registration is idempotent by name across processes: a create-only name index decides."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._entries: dict[tuple[str, str], RegistryEntry] = {}

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
        registered_at = now_utc().isoformat()
        try:
            existing = _decode((await self._store.get(layout.registry_key(role, entity_id))).data)
            if existing is not None:
                registered_at = existing.registered_at
        except NotFound:
            pass
        entry = RegistryEntry(role, name, entity_id, registered_at, now_utc().isoformat())
        await self._write(entry)
        self._entries[(role, name)] = entry
        logger.info("registered role=%s name=%s id=%s", role, name, entity_id)
        return entry

    async def list(self, role: Role) -> list[RegistryEntry]:
        """Every entry of ``role`` ("producers" or "consumers"), by name."""
        _check_role(role)
        metas = await self._store.list(layout.registry_prefix(role))
        keys = [m.key for m in metas if m.key.endswith(".json")]
        results = await gather_limited(16, (self._store.get(k) for k in keys))
        entries = []
        for result in results:
            if isinstance(result, NotFound):
                continue
            if isinstance(result, BaseException):
                raise result
            entry = _decode(result.data)
            if entry is not None:
                entries.append(entry)
        return sorted(entries, key=lambda e: (e.name, e.entity_id))

    async def heartbeat(self) -> None:
        """Write ``last_seen`` for every entry this process registered."""
        for entry in list(self._entries.values()):
            entry.last_seen = now_utc().isoformat()
            try:
                await self._write(entry)
            except StoreError as exc:
                logger.warning("heartbeat failed name=%s error=%s", entry.name, exc)

    async def run_heartbeat(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            await self.heartbeat()

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
