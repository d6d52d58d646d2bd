"""What an idle queue costs on S3 (one SeaweedFS on loopback), counted by the server.

1. idle: ``--topics`` topics (10, 100, 1,000), one consumer ``listen()``-ing on each, all in
   one process at default settings, nothing published: the requests of ``--idle-seconds``
   (after the start-up polls are over), per minute. Then a producer in another process
   (bench/queue/wake_producer.py) publishes ``--wakes`` messages, one at a time, to one of the
   topics: wake-up latency from just before its ``publish`` to the handler (one host, one
   clock).
2. pollers: 10 consumers in one process, each calling ``poll()`` on its own idle topic once a
   second for ``--idle-seconds``: the requests of that time, from the first poll on.
3. drain: 32 tasks ``publish()``-ing on one producer while 4 consumers drain the topic in a
   ``poll()`` loop (bench/common.py's ``drain``: after an empty poll, a pause of 10 ms
   doubling up to 250 ms) or ``listen()``-ing, all in one process: USD per million
   messages at AWS list prices (PUT/LIST $5, GET/HEAD $0.40 per million). ``poll-100``:
   the ``poll()`` loop with ``polling.max_messages_per_poll: 100``, so a poll takes a whole
   group-commit object (each poll's acks of an object's members cost a lease write while
   members remain: docs/protocol.md, "Group commit"). ``poll-each``: the ``poll()`` loop
   awaiting each ``ack()`` before the next, as the quick start does, so each is a write.

Each run uses fresh buckets; medians of ``--runs`` runs. Run from the repository root::

    .venv/bin/python -m bench.cost.idle                      # 3 runs, ~15 min
    .venv/bin/python -m bench.cost.idle --runs 1 --topics 10 --idle-seconds 20

Prints a table; writes ``bench/results/idle.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import platform
import random
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from tests.servers.seaweedfs import SeaweedFS

import pawn_queue
from bench.common import (
    RESULTS,
    RequestClasses,
    delta,
    drain,
    git_state,
    median,
    percentile,
    s3_settings,
    scrape,
    write_results,
)
from bench.queue.batch import ListenDrain
from bench.queue.waiting import producer_process
from pawn_queue import Message, PawnQueue
from pawn_queue.config import NotifyConfig

logger = logging.getLogger("bench.cost.idle")

POLLERS = 10
PUBLISHERS = 32
DRAINERS = 4
DRAIN_MODES = ("poll", "listen", "poll-100", "poll-each")
# Targets of issue #31: requests a minute at 1,000 idle topics, LISTs of the 10 pollers in
# a minute, USD per million messages drained by poll() loops, wake-up p50 in seconds.
TARGETS = {"idle_1000_per_min": 70, "pollers_list": 20, "poll_usd": 0.60, "wake_p50_s": 1.0}


def config(server: SeaweedFS, bucket: str) -> dict[str, Any]:
    return {"backend": "s3", "s3": {**s3_settings(server.endpoint), "bucket_name": bucket}}


def new_bucket(server: SeaweedFS, case: str) -> str:
    bucket = f"{case}-{uuid.uuid4().hex[:12]}"
    server.create_bucket(bucket)
    return bucket


async def counts(server: SeaweedFS, bucket: str) -> dict[str, int]:
    return await asyncio.to_thread(scrape, server.metrics_url, bucket)


async def settle_counts(server: SeaweedFS, bucket: str, least: float) -> dict[str, int]:
    """The counts once ``least`` seconds passed and no LIST was counted for 3 s (the
    listeners' start-up polls are over)."""
    started = time.monotonic()
    last = await counts(server, bucket)
    quiet_since = time.monotonic()
    while True:
        await asyncio.sleep(1.0)
        now = await counts(server, bucket)
        if now.get("LIST", 0) != last.get("LIST", 0):
            quiet_since = time.monotonic()
        last = now
        if time.monotonic() - started >= least and time.monotonic() - quiet_since >= 3:
            return now


async def gather_in_chunks(calls: list[Callable[[], Awaitable[Any]]], size: int = 50) -> list[Any]:
    results: list[Any] = []
    for start in range(0, len(calls), size):
        results += await asyncio.gather(*(call() for call in calls[start : start + size]))
    return results


async def idle_case(
    server: SeaweedFS, topics: int, args: argparse.Namespace, sweep: float | None = None
) -> dict[str, Any]:
    """With ``sweep``, ``notify.sweep_interval_seconds`` that short: every topic is overdue
    during the count, so the sweep lists at its pace (the steady state of many topics; at
    the default, 600 s, the count shows none, the topics being listed at start)."""
    bucket = new_bucket(server, f"idle{topics}")
    cfg = config(server, bucket)
    if sweep is not None:
        cfg["notify"] = {"sweep_interval_seconds": sweep}
    names = [f"topic-{i:04d}" for i in range(topics)]
    arrived: dict[int, float] = {}
    events = [asyncio.Event() for _ in range(args.wakes)]

    async def handler(message: Message) -> None:
        await message.ack()
        payload = message.payload
        if isinstance(payload, dict) and "t" in payload:
            i = int(payload["i"])
            arrived.setdefault(i, time.time() - float(payload["t"]))
            events[i].set()

    async with await PawnQueue.from_config(cfg) as pq:
        await gather_in_chunks([lambda n=n: pq.create_topic(n) for n in names])  # type: ignore[misc]
        consumers = await gather_in_chunks(
            [lambda n=n: pq.register_consumer(f"c-{n}", topics=[n]) for n in names]  # type: ignore[misc]
        )
        listeners = [asyncio.create_task(c.listen(handler)) for c in consumers]
        try:
            before = await settle_counts(server, bucket, args.warmup)
            await asyncio.sleep(args.idle_seconds)
            after = await counts(server, bucket)
            target = random.Random(topics).choice(names)
            async with producer_process(cfg, target) as publish:
                for i in range(args.wakes):
                    await asyncio.sleep(args.wake_gap)
                    await publish(i)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(events[i].wait(), 90)
        finally:
            for task in listeners:
                task.cancel()
            await asyncio.gather(*listeners, return_exceptions=True)
    requests = {k: v for k, v in delta(before, after).items() if ":" not in k}
    minutes = args.idle_seconds / 60
    latencies = [arrived[i] for i in sorted(arrived)]
    return {
        "topics": topics,
        "case": f"{topics}" if sweep is None else f"{topics}, sweep {sweep:g} s",
        "requests": requests,
        "per_min": {k: round(v / minutes, 1) for k, v in requests.items()},
        "total_per_min": round(sum(requests.values()) / minutes, 1),
        "wake_s": [round(x, 3) for x in latencies],
        "wake_p50_s": round(percentile(latencies, 50), 3) if latencies else None,
        "woken": f"{len(latencies)}/{args.wakes}",
    }


async def pollers_case(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    bucket = new_bucket(server, "pollers")
    async with await PawnQueue.from_config(config(server, bucket)) as pq:
        names = [f"topic-{i}" for i in range(POLLERS)]
        for name in names:
            await pq.create_topic(name)
        consumers = [await pq.register_consumer(f"c-{n}", topics=[n]) for n in names]
        before = await counts(server, bucket)
        end = time.monotonic() + args.idle_seconds

        async def loop(consumer: Any) -> int:
            polls = 0
            while time.monotonic() < end:
                assert await consumer.poll() == []
                polls += 1
                await asyncio.sleep(1.0)
            return polls

        polls = await asyncio.gather(*(loop(c) for c in consumers))
        await asyncio.sleep(1.5)  # the server's counters lag a little
        after = await counts(server, bucket)
    requests = {k: v for k, v in delta(before, after).items() if ":" not in k}
    return {"seconds": args.idle_seconds, "polls": sum(polls), "requests": requests}


async def drain_case(server: SeaweedFS, mode: str, args: argparse.Namespace) -> dict[str, Any]:
    bucket = new_bucket(server, f"drain-{mode}")
    messages = args.messages
    cfg = config(server, bucket)
    if mode == "poll-100":  # a poll as big as the objects group commit writes here (~30)
        cfg["polling"] = {"max_messages_per_poll": 100}
    async with await PawnQueue.from_config(cfg) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        consumers = [await pq.register_consumer(f"c{i}", ["t"]) for i in range(DRAINERS)]
        before = await counts(server, bucket)
        share = [messages // PUBLISHERS + (i < messages % PUBLISHERS) for i in range(PUBLISHERS)]

        async def publish(count: int) -> None:
            for n in range(count):
                await producer.publish("t", {"n": n})

        publishing = asyncio.gather(*(publish(count) for count in share))
        if mode.startswith("poll"):
            result = await drain(consumers, messages, 300, one_by_one=mode == "poll-each")
            if result.timed_out:
                raise TimeoutError(f"{result.unique} of {messages} acked in 300 s")
        else:
            listening = ListenDrain(messages)
            listening.start(consumers)
            try:
                if not await listening.wait(300):
                    raise TimeoutError(f"{len(listening.ids)} of {messages} acked in 300 s")
            finally:
                await listening.stop()
        await publishing
        await pq.runtime.background.done()
    await asyncio.sleep(1.5)  # the server's counters lag a little
    requests = {
        k: v for k, v in delta(before, await counts(server, bucket)).items() if ":" not in k
    }
    classes = RequestClasses.from_counts(requests).per(messages)
    return {
        "mode": mode,
        "requests": requests,
        "per_message": classes.as_dict(),
        "usd_per_million": round(classes.dollars_per_million(), 3),
    }


async def run_all(server: SeaweedFS, args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, list[Any]] = {"idle": [], "pollers": [], "drain": []}
    for run in range(args.runs):
        for topics in [] if args.no_idle else args.topics:
            row = await idle_case(server, topics, args)
            logger.info("run %d idle %d topics: %s", run, topics, row)
            results["idle"].append(row)
        if not args.no_idle and "sweep_interval_seconds" in NotifyConfig.model_fields:
            row = await idle_case(server, max(args.topics), args, args.sweeping)
            logger.info("run %d idle, sweeping: %s", run, row)
            results["idle"].append(row)
        if not args.no_pollers:
            row = await pollers_case(server, args)
            logger.info("run %d pollers: %s", run, row)
            results["pollers"].append(row)
        if not args.no_drain:
            modes = DRAIN_MODES
            for mode in modes if run % 2 == 0 else modes[::-1]:
                row = await drain_case(server, mode, args)
                logger.info("run %d drain %s: %s", run, mode, row)
                results["drain"].append(row)
    return results


def summary(results: dict[str, Any], args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    medians: dict[str, Any] = {}
    lines = [f"SeaweedFS, medians of {args.runs} runs ({git_state()['commit']})", ""]
    lines.append(f"1. idle listen(), one consumer per topic, {args.idle_seconds:g} s, per minute")
    lines.append(f"{'topics':<22}{'all':>8}{'GET/HEAD':>10}{'LIST':>7}{'PUT':>6}{'wake p50 s':>12}")
    for case in dict.fromkeys(r["case"] for r in results["idle"]):
        rows = [r for r in results["idle"] if r["case"] == case]
        kinds = {k for r in rows for k in r["per_min"]}
        m = {k: median(r["per_min"].get(k, 0) for r in rows) for k in kinds}
        m["all"] = median(r["total_per_min"] for r in rows)
        m["wake_p50_s"] = median(r["wake_p50_s"] for r in rows if r["wake_p50_s"] is not None)
        medians[f"idle_{case}"] = m
        head = m.get("HEAD", 0) + m.get("GET", 0)  # SeaweedFS counts a HEAD as a GET
        lines.append(
            f"{case:<22}{m['all']:>8.1f}{head:>10.1f}"
            f"{m.get('LIST', 0):>7.1f}{m.get('PUT', 0):>6.1f}{m['wake_p50_s']:>12.3f}"
        )
    if results["pollers"]:
        rows = results["pollers"]
        m = {
            k: median(r["requests"].get(k, 0) for r in rows) for k in ("LIST", "HEAD", "GET", "PUT")
        }
        medians["pollers"] = m
        lines += [
            "",
            f"2. {POLLERS} consumers each poll() an idle topic once a second, "
            f"{args.idle_seconds:g} s: " + ", ".join(f"{k} {v:g}" for k, v in m.items()),
        ]
    if results["drain"]:
        lines += ["", f"3. {args.messages} messages, {PUBLISHERS} publishers, {DRAINERS} consumers"]
        for mode in DRAIN_MODES:
            rows = [r for r in results["drain"] if r["mode"] == mode]
            if not rows:
                continue
            usd = median(r["usd_per_million"] for r in rows)
            medians[f"drain_{mode}_usd"] = usd
            per = {k: median(r["per_message"][k] for r in rows) for k in ("put_list", "get_head")}
            lines.append(
                f"   {mode:<9} USD {usd:.3f} per million (PUT/LIST {per['put_list']:.3f}, "
                f"GET/HEAD {per['get_head']:.3f} per message)"
            )
    medians["targets"] = {
        "idle_1000_per_min": (
            medians.get("idle_1000", {}).get("all"),
            TARGETS["idle_1000_per_min"],
        ),
        "wake_p50_s_at_1000": (
            medians.get("idle_1000", {}).get("wake_p50_s"),
            TARGETS["wake_p50_s"],
        ),
        "pollers_list": (medians.get("pollers", {}).get("LIST"), TARGETS["pollers_list"]),
        "poll_usd": (medians.get("drain_poll_usd"), TARGETS["poll_usd"]),
    }
    return "\n".join(lines), medians


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--topics", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--idle-seconds", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=15.0, help="least seconds before counting")
    parser.add_argument("--wakes", type=int, default=5)
    parser.add_argument("--wake-gap", type=float, default=3.0, help="idle seconds before each")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--no-idle", action="store_true")
    parser.add_argument(
        "--sweeping", type=float, default=20.0, help="sweep interval of the steady-state case"
    )
    parser.add_argument("--no-pollers", action="store_true")
    parser.add_argument("--no-drain", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS / "idle.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("pawn_queue").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory(prefix="pq-bench-idle-") as tmp:
        server = SeaweedFS.start(Path(tmp) / "seaweedfs")
        try:
            results = asyncio.run(run_all(server, args))
        finally:
            server.stop()
    text, medians = summary(results, args)
    print(text)
    document = {
        "results": results,
        "medians": medians,
        "settings": vars(args) | {"out": str(args.out)},
        "host": {"python": platform.python_version(), "pawn_queue": pawn_queue.__file__},
        "git": git_state(),
        "table": text,
    }
    write_results(args.out, document)


if __name__ == "__main__":
    main()
