"""The queue on S3 through a fault-injecting proxy (``tests/servers/fault_proxy.py``) before
SeaweedFS.

What the S3 client (obstore 0.12, Rust ``object_store``) does with a failed request, measured
through the proxy (``RetryConfig`` from ``s3.max_retries`` and ``s3.retry_timeout_seconds``):

* 5xx answers (500 InternalError, 503 SlowDown) are retried for every request, conditional
  PUTs and DeleteObjects included, up to ``max_retries`` times within ``retry_timeout``.
* A broken connection (before or after the server applied the request) and a timeout are
  retried for GET, HEAD, LIST and unconditional PUTs only. A create-only or if-match PUT and
  a DeleteObjects POST fail at once with an unknown outcome: pawn-queue reads the lease back
  (rule 6), resends deletes itself, and writes a message again only after a look found
  neither the message nor a lease naming it (a blind resend, as of a plain PUT, wrote a
  message that was consumed and acked in the 100 ms between a second time).
* Backoff has decorrelated jitter: the first wait is 100 ms, each next one is drawn from
  ``[100 ms, 2 x previous)``. Waits grow on average, not monotonically, and vary by run.
* The signature covers ``Host``, which SeaweedFS checks as received: the proxy forwards it
  unchanged (a rewritten one gets 403 SignatureDoesNotMatch on a server with identities).
* SeaweedFS holds a conditional write competing with another on the same key about a second,
  then applies it: request timeouts here are never below 3 s.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import LeaseLostError, Message, PawnQueue, PawnQueueError
from pawn_queue._protocol import layout
from pawn_queue._protocol.envelope import now_utc
from pawn_queue.config import S3Config, load_config
from pawn_queue.consumer import Consumer
from pawn_queue.exceptions import PublishError, StoreError, StoreUnavailable
from pawn_queue.store import open_store
from pawn_queue.store.s3 import S3Store
from tests.helpers.faults import FaultyStore
from tests.helpers.stores import FAST_CONCURRENCY, queue_config_dict
from tests.helpers.support import settled
from tests.servers.fault_proxy import FaultKind, FaultProxy, FaultRule
from tests.servers.seaweedfs import SeaweedFS

LEASES = "/leases/"
MESSAGES = "/messages/"


@pytest.fixture
def proxy(seaweedfs: SeaweedFS) -> Iterator[FaultProxy]:
    with FaultProxy(seaweedfs.endpoint, seed=7, max_lifetime_seconds=300) as running:
        yield running


def proxied(
    request: pytest.FixtureRequest, tmp_path: Path, proxy: FaultProxy, **s3: Any
) -> dict[str, Any]:
    """The fast test config on a fresh bucket, through the proxy."""
    config = queue_config_dict("s3", request, tmp_path)
    timeouts = {"request_timeout_seconds": 10.0, "connect_timeout_seconds": 1.0}
    retries = {"max_retries": 3, "retry_timeout_seconds": 10.0}
    extra = {"endpoint_url": proxy.endpoint, **timeouts, **retries, **s3}
    return {**config, "s3": {**config["s3"], **extra}}


def mixed(rate: float, *, slow: float = 0.3) -> list[FaultRule]:
    """``rate`` of all requests hit by a fault, split evenly over five kinds."""
    kinds = ("error_500", "slowdown_503", "reset", "drop_response", "slow")
    return [FaultRule(kind, rate / len(kinds), delay_seconds=slow) for kind in kinds]


async def patiently(call: Callable[[], Awaitable[Any]], attempts: int = 50) -> Any:
    """Repeat a call that failed transiently, as an application would."""
    for attempt in itertools.count():
        try:
            return await call()
        except (StoreError, PublishError):
            if attempt >= attempts:
                raise


async def keys(pq: PawnQueue, prefix: str) -> list[str]:
    await settled(pq)
    return [m.key for m in await patiently(lambda: pq.store.list(prefix))]


# -- 1. drain under faults ------------------------------------------------------------------


@dataclass
class Delivery:
    seq: int
    message: Message
    consumer: str
    at: datetime
    outcome: str = "pending"  # acked | lost (LeaseLostError) | failed (ack kept failing)

    @property
    def lease_expiry(self) -> datetime:
        """When the lease expired as last written by this holder."""
        return self.message._claimed.lease.expires


@dataclass
class Ledger:
    published: dict[int, str] = field(default_factory=dict)  # seq -> id returned
    raised: set[int] = field(default_factory=set)  # publish raised (may still have landed)
    # Publishes that lasted longer than the shortest tombstone: a look after that finds
    # nothing, so their resend may write them again after an ack (docs/protocol.md, Publish).
    outlasted_tombstone: set[int] = field(default_factory=set)
    deliveries: list[Delivery] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    poll_errors: int = 0

    async def add(self, delivery: Delivery) -> None:
        async with self.changed:
            self.deliveries.append(delivery)
            self.changed.notify_all()

    async def settle(self, delivery: Delivery, *, requeue: bool | None = None) -> None:
        """Ack (or nack, when ``requeue`` is given) until it works or the lease is lost."""
        for _ in range(50):
            try:
                if requeue is None:
                    await delivery.message.ack()
                else:
                    await delivery.message.nack(requeue=requeue)
            except LeaseLostError:
                delivery.outcome = "lost"
                break
            except StoreError:
                continue
            delivery.outcome = "acked"
            break
        else:
            delivery.outcome = "failed"
            delivery.message.abandon()
        async with self.changed:
            self.changed.notify_all()

    def all_acked(self) -> bool:
        acked = {d.message.id for d in self.deliveries if d.outcome == "acked"}
        return set(self.published.values()) <= acked


async def consume(
    consumer: Consumer,
    ledger: Ledger,
    stop: asyncio.Event,
    stalling: asyncio.Event,
    *,
    stall_once: bool = False,
) -> None:
    """Poll and ack until ``stop``. ``stall_once``: the first batch is held with lease
    refreshes paused (a stalled process) until another consumer took one of them over; the
    others start once it holds that batch (``stalling``), or they could take every message."""
    if not stall_once:
        await stalling.wait()
    while not stop.is_set():
        try:
            messages = await consumer.poll(wait=0.3)
        except StoreError:
            ledger.poll_errors += 1
            continue
        batch = [Delivery(m.payload["seq"], m, consumer.name, now_utc()) for m in messages]
        for delivery in batch:
            await ledger.add(delivery)
        if stall_once and batch:
            stall_once = False
            stalling.set()
            await stall_until_taken_over(consumer, ledger, {d.seq for d in batch}, batch[0].at)
        for delivery in batch:
            await ledger.settle(delivery)


async def stall_until_taken_over(
    consumer: Consumer, ledger: Ledger, seqs: set[int], since: datetime
) -> None:
    """Stop refreshing leases until another consumer was given one of ``seqs`` after
    ``since`` (an earlier delivery is no takeover)."""
    consumer.held_leases.paused = True

    def taken_over() -> bool:
        return any(
            d.seq in seqs and d.consumer != consumer.name and d.at > since
            for d in ledger.deliveries
        )

    async with asyncio.timeout(20), ledger.changed:
        await ledger.changed.wait_for(taken_over)
    consumer.held_leases.paused = False


def check_deliveries(ledger: Ledger) -> dict[str, int]:
    """Every published message acked; every redelivery explained.

    A redelivery is explained by a lease that expired (its holder lost it or gave up) before
    the message was delivered again. After an ack, only by a redrive that was repeated (a
    second object with the same id), or by a publish that outlasted the shortest tombstone
    (the one case left to chance): any other publish whose answer was lost is never written
    again once it landed, so it is never delivered again after an ack.
    """
    by_seq: dict[int, list[Delivery]] = defaultdict(list)
    for delivery in ledger.deliveries:
        by_seq[delivery.seq].append(delivery)
    assert set(by_seq) <= set(ledger.published) | ledger.raised, "delivered but never published"
    counts = {"deliveries": len(ledger.deliveries), "after_expiry": 0, "second_write": 0}
    for seq, deliveries in by_seq.items():
        deliveries.sort(key=lambda d: d.at)
        trail = [(d.consumer, d.outcome, d.at.time(), d.lease_expiry.time()) for d in deliveries]
        assert len({d.message.id for d in deliveries}) == 1, (seq, "two ids", trail)
        assert deliveries[-1].outcome == "acked", (seq, trail)
        for earlier, later in itertools.pairwise(deliveries):
            if earlier.outcome == "acked":
                objects = {d.message._claimed.key for d in (earlier, later)}  # 2: redriven twice
                explained = len(objects) == 2 or seq in ledger.outlasted_tombstone
                assert explained, (seq, "redelivered after an ack", trail)
                counts["second_write"] += 1
                continue
            assert earlier.outcome in ("lost", "failed"), (seq, trail)
            assert later.at > earlier.lease_expiry, (seq, "redelivered within a lease", trail)
            counts["after_expiry"] += 1
    for seq, message_id in ledger.published.items():
        assert by_seq[seq] and by_seq[seq][-1].message.id == message_id, f"seq {seq} lost"
    return counts


async def drain(
    pq: PawnQueue,
    consumer: Consumer,
    ledger: Ledger,
    requeue: Callable[[int], bool | None] = lambda seq: None,
) -> None:
    """Poll until no message is left, recording each delivery; ack it, or nack it when
    ``requeue(seq)`` says True or False."""
    async with asyncio.timeout(60):
        while await keys(pq, layout.messages_prefix("t")):
            for message in await patiently(lambda: consumer.poll(wait=0.5)):
                delivery = Delivery(message.payload["seq"], message, consumer.name, now_utc())
                await ledger.add(delivery)
                await ledger.settle(delivery, requeue=requeue(delivery.seq))


async def assert_empty(
    pq: PawnQueue, topic: str, orphans: frozenset[str] | set[str] = frozenset()
) -> None:
    """No message or dead letter left, and no lease but ``orphans``."""
    assert set(await keys(pq, layout.leases_prefix(topic))) <= orphans
    for prefix in (layout.messages_prefix, layout.dead_letter_prefix):
        assert await keys(pq, prefix(topic)) == []


def unknown_claims(caplog: pytest.LogCaptureFixture, *outcomes: str) -> set[str]:
    """The lease keys of claims given up with an unknown outcome (``outcomes``: how the
    request failed). Such a claim may have landed after all, even on a message that was gone
    by then: its lease blocks nothing, is swept as an orphan, and only that explains it."""
    found = set()
    for record in caplog.records:
        text = record.getMessage()
        if text.startswith("claim failed"):
            match = re.search(r"key '([^']+)' at .*: (.+)$", text)
            # A store request's failure ("timed out"), or the claim's own bound's ("timed
            # out (outcome unknown)": a conflict answer resent past it, as with a 409).
            if match and match.group(2).removesuffix(" (outcome unknown)") in outcomes:
                found.add(match.group(1))
    return found


# rules, request timeout, visibility timeout
DRAIN_CASES: dict[str, tuple[list[FaultRule], float, float]] = {
    "no-faults": ([], 10.0, 2.0),
    "5pct-mixed": (mixed(0.05), 10.0, 2.0),
    "15pct-mixed": (mixed(0.15), 10.0, 2.0),
    # AWS's answer to concurrent conditional writes, to a third of claims, refreshes, acks
    # and publishes: resent, then a lost race, never a loss or an unexplained redelivery.
    "409-conflicts": ([FaultRule("conflict_409", 0.3)], 10.0, 2.0),
    # Stalled requests are never forwarded; slow ones are applied but answered after the
    # client gave up (an unknown outcome for conditional writes). A lease must outlive a
    # request that times out, so the visibility timeout exceeds the request timeout; and an
    # acked message's lease, kept until two safety windows (2.4 s) before it expires, must
    # outlive a publish that timed out after it landed, or the publish cannot tell.
    "stall": (
        [FaultRule("stall", 0.02, delay_seconds=3.5), FaultRule("slow", 0.02, delay_seconds=3.5)],
        3.0,
        8.0,
    ),
}


@pytest.mark.parametrize("case", list(DRAIN_CASES))
async def test_drain_under_faults(
    case: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules, timeout, visibility = DRAIN_CASES[case]
    config = proxied(request, tmp_path, proxy, request_timeout_seconds=timeout)
    config["polling"].update(
        visibility_timeout_seconds=visibility, lease_refresh_interval_seconds=visibility * 0.15
    )
    ledger, stop, stalling = Ledger(), asyncio.Event(), asyncio.Event()
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        queues = [await PawnQueue.from_config(config) for _ in range(3)]
        for queue in queues:
            await queue.setup()
        consumers = [await q.register_consumer(f"c{i}", ["t"]) for i, q in enumerate(queues)]
        proxy.set_rules(rules)
        tasks = [
            asyncio.create_task(consume(c, ledger, stop, stalling, stall_once=i == 0))
            for i, c in enumerate(consumers)
        ]
        refresh = visibility * 0.15
        window = FAST_CONCURRENCY["clock_skew_margin_seconds"] + min(1.0, visibility / 4)
        shortest_tombstone = visibility - refresh - 2 * window
        for seq in range(30 if case == "stall" else 60):
            started = time.monotonic()
            try:
                ledger.published[seq] = await producer.publish("t", {"seq": seq})
            except PublishError:
                ledger.raised.add(seq)
            if time.monotonic() - started > shortest_tombstone:
                ledger.outlasted_tombstone.add(seq)
        async with asyncio.timeout(60), ledger.changed:
            await ledger.changed.wait_for(ledger.all_acked)
        proxy.set_rules([])
        stop.set()
        async with asyncio.timeout(30):
            await asyncio.gather(*tasks)
            for queue in queues:
                await queue.teardown()
        # Publishes that raised may have landed: drain them too.
        await drain(pq, await pq.register_consumer("drain", ["t"]), ledger)
        # A claim that timed out, was read back and not found, and landed after all leaves a
        # lease on a message that is gone: it blocks nothing, and only a timeout explains it.
        await assert_empty(pq, "t", unknown_claims(caplog, "timed out"))
    counts = check_deliveries(ledger)
    assert counts["after_expiry"] >= 1  # the stalled consumer's message at least
    stats = {k: v for k, v in sorted(proxy.stats().items()) if ":" not in k}
    assert sum(stats.get(rule.kind, 0) for rule in rules) > 0 or not rules
    print(case, counts, f"raised={len(ledger.raised)} poll_errors={ledger.poll_errors}", stats)


# -- 2. dead letters under faults -----------------------------------------------------------


async def test_dead_letters_and_redrive_under_faults(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with await PawnQueue.from_config(proxied(request, tmp_path, proxy)) as pq:
        await pq.create_topic("t", max_receive_count=2)
        producer = await pq.register_producer("p")
        ids = {seq: await producer.publish("t", {"seq": seq}) for seq in range(20)}
        consumer = await pq.register_consumer("c", ["t"])
        proxy.set_rules(mixed(0.15))
        # Even: nacked, so dead-lettered at once. Odd: requeued until the third receive
        # dead-letters it (max_receive_count).
        await drain(pq, consumer, Ledger(), requeue=lambda seq: seq % 2 == 1)
        proxy.set_rules([])
        letters = await pq.dead_letters("t")
        assert sorted(letter.id for letter in letters) == sorted(ids.values())
        reasons = {letter.id: letter.reason for letter in letters}
        assert {seq: reasons[i] for seq, i in ids.items()} == {
            seq: "max_receive_count" if seq % 2 else "nack" for seq in ids
        }
        # A claim whose answer was dropped and whose read-back failed too may have landed,
        # even on a message dead-lettered by then from an older listing: an orphan lease.
        assert await keys(pq, layout.messages_prefix("t")) == []
        leases = set(await keys(pq, layout.leases_prefix("t")))
        assert leases <= unknown_claims(caplog, "connection failed")

        proxy.set_rules(mixed(0.15))
        redrive_errors = 0
        async with asyncio.timeout(60):
            while await patiently(lambda: pq.dead_letters("t")):
                try:
                    await pq.redrive("t")
                except (StoreError, PublishError):
                    redrive_errors += 1  # a retry rewrites what was not yet cleared
        ledger = Ledger(published=ids)
        await drain(pq, consumer, ledger)
        proxy.set_rules([])
        await assert_empty(pq, "t", unknown_claims(caplog, "connection failed"))
    counts = check_deliveries(ledger)
    assert counts["second_write"] == 0 or redrive_errors  # a second copy has a cause
    print("redrive", counts, f"redrive_errors={redrive_errors}", proxy.stats()["requests"])


# -- 3. bounded retries with backoff ---------------------------------------------------------


async def test_retries_are_bounded_and_back_off_with_jitter(
    request: pytest.FixtureRequest, tmp_path: Path, proxy: FaultProxy
) -> None:
    # The client's own retries, measured alone: no throttle backoff after them (a 503
    # SlowDown is sent again for throttle_timeout_seconds: tests/store/test_throttling.py).
    config = proxied(
        request,
        tmp_path,
        proxy,
        max_retries=5,
        retry_timeout_seconds=60,
        throttle_timeout_seconds=0.5,
    )
    runs: list[list[float]] = []
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        for kind in ("error_500", "slowdown_503", "error_500"):
            proxy.set_rules([FaultRule(kind, 1.0, frozenset({"put"}), key_pattern=MESSAGES)])
            before = len(proxy.injected())
            with pytest.raises(PublishError) as raised:
                await producer.publish("t", {"n": 1})
            assert isinstance(raised.value.__cause__, StoreUnavailable)
            times = [injection.time for injection in proxy.injected()[before:]]
            assert len(times) == 5 + 1  # max_retries + 1 attempts
            runs.append([b - a for a, b in itertools.pairwise(times)])
        # A broken connection on a GET: retried as often.
        proxy.set_rules([FaultRule("reset", 1.0, frozenset({"get"}))])
        before = proxy.stats().get("reset:get", 0)
        with pytest.raises(StoreUnavailable) as failed:
            await pq.store.get("t/.topic")
        assert isinstance(failed.value, PawnQueueError)
        assert proxy.stats()["reset:get"] - before == 5 + 1
        proxy.set_rules([])
        assert await keys(pq, layout.messages_prefix("t")) == []
    assert min(min(gaps) for gaps in runs) >= 0.1  # the first backoff: no attempt before it
    # Later waits are longer on average: the client's first pause is 0.1 s, each later one
    # drawn up to twice the one before. Over the three runs together: one slow request on a
    # loaded machine lengthened a run's first gap past its later ones' mean (0.34 s: 0.21).
    firsts, laters = [g[0] for g in runs], [x for g in runs for x in g[1:]]
    assert sum(laters) / len(laters) > sum(firsts) / len(firsts), runs
    # Jitter: the same failure sequence waits differently from one run to the next.
    assert max(abs(a - b) for a, b in zip(runs[0][1:], runs[2][1:], strict=True)) > 0.02

    # retry_timeout ends the retries before max_retries.
    store = S3Store(S3Config(**{**config["s3"], "max_retries": 50, "retry_timeout_seconds": 1}))
    proxy.set_rules([FaultRule("slowdown_503", 1.0, frozenset({"head"}))])
    started = proxy.stats().get("slowdown_503:head", 0)
    with pytest.raises(StoreUnavailable, match="HTTP 503"):
        await store.head("t/.topic")
    attempts = proxy.stats()["slowdown_503:head"] - started
    assert 2 <= attempts < 50 + 1
    await store.close()


# -- 4. answers lost after the server applied the request (rule 6) --------------------------


def dropped(operation: str, pattern: str) -> list[FaultRule]:
    return [FaultRule("drop_response", 1.0, frozenset({operation}), pattern, limit=1)]


@pytest.fixture
async def pair(request: pytest.FixtureRequest, tmp_path: Path, proxy: FaultProxy) -> Any:
    """A queue with a topic, a producer and a consumer, and a second queue's consumer; long
    leases (30 s) with rare refreshes, so that only the requests under test touch them."""
    config = proxied(request, tmp_path, proxy)
    config["polling"].update(visibility_timeout_seconds=30.0, lease_refresh_interval_seconds=10.0)
    async with (
        await PawnQueue.from_config(config) as pq,
        await PawnQueue.from_config(config) as other,
    ):
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumer = await pq.register_consumer("c", ["t"])
        rival = await other.register_consumer("rival", ["t"])
        yield pq, producer, consumer, rival


async def test_lost_answer_to_a_claim_is_recognised(pair: Any, proxy: FaultProxy) -> None:
    pq, producer, consumer, rival = pair
    mid = await producer.publish("t", {"n": 1})
    proxy.set_rules(dropped("put", LEASES))
    # Delivered now, by the poll that claimed it, not after the 30 s lease ran out.
    [message] = await consumer.poll(wait=5)
    assert proxy.stats()["drop_response:put"] == 1
    assert message.id == mid and message.receive_count == 1
    assert await rival.poll(wait=0.5) == []
    await message.ack()
    await assert_empty(pq, "t")


async def test_lost_answer_to_a_refresh_is_recognised(pair: Any, proxy: FaultProxy) -> None:
    pq, producer, consumer, rival = pair
    await producer.publish("t", {"n": 1})
    [message] = await consumer.poll(wait=5)
    proxy.set_rules(dropped("put", LEASES))
    await message.extend(20)  # if-match PUT applied, answer lost: the lease is still ours
    assert proxy.stats()["drop_response:put"] == 1
    await message.extend(20)  # an if-match on the etag read back
    assert await rival.poll(wait=0.5) == []
    await message.ack()
    await assert_empty(pq, "t")


def later_message_puts() -> FaultRule:
    """A rule that changes nothing and counts every PUT of a message after the rules before
    it (as ``slow:put``, a zero delay)."""
    return FaultRule("slow", 1.0, frozenset({"put"}), MESSAGES)


async def test_lost_answer_to_a_publish_writes_one_message(
    pair: Any, proxy: FaultProxy, caplog: pytest.LogCaptureFixture
) -> None:
    pq, producer, consumer, _ = pair
    proxy.set_rules([*dropped("put", MESSAGES), later_message_puts()])
    with caplog.at_level("INFO", logger="pawn_queue._protocol.landing"):
        mid = await producer.publish("t", {"n": 1})
    assert proxy.stats()["drop_response:put"] == 1
    # Not resent: the look found the message (docs/protocol.md, "Publish").
    assert proxy.stats().get("slow:put", 0) == 0
    assert "write landed though its answer was lost" in caplog.text
    [key] = await keys(pq, layout.messages_prefix("t"))
    assert mid in key
    [message] = await consumer.poll(wait=5)
    assert message.id == mid
    await message.ack()
    assert await consumer.poll(wait=0.5) == []
    await assert_empty(pq, "t")


async def test_a_stalled_publish_ends_at_its_deadline_saying_the_outcome_is_unknown(
    request: pytest.FixtureRequest, tmp_path: Path, proxy: FaultProxy
) -> None:
    """Every request on the message and its lease stalls: the PUTs, and the looks between
    them (HEAD, GET), each retried by the client, added up to minutes; now the publish
    gives up at request timeout x (max_retries + 1), and says its outcome is unknown."""
    config = proxied(request, tmp_path, proxy, request_timeout_seconds=1.0, max_retries=2)
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        operations = frozenset({"put", "head", "get"})
        proxy.set_rules([FaultRule("stall", 1.0, operations, "/(messages|leases)/", 60.0)])
        started = time.monotonic()
        with pytest.raises(PublishError) as caught:
            await producer.publish("t", {"n": 1})
        elapsed = time.monotonic() - started
        assert elapsed < 1.0 * (2 + 1) + 1.0, elapsed  # the deadline, and a second of slack
        assert "outcome unknown" in str(caught.value)
        proxy.set_rules([])
        assert await keys(pq, layout.messages_prefix("t")) == []  # stalled: never forwarded
        await producer.publish("t", {"n": 2})
        assert len(await keys(pq, layout.messages_prefix("t"))) == 1


async def test_lost_answer_to_a_publish_acked_meanwhile_is_not_written_again(
    request: pytest.FixtureRequest, tmp_path: Path, proxy: FaultProxy
) -> None:
    """The publish PUT lands and its answer is lost; a consumer claims and acks the message
    before the publish looks. The acked message's lease, kept a while, tells the publish
    that it landed: one delivery, one id, no second write."""
    config = proxied(request, tmp_path, proxy)
    config["polling"].update(visibility_timeout_seconds=30.0, lease_refresh_interval_seconds=10.0)
    acked = asyncio.Event()

    async def look_after_the_ack(operation: str, key: str) -> None:
        if operation == "head" and MESSAGES in key:
            await acked.wait()

    loaded = load_config(config)
    gated = FaultyStore(open_store(loaded), hooks=[look_after_the_ack])
    async with (
        await PawnQueue.from_config(config) as pq,
        PawnQueue(loaded, store=gated) as publishing_queue,
    ):
        await pq.create_topic("t")
        producer = await publishing_queue.register_producer("p")
        consumer = await pq.register_consumer("c", ["t"])
        # Applied, answer lost; a resend (as the S3 client makes of a plain PUT) is held back
        # long enough for the consumer to ack the first copy.
        stall = FaultRule("stall", 1.0, frozenset({"put"}), MESSAGES, delay_seconds=3, limit=1)
        proxy.set_rules([*dropped("put", MESSAGES), stall, later_message_puts()])
        async with asyncio.timeout(30):
            publishing = asyncio.create_task(producer.publish("t", {"n": 1}))
            [message] = await consumer.poll(wait=10)
            await message.ack()
            acked.set()
            mid = await publishing
        assert mid == message.id
        # Not delivered again (the consumer that acked it would not claim its key again soon).
        rival = await publishing_queue.register_consumer("rival", ["t"])
        assert await rival.poll(wait=1) == []
        assert proxy.stats()["drop_response:put"] == 1
        assert proxy.stats().get("stall:put", 0) == proxy.stats().get("slow:put", 0) == 0
        await assert_empty(pq, "t")


@pytest.mark.parametrize(
    ("target", "kind"), [(MESSAGES, "drop_response"), (LEASES, "drop_response"), (LEASES, "reset")]
)
async def test_failed_ack_delete_is_resent(
    target: str, kind: FaultKind, pair: Any, proxy: FaultProxy
) -> None:
    """The client does not resend a DeleteObjects whose connection broke: the store does.
    Applied or not, the message and its lease end up deleted, and the ack succeeds."""
    pq, producer, consumer, rival = pair
    await producer.publish("t", {"n": 1})
    [message] = await consumer.poll(wait=5)
    proxy.set_rules([FaultRule(kind, 1.0, frozenset({"delete"}), target, limit=1)])
    await message.ack()
    await settled(pq)  # the lease delete follows the ack
    assert proxy.stats()[f"{kind}:delete"] == 1
    assert await rival.poll(wait=0.5) == []
    await assert_empty(pq, "t")


async def test_listen_survives_failing_change_signals(pair: Any, proxy: FaultProxy) -> None:
    pq, producer, consumer, _ = pair
    # Twice max_retries + 1: the first two looks at the change signals fail.
    proxy.set_rules([FaultRule("error_500", 1.0, key_pattern="^_notify", limit=8)])
    handled: asyncio.Queue[str] = asyncio.Queue()

    async def handler(message: Message) -> None:
        await message.ack()
        handled.put_nowait(message.id)

    listening = asyncio.create_task(consumer.listen(handler))
    for _ in range(500):  # until a look at the signals failed (counted by the proxy's threads)
        if proxy.stats().get("error_500", 0) >= 4:
            break
        await asyncio.sleep(0.02)
    assert proxy.stats()["error_500"] >= 4
    mid = await producer.publish("t", {"n": 1})
    got = asyncio.ensure_future(handled.get())
    try:
        await asyncio.wait({listening, got}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        assert not listening.done(), f"listen() ended: {listening.exception()!r}"
        assert got.done() and got.result() == mid
    finally:
        for task in (listening, got):
            task.cancel()
        await asyncio.gather(listening, got, return_exceptions=True)
    await assert_empty(pq, "t")
