"""OpenTelemetry tracing (pawn_queue.tracing), recorded by the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from pawn_queue import Message, PawnQueue
from pawn_queue.config import load_config
from pawn_queue.observe import Observer, Publication
from pawn_queue.tracing import Tracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


class Raising(Observer):
    def before_publish(self, publication: Publication) -> None:
        raise RuntimeError("observer bug")

    def settled(self, *args: object) -> None:
        raise RuntimeError("observer bug")


async def test_publish_and_listen_make_linked_spans(
    queue_config: dict[str, Any], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    tracer = provider.get_tracer("test")
    observers = [Raising(), Tracing(provider)]
    async with PawnQueue(load_config(queue_config), observers=observers) as pq:
        await pq.create_topic("orders")
        producer = await pq.register_producer("p")
        message_id = await producer.publish("orders", {"n": 1}, attributes={"k": "v"})
        consumer = await pq.register_consumer("c", topics=["orders"])
        seen: list[Message] = []
        inner: list[trace.Span] = []
        handled = asyncio.Event()

        async def handler(message: Message) -> None:
            with tracer.start_as_current_span("work") as span:
                inner.append(span)
            seen.append(message)
            await message.ack()
            handled.set()

        task = asyncio.create_task(consumer.listen(handler))
        await asyncio.wait_for(handled.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    [publish] = named(exporter, "publish orders")
    assert publish.kind is SpanKind.PRODUCER
    assert publish.attributes is not None
    assert publish.attributes["messaging.system"] == "pawn-queue"
    assert publish.attributes["messaging.destination.name"] == "orders"
    assert publish.attributes["messaging.message.id"] == message_id
    # The message carries the publish span's context, next to the caller's attributes.
    [message] = seen
    publish_context = publish.get_span_context()
    assert publish_context is not None
    trace_id, span_id = publish_context.trace_id, publish_context.span_id
    traceparent = f"00-{trace_id:032x}-{span_id:016x}-{publish_context.trace_flags:02x}"
    assert message.attributes == {"k": "v", "traceparent": traceparent}
    assert message.settled  # the raising observer broke neither publish nor ack

    [process] = named(exporter, "process orders")
    assert process.kind is SpanKind.CONSUMER
    assert process.attributes is not None
    assert process.attributes["messaging.message.id"] == message_id
    assert process.attributes["messaging.destination.name"] == "orders"
    [link] = process.links
    assert (link.context.trace_id, link.context.span_id) == (trace_id, span_id)
    # The handler's own span is a child of the process span.
    [work] = named(exporter, "work")
    assert work.parent is not None and process.context is not None
    assert work.parent.span_id == process.context.span_id


async def test_a_failed_handler_marks_its_span_and_a_caller_traceparent_stays(
    queue_config: dict[str, Any], provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    async with PawnQueue(load_config(queue_config), observers=[Tracing(provider)]) as pq:
        await pq.create_topic("t")
        producer = await pq.register_producer("p")
        ids = await producer.publish_batch("t", [1, 2], attributes={"traceparent": own})
        consumer = await pq.register_consumer("c", topics=["t"])
        failed = asyncio.Event()

        async def handler(message: Message) -> None:
            assert message.attributes == {"traceparent": own}
            if len(ids) == 2:
                ids.pop()
                return await message.ack()
            failed.set()
            raise ValueError("boom")

        task = asyncio.create_task(consumer.listen(handler))
        await asyncio.wait_for(failed.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    [publish] = named(exporter, "publish t")
    assert publish.attributes is not None
    assert publish.attributes["messaging.batch.message_count"] == "2"
    processes = named(exporter, "process t")
    assert len(processes) == 2
    for span in processes:
        [link] = span.links
        assert f"{link.context.trace_id:032x}" == own.split("-")[1]
    assert sorted(s.status.status_code.name for s in processes) == ["ERROR", "UNSET"]
    assert any(StatusCode.ERROR is s.status.status_code for s in processes)


async def test_without_the_tracing_observer_no_attribute_is_added(
    queue_config: dict[str, Any], exporter: InMemorySpanExporter
) -> None:
    async with PawnQueue(load_config(queue_config)) as pq:
        await pq.create_topic("t")
        await (await pq.register_producer("p")).publish("t", 1)
        [message] = await (await pq.register_consumer("c", topics=["t"])).poll(wait=5)
        assert message.attributes == {}
        await message.ack()
    assert exporter.get_finished_spans() == ()
