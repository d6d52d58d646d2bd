"""A producer or a consumer of one subscription, for
``tests/protocol/test_subscription_crash.py``, which kills consumers with SIGKILL.

Run as ``python tests/workers/subscription_worker.py SPEC``, SPEC a JSON object with
``config`` (queue config), ``role`` (``produce`` | ``consume``), ``name``, ``seed``,
``journal`` (a path), and for a producer ``count`` (publish calls), for a consumer
``subscription`` and ``kill``: null (the test kills it at a random moment), or
``{"target": "claim" | "ack", "index": n, "phase": "before" | "during" | "after"}``, which
makes its store SIGKILL the process at the n-th store call made while claiming (polls) or
acking (:class:`tests.workers.crash_worker.KillingStore`).

Events go to the journal as JSON lines that survive the SIGKILL
(:class:`tests.workers.crash_worker.Journal`): ``published`` (ids and the message kind,
once ``publish()`` returned), ``received``, ``intent-ack`` (before ``ack()``), ``acked``
(after it returned), ``lease-lost``. A consumer prints ``ready`` once registered, then polls
and acks until it is killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parents[2]))  # run as a script: the repository's root

from pawn_queue import PawnQueue
from pawn_queue.config import load_config
from pawn_queue.exceptions import LeaseLostError
from pawn_queue.store import open_store
from tests.workers.crash_worker import Journal, KillingStore

KINDS = ("x", "y", "z")


async def produce(pq: PawnQueue, spec: dict[str, Any], journal: Journal) -> None:
    """Publish ``count`` times: single messages, concurrent ones (group commit), batches and
    dedup ids, each with a ``kind`` attribute."""
    rng = random.Random(spec["seed"])
    producer = await pq.register_producer(spec["name"])
    print("ready", flush=True)
    for n in range(spec["count"]):
        kind = rng.choice(KINDS)
        attributes = {"kind": kind}
        how = rng.choice(["one", "one", "together", "batch", "dedup"])
        if how == "one":
            ids = [await producer.publish("t", {"n": n}, attributes=attributes)]
        elif how == "together":
            ids = list(
                await asyncio.gather(
                    *(
                        producer.publish("t", {"n": n, "m": m}, attributes=attributes)
                        for m in range(4)
                    )
                )
            )
        elif how == "batch":
            ids = await producer.publish_batch(
                "t", [{"n": n, "m": m} for m in range(3)], attributes=attributes
            )
        else:
            dedup_id = f"{spec['name']}-{n}"
            ids = [await producer.publish("t", {"n": n}, attributes=attributes, dedup_id=dedup_id)]
        journal.write("published", ids=ids, kind=kind, how=how)
        await asyncio.sleep(rng.uniform(0.0, 0.03))


async def consume(pq: PawnQueue, spec: dict[str, Any], journal: Journal) -> None:
    rng = random.Random(spec["seed"])
    subscription = spec["subscription"]
    consumer = await pq.register_consumer(spec["name"], ["t"], subscription=subscription)
    print("ready", flush=True)
    while True:
        journal.enter("claim")
        messages = await consumer.poll(wait=0.5)
        journal.enter("")
        for message in messages:
            assert (message.topic, message.subscription) == ("t", subscription)
            journal.write("received", id=message.id)
        journal.enter("ack")
        for message in messages:
            await asyncio.sleep(rng.uniform(0.0, 0.02))  # the work
            journal.write("intent-ack", id=message.id)
            try:
                await message.ack()
            except LeaseLostError:
                journal.write("lease-lost", id=message.id)
                continue
            journal.write("acked", id=message.id)
        journal.enter("")


async def main(spec: dict[str, Any]) -> None:
    journal = Journal(spec["journal"])
    config = load_config(spec["config"], environ={})
    kill = spec.get("kill")
    store = KillingStore(
        open_store(config), journal, kill["target"] if kill else "", kill, spec["seed"]
    )
    async with PawnQueue(config, store=store) as pq:
        if spec["role"] == "produce":
            await produce(pq, spec, journal)
        else:
            await consume(pq, spec, journal)
    journal.write("done")


if __name__ == "__main__":
    asyncio.run(main(json.loads(sys.argv[1])))
    sys.stdout.flush()
    os._exit(0)  # as crash_worker.py: skip a teardown that may abort after the work is done
