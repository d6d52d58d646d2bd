"""A queue client for ``tests/protocol/test_crash_matrix.py`` that dies by SIGKILL inside one
operation.

Run as ``python tests/workers/crash_worker.py SPEC``, SPEC a JSON object with ``config`` (queue
config),
``role`` (publish | claim | refresh | ack | nack | batch | redrive, also the topic's name),
``trial``, ``seed``, ``journal`` (a path), ``count`` (messages to handle), ``ids`` (dead letters
to redrive) and ``kill``. ``{"index": n, "phase": p, "verbs": v}`` kills the process at the
n-th store call (of the verbs ``v``, or of any verb for null) made inside the role's operation:
before the call (p ``before``), while it is in flight (``during``) or after it returned
(``after``). With null the test kills the process at a random moment after it printed
``ready``.

Every event goes to the journal as one JSON line written with ``os.write`` on an ``O_APPEND``
descriptor: once written, a line survives the SIGKILL. Payloads are ``{"token", "fate"}``; a
message is acked or dead-lettered according to its fate, by whoever receives it.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

from pawn_queue import Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.exceptions import LeaseLostError
from pawn_queue.store import open_store
from pawn_queue.store.base import ObjectMeta, PutMode, Store, StoredObject

T = TypeVar("T")

# The phase, set around each operation, that a role's kill point is counted in.
TARGET = {
    "publish": "publish",
    "claim": "claim",
    "refresh": "hold",  # only the background refresh writes to the store then
    "ack": "ack",
    "nack": "nack",
    "batch": "batch",  # member settlements, and the refreshes that write them to the lease
    "redrive": "redrive",
}


class Journal:
    """Append-only JSON lines, each flushed to the kernel before the call returns."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self.phase = ""

    def write(self, event: str, **fields: Any) -> None:
        line = json.dumps({"e": event, "t": time.time(), **fields}) + "\n"
        os.write(self._fd, line.encode())

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.write("phase", p=phase)


class KillingStore:
    """Passes calls to ``inner``, journals the writes to topic keys, and SIGKILLs the process
    at the chosen call of the target phase."""

    def __init__(
        self, inner: Store, journal: Journal, target: str, kill: dict[str, Any] | None, seed: int
    ) -> None:
        self._inner = inner
        self._journal = journal
        self._target = target
        self._kill = kill
        self._rng = random.Random(seed)
        self._calls = 0

    async def _call(self, verb: str, keys: Sequence[str], run: Callable[[], Awaitable[T]]) -> T:
        first = keys[0] if keys else ""
        hit = False
        verbs = self._kill.get("verbs") if self._kill else None
        if (
            self._journal.phase == self._target
            and not first.startswith("_notify/")
            and (verbs is None or verb in verbs)
        ):
            hit = self._kill is not None and self._calls == self._kill["index"]
            self._calls += 1
        phase = self._kill["phase"] if hit and self._kill else ""
        logged = verb in ("put", "delete") and not first.startswith("_")
        if phase == "before":
            self._die(verb, first, phase)
        for key in keys if logged else ():
            self._journal.write(verb, key=key, s="start")
        if phase == "during":
            # The request is on its way (or the file operation under way) when the process dies.
            pending = asyncio.ensure_future(run())
            await asyncio.sleep(self._rng.choice([0.0, self._rng.uniform(0.0, 0.003)]))
            self._die(verb, first, "after" if pending.done() else phase)
        result = await run()
        if logged or (verb == "get" and "/messages/" in first):
            for key in keys:
                self._journal.write(verb, key=key, s="done")
        if phase == "after":
            self._die(verb, first, phase)
        return result

    def _die(self, verb: str, key: str, phase: str) -> NoReturn:
        self._journal.write("kill", verb=verb, key=key, phase=phase, call=self._calls - 1)
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("SIGKILL did not stop the process")

    async def get(self, key: str) -> StoredObject:
        return await self._call("get", [key], lambda: self._inner.get(key))

    async def head(self, key: str) -> ObjectMeta:
        return await self._call("head", [key], lambda: self._inner.head(key))

    async def put(
        self, key: str, data: bytes, mode: PutMode = "overwrite", *, durable: bool = True
    ) -> str:
        return await self._call(
            "put", [key], lambda: self._inner.put(key, data, mode, durable=durable)
        )

    async def list(
        self, prefix: str = "", start_after: str | None = None, limit: int | None = None
    ) -> list[ObjectMeta]:
        return await self._call(
            "list", [prefix], lambda: self._inner.list(prefix, start_after, limit)
        )

    async def delete(self, key: str) -> None:
        await self._call("delete", [key], lambda: self._inner.delete(key))

    async def delete_many(self, keys: Sequence[str]) -> None:
        await self._call("delete", list(keys), lambda: self._inner.delete_many(keys))

    async def close(self) -> None:
        await self._inner.close()


