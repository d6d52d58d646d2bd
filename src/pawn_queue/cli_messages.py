"""``pawn-queue publish``, ``consume`` and ``peek``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from datetime import timedelta
from typing import Annotated, Any

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pawn_queue import layout
from pawn_queue.cli_common import (
    JsonOption,
    Options,
    build_config,
    fail,
    json_line,
    open_queue,
    options,
    payload_fields,
    print_json,
    require_topic,
    run,
    short,
    stderr_console,
    stdout_console,
)
from pawn_queue.envelope import CorruptObject, Envelope, decode_batch, now_utc
from pawn_queue.exceptions import NotFound
from pawn_queue.message import Message
from pawn_queue.producer import Producer


def _attributes(values: list[str] | None) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--attribute: expected KEY=VALUE, got {item!r}", code=2)
        out[key] = value
    return out


class _Counter:
    """Published count and rate, shown on stderr when it is a terminal."""

    def __init__(self) -> None:
        self.count = 0
        self.started = time.perf_counter()
        self._progress: Progress | None = None
        self._task: Any = None
        if sys.stderr.isatty():
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                TextColumn("{task.completed} published"),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(),
                console=stderr_console(),
                transient=True,
            )
            self._task = self._progress.add_task("publishing", total=None, rate="")
            self._progress.start()

    def add(self, n: int) -> None:
        self.count += n
        if self._progress is not None:
            rate = self.count / max(time.perf_counter() - self.started, 1e-6)
            self._progress.update(self._task, advance=n, rate=f"{rate:,.0f} msg/s")

    def close(self) -> None:
        if self._progress is not None:
            self._progress.stop()


async def _publish_stdin(
    producer: Producer,
    topic: str,
    batch: int | None,
    attributes: dict[str, str],
    concurrency: int,
) -> tuple[int, int]:
    """Publish every JSON line of stdin; returns (published, invalid lines)."""
    loop = asyncio.get_running_loop()
    counter = _Counter()
    invalid = 0
    chunk: list[Any] = []
    in_flight: list[asyncio.Task[str]] = []

    async def flush_batch() -> None:
        if chunk:
            ids = await producer.publish_batch(topic, list(chunk), attributes=attributes)
            chunk.clear()
            for message_id in ids:
                typer.echo(message_id)
            counter.add(len(ids))

    async def drain(keep: int) -> None:
        while len(in_flight) > keep:
            message_id = await in_flight.pop(0)
            typer.echo(message_id)
            counter.add(1)

    try:
        line_no = 0
        while True:
            line = await loop.run_in_executor(None, sys.stdin.readline)
            if not line:
                break
            line_no += 1
            if not line.strip():
                continue
            try:
                payload = json.loads(line)
            except ValueError as exc:
                invalid += 1
                typer.echo(f"line {line_no}: invalid JSON ({exc}); skipped", err=True)
                continue
            if batch:
                chunk.append(payload)
                if len(chunk) >= batch:
                    await flush_batch()
            else:
                coro = producer.publish(topic, payload, attributes=attributes or None)
                in_flight.append(asyncio.ensure_future(coro))
                await drain(concurrency - 1)
        await flush_batch()
        await drain(0)
    finally:
        for task in in_flight:
            task.cancel()
        counter.close()
    return counter.count, invalid


def publish(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    message: Annotated[
        str | None,
        typer.Argument(
            metavar="[JSON]", help="One message (JSON). Without it: JSON lines from stdin."
        ),
    ] = None,
    batch: Annotated[
        int | None,
        typer.Option(min=1, help="Publish stdin in batch objects of N messages (publish_batch)."),
    ] = None,
    attribute: Annotated[
        list[str] | None, typer.Option("--attribute", "-a", help="KEY=VALUE (repeatable).")
    ] = None,
    producer_name: Annotated[
        str, typer.Option("--producer", help="Producer name to register as.")
    ] = "pawn-queue-cli",
    concurrency: Annotated[
        int,
        typer.Option(min=1, help="Publishes in flight from stdin (above 1, order is not kept)."),
    ] = 1,
) -> None:
    """Publish one message, or one per JSON line of stdin; prints the ids on stdout.

    Stdin lines are published in order (FIFO), one at a time unless --concurrency or --batch.
    A stdin line that is not valid JSON is reported on stderr with its line number and
    skipped; the other lines are published, and the exit code is 1 at the end.
    """
    opts = options(ctx)
    attributes = _attributes(attribute)
    payload: Any = None
    if message is not None:
        try:
            payload = json.loads(message)
        except ValueError as exc:
            fail(f"invalid JSON message: {exc}", code=2)

    async def main() -> tuple[int, int]:
        layout.validate_name(topic, "topic name")  # before registering: a refusal writes nothing
        async with open_queue(opts) as pq:
            producer = await pq.register_producer(producer_name)
            if message is not None:
                typer.echo(await producer.publish(topic, payload, attributes=attributes or None))
                return 1, 0
            await require_topic(pq, topic)
            return await _publish_stdin(producer, topic, batch, attributes, concurrency)

    published, invalid = run(ctx, main)
    if message is None:
        typer.echo(f"published {published} messages to {topic}", err=True)
    if invalid:
        typer.echo(f"error: {invalid} invalid JSON lines skipped", err=True)
        raise typer.Exit(1)


def message_dict(message: Message) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": message.id,
        "topic": message.topic,
        "producer_id": message.producer_id,
        "created_at": message.created_at,
        "receive_count": message.receive_count,
        "attributes": message.attributes,
        **payload_fields(message.payload),
    }
    if message.group is not None:
        body["group"] = message.group
    return body


def consume(
    ctx: typer.Context,
    topics: Annotated[list[str], typer.Argument(metavar="TOPIC...", help="Topic(s).")],
    count: Annotated[int | None, typer.Option(min=1, help="Stop after N messages.")] = None,
    follow: Annotated[bool, typer.Option(help="Keep waiting for new messages.")] = False,
    ack: Annotated[bool, typer.Option("--ack/--no-ack", help="Ack what was printed.")] = True,
    wait: Annotated[
        float, typer.Option(min=0, help="Wait this long for a message before stopping.")
    ] = 1.0,
    consumer_name: Annotated[
        str, typer.Option("--consumer", help="Consumer name to register as.")
    ] = "pawn-queue-cli",
    metrics_port: Annotated[
        int | None, typer.Option(help="Serve Prometheus metrics on this port meanwhile.")
    ] = None,
) -> None:
    """Print messages as JSON lines on stdout (acked once printed, unless --no-ack).

    Stops when no message arrived within --wait seconds, or after --count messages;
    --follow keeps waiting. With --no-ack the messages are released on exit and can be
    consumed again at once.
    """
    opts = options(ctx)
    run(ctx, lambda: _consume(opts, topics, count, follow, ack, wait, consumer_name, metrics_port))


async def _consume(
    opts: Options,
    topics: list[str],
    count: int | None,
    follow: bool,
    ack: bool,
    wait: float,
    consumer_name: str,
    metrics_port: int | None,
) -> None:
    config = build_config(opts)
    if count is not None and count < config.polling.max_messages_per_poll:
        polling = config.polling.model_copy(update={"max_messages_per_poll": count})
        config = config.model_copy(update={"polling": polling})
    metrics = None
    if metrics_port is not None:
        from pawn_queue.metrics import default_metrics, start_exporter

        metrics = default_metrics()
        start_exporter(metrics_port)
    printed = 0
    async with open_queue(opts, metrics, config) as pq:
        consumer = await pq.register_consumer(consumer_name, topics)
        while count is None or printed < count:
            poll_wait = max(wait, 30.0) if follow else wait
            if metrics is not None:
                messages = await metrics.poll(consumer, poll_wait)
            else:
                messages = await consumer.poll(wait=poll_wait)
            if not messages and not follow:
                break
            for msg in messages:
                if count is not None and printed >= count:
                    break  # left unsettled: released on exit
                sys.stdout.write(json_line(message_dict(msg)) + "\n")
                sys.stdout.flush()
                printed += 1
                if ack:
                    await msg.ack()


def peek(
    ctx: typer.Context,
    topic: Annotated[str, typer.Argument(help="Topic name.")],
    limit: Annotated[int, typer.Option(min=1, help="At most N messages.")] = 10,
    json_output: JsonOption = False,
) -> None:
    """Show the oldest messages without claiming them (state: pending, in_flight, delayed)."""
    opts = options(ctx, json_output)

    async def main() -> list[dict[str, Any]]:
        async with open_queue(opts) as pq:
            await require_topic(pq, topic)
            return await _peek(pq.store, topic, limit, pq.config.polling.visibility_timeout_seconds)

    rows = run(ctx, main)
    if opts.json:
        print_json(rows)
        return
    table = Table(title=f"{topic}: {len(rows)} oldest messages")
    table.add_column("id", no_wrap=True, min_width=36)
    for column in ("state", "created at", "attributes", "payload"):
        table.add_column(column)
    for row in rows:
        shown = row.get("payload", row.get("payload_base64"))
        attrs = json_line(row["attributes"]) if row["attributes"] else ""
        table.add_row(row["id"], row["state"], row["created_at"], attrs, short(shown, 50))
    stdout_console().print(table)


async def _peek(store: Any, topic: str, limit: int, visibility: float) -> list[dict[str, Any]]:
    now = now_utc()
    fresh_after = now - timedelta(seconds=visibility)
    leases = await store.list(layout.leases_prefix(topic))
    leased = {m.key for m in leases if m.last_modified > fresh_after}
    metas = await store.list(layout.messages_prefix(topic), limit=limit)
    rows: list[dict[str, Any]] = []
    for meta in metas:
        pending = layout.parse_pending_key(meta.key)
        if pending is None:
            continue
        try:
            data = (await store.get(meta.key)).data
        except NotFound:
            continue  # acked meanwhile
        due = layout.due_from_key(meta.key)
        if due is not None and due > now:
            state = "delayed"
        elif layout.lease_key(topic, pending.lease_id()) in leased:
            state = "in_flight"
        else:
            state = "pending"
        try:
            envelopes = decode_batch(data) if pending.kind == "batch" else [Envelope.decode(data)]
        except CorruptObject as exc:
            rows.append({"id": pending.object_id, "key": meta.key, "state": "corrupt",
                         "created_at": "", "attributes": {}, "payload": str(exc)})  # fmt: skip
            continue
        for envelope in envelopes:
            rows.append(
                {
                    "id": envelope.id,
                    "key": meta.key,
                    "state": state,
                    "due": due.isoformat() if due else None,
                    "topic": envelope.topic,
                    "producer_id": envelope.producer_id,
                    "created_at": envelope.created_at,
                    "attributes": envelope.attributes,
                    **({"group": envelope.group} if envelope.group else {}),
                    **payload_fields(envelope.payload),
                }
            )
            if len(rows) >= limit:
                return rows
    return rows
