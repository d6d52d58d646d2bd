"""What the limits page shows (docs/concepts/flow-control.md): each concurrency limit's slots
with those held and by whom, each rate limit with its rate and when a chunk of its permits
was last won, and the subscribers' pauses. One LIST each of ``_limits/``, ``_rates/`` and
``_pauses/``, then a GET of each slot (the first :data:`SLOTS_READ`), of each rate's newest
ring key and of each pause."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pawn_queue._internal.aio import gather_limited
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import CorruptObject, LeaseBody
from pawn_queue._protocol.pauses import decode_until
from pawn_queue._protocol.rates import decode_chunk
from pawn_queue.exceptions import NotFound
from pawn_queue.store.base import ObjectMeta, Store

SLOTS_READ = 200  # slots read (by limit name) for the limits page, at most
_READ_CONCURRENCY = 8


@dataclass(frozen=True)
class SlotRow:
    slot: int
    held: bool
    holder: str = ""  # host:pid
    expires_at: str = ""  # while held


@dataclass(frozen=True)
class LimitRow:
    """A concurrency limit: the slots written so far (its limit, once each was used)."""

    name: str
    slots: tuple[SlotRow, ...]

    @property
    def held(self) -> int:
        return sum(slot.held for slot in self.slots)


@dataclass(frozen=True)
class RateRow:
    name: str
    rate: str  # as the last chunk won says: "20/1s"
    last_won: datetime  # when a chunk of its permits was last won


@dataclass(frozen=True)
class PauseRow:
    name: str
    until: datetime | None  # None: not readable


@dataclass(frozen=True)
class LimitsView:
    limits: tuple[LimitRow, ...] = ()
    rates: tuple[RateRow, ...] = ()
    pauses: tuple[PauseRow, ...] = ()
    slots_unread: int = 0


async def read_limits(store: Store, now: datetime) -> LimitsView:
    """The limits, rates and pauses in ``store``, as of ``now``."""
    slot_metas = [m for m in await store.list(layout.LIMITS) if layout.limit_slot_of(m.key)]
    rate_metas = [m for m in await store.list(layout.RATES) if layout.rate_name_of(m.key)]
    pause_keys = [m.key for m in await store.list(layout.PAUSES) if layout.pause_name_of(m.key)]
    wanted = sorted(slot_metas, key=lambda m: layout.limit_slot_of(m.key) or ("", 0))
    slots = await gather_limited(
        _READ_CONCURRENCY, (_read_slot(store, m.key, now) for m in wanted[:SLOTS_READ])
    )
    by_name: dict[str, list[SlotRow]] = {}
    for meta, slot in zip(wanted, slots, strict=False):
        if isinstance(slot, BaseException):
            raise slot
        if slot is not None:
            by_name.setdefault(_slot_name(meta), []).append(slot)
    newest: dict[str, ObjectMeta] = {}
    for meta in rate_metas:
        name = layout.rate_name_of(meta.key) or ""
        if name not in newest or meta.last_modified > newest[name].last_modified:
            newest[name] = meta
    rates = await gather_limited(
        _READ_CONCURRENCY, (_read_rate(store, n, m) for n, m in sorted(newest.items()))
    )
    pauses = await gather_limited(_READ_CONCURRENCY, (_read_pause(store, k) for k in pause_keys))
    for result in (*rates, *pauses):
        if isinstance(result, BaseException):
            raise result
    return LimitsView(
        limits=tuple(LimitRow(name, tuple(rows)) for name, rows in sorted(by_name.items())),
        rates=tuple(r for r in rates if isinstance(r, RateRow)),
        pauses=tuple(p for p in pauses if isinstance(p, PauseRow)),
        slots_unread=max(0, len(wanted) - SLOTS_READ),
    )


def _slot_name(meta: ObjectMeta) -> str:
    found = layout.limit_slot_of(meta.key)
    return found[0] if found else ""


async def _read_slot(store: Store, key: str, now: datetime) -> SlotRow | None:
    found = layout.limit_slot_of(key)
    assert found is not None
    try:
        body = LeaseBody.decode((await store.get(key)).data)
    except NotFound:
        return None  # gone since the listing (deleted by hand)
    except CorruptObject:
        return SlotRow(found[1], held=False, holder="(not a slot)")
    held = not body.released and datetime.fromisoformat(body.expires_at) > now
    return SlotRow(
        found[1], held, body.consumer_id if held else "", body.expires_at if held else ""
    )


async def _read_rate(store: Store, name: str, meta: ObjectMeta) -> RateRow | None:
    try:
        data = (await store.get(meta.key)).data
    except NotFound:
        return None
    return RateRow(name, decode_chunk(data)[1], meta.last_modified)


async def _read_pause(store: Store, key: str) -> PauseRow | None:
    name = layout.pause_name_of(key) or ""
    try:
        data = (await store.get(key)).data
    except NotFound:
        return None
    return PauseRow(name, decode_until(data))
