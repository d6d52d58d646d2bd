"""Fixtures of the Spark tests: one local SparkSession per test session, a store per test.

Test modules load this as a plugin (PySpark is part of the test install: ``make test``
installs the ``spark`` extra, and a missing PySpark fails the tests)::

    pytest_plugins = ["tests.helpers.spark_support"]

The session is ``local[2,2]``: two worker threads, and two attempts per task, so a task that
fails once is retried as it would be on a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tests.helpers.spark_helpers import SparkQueue, filesystem_queue, local_spark, s3_queue

SPARK_BACKENDS = ["filesystem", "s3"]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    session = local_spark(
        "local[2,2]",
        {
            "spark.app.name": "pawn-queue-tests",
            "spark.sql.streaming.stopTimeout": "30s",
            "spark.driver.memory": "1g",
            "spark.sql.execution.pythonUDF.arrow.enabled": "false",  # pandas not needed
        },
    )
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(params=SPARK_BACKENDS)
def spark_queue(request: pytest.FixtureRequest, tmp_path: Path) -> SparkQueue:
    if request.param == "filesystem":
        return filesystem_queue(tmp_path)
    return s3_queue(request.getfixturevalue("s3_config"), tmp_path)


@pytest.fixture
def fs_queue(tmp_path: Path) -> SparkQueue:
    return filesystem_queue(tmp_path)
