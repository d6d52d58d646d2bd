"""Fixtures of the Spark tests: one local SparkSession per test session, a store per test.

Test modules load this as a plugin (PySpark is part of the test install: ``make test``
installs the ``spark`` extra, and a missing PySpark fails the tests)::

    pytest_plugins = ["tests.spark_support"]

The session is ``local[2,2]``: two worker threads, and two attempts per task, so a task that
fails once is retried as it would be on a cluster.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from pawn_queue.spark import register
from tests.spark_helpers import SparkQueue, filesystem_queue, s3_queue

SPARK_BACKENDS = ["filesystem", "s3"]


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    # Python workers must run this interpreter (pyarrow, pawn_queue), not python3 from PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2,2]")
        .appName("pawn-queue-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.execution.pythonUDF.arrow.enabled", "false")  # pandas not needed
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
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
