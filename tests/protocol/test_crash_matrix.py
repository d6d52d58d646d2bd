"""Crash matrix: real client processes killed with SIGKILL inside every operation.

Producers (publish, publish_batch), consumers (claim, lease refresh, ack, nack, settlement of
batch members) and redrives of dead letters run as processes (``tests/workers/crash_worker.py``) on
the filesystem and S3 stores. Most are killed by their own store wrapper at a random store
call inside the operation (before it, while it is in flight, or after it returned); the rest
by the test at a random moment. The trials of one store share its topics (one per
operation), so workers also meet what killed ones left behind. Then the test re-runs the
interrupted redrives, drains every topic with a consumer of its own, and checks from the
workers' journals that every message is accounted for exactly as the protocol allows:

- every published message (and every one whose publish was cut short but got written) is
  acked or a dead letter according to its fate, once: nothing lost, nothing unknown, no
  corrupt object, no message both acked and dead-lettered;
- an object is never read again once a worker deleted it, nor a batch member once a lease
  write carried its settlement (a member whose settlement was not yet written when its
  worker died is redelivered: that is the protocol, and the summary counts them);
- after a redrive re-run, each dead letter it targeted is pending exactly once and no longer
  a dead letter; the others are untouched;
- the only leases left are orphans of objects a worker was deleting when it died.

Each trial's seed is ``BASE_SEED + store offset + trial index``; failures name the seeds of
the trials that touched the message.
"""

from __future__ import annotations

import asyncio
import collections
import json
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import LeaseBody, decode_batch
from tests.helpers.stores import queue_config_dict
from tests.helpers.support import settled, sigkill
from tests.workers.crash_worker import TARGET

ROLES = ("publish", "claim", "refresh", "ack", "nack", "batch", "redrive")
TRIALS_PER_ROLE = 10
PARALLEL = 3
BASE_SEED = 7_340_000
SEED_OFFSET = {"filesystem": 0, "s3": 100_000}
PARENT_KILL_EVERY = 4  # every 4th trial of a role is killed by the test at a random moment
# Kill points are drawn from the first CALLS[role] store calls of the operation.
# An ack's lease delete may share a request with the next ack's message delete: 3 acks make
# 4 to 6 calls.
CALLS = {"publish": 5, "claim": 9, "refresh": 12, "ack": 4, "nack": 9, "batch": 10, "redrive": 9}
PARENT_DELAY = {"refresh": 2.0, "batch": 2.0}  # else 0.06 s: about how long the work lasts
COUNT = {"publish": 4, "claim": 4, "refresh": 3, "ack": 3, "nack": 3, "batch": 6, "redrive": 3}
WORKER = str(Path(__file__).parents[1] / "workers" / "crash_worker.py")
WORKER_TIMEOUT = 60.0
DRAIN_TIMEOUT = 90.0


_STATUS_LOST = 255  # what asyncio reports for a child whose exit status another waiter took


@dataclass
class Trial:
    index: int
    seed: int
    role: str
    kill: dict[str, Any] | None
    delay: float
    journal: Path
    ids: list[str] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def died_in_target(self) -> bool:
        if any(e["e"] == "kill" for e in self.events):
            return True
        phases = [e["p"] for e in self.events if e["e"] == "phase"]
        return self.returncode == -9 and bool(phases) and phases[-1] == TARGET[self.role]


@dataclass
class Known:
    """A message the test knows of: published by it, or by a worker (confirmed or intended)."""

    token: str
    fate: str
    topic: str
    confirmed: bool


@dataclass
class World:
    """Everything the audit needs to know about one store's run."""

    known: dict[str, Known] = field(default_factory=dict)
    batch_of: dict[str, str] = field(default_factory=dict)  # member id -> batch object key
    redrive_ids: list[str] = field(default_factory=list)
    touched: dict[str, set[int]] = field(default_factory=lambda: collections.defaultdict(set))
    problems: list[str] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    def problem(self, message_id: str, text: str) -> None:
        seeds = sorted(self.touched.get(message_id, ()))
        known = self.known.get(message_id)
        topic = f" of topic {known.topic}" if known is not None else ""
        self.problems.append(f"message {message_id}{topic}: {text} (trial seeds {seeds})")


