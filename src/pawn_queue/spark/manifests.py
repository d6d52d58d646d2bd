"""Micro-batch manifests and read limits: what one micro-batch of a streaming read owns.

A manifest is ``_spark/{query}/batches/{n}.json``: the objects micro-batch ``n`` owns, in
order, with their size, the batch members settled before (skipped) and their receive count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pawn_queue._protocol import codec
from pawn_queue._protocol.envelope import encode_json, now_utc
from pawn_queue.exceptions import PawnQueueError
from pawn_queue.spark.reading import ObjectRef

CLAIM_CHUNK = 256


@dataclass(frozen=True, slots=True)
class Limit:
    """How much one micro-batch may admit (Spark's ReadLimit); None means no bound."""

    max_rows: int | None = None
    max_objects: int | None = None
    max_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Manifest:
    """The objects micro-batch ``batch`` owns, in order."""

    batch: int
    refs: tuple[ObjectRef, ...]

    def encode(self, query: str) -> bytes:
        objects: list[dict[str, Any]] = []
        for ref in self.refs:
            entry: dict[str, Any] = {"key": ref.key, "size": ref.size}
            if ref.skip:
                entry["skip"] = list(ref.skip)
            if ref.receives != 1:
                entry["receives"] = ref.receives
            objects.append(entry)
        body = {
            "query": query,
            "batch": self.batch,
            "created_at": now_utc().isoformat(),
            "objects": objects,
        }
        return encode_json(body)

    @classmethod
    def decode(cls, batch: int, data: bytes) -> Manifest:
        try:
            body = codec.loads(data)
            refs = tuple(
                ObjectRef(
                    key=str(entry["key"]),
                    size=int(entry.get("size", 0)),
                    skip=tuple(int(i) for i in entry.get("skip", ())),
                    receives=int(entry.get("receives", 1)),
                )
                for entry in body["objects"]
            )
        except (ValueError, TypeError, KeyError) as exc:
            raise PawnQueueError(f"manifest of micro-batch {batch} is unreadable: {exc}") from None
        return cls(batch, refs)


class Budget:
    """What a micro-batch admitted so far, against its limit."""

    def __init__(self, limit: Limit) -> None:
        self.limit = limit
        self.rows = self.objects = self.bytes = 0

    @property
    def counts_rows(self) -> bool:
        return self.limit.max_rows is not None

    def full(self) -> bool:
        lim = self.limit
        return (
            (lim.max_rows is not None and self.rows >= lim.max_rows)
            or (lim.max_objects is not None and self.objects >= lim.max_objects)
            or (lim.max_bytes is not None and self.bytes >= lim.max_bytes)
        )

    def admits(self, size: int, rows: int) -> bool:
        lim = self.limit
        return not (
            (lim.max_rows is not None and self.rows + rows > lim.max_rows)
            or (lim.max_objects is not None and self.objects + 1 > lim.max_objects)
            or (lim.max_bytes is not None and self.bytes + size > lim.max_bytes)
        )

    def take(self, size: int, rows: int) -> None:
        self.rows += rows
        self.objects += 1
        self.bytes += size

    def chunk(self, rows_per_object: float) -> int:
        """How many candidates to claim next without overshooting much."""
        lim, size = self.limit, CLAIM_CHUNK
        if lim.max_objects is not None:
            size = min(size, lim.max_objects - self.objects)
        if lim.max_rows is not None:
            size = min(size, int((lim.max_rows - self.rows) / max(rows_per_object, 1.0)))
        return max(size, 1)
