"""`pawn-queue consume --follow` stopped by SIGTERM, as a service manager stops it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pawn_queue.sync import PawnQueue


def _cli(url: str, *args: str) -> tuple[list[str], dict[str, str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAWNQUEUE_")}
    return [sys.executable, "-m", "pawn_queue", "--url", url, *args], env


def test_sigterm_releases_what_consume_follow_holds(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'queue'}"
    with PawnQueue.from_url(url) as pq:
        pq.create_topic("jobs")
        mid = pq.register_producer("p").publish("jobs", {"n": 1})
    argv, env = _cli(url, "consume", "jobs", "--follow", "--no-ack")
    follower = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert follower.stdout is not None
        line = follower.stdout.readline()  # printed: claimed and held, not acked
        assert json.loads(line)["id"] == mid
        follower.send_signal(signal.SIGTERM)
        _, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 128 + signal.SIGTERM, err
    assert b"terminated" in err
    # Released at once (not after the 30 s visibility timeout), its receive not counted.
    with PawnQueue.from_url(url) as pq:
        [again] = pq.register_consumer("next", ["jobs"]).poll(wait=10)
        assert again.id == mid and again.receive_count == 1
        again.ack()