def matrix_config(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    config: dict[str, Any] = queue_config_dict(backend, request, tmp_path)
    config["polling"] = {
        "interval_seconds": 0.05,
        "max_messages_per_poll": 10,
        "visibility_timeout_seconds": 2.0,
        "lease_refresh_interval_seconds": 0.4,
    }
    config["concurrency"] = {"strategy": "conditional_write", "clock_skew_margin_seconds": 0.1}
    return config


async def prepare(pq: PawnQueue, world: World, rng: random.Random) -> None:
    """Create the topics and publish what the consumer and redrive trials will work on."""
    producer = await pq.register_producer("crash-producer")
    for role in ROLES:
        # A refresh trial dies inside one of the lease refreshes it makes: a lease a message
        # gives it enough of them (a run's lease is refreshed once for its second).
        await pq.create_topic(role, claims="message" if role == "refresh" else "second")
        await pq.registry.register("consumers", f"crash-{role}")
    fates = {"ack": ["ack"], "nack": ["nack"], "redrive": ["nack"]}
    for role in ("claim", "refresh", "ack", "nack", "redrive"):
        for _ in range(TRIALS_PER_ROLE * (COUNT[role] + 1)):
            token, fate = f"{role}-{len(world.known)}", rng.choice(fates.get(role, ["ack", "nack"]))
            message_id = await producer.publish(role, {"token": token, "fate": fate})
            world.known[message_id] = Known(token, fate, role, confirmed=True)
    for _ in range(TRIALS_PER_ROLE * 3):
        payloads = [
            {"token": f"batch-{len(world.known)}-{m}", "fate": rng.choice(["ack", "nack"])}
            for m in range(3)
        ]
        ids = await producer.publish_batch("batch", payloads)
        for message_id, payload in zip(ids, payloads, strict=True):
            world.known[message_id] = Known(payload["token"], payload["fate"], "batch", True)
    for meta in await pq.store.list(layout.messages_prefix("batch")):
        for member in decode_batch((await pq.store.get(meta.key)).data):
            world.batch_of[member.id] = meta.key
    # Dead letters for the redrive trials, made by a consumer that does not crash.
    world.redrive_ids = [i for i, k in world.known.items() if k.topic == "redrive"]
    preparer = await pq.register_consumer("crash-preparer", ["redrive"])
    while len(await pq.store.list(layout.dead_letter_prefix("redrive"))) < len(world.redrive_ids):
        for message in await preparer.poll(wait=1.0):
            await message.nack()


def plan(backend: str, world: World, tmp_path: Path, rng: random.Random) -> list[Trial]:
    roles = [role for role in ROLES for _ in range(TRIALS_PER_ROLE)]
    rng.shuffle(roles)
    trials = []
    redrive_chunks = iter(range(0, len(world.redrive_ids), COUNT["redrive"]))
    nth: collections.Counter[str] = collections.Counter()
    for index, role in enumerate(roles):
        seed = BASE_SEED + SEED_OFFSET[backend] + index
        trial_rng = random.Random(seed)
        kill = None
        nth[role] += 1
        if nth[role] % PARENT_KILL_EVERY:
            kill = {
                "index": trial_rng.randrange(CALLS[role]),
                "phase": trial_rng.choice(["before", "during", "after"]),
                # A redrive first reads every dead letter: aim at the moves after that.
                "verbs": ["put", "delete"] if role == "redrive" else None,
            }
        delay = trial_rng.uniform(0.0, PARENT_DELAY.get(role, 0.06))
        trial = Trial(index, seed, role, kill, delay, tmp_path / f"journal-{index}.jsonl")
        if role == "redrive":
            start = next(redrive_chunks)
            trial.ids = world.redrive_ids[start : start + COUNT["redrive"]]
        trials.append(trial)
    return trials


async def run_trial(trial: Trial, config: dict[str, Any], slots: asyncio.Semaphore) -> None:
    worker_config = {**config, "polling": {**config["polling"], "max_messages_per_poll": 4}}
    spec = {
        "config": worker_config,
        "role": trial.role,
        "trial": trial.index,
        "seed": trial.seed,
        "journal": str(trial.journal),
        "count": COUNT[trial.role],
        "ids": trial.ids,
        "kill": trial.kill,
    }
    killed_by_test = False
    async with slots:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            WORKER,
            json.dumps(spec),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            async with asyncio.timeout(WORKER_TIMEOUT):
                if trial.kill is None:
                    assert process.stdout is not None
                    if await process.stdout.readline() == b"ready\n":
                        await asyncio.sleep(trial.delay)
                        sigkill(process)
                        killed_by_test = True
                _, stderr = await process.communicate()
        except TimeoutError:
            stderr = f"still running after {WORKER_TIMEOUT:g} s".encode()
        finally:
            hung = process.returncode is None
            if hung:
                sigkill(process)
                await process.wait()
    trial.returncode = None if hung else process.returncode
    trial.stderr = stderr.decode(errors="replace")[-3000:]
    if trial.journal.exists():
        trial.events = [json.loads(line) for line in trial.journal.read_text().splitlines()]
    if trial.returncode == _STATUS_LOST and not trial.stderr:
        # asyncio reports 255 when the child was reaped by another waiter first (CPython's
        # subprocess._cleanup can reap a reused pid). How the worker ended is then known from
        # its journal, written just before its SIGKILL or its exit, or from the test's kill.
        last = trial.events[-1]["e"] if trial.events else ""
        if last == "kill" or killed_by_test:
            trial.returncode = -9
        elif last == "done":
            trial.returncode = 0


async def drain(pq: PawnQueue) -> list[tuple[str, str, str, str]]:
    """Consume every topic until no message object is left; return (id, token, topic, action)."""
    consumer = await pq.register_consumer("crash-drainer", list(ROLES))
    receipts: list[tuple[str, str, str, str]] = []
    async with asyncio.timeout(DRAIN_TIMEOUT):
        while True:
            messages = await consumer.poll(wait=0.5)
            for message in messages:
                # Redriven messages are done with; the others go where their fate says.
                action = "ack" if message.topic == "redrive" else message.payload["fate"]
                receipts.append((message.id, message.payload["token"], message.topic, action))
                await (message.ack() if action == "ack" else message.nack())
            if not messages and not any(
                [await pq.store.list(layout.messages_prefix(t), limit=1) for t in ROLES]
            ):
                return receipts


def object_ids(world: World, key: str) -> list[str]:
    """The message ids held by a pending object's key."""
    pending = layout.parse_pending_key(key)
    if pending is None:
        return []
    if pending.kind == "batch":
        return [m for m, k in world.batch_of.items() if k == key]
    return [pending.object_id]


async def pending_counts(pq: PawnQueue, topic: str) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()
    for meta in await pq.store.list(layout.messages_prefix(topic)):
        pending = layout.parse_pending_key(meta.key)
        if pending is not None and pending.kind != "batch":
            counts[pending.object_id] += 1
    return counts


async def dead_letter_ids(pq: PawnQueue, topic: str) -> set[str]:
    metas = await pq.store.list(layout.dead_letter_prefix(topic))
    return {m.key.rsplit("/", 1)[-1].removesuffix(".json") for m in metas}


class Read(NamedTuple):
    """A delivery: by the worker of trial ``seed`` (-1: the drain), and when its object was read."""

    seed: int
    id: str
    token: str
    at: float


@dataclass
class Evidence:
    """What the journals say happened."""

    intents: dict[str, str] = field(default_factory=dict)  # token -> fate, publishes begun
    acked: set[str] = field(default_factory=set)  # ack() returned
    deleted: set[str] = field(default_factory=set)  # a worker began to delete the object
    gone_at: dict[str, float] = field(default_factory=dict)  # ... and finished, at
    settled_at: dict[str, float] = field(default_factory=dict)  # batch member in the lease, at
    received: list[Read] = field(default_factory=list)
    redrive: set[str] = field(default_factory=set)  # redrive begun
    member_settled: dict[str, float] = field(default_factory=dict)  # batch member ack() returned
    # Batch members whose settlement began before a lease write that began: it may carry them
    # (an ack returns once a lease write carrying its member landed, rule 13).
    maybe_settled: set[str] = field(default_factory=set)


def learn(world: World, trials: list[Trial]) -> Evidence:
    ev = Evidence()
    for trial in trials:
        settled_here: dict[str, set[str]] = collections.defaultdict(set)  # lease key -> members
        writing: dict[str, set[str]] = {}  # lease key -> members in the write under way
        intended: dict[str, set[str]] = collections.defaultdict(set)  # lease key -> members
        read_at: dict[str, float] = {}  # object id -> when this worker last read it
        for e in trial.events:
            kind, key, done = e["e"], e.get("key", ""), e.get("s") == "done"
            if kind == "intent-publish":
                ev.intents.update((p["token"], p["fate"]) for p in e["payloads"])
            elif kind == "published":
                for token, message_id in zip(e["tokens"], e["ids"], strict=True):
                    world.known[message_id] = Known(token, ev.intents[token], "publish", True)
                    world.touched[message_id].add(trial.seed)
            elif kind == "intent-redrive":
                ev.redrive.update(e["ids"])
                for message_id in e["ids"]:
                    world.touched[message_id].add(trial.seed)
            elif "id" in e:  # received, intent-ack/nack, acked/nacked, lease-lost
                message_id = e["id"]
                world.touched[message_id].add(trial.seed)
                batch_key = world.batch_of.get(message_id)
                if kind == "received":
                    obj = object_id(batch_key) if batch_key else message_id
                    at = read_at.get(obj, e["t"])
                    ev.received.append(Read(trial.seed, message_id, e["token"], at))
                if kind == "acked":
                    ev.acked.add(message_id)
                if kind.startswith("intent-") and batch_key:
                    intended[lease_of(batch_key)].add(message_id)
                if kind in ("acked", "nacked") and batch_key:
                    settled_here[lease_of(batch_key)].add(message_id)
                    ev.member_settled.setdefault(message_id, e["t"])
            elif kind == "get" and done:
                read_at[object_id(key)] = e["t"]
            elif kind == "put" and "/leases/" in key:
                # A lease write carries the members settled before it began.
                if not done:
                    writing[key] = set(settled_here[key])
                    ev.maybe_settled |= intended[key]
                for member in writing.pop(key, ()) if done else ():
                    ev.settled_at[member] = min(ev.settled_at.get(member, e["t"]), e["t"])
            elif kind == "delete" and "/messages/" in key:
                for message_id in object_ids(world, key):
                    if done:
                        ev.gone_at[message_id] = min(ev.gone_at.get(message_id, e["t"]), e["t"])
                    else:
                        ev.deleted.add(message_id)
    return ev


def object_id(key: str) -> str:
    pending = layout.parse_pending_key(key)
    assert pending is not None, key
    return pending.object_id


def lease_of(batch_key: str) -> str:
    return layout.lease_key("batch", object_id(batch_key))


async def check_redrive(pq: PawnQueue, world: World, ev: Evidence) -> None:
    """Re-run the interrupted redrives; then each message is pending once or a dead letter."""
    pending, dead = await pending_counts(pq, "redrive"), await dead_letter_ids(pq, "redrive")
    world.stats["redrive: pending and dead letter after the kills"] = len(set(pending) & dead)
    await pq.redrive("redrive", ids=sorted(ev.redrive))
    pending, dead = await pending_counts(pq, "redrive"), await dead_letter_ids(pq, "redrive")
    for message_id in world.redrive_ids:
        where = f"{pending[message_id]} pending copies, dead letter: {message_id in dead}"
        if message_id in ev.redrive and (pending[message_id] != 1 or message_id in dead):
            world.problem(message_id, f"redriven again after a crash: {where}")
        if message_id not in ev.redrive and (pending[message_id] or message_id not in dead):
            world.problem(message_id, f"never redriven: {where}")
    for message_id in set(pending) - set(world.redrive_ids):
        world.problem(message_id, "pending in topic redrive but never published there")


async def leases_left(pq: PawnQueue, topic: str) -> list[tuple[str, str]]:
    """The leases left in ``topic``, each with the id it is named after, or for a run's
    (named after its second) the message it names: the first it took (all were settled)."""
    left = []
    for meta in await pq.store.list(layout.leases_prefix(topic)):
        owner = layout.lease_id_of(meta.key)
        if layout.run_end(owner) is not None:
            owner = LeaseBody.decode((await pq.store.get(meta.key)).data).message_id
        left.append((meta.key, owner))
    return left


def audit(
    world: World,
    ev: Evidence,
    drained: list[tuple[str, str, str, str]],
    dead: dict[str, dict[str, tuple[str, str]]],
    leases: dict[str, list[tuple[str, str]]],
) -> None:
    """Check every message against the journals and what the drain found."""
    reads = ev.received + [Read(-1, i, tok, float("inf")) for i, tok, _, _ in drained]
    letters = [(i, tok) for d in dead.values() for i, (tok, _) in d.items()]
    for message_id, token in [(r.id, r.token) for r in reads] + letters:
        known = world.known.get(message_id)
        if known is None and token in ev.intents:  # a publish that died after its write
            world.known[message_id] = Known(token, ev.intents[token], "publish", False)
        elif known is None or known.token != token:
            world.problem(message_id, f"token {token!r} is not the one published with this id")
    # An object deleted, or a batch member whose settlement reached the lease, is never read again.
    for read in reads:
        who = f"worker {read.seed}" if read.seed >= 0 else "the drain"
        if read.at > ev.gone_at.get(read.id, read.at):
            world.problem(read.id, f"read by {who} after a worker deleted its object")
        if read.at > ev.settled_at.get(read.id, read.at):
            world.problem(read.id, f"read by {who} after its settlement was in the lease")
    confirmed = {k.token for k in world.known.values() if k.confirmed}
    landed = {k.token for k in world.known.values() if not k.confirmed}
    unconfirmed = len(set(ev.intents) - confirmed)
    world.stats["publishes killed before returning: written / not"] = (
        f"{len(landed)} / {unconfirmed - len(landed)}"
    )
    drained_as = {i: action for i, _, _, action in drained}
    drained_count = collections.Counter(i for i, _, _, _ in drained)
    for message_id, known in world.known.items():
        in_dead = message_id in dead[known.topic]
        if known.topic == "redrive":
            expected_dead = message_id not in ev.redrive
            if in_dead != expected_dead or drained_count[message_id] != (not expected_dead):
                world.problem(
                    message_id,
                    f"redrive: dead letter {in_dead}, drained {drained_count[message_id]} times",
                )
            continue
        if drained_count[message_id] > 1:
            world.problem(message_id, f"drained {drained_count[message_id]} times")
        if known.fate == "nack":
            if not in_dead and (known.confirmed or message_id in drained_as):
                world.problem(message_id, "nacked (or to be) but not in dead-letter")
        elif in_dead:
            world.problem(message_id, "in dead-letter but it was only ever acked")
        elif known.confirmed and not (
            drained_as.get(message_id) == "ack"
            or message_id in ev.acked
            or message_id in ev.deleted
            or message_id in ev.maybe_settled
        ):
            world.problem(message_id, "lost: never acked, not pending, not a dead letter")
    for topic, letters in dead.items():
        for message_id, (_, reason) in letters.items():
            if reason != "nack":
                world.problem(message_id, f"dead letter in {topic} with reason {reason!r}")
    # A crash between the two deletes of a settlement leaves a lease without its object
    # (docs/protocol.md, "Orphan leases"); any other leftover lease is a leak.
    orphans = 0
    for left in leases.values():
        for key, owner in left:
            members = [m for m, k in world.batch_of.items() if owner in k] or [owner]
            if not any(m in ev.deleted for m in members):
                world.problem(owner, f"lease {key} left behind, its object never deleted")
            orphans += 1
    world.stats["orphan leases (crash between the two deletes)"] = orphans


def summarise(world: World, trials: list[Trial], ev: Evidence, seconds: float) -> str:
    lines = [f"{'role':<8} trials self-killed test-killed died-in-op finished"]
    for role in ROLES:
        mine = [t for t in trials if t.role == role]
        killed = [t for t in mine if t.returncode == -9]
        lines.append(
            f"{role:<8} {len(mine):>6} {sum(t.kill is not None for t in killed):>11}"
            f" {sum(t.kill is None for t in killed):>11} {sum(t.died_in_target for t in mine):>10}"
            f" {sum(t.returncode == 0 for t in mine):>8}"
        )
    points = collections.Counter(
        f"{e['verb']} {e['key'].split('/')[1] if '/' in e['key'] else e['key']} {e['phase']}"
        for t in trials
        for e in t.events
        if e["e"] == "kill"
    )
    reads = collections.Counter(r.id for r in ev.received)
    world.stats["messages read by more than one worker"] = sum(n > 1 for n in reads.values())
    # Rule 13: a member's ack() returns once its settlement is in the lease (or its object is
    # deleted), so no worker reads it again after that.
    again = {r.id for r in ev.received if r.at > ev.member_settled.get(r.id, r.at)}
    world.stats["batch members read again after their ack() returned"] = len(again)
    for message_id in sorted(again):
        world.problem(message_id, "a batch member read again after its ack() returned")
    world.stats["kill points"] = dict(sorted(points.items()))
    world.stats["seconds"] = round(seconds, 1)
    return "\n".join(lines + [f"{k}: {v}" for k, v in world.stats.items()])


@pytest.mark.parametrize("backend", ["filesystem", "s3"])
async def test_crash_matrix(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    started = time.monotonic()
    config = matrix_config(backend, request, tmp_path)
    world = World()
    rng = random.Random(BASE_SEED + SEED_OFFSET[backend] - 1)
    async with await PawnQueue.from_config(config) as pq:
        async with asyncio.timeout(120):
            await prepare(pq, world, rng)
        trials = plan(backend, world, tmp_path, rng)
        slots = asyncio.Semaphore(PARALLEL)
        await asyncio.gather(*(run_trial(t, config, slots) for t in trials))
        for trial in trials:
            if trial.returncode not in (0, -9):
                world.problems.append(
                    f"trial seed {trial.seed} ({trial.role}) exited {trial.returncode}: "
                    f"{trial.stderr}"
                )
        ev = learn(world, trials)
        await check_redrive(pq, world, ev)
        for topic in ROLES:
            for message_id, copies in (await pending_counts(pq, topic)).items():
                if copies > 1:
                    world.problem(message_id, f"{copies} pending objects in {topic}")
        drained = await drain(pq)
        await settled(pq)  # the deletes of the drain's own acks' leases
        dead = {
            topic: {d.id: (d.payload["token"], d.reason) for d in await pq.dead_letters(topic)}
            for topic in ROLES
        }
        leases = {t: await leases_left(pq, t) for t in ROLES}
    audit(world, ev, drained, dead, leases)
    summary = summarise(world, trials, ev, time.monotonic() - started)
    summary = f"crash matrix on {backend}, base seed {BASE_SEED + SEED_OFFSET[backend]}\n{summary}"
    print(f"\n{summary}")
    assert not world.problems, "\n".join([summary, *world.problems[:30]])
    for role in ROLES:
        hits = sum(t.died_in_target for t in trials if t.role == role)
        assert hits >= TRIALS_PER_ROLE // 2, f"{role}: only {hits} trials died inside it\n{summary}"
