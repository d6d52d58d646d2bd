"""The producer process of the queue benchmark's wake case (``bench/queue/waiting.py``): a
publish from another process than the listening consumer's.

Started as ``python -m bench.queue.wake_producer`` from the repository root. Reads lines from stdin:
first ``{"queue": <PawnQueue config>, "topic": name}`` (on stdin, so connection settings never
show in a process list), then one ``{"i": n}`` per message to publish. Answers ``ready`` once
its producer is registered, then per message one JSON line ``{"i", "t", "publish_s"}``, where
``t`` is ``time.time()`` just before ``publish`` (also put in the payload). Exits at end of
input, closing its PawnQueue (so the change signals of its last publish go out).
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time

from pawn_queue import PawnQueue


async def serve() -> None:
    spec = json.loads(await asyncio.to_thread(sys.stdin.readline))
    topic = str(spec["topic"])
    async with await PawnQueue.from_config(spec["queue"]) as pq:
        producer = await pq.register_producer("wake-producer")
        print("ready", flush=True)
        # Reading stdin in a thread keeps the event loop free for the signal marks.
        while line := await asyncio.to_thread(sys.stdin.readline):
            request = json.loads(line)
            sent = time.time()
            await producer.publish(topic, {"t": sent, "i": request["i"]})
            reply = {"i": request["i"], "t": sent, "publish_s": round(time.time() - sent, 4)}
            print(json.dumps(reply), flush=True)


def main() -> None:
    logging.basicConfig(level=logging.ERROR, format="wake_producer: %(message)s")
    asyncio.run(serve())


if __name__ == "__main__":
    main()
