"""A consumer process killed with ``kill -9`` while holding messages loses nothing.

Runs on the stores that other processes can share: the local directory, every S3 server of
the matrix and Azurite.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from pawn_queue import PawnQueue
from tests.helpers.stores import S3_SERVERS, queue_config_dict
from tests.helpers.support import keys_under

HOLDER = """
import asyncio, json, sys
from pawn_queue import PawnQueue

async def main():
    async with await PawnQueue.from_config(json.loads(sys.argv[1])) as pq:
        consumer = await pq.register_consumer("doomed", topics=["jobs"])
        held = []
        while len(held) < int(sys.argv[2]):
            held += await consumer.poll()
        print(json.dumps([m.id for m in held]), flush=True)
        await asyncio.Event().wait()  # hold the leases (refreshing them) until killed

asyncio.run(main())
"""


@pytest.mark.parametrize("backend", ["filesystem", *S3_SERVERS, "azure"])
async def test_killed_consumer_messages_are_redelivered(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    config: dict[str, Any] = queue_config_dict(backend, request, tmp_path)
    config["polling"]["visibility_timeout_seconds"] = 2.0
    async with await PawnQueue.from_config(config) as pq:
        await pq.create_topic("jobs")
        producer = await pq.register_producer("p")
        published = [await producer.publish("jobs", {"n": n}) for n in range(15)]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            HOLDER,
            json.dumps(config),
            "10",
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 60)
            held = json.loads(line)
            # At least 10: a poll that met a slow claim returns fewer and the next one up to
            # a poll's worth more, so the holder may end with more than it asked for.
            assert len(held) >= 10 and set(held) <= set(published)
        finally:  # the scenario's kill, and no orphan if the test failed before it
            os.kill(process.pid, signal.SIGKILL)
            await process.wait()

        survivor = await pq.register_consumer("survivor", topics=["jobs"])
        delivered: list[str] = []
        async with asyncio.timeout(60):
            while len(delivered) < len(published):
                for message in await survivor.poll():
                    delivered.append(message.id)
                    await message.ack()
                await asyncio.sleep(0.05)
        assert sorted(delivered) == sorted(published)
        assert len(delivered) == len(set(delivered))
        assert await keys_under(pq, "jobs/messages/") == []
        assert await keys_under(pq, "jobs/leases/") == []
