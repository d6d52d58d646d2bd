"""Large and binary payloads round-trip on every store without piling up copies."""

from __future__ import annotations

import os
import tracemalloc

from pawn_queue import PawnQueue

MIB = 1024 * 1024
SIZE = 100 * MIB


async def round_trip(pq: PawnQueue, payload: object) -> tuple[object, int, int]:
    """Publish and receive ``payload``; the Python memory peaks of each side, in bytes."""
    producer = await pq.register_producer("p")
    consumer = await pq.register_consumer("c", topics=["big"])
    tracemalloc.start()
    try:
        await producer.publish("big", payload)
        publish_peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.reset_peak()
        [message] = await consumer.poll()
        received = message.payload
        receive_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    await message.ack()
    return received, publish_peak, receive_peak


async def test_100_mib_bytes_payload(pq: PawnQueue) -> None:
    await pq.create_topic("big")
    payload = os.urandom(SIZE)
    received, publish_peak, receive_peak = await round_trip(pq, payload)
    assert received == payload
    # One joined body while publishing; the stored body plus the payload slice receiving.
    assert publish_peak < 2.5 * SIZE, publish_peak / MIB
    assert receive_peak < 3.5 * SIZE, receive_peak / MIB


async def test_100_mib_json_payload(pq: PawnQueue) -> None:
    await pq.create_topic("big")
    payload = {"blob": "x" * SIZE, "n": 1}
    received, publish_peak, receive_peak = await round_trip(pq, payload)
    assert received == payload
    assert publish_peak < 3.5 * SIZE, publish_peak / MIB
    assert receive_peak < 3.5 * SIZE, receive_peak / MIB


async def test_small_bytes_payload_and_dead_letter(pq: PawnQueue) -> None:
    await pq.create_topic("t")
    producer = await pq.register_producer("p")
    await producer.publish("t", b"\x00\xffbinary\nwith newline", attributes={"type": "raw"})
    consumer = await pq.register_consumer("c", topics=["t"])
    [message] = await consumer.poll()
    assert message.payload == b"\x00\xffbinary\nwith newline"
    assert message.attributes == {"type": "raw"}
    await message.nack()
    [letter] = await pq.dead_letters("t")
    assert letter.payload == b"\x00\xffbinary\nwith newline"
    assert await pq.redrive("t") == 1
    [again] = await consumer.poll()
    assert again.payload == b"\x00\xffbinary\nwith newline"
