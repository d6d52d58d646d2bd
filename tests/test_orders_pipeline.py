"""examples/orders_pipeline.py: the order service and the Spark query each get every order
through their own subscription, exactly once; an output Spark cannot write is refused before
anything is published; --reset deletes nothing the pipeline did not make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

# Spark in processes of their own (a standalone cluster's JVMs, a pipeline's processes), on
# timeouts Spark sets: make pytest runs these alone, after the others.
pytestmark = pytest.mark.alone


REPO = Path(__file__).resolve().parent.parent


def test_s3a_output_without_the_s3a_filesystem_fails_before_publishing(tmp_path: Path) -> None:
    store = tmp_path / "queue"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PYSPARK_PYTHON"] = sys.executable
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "orders_pipeline.py"),
            "--url",
            f"file://{store}",
            "--out",
            "s3a://lake/demo",
            "--orders",
            "10",
            "--rounds",
            "1",
            "--master",
            "local[1]",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    assert "round 1: published" not in run.stdout
    assert not store.exists(), "nothing may be published"  # the store is made by publishing
    # One clear line: what is missing, and how to add it.
    [message] = [line for line in run.stderr.splitlines() if "s3a://lake/demo" in line]
    assert "org.apache.hadoop.fs.s3a.S3AFileSystem" in message
    assert (
        "hadoop-aws" in message and "--packages" in message and "nothing was published" in message
    )
    assert "Traceback" not in run.stderr


def test_cluster_page_says_what_the_driver_and_s3a_need() -> None:
    section = (REPO / "docs" / "spark" / "cluster.md").read_text(encoding="utf-8")
    command = section.split("```bash", 1)[1].split("```", 1)[0]
    assert "--out s3a://" in command
    # The driver's own environment, not only the executors'.
    assert "export PAWNQUEUE_S3_AWS_ACCESS_KEY_ID" in command
    assert "spark.executorEnv.PAWNQUEUE_S3_AWS_ACCESS_KEY_ID" in command
    for needed in (
        "--packages org.apache.hadoop:hadoop-aws:",
        "spark.hadoop.fs.s3a.endpoint",
        "spark.hadoop.fs.s3a.path.style.access",
        "spark.hadoop.fs.s3a.access.key",
    ):
        assert needed in command, needed
    assert "AWS SDK" in section


def test_reset_never_deletes_a_directory_the_pipeline_did_not_make(tmp_path: Path) -> None:
    """--reset used to rmtree --url and --out whatever they held."""
    mine = tmp_path / "precious"
    mine.mkdir()
    (mine / "thesis.txt").write_text("years of work")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "orders_pipeline.py"),
            "--reset",
            "--url",
            f"file://{tmp_path / 'queue'}",
            "--out",
            str(mine),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode != 0
    assert "was not made by orders_pipeline.py" in run.stderr
    assert (mine / "thesis.txt").read_text() == "years of work"


def test_the_service_and_the_query_each_get_every_order_once(tmp_path: Path) -> None:
    """What ``make demo`` runs, smaller: the order service and the Spark query each take
    every order of ``orders`` through their own subscription, exactly once, and say so."""
    store, out = tmp_path / "queue", tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAWNQUEUE_", "AWS_"))}
    env["PYSPARK_PYTHON"] = sys.executable
    orders, rounds = 120, 2
    run = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "orders_pipeline.py"),
            *("--reset", "--url", f"file://{store}", "--out", str(out)),
            *("--orders", str(orders), "--rounds", str(rounds), "--master", "local[2]"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, f"{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    published = orders * rounds
    [summary] = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    every = {"orders": published, "distinct": published, "first": 0, "last": published - 1}
    assert summary["subscriptions"] == {"service": every, "revenue": every}
    assert summary["orders_in_revenue_table"] == summary["orders_published"] == published
    assert summary["revenue"] == summary["expected_revenue"]
    assert (
        "checked: each subscription of orders got every order exactly once "
        f"(service: {published} of {published}, revenue: {published} of {published})"
    ) in run.stdout
    # Every order went to the subscriptions only, and both took (and acked) all of them.
    assert sorted(p.name for p in (store / "orders" / "subscriptions").iterdir()) == [
        "revenue",
        "service",
    ]
    for queue in (store / "orders", *(store / "orders" / "subscriptions").iterdir()):
        assert not any((queue / "messages").glob("*.*")), queue
        assert not any((queue / "dead-letter").glob("*")), queue
