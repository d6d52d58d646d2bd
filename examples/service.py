"""A service: orders in, shipments out, invalid orders dead-lettered.

Run the handlers as a service (stop with Ctrl-C or SIGTERM)::

    pawn-queue worker examples.service:app --url file://./service-queue --create-topics

or run this file: it publishes a few orders (one of them invalid) to ``./service-queue``,
serves them, and prints what came out::

    python examples/service.py
"""

from __future__ import annotations

import asyncio
import sys

from pydantic import BaseModel, Field

from pawn_queue import App, Message, Retry

app = App("file://./service-queue", name="shop", create_topics=True)


class Order(BaseModel):
    order_id: int
    sku: str
    quantity: int = Field(gt=0)


class Shipment(BaseModel):
    order_id: int
    parcels: int


class OutOfStock(Exception):
    """Retried: stock may come in."""


@app.subscriber(
    "orders",
    concurrency=4,
    publish_to="shipments",
    retry=Retry(max_receives=3, base_delay=0.5, jitter=0.5, retry_on=(OutOfStock,)),
)
async def ship(order: Order) -> Shipment:
    """Validated orders in (an invalid one is dead-lettered at once); shipments out."""
    return Shipment(order_id=order.order_id, parcels=(order.quantity + 9) // 10)


@app.subscriber("shipments", concurrency=2)
def record(shipment: Shipment, message: Message) -> None:
    """A plain function runs in a thread; the message is there when a handler wants it."""
    # One write per line: print() writes the line and its end apart, and two threads'
    # lines could run together.
    sys.stdout.write(
        f"shipped order {shipment.order_id} in {shipment.parcels} parcel(s) [{message.id}]\n"
    )


async def main() -> int:
    await app.start()
    orders = [{"order_id": i, "sku": "pawn", "quantity": 5 * i} for i in range(1, 6)]
    orders.append({"order_id": 6, "sku": "pawn", "quantity": 0})  # invalid: dead-lettered
    for order in orders:
        await app.producer.publish("orders", order)
    serving = asyncio.create_task(app.serve())
    try:
        async with asyncio.timeout(30):
            while True:  # a demo's end: every order shipped or dead-lettered
                stats = [await app.queue.topic_stats(t) for t in ("orders", "shipments")]
                if all(s.pending + s.in_flight + s.delayed == 0 for s in stats):
                    break
                await asyncio.sleep(0.1)
        for letter in await app.queue.dead_letters("orders"):
            print(f"dead letter {letter.payload}: {letter.reason} ({letter.error})")
        await app.queue.purge_dead_letters("orders")
    finally:
        app.stop_consuming()
        await serving
        await app.stop()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
