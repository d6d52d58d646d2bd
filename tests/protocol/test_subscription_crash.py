"""Consumers of different subscriptions killed with ``kill -9`` while producers publish: every
subscription still gets every message it takes, and a message is delivered again within a
subscription only after its holder died (or lost its lease).

Real processes (``tests/workers/subscription_worker.py``, on the journal and the killing
store of ``tests/workers/crash_worker.py``): two producers publish single messages,
concurrent ones (group commit), batches and dedup ids to topic ``t``, which has three
subscriptions (one filtered on the ``kind`` attribute). Each subscription has two consumer
slots; each slot runs consumers one after the other, each killed either by its own store at
a random call while it claims or acks, or by the test at a random moment. Then the test
drains every subscription itself and checks from the journals:

- nothing lost: each subscription got every message it takes (acked by a worker, acked by a
  worker that died inside ``ack()``, or drained at the end), and none it does not take;
- nothing delivered twice within a subscription but after its earlier holder was killed or
  lost its lease, and never after an ``ack()`` returned;
- nothing left: no message in any subscription, none in the topic's own queue.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import settled, sigkill

WORKER = str(Path(__file__).parents[1] / "workers" / "subscription_worker.py")
SUBSCRIPTIONS: dict[str, Any] = {"all": None, "also-all": None, "xy": {"kind": ["x", "y"]}}
SLOTS = 2  # consumers of a subscription alive at once
ROUNDS = 3  # consumers run (and killed) one after the other in each slot
PUBLISHES = 30  # publish calls per producer
BASE_SEED = 9_100_000
START_TIMEOUT = 30.0
RUN_TIMEOUT = 90.0  # the processes' part; each runs about 10 s on an idle machine
DRAIN_TIMEOUT = 60.0


@dataclass
class Worker:
    name: str
    subscription: str  # "" for a producer
    seed: int
    journal: Path
    kill: dict[str, Any] | None
    killed_at: float | None = None  # when the test sent SIGKILL
    returncode: int | None = None
    stderr: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    def read(self) -> None:
        if self.journal.exists():
            self.events = [json.loads(line) for line in self.journal.read_text().splitlines()]

    @property
    def died_at(self) -> float:
        """When it died: its store's SIGKILL (journaled just before), or the test's."""
        own = [e["t"] for e in self.events if e["e"] == "kill"]
        if own:
            return float(own[0])
        assert self.killed_at is not None, self.name
        return self.killed_at


def crash_config(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    config: dict[str, Any] = queue_config_dict(backend, request, tmp_path)
    config["polling"] = {
        "interval_seconds": 0.05,
        "max_messages_per_poll": 5,
        "visibility_timeout_seconds": 3.0,
        "lease_refresh_interval_seconds": 0.5,
    }
    config["concurrency"] = {"strategy": "conditional_write", "clock_skew_margin_seconds": 0.1}
    config["notify"] = {"check_interval_seconds": 0.05, "idle_check_interval_seconds": 0.2}
    return config


async def run(worker: Worker, config: dict[str, Any], role: str, count: int = 0) -> None:
    """Run ``worker`` to its end: a producer's last publish, a consumer's SIGKILL (its own,
    or the test's at a random moment once it is ready)."""
    spec = {
        "config": config,
        "role": role,
        "name": worker.name,
        "seed": worker.seed,
        "journal": str(worker.journal),
        "subscription": worker.subscription,
        "count": count,
        "kill": worker.kill,
    }
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        WORKER,
        json.dumps(spec),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    try:
        async with asyncio.timeout(START_TIMEOUT):
            ready = await process.stdout.readline()
            if ready == b"ready\n" and role == "consume":
                # A random moment: while it polls, holds, acks, or (its store's kill point
                # not reached) whatever it does then.
                await asyncio.sleep(random.Random(worker.seed).uniform(0.2, 1.5))
                if process.returncode is None:
                    worker.killed_at = time.time()
                    sigkill(process)
            _, stderr = await process.communicate()
    finally:
        if process.returncode is None:
            sigkill(process)
            await process.wait()
    worker.returncode = process.returncode
    worker.stderr = stderr.decode(errors="replace")[-3000:]
    worker.read()


async def slot(workers: list[Worker], config: dict[str, Any]) -> None:
    for worker in workers:
        await run(worker, config, "consume")


def plan(tmp_path: Path, offset: int) -> tuple[list[Worker], list[list[Worker]]]:
    producers = [
        Worker(f"producer-{n}", "", BASE_SEED + offset + n, tmp_path / f"producer-{n}.jsonl", None)
        for n in range(2)
    ]
    slots = []
    for s, subscription in enumerate(SUBSCRIPTIONS):
        for n in range(SLOTS):
            workers = []
            for r in range(ROUNDS):
                seed = BASE_SEED + offset + 100 * (s + 1) + 10 * n + r
                rng = random.Random(seed)
                kill = None
                if rng.random() < 0.6:  # else the test kills it
                    kill = {
                        "target": rng.choice(["claim", "ack"]),
                        "index": rng.randrange(8),
                        "phase": rng.choice(["before", "during", "after"]),
                    }
                name = f"{subscription}-{n}-{r}"
                workers.append(Worker(name, subscription, seed, tmp_path / f"{name}.jsonl", kill))
            slots.append(workers)
    return producers, slots


async def drain(pq: PawnQueue, subscription: str) -> list[str]:
    """Take every message left in the subscription (once the dead consumers' leases expired)."""
    consumer = await pq.register_consumer(f"drain-{subscription}", ["t"], subscription=subscription)
    queue = layout.subscription_queue("t", subscription)
    drained: list[str] = []
    async with asyncio.timeout(DRAIN_TIMEOUT):
        while True:
            messages = await consumer.poll(wait=0.5)
            for message in messages:
                drained.append(message.id)
                await message.ack()
            if not messages and not await pq.store.list(layout.messages_prefix(queue), limit=1):
                return drained


def audit(
    subscription: str,
    wanted: set[str],
    workers: list[Worker],
    drained: list[str],
) -> list[str]:
    """What the journals and the drain show that the protocol does not allow."""
    problems: list[str] = []
    # Each delivery in time order: (when, worker or None for the drain, id).
    deliveries: dict[str, list[tuple[float, Worker | None]]] = defaultdict(list)
    acked: dict[str, list[Worker]] = defaultdict(list)  # ack() returned
    ack_begun: set[str] = set()  # ack() called (it may have landed before the kill)
    lease_lost: set[tuple[str, str]] = set()  # (worker, id)
    for worker in workers:
        for e in worker.events:
            if e["e"] == "received":
                deliveries[e["id"]].append((e["t"], worker))
            elif e["e"] == "acked":
                acked[e["id"]].append(worker)
            elif e["e"] == "intent-ack":
                ack_begun.add(e["id"])
            elif e["e"] == "lease-lost":
                lease_lost.add((worker.name, e["id"]))
    end = time.time()
    for message_id in drained:
        deliveries[message_id].append((end, None))
    for message_id in sorted(set(deliveries) - wanted):
        problems.append(f"{subscription}: {message_id} delivered, but it does not take it")
    for message_id in sorted(wanted):
        if not (acked[message_id] or message_id in ack_begun or message_id in drained):
            problems.append(f"{subscription}: {message_id} lost (never acked nor drained)")
    for message_id, seen in deliveries.items():
        seen.sort(key=lambda delivery: delivery[0])
        if len(acked[message_id]) > 1:
            problems.append(f"{subscription}: {message_id} acked by two consumers")
        for (_, holder), (again, by) in itertools.pairwise(seen):
            who = by.name if by else "the drain"
            if holder is None:
                problems.append(f"{subscription}: {message_id} delivered after the drain")
                continue
            if holder in acked[message_id]:
                problems.append(
                    f"{subscription}: {message_id} delivered to {who} after {holder.name}'s "
                    "ack() returned"
                )
            explained = (holder.name, message_id) in lease_lost or holder.died_at < again
            if not explained:
                problems.append(
                    f"{subscription}: {message_id} delivered to {who} while {holder.name} "
                    "held it, alive, with its lease"
                )
    return problems


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_killed_consumers_of_subscriptions_lose_nothing(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config = crash_config(backend, request, tmp_path)
    producers, slots = plan(tmp_path, {"filesystem": 0, "s3": 10_000}[backend])
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        # Concurrent creates (conditional writes on both stores): one wait for all.
        await asyncio.gather(
            *(pq.create_subscription("t", name, filter=f) for name, f in SUBSCRIPTIONS.items())
        )
        async with asyncio.timeout(RUN_TIMEOUT):
            await asyncio.gather(
                *(run(p, config, "produce", PUBLISHES) for p in producers),
                *(slot(workers, config) for workers in slots),
            )
        consumers = [w for workers in slots for w in workers]
        for worker in producers + consumers:
            if worker.returncode not in (0, -9) or "Traceback" in worker.stderr:
                pytest.fail(f"{worker.name} exited {worker.returncode}: {worker.stderr}")
        for worker in consumers:
            assert worker.returncode == -9, f"{worker.name} was not killed"
        published: dict[str, str] = {}  # id -> kind
        for producer in producers:
            for e in producer.events:
                if e["e"] == "published":
                    published.update(dict.fromkeys(e["ids"], e["kind"]))
        assert len(published) >= 2 * PUBLISHES
        assert {e["e"] for e in producers[0].events} >= {"published", "done"}

        problems: list[str] = []
        self_killed = 0
        for subscription, given in SUBSCRIPTIONS.items():
            kinds = given["kind"] if given else ["x", "y", "z"]
            wanted = {i for i, kind in published.items() if kind in kinds}
            mine = [w for w in consumers if w.subscription == subscription]
            self_killed += sum(any(e["e"] == "kill" for e in w.events) for w in mine)
            drained = await drain(pq, subscription)
            problems += audit(subscription, wanted, mine, drained)
            received = [e["id"] for w in mine for e in w.events if e["e"] == "received"]
            acked = {e["id"] for w in mine for e in w.events if e["e"] == "acked"}
            print(
                f"{backend} {subscription}: {len(wanted)} messages, {len(received)} deliveries "
                f"to {len(mine)} killed consumers ({len(received) - len(set(received))} again), "
                f"{len(acked)} acked by them, {len(drained)} drained"
            )
            assert acked, f"{subscription}: its consumers acked nothing before they died"
        await settled(pq)
        assert problems == []
        assert self_killed > 0  # some died inside a store call, not only between them
        for subscription in SUBSCRIPTIONS:
            queue = layout.subscription_queue("t", subscription)
            assert await pq.store.list(layout.messages_prefix(queue)) == []
        assert await pq.store.list(layout.messages_prefix("t")) == []
