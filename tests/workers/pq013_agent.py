"""Runs under pawn-queue 0.1.3 (its own venv): publish, consume or register, print JSON.

python pq013_agent.py CONFIG_JSON publish TOPIC N
python pq013_agent.py CONFIG_JSON publish-json TOPIC PAYLOADS_JSON_LIST
python pq013_agent.py CONFIG_JSON consume TOPIC N
python pq013_agent.py CONFIG_JSON register NAME
"""

import asyncio
import json
import sys

from pawn_queue import PawnQueue  # 0.1.3 from PyPI


async def main(config: dict, action: str, *args: str) -> object:
    async with await PawnQueue.from_config(config) as pq:
        if action == "publish":
            topic, count = args[0], int(args[1])
            await pq.create_topic(topic)
            producer = await pq.register_producer("legacy-producer")
            return [await producer.publish(topic, {"n": n, "from": "0.1.3"}) for n in range(count)]
        if action == "publish-json":
            topic, payloads = args[0], json.loads(args[1])
            await pq.create_topic(topic)
            producer = await pq.register_producer("legacy-producer")
            return [await producer.publish(topic, payload) for payload in payloads]
        if action == "consume":
            topic, count = args[0], int(args[1])
            consumer = await pq.register_consumer("legacy-consumer", topics=[topic])
            got: list[dict] = []
            for _ in range(200):
                for message in await consumer.poll():
                    got.append(
                        {
                            "id": message.id,
                            "payload": message.payload,
                            "producer_id": message.producer_id,
                        }
                    )
                    await message.ack()
                if len(got) >= count:
                    break
                await asyncio.sleep(0.05)
            return got
        if action == "register":
            return (await pq.register_producer(args[0])).id
    raise SystemExit(f"unknown action {action}")


if __name__ == "__main__":
    result = asyncio.run(main(json.loads(sys.argv[1]), sys.argv[2], *sys.argv[3:]))
    print(json.dumps(result))
