"""A process ``tests/protocol/test_group_commit.py`` kills with SIGKILL.

``python tests/workers/group_commit_worker.py publish CONFIG``: 16 tasks publish at once, in
a loop; each id is printed as soon as its ``publish()`` returned.
``python tests/workers/group_commit_worker.py ack CONFIG``: polls batch members twice, acks
them a poll at a time (gathered) and prints each id once its ``ack()`` returned; then polls a
third time, prints ``held`` and waits, holding those unsettled.
CONFIG is a queue config as JSON. Lines are flushed one by one: the test reads them and
kills the process.
"""

from __future__ import annotations

import asyncio
import json
import sys

from pawn_queue import PawnQueue


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def publish(config: dict[str, object]) -> None:
    async with await PawnQueue.from_config(config) as pq:
        producer = await pq.register_producer("crash")

        async def loop(task: int) -> None:
            for n in range(10_000):
                say(await producer.publish("t", {"task": task, "n": n}))

        await asyncio.gather(*(loop(task) for task in range(16)))


async def ack(config: dict[str, object]) -> None:
    async with await PawnQueue.from_config(config) as pq:
        consumer = await pq.register_consumer("crash", ["t"])
        say("ready")
        for _ in range(2):
            messages = await consumer.poll(wait=5)

            async def settle(message: object) -> None:
                await message.ack()  # type: ignore[attr-defined]
                say(message.id)  # type: ignore[attr-defined]

            await asyncio.gather(*(settle(m) for m in messages))
        await consumer.poll(wait=5)  # held, never settled
        say("held")
        await asyncio.Event().wait()  # until killed


if __name__ == "__main__":
    role, raw = sys.argv[1], sys.argv[2]
    asyncio.run({"publish": publish, "ack": ack}[role](json.loads(raw)))
