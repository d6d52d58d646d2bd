"""examples/orders_pipeline.py on a Spark standalone cluster (a master and two one-core
workers) with the S3 store, submitted the way docs/spark/cluster.md says: the same
script as on local Spark, exactly once (the query through its subscription, the order
service through its own), with its tasks on both workers."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow.dataset as ds  # type: ignore[import-untyped]
import pytest

from pawn_queue import PawnQueue
from pawn_queue._protocol import layout
from pawn_queue.config import S3Config
from pawn_queue.store.s3 import S3Store
from tests.helpers.spark_cluster import SPARK_HOME, standalone_cluster

# Spark in processes of their own (a standalone cluster's JVMs, a pipeline's processes), on
# timeouts Spark sets: make pytest runs these alone, after the others.
pytestmark = pytest.mark.alone


REPO = Path(__file__).resolve().parents[2]
PIPELINE = REPO / "examples" / "orders_pipeline.py"
ORDERS, ROUNDS, THRESHOLD = 1000, 2, 400.0


def pipeline_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("orders_pipeline", PIPELINE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def expected_orders() -> tuple[list[dict[str, Any]], float]:
    """The orders the script publishes (its own code, seeded per round) and their value,
    published to an in-memory store instead."""
    module = pipeline_module()
    url = f"memory://orders-{uuid.uuid4().hex}"
    value = 0.0
    for round_ in range(1, ROUNDS + 1):
        value += await module.publish_orders(url, (round_ - 1) * ORDERS, ORDERS, seed=round_)
    async with PawnQueue.from_url(url) as pq:
        orders = [m.payload for m in await pq.peek("orders", limit=ROUNDS * ORDERS + 1)]
    return orders, value


def task_executors(event_log_dir: Path) -> dict[str, int]:
    """Tasks finished per executor id, from the application's event log."""
    counts: dict[str, int] = {}
    for path in event_log_dir.rglob("events_*"):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event.get("Event") == "SparkListenerTaskEnd":
                executor = event["Task Info"]["Executor ID"]
                counts[executor] = counts.get(executor, 0) + 1
    return counts


async def left_in(s3: S3Config, queue: str) -> list[str]:
    """The messages and dead letters left in a topic's own queue or a subscription's."""
    store = S3Store(s3)
    try:
        # (Leases of acked objects may stay a while as tombstones: see docs/protocol.md.)
        keys = [m.key for m in await store.list(layout.messages_prefix(queue))]
        return keys + [m.key for m in await store.list(layout.dead_letter_prefix(queue))]
    finally:
        await store.close()


def test_orders_pipeline_runs_unchanged_on_a_standalone_cluster(
    s3_config: S3Config, tmp_path: Path
) -> None:
    assert s3_config.aws_access_key_id and s3_config.aws_secret_access_key
    key = s3_config.aws_access_key_id.get_secret_value()
    secret = s3_config.aws_secret_access_key.get_secret_value()
    url = f"s3://{s3_config.bucket_name}?endpoint_url={s3_config.endpoint_url}"
    events = tmp_path / "events"
    events.mkdir()
    # Credentials only as docs/spark/cluster.md says: the driver's environment and spark.executorEnv
    # (the workers themselves start without any; see standalone_cluster).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env.update(PAWNQUEUE_S3_ACCESS_KEY=key, PAWNQUEUE_S3_SECRET_KEY=secret)
    with standalone_cluster(tmp_path / "cluster") as cluster:
        command = [
            str(SPARK_HOME / "bin" / "spark-submit"),
            *("--master", cluster.master_url),
            *("--conf", f"spark.pyspark.python={sys.executable}"),
            *("--conf", f"spark.executorEnv.PAWNQUEUE_S3_ACCESS_KEY={key}"),
            *("--conf", f"spark.executorEnv.PAWNQUEUE_S3_SECRET_KEY={secret}"),
            # For the checks below only: where each task ran.
            *("--conf", "spark.eventLog.enabled=true", "--conf", f"spark.eventLog.dir={events}"),
            *("--conf", "spark.eventLog.compress=false", "--conf", "spark.ui.enabled=false"),
            str(PIPELINE),
            *("--url", url, "--out", str(tmp_path / "out")),
            *("--orders", str(ORDERS), "--rounds", str(ROUNDS), "--threshold", str(THRESHOLD)),
        ]
        run = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
        [app] = cluster.master_state()["completedapps"]
        executors_by_worker = [
            [e for e in cluster.worker_state(i)["finishedexecutors"] if e["appid"] == app["id"]]
            for i in range(2)
        ]

    assert f"spark master: {cluster.master_url}" in run.stdout
    # The application had an executor on each worker, and both ran tasks (none ran in the
    # driver, as they would in local mode).
    assert [len(executors) for executors in executors_by_worker] == [1, 1]
    ran = task_executors(events)
    assert set(ran) == {str(e[0]["id"]) for e in executors_by_worker}, ran

    orders, value = asyncio.run(expected_orders())
    assert len({o["order_id"] for o in orders}) == ROUNDS * ORDERS
    alerts = [o for o in orders if o["quantity"] * o["price"] >= THRESHOLD]
    summary = json.loads(run.stdout.split("exactly once")[0].strip().splitlines()[-1])
    every = {"orders": ROUNDS * ORDERS, "distinct": ROUNDS * ORDERS}
    every |= {"first": 0, "last": ROUNDS * ORDERS - 1}
    assert summary == {
        "orders_published": ROUNDS * ORDERS,
        "orders_in_revenue_table": ROUNDS * ORDERS,
        "revenue": round(value, 2),
        "expected_revenue": round(value, 2),
        "alerts_received": len(alerts),
        "subscriptions": {"service": every, "revenue": every},
    }
    assert "checked: each subscription of orders got every order exactly once" in run.stdout
    # The revenue table read without Spark: every order counted once.
    table = ds.dataset(tmp_path / "out" / "revenue", format="parquet").to_table()
    assert sum(table.column("orders").to_pylist()) == ROUNDS * ORDERS
    assert abs(sum(table.column("revenue").to_pylist()) - value) < 0.01
    # Nothing left: the query and the order service acked every order (each in its
    # subscription; the topic's own queue got none), the script's consumer every alert.
    for subscription in ("service", "revenue"):
        queue = layout.subscription_queue("orders", subscription)
        assert asyncio.run(left_in(s3_config, queue)) == []
    assert asyncio.run(left_in(s3_config, "orders")) == []
    assert asyncio.run(left_in(s3_config, "alerts")) == []
