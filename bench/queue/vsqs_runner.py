"""vsqs 0.3 (PyPI) on a local directory, for bench/queue/compare.py's local-directory comparison.

Runs under its own virtualenv (``make .venv-vsqs/.installed``), from the repository root
(``bench.queue.support.run_child`` starts it)::

    .venv-vsqs/bin/python -m bench.queue.vsqs_runner '{"dir": "/tmp/x", "backlogs": [2000, 10000],
                                                       "ops": 300, "runs": 3}'

For each backlog: fill the queue up to it, then per run time ``ops`` serial ``publish()``
calls and ``ops`` serial ``receive()`` + ``delete()`` pairs (its API is blocking and
returns one message per call). The fill writes ready messages straight into the queue
directory in vsqs's own on-disk format (a file named by a microsecond timestamp): through
``publish()``, which lists the whole directory each time, 10,000 messages take about a
minute. Prints the JSON result as its last line.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from typing import Any

from bench import common

warnings.simplefilter("ignore", DeprecationWarning)  # vsqs calls Condition.notifyAll

from vsqs.queue import QueueManager  # noqa: E402

PAYLOAD = b'{"n": 0, "pad": "' + b"x" * 40 + b'"}'


def _fill(path: str, count: int) -> None:
    """``count`` ready messages, older than anything publish() will create."""
    base = int(time.time() * 1_000_000) - 10_000_000 - count
    for i in range(count):
        with open(os.path.join(path, str(base + i)), "wb") as f:
            f.write(PAYLOAD)


def _pending(path: str) -> int:
    return sum(1 for name in os.listdir(path) if name.isdigit())


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    manager = QueueManager(spec["dir"])
    rows = []
    try:
        queue = manager.get_queue("bench")
        for backlog in spec["backlogs"]:
            pending = _pending(queue.path)
            if pending < backlog:
                _fill(queue.path, backlog - pending)
            publish_rates, consume_rates = [], []
            for _ in range(spec["runs"]):
                started = time.perf_counter()
                for _ in range(spec["ops"]):
                    queue.publish(PAYLOAD)
                publish_rates.append(spec["ops"] / (time.perf_counter() - started))
                started = time.perf_counter()
                for _ in range(spec["ops"]):
                    message_id, _data = queue.receive(visibility_timeout=60, timeout=10)
                    if message_id is None:
                        raise RuntimeError("vsqs: receive timed out on a non-empty queue")
                    queue.delete(message_id)
                consume_rates.append(spec["ops"] / (time.perf_counter() - started))
            rows.append(
                {
                    "backlog": backlog,
                    "publish_per_s": round(common.median(publish_rates), 1),
                    "consume_per_s": round(common.median(consume_rates), 1),
                    "publish_runs": [round(r, 1) for r in publish_rates],
                    "consume_runs": [round(r, 1) for r in consume_rates],
                }
            )
    finally:
        manager.close()
        manager.observer.join(timeout=10)
    return rows


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))))