async def settle(message: Message, journal: Journal) -> None:
    """Ack or dead-letter ``message`` as its fate says, journaling the intent and the result."""
    fate = message.payload["fate"]
    journal.write(f"intent-{fate}", id=message.id)
    try:
        await (message.ack() if fate == "ack" else message.nack())
    except LeaseLostError:
        journal.write("lease-lost", id=message.id)  # taken over: the new holder settles it
        return
    journal.write(f"{fate}ed", id=message.id)


async def publish(
    pq: PawnQueue, spec: dict[str, Any], journal: Journal, rng: random.Random
) -> None:
    producer = await pq.register_producer("crash-producer")
    print("ready", flush=True)
    for n in range(spec["count"]):
        size = 3 if rng.random() < 0.3 else 1
        payloads = [
            {"token": f"w{spec['trial']}-{n}.{m}", "fate": rng.choice(["ack", "nack"])}
            for m in range(size)
        ]
        journal.write("intent-publish", payloads=payloads)
        journal.enter("publish")
        if size == 1:
            ids = [await producer.publish("publish", payloads[0])]
        else:
            ids = await producer.publish_batch("publish", payloads)
        journal.enter("")
        journal.write("published", tokens=[p["token"] for p in payloads], ids=ids)


async def consume(
    pq: PawnQueue, spec: dict[str, Any], journal: Journal, rng: random.Random
) -> None:
    role = spec["role"]
    consumer = await pq.register_consumer(f"crash-{role}", [role])
    print("ready", flush=True)
    held: list[Message] = []
    while len(held) < spec["count"]:
        journal.enter("claim")
        messages = await consumer.poll(wait=1.0)
        journal.enter("")
        if not messages:
            break
        for message in messages:
            journal.write("received", id=message.id, token=message.payload["token"])
        held += messages
    if role == "refresh":
        journal.enter("hold")
        await asyncio.sleep(2.0)  # several refresh rounds
    elif role in ("ack", "nack", "batch"):
        journal.enter(role)
        for message in held:
            if role == "batch":
                # Refreshes (every 0.4 s) between settlements write the settled members into
                # the lease, so a later holder must skip them.
                await asyncio.sleep(rng.uniform(0.1, 0.5))
            await settle(message, journal)
        # The deletes that follow acks run in the background: still this operation.
        await pq.runtime.background.done()
    journal.enter("")
    for message in held:
        if not message.settled and message.lease_held:
            await settle(message, journal)


async def redrive(
    pq: PawnQueue, spec: dict[str, Any], journal: Journal, rng: random.Random
) -> None:
    print("ready", flush=True)
    journal.write("intent-redrive", ids=spec["ids"])
    journal.enter("redrive")
    moved = await pq.redrive("redrive", ids=spec["ids"])
    journal.enter("")
    journal.write("redriven", count=moved)


async def main(spec: dict[str, Any]) -> None:
    journal = Journal(spec["journal"])
    config = load_config(spec["config"], environ={})
    role = spec["role"]
    store = KillingStore(open_store(config), journal, TARGET[role], spec["kill"], spec["seed"])
    run = {"publish": publish, "redrive": redrive}.get(role, consume)
    async with PawnQueue(config, store=store) as pq:
        await run(pq, spec, journal, random.Random(spec["seed"]))
    journal.write("done")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
    # Skip interpreter shutdown: obstore's Rust runtime now and then aborts (SIGABRT) while
    # it is torn down, after all the work is done and journaled.
    sys.stdout.flush()
    os._exit(0)
