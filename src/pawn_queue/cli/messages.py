"""``pawn-queue publish``, ``consume`` and ``peek``."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import typer
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from pawn_queue._protocol import layout
from pawn_queue._protocol.delivery import Message
from pawn_queue._protocol.topics import PeekedMessage
from pawn_queue.cli.common import (
    EXIT_USAGE,
    CliError,
    JsonOption,
    Options,
    PriorityOption,
    SubscriptionOption,
    attribute_options,
    build_config,
    fail,
    json_line,
    open_queue,
    options,
    payload_fields,
    print_json,
    require_extra,
    run,
    short,
    stderr_console,
    stdout_console,
)
from pawn_queue.exceptions import PayloadError, PublishError
from pawn_queue.producer import check_timing
from pawn_queue.store.base import Store

_T = TypeVar("_T")


_ROOM_NOTICE_AFTER = 0.5  # a publish still running then may be waiting for room: look


def _loads(text: str) -> Any:
    """A JSON value; NaN and infinities are refused (they are not JSON, and no message holds
    them)."""
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


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


class _RoomNotice:
    """Says on stderr when a publish waits for room in a topic at its ``max_pending``.

    The producer waits silently; a publish still running after a moment makes this look
    (one LIST of up to ``max_pending`` keys) and, if the topic is full, say so once.
    """

    def __init__(self, store: Store, topic: str, max_pending: int | None, wait: float) -> None:
        self._store = store
        self._topic = topic
        self._max_pending = max_pending
        self._wait = wait
        self._shown = False

    async def publish(self, call: Awaitable[_T]) -> _T:
        task = asyncio.ensure_future(call)
        if self._max_pending is None or self._wait <= 0:
            return await task
        try:
            done, _ = await asyncio.wait({task}, timeout=_ROOM_NOTICE_AFTER)
            if not done and not self._shown:
                prefix = layout.messages_prefix(self._topic)
                pending = await self._store.list(prefix, limit=self._max_pending)
                if len(pending) >= self._max_pending and not task.done():
                    self._shown = True
                    typer.echo(
                        f"topic {self._topic} is full (max_pending {self._max_pending}): "
                        f"waiting up to {self._wait:g}s for room (--wait-for-room)",
                        err=True,
                    )
            result = await task
        except BaseException:
            task.cancel()
            raise
        if not done:
            self._shown = False  # room came: a later wait is announced again
        return result


class _LineError(Exception):
    """A stdin line stopped the publishing (not a bad line: those are skipped)."""


async def _publish_stdin(
    send: Callable[[Any], Awaitable[str]],
    send_batch: Callable[[list[Any]], Awaitable[list[str]]] | None,
    batch: int | None,
    concurrency: int,
) -> tuple[int, int]:
    """Publish every JSON line of stdin; returns (published, skipped lines)."""
    loop = asyncio.get_running_loop()
    counter = _Counter()
    invalid = 0
    chunk: list[tuple[int, Any]] = []
    in_flight: list[tuple[int, asyncio.Future[str]]] = []

    async def flush_batch() -> None:
        nonlocal invalid
        if not chunk or send_batch is None:
            return
        lines = f"lines {chunk[0][0]}-{chunk[-1][0]}" if len(chunk) > 1 else f"line {chunk[0][0]}"
        try:
            ids = await send_batch([payload for _, payload in chunk])
        except PayloadError as exc:
            invalid += len(chunk)
            typer.echo(f"{lines} (one batch): cannot publish ({exc}); skipped", err=True)
            return
        except PublishError as exc:
            raise _LineError(f"{lines} (one batch): {exc}") from exc
        finally:
            chunk.clear()
        for message_id in ids:
            typer.echo(message_id)
        counter.add(len(ids))

    async def drain(keep: int) -> None:
        nonlocal invalid
        while len(in_flight) > keep:
            line_no, future = in_flight.pop(0)
            try:
                message_id = await future
            except PayloadError as exc:
                invalid += 1
                typer.echo(f"line {line_no}: cannot publish ({exc}); skipped", err=True)
                continue
            except PublishError as exc:
                raise _LineError(f"line {line_no}: {exc}") from exc
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
                payload = _loads(line)
            except (ValueError, RecursionError) as exc:
                invalid += 1
                reason = exc if isinstance(exc, ValueError) else "nested too deeply"
                typer.echo(f"line {line_no}: invalid JSON ({reason}); skipped", err=True)
                continue
            if batch:
                chunk.append((line_no, payload))
                if len(chunk) >= batch:
                    await flush_batch()
            else:
                in_flight.append((line_no, asyncio.ensure_future(send(payload))))
                await drain(concurrency - 1)
        await flush_batch()
        await drain(0)
    finally:
        for _, future in in_flight:
            future.cancel()
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
    delay: Annotated[
        float | None, typer.Option(min=0, help="Keep the messages invisible this many seconds.")
    ] = None,
    group: Annotated[
        str | None,
        typer.Option(help="Message group: delivered in order, one at a time."),
    ] = None,
    dedup_id: Annotated[
        str | None,
        typer.Option(help="Dedup id of the one message: a repeat within the window is dropped."),
    ] = None,
    wait_for_room: Annotated[
        float,
        typer.Option(min=0, help="On a topic at its max_pending: wait this long for room."),
    ] = 30.0,
    expires_in: Annotated[
        float | None,
        typer.Option(
            min=0, help="Never deliver the messages after this many seconds (longer than --delay)."
        ),
    ] = None,
    priority: PriorityOption = 0,
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
    A stdin line that is not valid JSON (NaN and Infinity included) is reported on stderr
    with its line number and skipped; the other lines are published, and the exit code is 1
    at the end. On a topic at its max_pending, a publish (not --batch) waits up to
    --wait-for-room seconds for room (saying so on stderr), then fails with the line number;
    later lines are not published.
    """
    opts = options(ctx)
    attributes = attribute_options(attribute)
    payload: Any = None
    if message is not None:
        try:
            payload = _loads(message)
        except ValueError as exc:
            fail(f"invalid JSON message: {exc}", EXIT_USAGE)
        except RecursionError:
            fail("invalid JSON message: nested too deeply", EXIT_USAGE)
    elif dedup_id is not None:
        fail("--dedup-id needs one message (the JSON argument), not stdin lines", EXIT_USAGE)
    if batch and (delay is not None or group is not None or dedup_id is not None):
        fail("--batch cannot be combined with --delay, --group or --dedup-id", EXIT_USAGE)
    if group == "":
        fail("--group must not be empty", EXIT_USAGE)

    async def main() -> tuple[int, int]:
        # Before registering: a refusal writes nothing.
        layout.validate_name(topic, "topic name")
        check_timing(delay, expires_in)
        async with open_queue(opts) as pq:
            settings = await pq.topic_settings(topic)
            producer = await pq.register_producer(producer_name)
            notice = _RoomNotice(pq.store, topic, settings.max_pending, wait_for_room)

            def send(value: Any, dedup: str | None = None) -> Awaitable[str]:
                published = producer.publish(
                    topic,
                    value,
                    delay=delay,
                    attributes=attributes or None,
                    group=group,
                    dedup_id=dedup,
                    wait_for_room=wait_for_room,
                    expires_in=expires_in,
                    priority=priority,
                )
                return notice.publish(published)

            if message is not None:
                typer.echo(await send(payload, dedup_id))
                return 1, 0

            def send_batch(values: list[Any]) -> Awaitable[list[str]]:
                return producer.publish_batch(
                    topic, values, attributes=attributes, expires_in=expires_in, priority=priority
                )

            try:
                return await _publish_stdin(send, send_batch, batch, concurrency)
            except _LineError as exc:
                raise CliError(f"{exc}; stopped there (the ids printed were published)") from exc

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
        **({"subscription": message.subscription} if message.subscription else {}),
        "producer_id": message.producer_id,
        "created_at": message.created_at,
        "receive_count": message.receive_count,
        "attributes": message.attributes,
        **payload_fields(message.payload),
    }
    if message.group is not None:
        body["group"] = message.group
    if message.expires_at is not None:
        body["expires_at"] = message.expires_at
    if message.priority:
        body["priority"] = message.priority
    return body


