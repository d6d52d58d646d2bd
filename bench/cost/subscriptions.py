"""Subscriptions on S3 (one SeaweedFS on loopback): what fan-out costs against a plain topic,
in the same run on the same server.

1. throughput: ``--publishers`` (32) tasks call ``publish()`` one message at a time (group
   commit on, the default) on one producer, ``--messages`` (10,000) messages, while
   consumers ``listen()`` and ack:

   - baseline: a topic without subscriptions, 4 competing consumers;
   - 1, 3 and 10 subscriptions (no filter), 4 competing consumers per subscription.

   Every subscription must receive every message: deliveries are counted per subscription,
   and a run fails (exit status 1, details printed and kept in the JSON) on a message
   missing from a subscription, one it should not have, or one delivered twice within a
   subscription other than after its lease was lost (a later delivery with a higher receive
   count, no earlier delivery acked). msg/s per subscription: messages from the first publish
   to the last ack of the slowest subscription. Cost: the requests SeaweedFS counted for the
   bucket, from before the first publish to after the queue closed (publishes, claims, reads,
   acks, lease deletes, change signals, index reads), at AWS list prices (PUT/COPY/POST/LIST
   $5, GET/HEAD $0.40 per million, DELETE free), per message and per message per
   subscription (total / (messages x subscriptions)). The requests are also counted
   in-process by a store wrapper, by the queue and the kind of key they touch (where the
   cost goes). Where the time goes: publish() latency, the client's and SeaweedFS's CPU per
   delivery (/proc), the requests SeaweedFS served a second, the host's load average.

   ``--processes one``: producer and every consumer in this process (one PawnQueue; 2 cores
   here, SeaweedFS on the same host). ``--processes per-subscription``: the producer here and
   each subscription's 4 consumers (the baseline's 4 too) in a child process of their own
   (``python -m bench.cost.subscriptions --child``), each its own PawnQueue, woken by change
   signals like any other process. ``both`` (the default) measures both.

2. filter: one topic with two subscriptions, ``all`` (no filter) and ``one`` (filter
   ``{"k": "7"}``), 4 consumers each, in this process; ``--messages`` published with the
   attribute ``k`` = str(n % 100), so ``one`` takes 1%. The cost attributable to each
   subscription is that of the requests on its keys (``{topic}/subscriptions/{name}/...``
   and its change-signal slot), counted by the in-process wrapper, per published message;
   what the two share (the topic's index, ``_notify/_``, ``_notify/`` listings, the
   registry) is reported apart. The wrapper's totals are compared with SeaweedFS's.

Runs alternate the order of the cases; the ratios are of medians measured in the same run.
The run is bounded: a drain gives up after ``--case-timeout`` s (a failure: messages
missing), and a case starts only if, judged by its slowest earlier run, it ends within
``--time-limit`` s (840) of the start (a case left out is listed with the results).
``targets``: per subscription throughput >= 0.5x the baseline's, cost per message per
subscription <= 1.2x the baseline's per message (at 1, 3 and 10 subscriptions), and the
filtered subscription's cost <= 0.1x the unfiltered one's.

Run from the repository root::

    .venv/bin/python -m bench.cost.subscriptions            # 3 runs, 6-12 min
    .venv/bin/python -m bench.cost.subscriptions --quick    # 1 run of 2,000 messages, ~1.5 min
    .venv/bin/python -m bench.cost.subscriptions --processes one --subscriptions 3 --no-filter

Prints a table; writes ``bench/results/subscriptions.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import itertools
import json
import math
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tests.servers.seaweedfs import SeaweedFS

from bench.common import (
    PRICE_GET_HEAD,
    PRICE_PUT_LIST,
    REPO,
    RESULTS,
    RequestClasses,
    delta,
    git_state,
    host_report,
    last_json_line,
    median,
    publish_many,
    s3_settings,
    scrape,
    scrubbed_env,
    write_results,
)
from bench.queue.batch import ListenDrain
from pawn_queue import Consumer, Message, PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import load_config
from pawn_queue.exceptions import LeaseLostError
from pawn_queue.observe import Observer
from pawn_queue.store import open_store
from pawn_queue.store.base import LIST_PAGE, ObjectMeta, Store
from pawn_queue.store.wrapper import StoreCall, StoreWrapper

T = TypeVar("T")

TOPIC = "orders"
CONSUMERS = 4  # per subscription, and the baseline's
SUBSCRIPTIONS = (1, 3, 10)
FILTER_VALUES = 100  # the attribute k takes str(n % 100): the filtered subscription takes 1%
FILTER_VALUE = "7"
SHARED = "(shared)"  # requests on no queue's keys: _notify/_, _notify/ listings, _registry
TOPIC_LABEL = "(topic)"  # the topic's own keys: its marker, index, own queue
# Goals: per subscription msg/s against the baseline's, USD per message per subscription
# against the baseline's per message, filtered against unfiltered cost per published message.
TARGETS = {"throughput": 0.5, "cost": 1.2, "filter": 0.1}


class DeliveryError(RuntimeError):
    """A subscription lost a message, got one it should not have, or got one twice."""


def config(server: SeaweedFS, bucket: str) -> dict[str, Any]:
    return {"backend": "s3", "s3": {**s3_settings(server.endpoint), "bucket_name": bucket}}


def sub_name(i: int) -> str:
    return f"s{i:02d}"


def label_of_queue(queue: str) -> str:
    subscription = layout.split_queue(queue)[1]
    return TOPIC_LABEL if subscription is None else subscription


# -- requests by queue and kind of key, counted in-process ---------------------------------


class QueueCounts(StoreWrapper):
    """Counts store calls as the S3 requests they stand for (as
    :class:`pawn_queue.store.counting.CountingStore`: a LIST per page of 1,000 keys, a
    DeleteObjects per 1,000 keys), by ``(queue label, kind of key, request)``: the queue is
    a subscription's name, TOPIC_LABEL or SHARED; the kind is the key's first segment under
    its queue (``messages``, ``leases``, ``.topic``...) or ``_notify slot``/``_notify/_``/...
    A change-signal slot counts for the queue it signals (``queues``: the queues whose slots
    are known); a DeleteObjects of keys of several queues is split between them."""

    def __init__(self, inner: Store, queues: Sequence[str]) -> None:
        super().__init__(inner)
        self.counts: collections.defaultdict[tuple[str, str, str], float] = collections.defaultdict(
            float
        )
        self._slots: dict[str, str] = {}
        for queue in queues:
            self._slots.setdefault(layout.notify_slot_key(queue), label_of_queue(queue))

    def classify(self, key: str) -> tuple[str, str]:
        if key.startswith(layout.NOTIFY):
            if key == layout.NOTIFY_ROOT:
                return SHARED, "_notify/_"
            if layout.is_notify_ring_key(key):
                return SHARED, "_notify ring"
            if key in self._slots:
                return self._slots[key], "_notify slot"
            return SHARED, "_notify/" if key == layout.NOTIFY else "_notify other slot"
        if key.startswith("_") or not key:
            return SHARED, key.partition("/")[0] or "(root)"
        queue = layout.queue_of(key)
        rest = key[len(queue) + 1 :]
        return label_of_queue(queue), rest.partition("/")[0] or "(prefix)"

    async def around(self, call: StoreCall, run: Callable[[], Awaitable[T]]) -> T:
        if call.operation == "delete_many":
            requests = -(-len(call.keys) // LIST_PAGE)
            for key in call.keys:
                self.counts[(*self.classify(key), "DELETE")] += requests / len(call.keys)
            return await run()
        where = self.classify(call.key)
        if call.operation == "list":
            result = await run()
            pages = -(-len(result) // LIST_PAGE) if isinstance(result, list) else 1
            self.counts[(*where, "LIST")] += max(1, pages)
            return result
        self.counts[(*where, call.operation.upper())] += 1
        return await run()

    def snapshot(self) -> list[list[Any]]:
        return [[*k, round(v, 3)] for k, v in sorted(self.counts.items())]


def by_label(rows: Sequence[Sequence[Any]]) -> dict[str, dict[str, float]]:
    """Counts ``[label, kind, request, n]`` summed per label and request."""
    out: dict[str, dict[str, float]] = collections.defaultdict(dict)
    for label, _, request, n in rows:
        out[label][request] = out[label].get(request, 0.0) + n
    return dict(out)


def by_kind(rows: Sequence[Sequence[Any]], relabel: Callable[[str], str]) -> dict[str, float]:
    """Counts summed per ``"{relabel(label)} {kind} {request}"``."""
    out: dict[str, float] = {}
    for label, kind, request, n in rows:
        name = f"{relabel(label)} {kind} {request}"
        out[name] = out.get(name, 0.0) + n
    return out


def merged(*parts: Sequence[Sequence[Any]]) -> list[list[Any]]:
    total: collections.defaultdict[tuple[str, str, str], float] = collections.defaultdict(float)
    for rows in parts:
        for label, kind, request, n in rows:
            total[(label, kind, request)] += n
    return [[*k, round(v, 3)] for k, v in sorted(total.items())]


# -- deliveries, checked per subscription --------------------------------------------------


class LeaseLosses(Observer):
    """Messages whose lease was lost, per queue (a redelivery of them is no duplicate)."""

    def __init__(self) -> None:
        self.lost: dict[str, set[str]] = collections.defaultdict(set)

    def lease_lost(self, message: Message) -> None:
        self.lost[message.queue].add(message.id)


class SubscriptionDrain(ListenDrain):
    """ListenDrain (its consumers ack each message) keeping every delivery: the receive
    count it came with and whether its ack succeeded."""

    def __init__(self, expected: int) -> None:
        super().__init__(expected)
        self.deliveries: dict[str, list[tuple[int, bool]]] = collections.defaultdict(list)
        self.lease_lost_acks = 0

    async def _handle(self, message: Message) -> None:
        entry = self.deliveries[message.id]
        entry.append((message.receive_count, False))
        try:
            await super()._handle(message)
        except LeaseLostError:
            self.lease_lost_acks += 1
            raise
        entry[-1] = (entry[-1][0], True)

    def record(self) -> dict[str, list[list[Any]]]:
        """Every delivery: id -> [[receive_count, acked], ...] (for the audit)."""
        return {k: [list(d) for d in v] for k, v in self.deliveries.items()}


@dataclass
class Audit:
    subscription: str
    expected: int
    acked: int = 0
    deliveries: int = 0
    redelivered_after_lease_loss: int = 0
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    duplicates: dict[str, list[list[Any]]] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.unexpected or self.duplicates)

    def summary(self) -> dict[str, Any]:
        return {
            "subscription": self.subscription,
            "expected": self.expected,
            "acked": self.acked,
            "deliveries": self.deliveries,
            "redelivered_after_lease_loss": self.redelivered_after_lease_loss,
            "missing": len(self.missing),
            "unexpected": len(self.unexpected),
            "duplicates": len(self.duplicates),
            "examples": {
                "missing": self.missing[:5],
                "unexpected": self.unexpected[:5],
                "duplicates": dict(list(self.duplicates.items())[:5]),
            },
        }


def audit(subscription: str, expected: set[str], deliveries: dict[str, list[list[Any]]]) -> Audit:
    """Every expected message acked once; a second delivery only after its lease was lost:
    a higher receive count than the one before, and no delivery before it acked."""
    result = Audit(subscription, len(expected))
    for message_id, seen in deliveries.items():
        result.deliveries += len(seen)
        if any(acked for _, acked in seen):
            result.acked += 1
        if message_id not in expected:
            result.unexpected.append(message_id)
        if len(seen) > 1:
            fine = all(
                later[0] > earlier[0] and not earlier[1]
                for earlier, later in itertools.pairwise(seen)
            )
            if fine:
                result.redelivered_after_lease_loss += len(seen) - 1
            else:
                result.duplicates[message_id] = seen
    result.missing = sorted(m for m in expected if not any(a for _, a in deliveries.get(m, [])))
    return result


async def pending_objects(store: Store, queue: str) -> dict[str, int]:
    """How many objects wait under the queue's messages/ and leases/ (to tell a message
    still pending from one gone)."""
    out = {}
    for name, prefix in (
        ("messages", layout.messages_prefix(queue)),
        ("leases", layout.leases_prefix(queue)),
    ):
        found: list[ObjectMeta] = await store.list(prefix)
        out[name] = len(found)
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (Linux /proc; NaN elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def register_consumers(pq: PawnQueue, subscription: str | None) -> Awaitable[list[Consumer]]:
    """The 4 consumers of a subscription (None: of the topic), registered concurrently."""
    prefix = subscription or "topic"
    return asyncio.gather(
        *(
            pq.register_consumer(f"{prefix}-c{i}", [TOPIC], subscription=subscription)
            for i in range(CONSUMERS)
        )
    )


# -- the throughput cases --------------------------------------------------------------------


def child_argv(spec: dict[str, Any]) -> list[str]:
    return [sys.executable, "-m", "bench.cost.subscriptions", "--child", json.dumps(spec)]


async def child_main(spec: dict[str, Any]) -> dict[str, Any]:
    """A child: 4 consumers of one subscription (or of the topic), its own PawnQueue; says
    ``ready`` once they listen; ends once ``expected`` messages are acked, or at its
    deadline; prints its deliveries and counts as JSON."""
    cfg = load_config(spec["config"])
    queue = (
        layout.subscription_queue(TOPIC, spec["subscription"]) if spec["subscription"] else TOPIC
    )
    store = QueueCounts(open_store(cfg), [queue])
    losses = LeaseLosses()
    drain = SubscriptionDrain(spec["expected"])
    async with PawnQueue(cfg, store=store, observers=[losses]) as pq:
        consumers = await register_consumers(pq, spec["subscription"])
        drain.start(consumers)
        print("ready", flush=True)
        cpu = time.process_time()
        try:
            complete = await drain.wait(spec["deadline"])
        finally:
            await drain.stop()
        pending = {} if complete else await pending_objects(store.inner, queue)
        await pq.runtime.background.done()
    return {
        "cpu_seconds": time.process_time() - cpu,
        "finished": drain.finished,
        "complete": complete,
        "pending": pending,
        "deliveries": drain.record(),
        "lease_lost": sorted(losses.lost.get(queue, ())),
        "lease_lost_acks": drain.lease_lost_acks,
        "requests": store.snapshot(),
    }


@contextlib.asynccontextmanager
async def child_consumers(
    cfg: dict[str, Any], subscriptions: Sequence[str | None], expected: int, deadline: float
) -> Any:
    """One child process per subscription (None: the topic), each listening; yields a
    function that waits for their reports."""
    processes = []
    try:
        for name in subscriptions:
            spec = {"config": cfg, "subscription": name, "expected": expected, "deadline": deadline}
            process = await asyncio.create_subprocess_exec(
                *child_argv(spec),
                stdout=asyncio.subprocess.PIPE,
                env=scrubbed_env(),
                cwd=REPO,
                limit=2**28,
            )
            processes.append(process)
        for process in processes:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            if line.strip() != b"ready":
                raise RuntimeError(f"child said {line!r} (exit {await process.wait()})")

        async def reports() -> list[dict[str, Any]]:
            async def one(process: asyncio.subprocess.Process) -> dict[str, Any]:
                out, _ = await asyncio.wait_for(process.communicate(), deadline + 120)
                if process.returncode != 0:
                    raise RuntimeError(f"child exited {process.returncode}")
                report: dict[str, Any] = last_json_line(out.decode())
                return report

            return list(await asyncio.gather(*(one(p) for p in processes)))

        yield reports
    finally:
        for process in processes:
            if process.returncode is None:
                process.kill()
                await process.wait()


async def throughput_case(
    server: SeaweedFS, subscriptions: int, args: argparse.Namespace, processes: str
) -> dict[str, Any]:
    """``subscriptions`` = 0: the baseline, a topic without subscriptions."""
    bucket = f"sub{subscriptions}-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    cfg = config(server, bucket)
    names: list[str | None] = [sub_name(i) for i in range(subscriptions)] or [None]
    queues = [layout.subscription_queue(TOPIC, n) if n else TOPIC for n in names]
    loaded = load_config(cfg)
    store = QueueCounts(open_store(loaded), [TOPIC, *queues])
    losses = LeaseLosses()
    messages = args.messages
    published: list[str] = []
    children: list[dict[str, Any]] = []
    drains: dict[str | None, SubscriptionDrain] = {}
    consumers: dict[str | None, list[Consumer]] = {}
    async with PawnQueue(loaded, store=store, observers=[losses]) as pq:
        await pq.create_topic(TOPIC)
        # Concurrently: each waits ~2 s for the producers' index caches.
        await asyncio.gather(*(pq.create_subscription(TOPIC, n) for n in names if n))
        producer = await pq.register_producer("bench")
        async with contextlib.AsyncExitStack() as stack:
            if processes == "one":
                for name in names:
                    consumers[name] = await register_consumers(pq, name)
                    drains[name] = SubscriptionDrain(messages)
            else:
                reports = await stack.enter_async_context(
                    child_consumers(cfg, names, messages, args.case_timeout)
                )
            store.counts.clear()
            before = await asyncio.to_thread(scrape, server.metrics_url, bucket)
            load = os.getloadavg()[0]
            cpu = time.process_time()
            server_cpu = cpu_seconds(server.process.pid)
            started = time.perf_counter()
            for name, drain in drains.items():
                drain.start(consumers[name])

            async def publish(n: int) -> None:
                published.append(await producer.publish(TOPIC, {"n": n}))

            publish_seconds = await publish_many(publish, messages, args.publishers)
            if processes == "one":
                try:
                    waits = [d.wait(args.case_timeout) for d in drains.values()]
                    complete = all(await asyncio.gather(*waits))
                finally:
                    for drain in drains.values():
                        await drain.stop()
                finished = max(d.finished for d in drains.values())
                pending = (
                    {} if complete else {q: await pending_objects(store.inner, q) for q in queues}
                )
                records = {n: d.record() for n, d in drains.items()}
                lease_lost = {label_of_queue(q): sorted(losses.lost.get(q, ())) for q in queues}
            else:
                children = await reports()
                finished = max(c["finished"] for c in children)
                complete = all(c["complete"] for c in children)
                pending = {q: c["pending"] for q, c in zip(queues, children, strict=True)}
                records = {n: c["deliveries"] for n, c in zip(names, children, strict=True)}
                lease_lost = {
                    label_of_queue(q): c["lease_lost"]
                    for q, c in zip(queues, children, strict=True)
                }
            cpu = time.process_time() - cpu
            server_cpu = cpu_seconds(server.process.pid) - server_cpu
        await pq.runtime.background.done()
    await asyncio.sleep(1.5)  # the server's counters lag a little
    counts = delta(before, await asyncio.to_thread(scrape, server.metrics_url, bucket))
    requests = merged(store.snapshot(), *(c["requests"] for c in children))
    audits = [audit(n or TOPIC_LABEL, set(published), records[n]) for n in names]
    elapsed = finished - started
    fanout = max(1, subscriptions)
    deliveries = messages * fanout
    classes = RequestClasses.from_counts(counts)
    child_cpu = sum(c["cpu_seconds"] for c in children)
    result = {
        "subscriptions": subscriptions,
        "processes": processes,
        "messages": messages,
        "complete": complete,
        "seconds": round(elapsed, 3),
        "publish_seconds": round(publish_seconds, 3),
        "rate_per_subscription": messages / elapsed,
        "deliveries_per_s": messages * fanout / elapsed,
        "publish_rate": messages / publish_seconds,
        "publish_latency_ms": round(args.publishers * publish_seconds / messages * 1000, 2),
        "load_average_at_start": load,
        # CPU while the case ran: this process (producer, and consumers with "one"), the
        # children (their whole drain, start-up polls included), SeaweedFS; and the share
        # of the host's cores they had together.
        "cpu_seconds": {
            "parent": round(cpu, 2),
            "children": round(child_cpu, 2),
            "server": round(server_cpu, 2),
        },
        "client_cpu_us_per_delivery": round((cpu + child_cpu) / deliveries * 1e6, 1),
        "server_cpu_us_per_delivery": round(server_cpu / deliveries * 1e6, 1),
        "server_requests_per_s": round(classes.total / elapsed, 1),
        "host_share": round((cpu + child_cpu + server_cpu) / (elapsed * (os.cpu_count() or 1)), 3),
        "counts": {k: v for k, v in counts.items() if ":" not in k},
        "codes": {k: v for k, v in counts.items() if ":" in k},
        "per_message": classes.per(messages).as_dict(),
        "per_message_per_subscription": classes.per(messages * fanout).as_dict(),
        "usd_per_million": classes.per(messages).dollars_per_million(),
        "usd_per_million_per_subscription": classes.per(messages * fanout).dollars_per_million(),
        "wrapper_requests": requests,
        "audits": [a.summary() for a in audits],
        "lease_lost": {k: len(v) for k, v in lease_lost.items()},
        "pending_at_timeout": pending,
    }
    failures = [a.summary() for a in audits if not a.ok]
    if failures or not complete:
        result["failure"] = {"audits": failures, "pending": pending, "lease_lost": lease_lost}
        raise DeliveryError(json.dumps(result["failure"], indent=2, default=str), result)
    return result


# -- the filter case ----------------------------------------------------------------------------


async def filter_case(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    bucket = f"filter-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    loaded = load_config(config(server, bucket))
    names = {"all": None, "one": {"k": FILTER_VALUE}}
    lingers = {"all": None, "one": args.filter_linger}
    queues = [layout.subscription_queue(TOPIC, n) for n in names]
    store = QueueCounts(open_store(loaded), [TOPIC, *queues])
    losses = LeaseLosses()
    messages = args.messages
    wanted = sum(1 for n in range(messages) if str(n % FILTER_VALUES) == FILTER_VALUE)
    published: dict[int, str] = {}
    latencies: dict[str, list[float]] = {"all": [], "one": []}  # publish() seconds, by taker
    async with PawnQueue(loaded, store=store, observers=[losses]) as pq:
        await pq.create_topic(TOPIC)
        await asyncio.gather(
            *(
                pq.create_subscription(TOPIC, n, filter=f, linger_seconds=lingers[n])
                for n, f in names.items()
            )
        )
        producer = await pq.register_producer("bench")
        drains = {"all": SubscriptionDrain(messages), "one": SubscriptionDrain(wanted)}
        consumers = {name: await register_consumers(pq, name) for name in names}
        store.counts.clear()
        before = await asyncio.to_thread(scrape, server.metrics_url, bucket)
        started = time.perf_counter()
        for name, drain in drains.items():
            drain.start(consumers[name])

        async def publish(n: int) -> None:
            attributes = {"k": str(n % FILTER_VALUES)}
            began = time.perf_counter()
            published[n] = await producer.publish(TOPIC, {"n": n}, attributes=attributes)
            took = latencies["one" if attributes["k"] == FILTER_VALUE else "all"]
            took.append(time.perf_counter() - began)

        publish_seconds = await publish_many(publish, messages, args.publishers)
        try:
            waits = [d.wait(args.case_timeout) for d in drains.values()]
            complete = all(await asyncio.gather(*waits))
        finally:
            for drain in drains.values():
                await drain.stop()
        elapsed = max(d.finished for d in drains.values()) - started
        pending = {} if complete else {q: await pending_objects(store.inner, q) for q in queues}
        await pq.runtime.background.done()
    await asyncio.sleep(1.5)
    counts = delta(before, await asyncio.to_thread(scrape, server.metrics_url, bucket))
    requests = store.snapshot()
    expected = {
        "all": set(published.values()),
        "one": {i for n, i in published.items() if str(n % FILTER_VALUES) == FILTER_VALUE},
    }
    audits = [audit(n, expected[n], drains[n].record()) for n in names]
    per_label = by_label(requests)
    attributed: dict[str, dict[str, Any]] = {
        label: {
            "per_message": RequestClasses.from_counts(c).per(messages).as_dict(),
            "usd_per_million_published": RequestClasses.from_counts(c)
            .per(messages)
            .dollars_per_million(),
        }
        for label, c in per_label.items()
    }
    wrapper_total = RequestClasses.from_counts(
        {r: sum(c.get(r, 0.0) for c in per_label.values()) for r in ("PUT", "GET", "HEAD", "LIST")}
    )
    result = {
        "messages": messages,
        "filtered_messages": wanted,
        "complete": complete,
        "seconds": round(elapsed, 3),
        "publish_seconds": round(publish_seconds, 3),
        "counts": {k: v for k, v in counts.items() if ":" not in k},
        "server_usd_per_million": RequestClasses.from_counts(counts)
        .per(messages)
        .dollars_per_million(),
        "wrapper_usd_per_million": wrapper_total.per(messages).dollars_per_million(),
        "attributed": attributed,
        "ratio": attributed["one"]["usd_per_million_published"]
        / attributed["all"]["usd_per_million_published"],
        "linger_seconds": args.filter_linger,
        # publish() p50, ms: of messages only 'all' takes, and of those 'one' takes too
        "publish_p50_ms": {k: round(median(v) * 1000, 2) for k, v in latencies.items()},
        "wrapper_requests": requests,
        "audits": [a.summary() for a in audits],
        "lease_lost": {label_of_queue(q): len(losses.lost.get(q, ())) for q in queues},
    }
    failures = [a.summary() for a in audits if not a.ok]
    if failures or not complete:
        result["failure"] = {"audits": failures, "pending": pending}
        raise DeliveryError(json.dumps(result["failure"], indent=2, default=str), result)
    return result


# -- running and reporting --------------------------------------------------------------------


def fmt_counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(counts.items()))


def modes_of(args: argparse.Namespace) -> list[str]:
    return ["one", "per-subscription"] if args.processes == "both" else [args.processes]


class Schedule:
    """Bounds the whole run: a case starts only if, judged by its slowest earlier run (set
    up and torn down included), it ends within ``limit`` seconds of the start."""

    def __init__(self, limit: float) -> None:
        self.deadline = time.monotonic() + limit
        self.took: dict[str, float] = {}
        self.skipped: list[str] = []

    async def run(self, key: str, case: Callable[[], Awaitable[T]]) -> T | None:
        if time.monotonic() + self.took.get(key, 0.0) > self.deadline:
            self.skipped.append(key)
            print(f"{key}: skipped, it would end after --time-limit", flush=True)
            return None
        started = time.monotonic()
        result = await case()
        self.took[key] = max(self.took.get(key, 0.0), time.monotonic() - started)
        return result


async def run_all(server: SeaweedFS, args: argparse.Namespace, results: dict[str, Any]) -> None:
    """Fills ``results``: ``throughput`` (``{processes}-{subscriptions}``: a list of runs),
    ``filter`` (a list of runs), ``skipped`` (cases left out to keep within --time-limit)."""
    cases = [0, *args.subscriptions] if args.subscriptions else []
    schedule = Schedule(args.time_limit)
    results["skipped"] = schedule.skipped
    for run in range(args.runs):
        order = cases if run % 2 == 0 else cases[::-1]
        for processes in modes_of(args):
            for subscriptions in order:
                key = f"{processes}-{subscriptions}"
                case = functools.partial(throughput_case, server, subscriptions, args, processes)
                result = await schedule.run(key, case)
                if result is None:
                    continue
                results["throughput"].setdefault(key, []).append(result)
                print(
                    f"run {run + 1} {processes:>16} subscriptions={subscriptions:<2} "
                    f"{result['rate_per_subscription']:7,.0f} msg/s per subscription "
                    f"({result['seconds']:.1f} s, publishing {result['publish_seconds']:.1f} s), "
                    f"${result['usd_per_million_per_subscription']:.3f}/M per subscription, "
                    f"load {result['load_average_at_start']:.1f}  {fmt_counts(result['counts'])}",
                    flush=True,
                )
        if args.no_filter:
            continue
        result = await schedule.run("filter", lambda: filter_case(server, args))
        if result is None:
            continue
        results["filter"].append(result)
        usd = {
            label: result["attributed"].get(label, {}).get("usd_per_million_published", 0.0)
            for label in ("all", "one", SHARED)
        }
        print(
            f"run {run + 1} filter: one / all {result['ratio']:.3f}x "
            + " ".join(f"{label} ${v:.3f}/M" for label, v in usd.items()),
            flush=True,
        )


MIX = ("PUT", "GET", "LIST", "DELETE")  # SeaweedFS counts HEAD as GET


def throughput_rows(
    results: dict[str, Any], processes: str, cases: Sequence[int]
) -> tuple[list[str], dict[str, Any]]:
    runs_of: dict[str, list[dict[str, Any]]] = results["throughput"]
    base = runs_of.get(f"{processes}-0")
    if not base:
        return [], {}
    lines = [
        f"{'subs':>4} {'msg/s/sub':>9} {'x base':>6} {'deliv/s':>8} {'pub/s':>7} "
        f"{'$/M msgs':>8} {'$/M/sub':>8} {'x base':>6} "
        + " ".join(f"{k:>6}" for k in MIX)
        + f" {'pub ms':>6} {'cli us':>6} {'srv us':>6} {'req/s':>6} {'host':>4}"
        + "   each run: msg/s/sub $/M/sub",
    ]
    medians: dict[str, Any] = {}
    base_rate = median(r["rate_per_subscription"] for r in base)
    base_usd = median(r["usd_per_million_per_subscription"] for r in base)
    for subscriptions in cases:
        runs = runs_of.get(f"{processes}-{subscriptions}")
        if not runs:
            continue
        fanout = max(1, subscriptions)
        mix = {
            kind: median(r["counts"].get(kind, 0) / (r["messages"] * fanout) for r in runs)
            for kind in sorted({k for r in runs for k in r["counts"]} | set(MIX))
        }
        rate = median(r["rate_per_subscription"] for r in runs)
        usd = median(r["usd_per_million_per_subscription"] for r in runs)
        each = [
            [round(r["rate_per_subscription"], 1), round(r["usd_per_million_per_subscription"], 4)]
            for r in runs
        ]
        m = {
            "rate_per_subscription": rate,
            "throughput_ratio": rate / base_rate,
            "deliveries_per_s": median(r["deliveries_per_s"] for r in runs),
            "publish_rate": median(r["publish_rate"] for r in runs),
            "seconds": median(r["seconds"] for r in runs),
            "usd_per_million": median(r["usd_per_million"] for r in runs),
            "usd_per_million_per_subscription": usd,
            "cost_ratio": usd / base_usd,
            "requests_per_message_per_subscription": {k: round(v, 4) for k, v in mix.items()},
            "publish_latency_ms": median(r["publish_latency_ms"] for r in runs),
            "client_cpu_us_per_delivery": median(r["client_cpu_us_per_delivery"] for r in runs),
            "server_cpu_us_per_delivery": median(r["server_cpu_us_per_delivery"] for r in runs),
            "server_requests_per_s": median(r["server_requests_per_s"] for r in runs),
            "host_share": median(r["host_share"] for r in runs),
            "load_average_at_start": [r["load_average_at_start"] for r in runs],
            "redelivered_after_lease_loss": sum(
                a["redelivered_after_lease_loss"] for r in runs for a in r["audits"]
            ),
            "runs": each,
        }
        medians[str(subscriptions)] = m
        lines.append(
            f"{subscriptions or 'none':>4} {rate:9,.0f} {m['throughput_ratio']:5.2f}x "
            f"{m['deliveries_per_s']:8,.0f} {m['publish_rate']:7,.0f} "
            f"{m['usd_per_million']:8.3f} {usd:8.3f} {m['cost_ratio']:5.2f}x "
            + " ".join(f"{mix[k]:6.3f}" for k in MIX)
            + f" {m['publish_latency_ms']:6.1f} {m['client_cpu_us_per_delivery']:6.0f} "
            f"{m['server_cpu_us_per_delivery']:6.0f} {m['server_requests_per_s']:6,.0f} "
            f"{m['host_share']:4.0%}   " + ", ".join(f"{r:,.0f} {u:.3f}" for r, u in each)
        )
    return lines, medians


def where_it_goes(results: dict[str, Any], key: str, top: int = 8) -> list[str]:
    """The costliest kinds of request of the median-cost run of a case (counted in-process),
    per message per subscription, with their share of its dollars."""
    runs = sorted(results["throughput"].get(key, []), key=lambda r: r["usd_per_million"])
    if not runs:
        return []
    run = runs[len(runs) // 2]
    per = run["messages"] * max(1, run["subscriptions"])
    kinds = by_kind(
        run["wrapper_requests"],
        lambda label: label if label in (SHARED, TOPIC_LABEL) else "subscription",
    )
    price = {"GET": PRICE_GET_HEAD, "HEAD": PRICE_GET_HEAD, "DELETE": 0.0}
    usd = {k: n / per * price.get(k.rsplit(" ", 1)[1], PRICE_PUT_LIST) for k, n in kinds.items()}
    total = sum(usd.values()) or 1.0
    out = [f"  {key}: requests per message per subscription, $/M, share of the dollars"]
    for name in sorted(kinds, key=lambda k: (-usd[k], -kinds[k]))[:top]:
        out.append(
            f"    {name:<36} {kinds[name] / per:7.4f} {usd[name]:7.4f} {usd[name] / total:6.1%}"
        )
    return out


def filter_summary(runs: list[dict[str, Any]], args: argparse.Namespace) -> tuple[list[str], Any]:
    labels = ("all", "one", SHARED, TOPIC_LABEL)

    def attributed(label: str, field_name: str, request: str | None = None) -> float:
        values = []
        for r in runs:
            entry = r["attributed"].get(label, {})
            value = entry.get(field_name, {}) if request else entry.get(field_name, 0.0)
            values.append(float(value.get(request, 0.0)) if request else float(value))
        return median(values)

    usd = {label: attributed(label, "usd_per_million_published") for label in labels}
    mix = {
        label: {k: attributed(label, "per_message", k) for k in ("put_list", "get_head", "delete")}
        for label in labels
    }
    ratio = median(r["ratio"] for r in runs)
    # Requests per message each subscription received (the filtered one's: per match).
    received: dict[str, dict[str, float]] = {}
    for label in ("all", "one"):
        kinds = sorted(
            {req for r in runs for lab, _, req, _ in r["wrapper_requests"] if lab == label}
        )
        received[label] = {
            req: median(
                sum(n for lab, _, q, n in r["wrapper_requests"] if lab == label and q == req)
                / (r["messages"] if label == "all" else r["filtered_messages"])
                for r in runs
            )
            for req in kinds
        }
    m: dict[str, Any] = {
        "usd_per_million_published": usd,
        "requests_per_published_message": mix,
        "ratio": ratio,
        "runs": [round(r["ratio"], 4) for r in runs],
        "requests_per_received_message": received,
        "seconds": median(r["seconds"] for r in runs),
        "server_usd_per_million": median(r["server_usd_per_million"] for r in runs),
        "wrapper_usd_per_million": median(r["wrapper_usd_per_million"] for r in runs),
        "publish_p50_ms": {k: median(r["publish_p50_ms"][k] for r in runs) for k in ("all", "one")},
    }
    lines = [
        "",
        f"filter: {args.messages:,} messages with attribute k = n % {FILTER_VALUES}; subscription "
        f"'one' (k = {FILTER_VALUE}: 1%, linger_seconds {args.filter_linger:g}) beside 'all' "
        f"(no filter), {CONSUMERS} consumers each, one process; requests on each one's keys "
        f"per published message, median of {len(runs)}:",
        f"{'':>10} {'$/M':>8} {'PUT/LIST':>9} {'GET/HEAD':>9} {'DELETE':>9}",
        *(
            f"{label:>10} {usd[label]:8.4f} {mix[label]['put_list']:9.4f} "
            f"{mix[label]['get_head']:9.4f} {mix[label]['delete']:9.4f}"
            for label in labels
        ),
        *(
            f"{label:>10} per message it received: "
            + " ".join(f"{req} {n:.3f}" for req, n in received[label].items())
            for label in ("all", "one")
        ),
        f"one / all: {ratio:.4f}x (runs: {', '.join(f'{r:.4f}' for r in m['runs'])}); "
        f"all requests: in-process ${m['wrapper_usd_per_million']:.3f}/M, "
        f"SeaweedFS ${m['server_usd_per_million']:.3f}/M",
        f"publish() p50: {m['publish_p50_ms']['all']:.1f} ms for a message only 'all' takes, "
        f"{m['publish_p50_ms']['one']:.1f} ms for one 'one' takes too",
    ]
    return lines, m


def summary(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    cases = [0, *args.subscriptions] if args.subscriptions else []
    lines: list[str] = []
    medians: dict[str, Any] = {"throughput": {}}
    targets: dict[str, Any] = {}
    where = {
        "one": "producer and every consumer in this one process (one PawnQueue)",
        "per-subscription": "producer here, each subscription's 4 consumers in a child process",
    }
    for processes in modes_of(args):
        rows, m = throughput_rows(results, processes, cases)
        if not rows:
            continue
        runs = len(results["throughput"][f"{processes}-0"])
        lines += [
            "",
            f"throughput: {args.messages:,} messages, {args.publishers} publishers (group "
            f"commit), {CONSUMERS} consumers per subscription, listen(); {where[processes]}; "
            f"SeaweedFS on the same {os.cpu_count()}-core host; median of {runs}. PUT..DELETE: "
            "requests per message per subscription (SeaweedFS's counts); pub ms: publish() "
            "latency; cli us, srv us: client and SeaweedFS CPU per delivery; req/s: requests "
            "SeaweedFS served a second; host: client and server CPU over wall time x cores:",
            *rows,
        ]
        medians["throughput"][processes] = m
        for subscriptions in args.subscriptions:
            row = m.get(str(subscriptions))
            if row is None:
                continue
            prefix = f"{processes}, {subscriptions} subscriptions"
            targets[f"{prefix}: msg/s per subscription vs baseline"] = {
                "goal": f">= {TARGETS['throughput']}x",
                "measured": round(row["throughput_ratio"], 3),
                "met": row["throughput_ratio"] >= TARGETS["throughput"],
            }
            targets[f"{prefix}: $ per message per subscription vs baseline"] = {
                "goal": f"<= {TARGETS['cost']}x",
                "measured": round(row["cost_ratio"], 3),
                "met": row["cost_ratio"] <= TARGETS["cost"],
            }
    first, *others = modes_of(args)
    lines += ["", "where the requests go (counted in-process, median-cost run):"]
    for subscriptions in cases:
        lines += where_it_goes(results, f"{first}-{subscriptions}")
    for processes in others if cases else []:  # the baseline and the most subscriptions
        for subscriptions in sorted({0, max(cases)}):
            lines += where_it_goes(results, f"{processes}-{subscriptions}")
    if results["filter"]:
        filter_lines, medians["filter"] = filter_summary(results["filter"], args)
        lines += filter_lines
        ratio = medians["filter"]["ratio"]
        targets["filtered vs unfiltered cost per published message"] = {
            "goal": f"<= {TARGETS['filter']}x",
            "measured": round(ratio, 4),
            "met": ratio <= TARGETS["filter"],
        }
    lines.append("")
    for name, t in targets.items():
        met = "met" if t["met"] else "NOT met"
        lines.append(f"target {name} {t['goal']}: {t['measured']}x ({met})")
    loads = [r["load_average_at_start"] for runs in results["throughput"].values() for r in runs]
    if loads:
        lines.append(
            f"host: {os.cpu_count()} cores shared with SeaweedFS (and whatever else runs): "
            f"1-minute load average {min(loads):.1f}-{max(loads):.1f} at the cases' starts"
        )
    if results.get("skipped"):
        lines.append(f"skipped to end within --time-limit: {', '.join(results['skipped'])}")
    return "\n".join(lines), {**medians, "targets": targets}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--publishers", type=int, default=32)
    parser.add_argument(
        "--subscriptions",
        type=int,
        nargs="*",
        default=list(SUBSCRIPTIONS),
        help="the throughput cases (none given: only the filter case)",
    )
    parser.add_argument("--processes", choices=("one", "per-subscription", "both"), default="both")
    parser.add_argument("--no-filter", action="store_true", help="leave the filter case out")
    parser.add_argument(
        "--filter-linger",
        type=float,
        default=0.1,
        help="the filtered subscription's linger_seconds (0: its copies go out at once)",
    )
    parser.add_argument(
        "--case-timeout", type=float, default=240.0, help="bound of one case's drain, seconds"
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=840.0,
        help="start no case that would end later than this many seconds from the start",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 1 run of 2,000 messages")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS / "subscriptions.json")
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(asyncio.run(child_main(json.loads(args.child)))), flush=True)
        return
    if args.quick:
        args.runs, args.messages, args.case_timeout = 1, 2000, 60.0
    load = os.getloadavg()
    failure: DeliveryError | None = None
    results: dict[str, Any] = {"throughput": {}, "filter": []}
    with tempfile.TemporaryDirectory(prefix="pq-bench-subs-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            asyncio.run(run_all(server, args, results))
        except DeliveryError as exc:
            failure = exc
        finally:
            server.stop()
    if failure is not None:
        # The evidence: the failed case (its audits: counts and example ids) and the runs
        # before it.
        document = {
            "failure": failure.args[0],
            "failed_case": failure.args[1],
            "results": results,
            "settings": vars(args) | {"out": str(args.out)},
            "host": host_report(load),
            "git": git_state(),
        }
        write_results(args.out, document)
        print(
            f"FAILED: a subscription lost, gained or duplicated messages (details in "
            f"{args.out}):\n{failure.args[0]}",
            file=sys.stderr,
        )
        sys.exit(1)
    text, medians = summary(results, args)
    print(text)
    document = {
        "medians": medians,
        "targets": medians.pop("targets"),
        "results": results,
        "settings": vars(args) | {"out": str(args.out)},
        "host": host_report(load),
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, document)


if __name__ == "__main__":
    main()
