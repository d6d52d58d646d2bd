"""pawn-queue topics as a PySpark data source and sink (``pip install "pawn-queue[spark]"``).

::

    from pawn_queue.spark import register
    register(spark)
    stream = (
        spark.readStream.format("pawnqueue")
        .option("url", "s3://bucket/queues?endpoint_url=...")
        .option("topic", "orders")
        .load()
    )

Streaming reads are exactly-once into an idempotent sink (Parquet, Delta): each micro-batch
is a manifest of the objects it owns, leased by the query and acked once Spark committed it.
Batch reads are snapshots (pending messages or dead letters) that claim nothing. With
``.option("subscription", "billing")`` a read takes that subscription of the topics instead
of their own queues (the ``topic`` column still names the topic); the ``priority`` column
says each message's priority. Writes pack rows into batch objects under deterministic keys,
so retries overwrite instead of adding (optional ``priority`` and ``expires_in`` columns
set what ``publish``'s arguments do); a topic with subscriptions gets them copied into each
subscription whose filter matches, as a producer's messages are.
Needs PySpark 4.2 or later (admission control) and pyarrow.
"""

from __future__ import annotations

try:
    from pyspark.sql import SparkSession
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        'pawn_queue.spark needs PySpark and pyarrow: pip install "pawn-queue[spark]"'
    ) from exc

from pawn_queue.spark.source import PawnQueueDataSource

__all__ = ["PawnQueueDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("pawnqueue")`` available in this Spark session."""
    spark.dataSource.register(PawnQueueDataSource)