def consume(
    ctx: typer.Context,
    topics: Annotated[list[str], typer.Argument(metavar="TOPIC...", help="Topic(s).")],
    subscription: SubscriptionOption = None,
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
        int | None,
        typer.Option(
            min=0,
            max=65535,
            help="Serve Prometheus metrics on this port (0: any free port) meanwhile; needs "
            "the metrics extra.",
        ),
    ] = None,
) -> None:
    """Print messages as JSON lines on stdout (acked once printed, unless --no-ack).

    Stops when no message arrived within --wait seconds, or after --count messages;
    --follow keeps waiting. With --no-ack the messages are released on exit and can be
    consumed again at once. With --subscription NAME, that subscription of each topic is
    read (a message then has a "subscription" field), competing with its other consumers.
    """
    opts = options(ctx)
    if metrics_port is not None:
        require_extra("prometheus_client", "metrics", "--metrics-port")
    consumer = _Reader(consumer_name, topics, subscription)
    run(ctx, lambda: _consume(opts, consumer, count, follow, ack, wait, metrics_port))


@dataclass(frozen=True, slots=True)
class _Reader:
    """Who ``consume`` registers as, and what it reads."""

    name: str
    topics: list[str]
    subscription: str | None


async def _consume(
    opts: Options,
    reader: _Reader,
    count: int | None,
    follow: bool,
    ack: bool,
    wait: float,
    metrics_port: int | None,
) -> None:
    config = build_config(opts)
    if count is not None and count < config.polling.max_messages_per_poll:
        polling = config.polling.model_copy(update={"max_messages_per_poll": count})
        config = config.model_copy(update={"polling": polling})
    metrics = None
    if metrics_port is not None:
        from pawn_queue.metrics import LOOPBACK, default_metrics, start_exporter

        metrics = default_metrics()
        try:
            server, _ = start_exporter(metrics_port)
        except OSError as exc:
            raise CliError(f"cannot listen on port {metrics_port}: {exc}") from None
        # The port bound, which --metrics-port 0 leaves to the system.
        typer.echo(f"serving metrics on http://{LOOPBACK}:{server.server_port}/metrics", err=True)
    printed = 0
    async with open_queue(opts, metrics, config, must_exist=True) as pq:
        if reader.subscription is not None:
            for topic in reader.topics:
                await pq.topic_settings(topic)  # a missing topic, said as such
        consumer = await pq.register_consumer(
            reader.name, reader.topics, subscription=reader.subscription
        )
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

    async def main() -> list[PeekedMessage]:
        async with open_queue(opts, must_exist=True) as pq:
            return await pq.peek(topic, limit)

    rows = [_peek_row(message) for message in run(ctx, main)]
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


def _peek_row(message: PeekedMessage) -> dict[str, Any]:
    if message.error is not None:
        return {"id": message.id, "key": message.key, "state": "corrupt",
                "created_at": "", "attributes": {}, "payload": message.error}  # fmt: skip
    return {
        "id": message.id,
        "key": message.key,
        "state": message.state,
        "due": message.due.isoformat(),
        "topic": message.topic,
        "producer_id": message.producer_id,
        "created_at": message.created_at,
        "attributes": message.attributes,
        **({"group": message.group} if message.group else {}),
        **({"priority": message.priority} if message.priority else {}),
        **payload_fields(message.payload),
    }
