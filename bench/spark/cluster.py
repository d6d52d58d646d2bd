"""Spark throughput on a standalone cluster (a master and two one-core workers on loopback,
``spark-class``) with the S3 store on SeaweedFS, and where a streaming read's time goes.

Cases (medians of ``--runs`` runs, a fresh topic per run):

- ``source``: a streaming query (Trigger.AvailableNow into the ``noop`` sink) that claims,
  reads and acks every message, on batch objects of 1,000 and on one message per object.
  ``rows_per_s`` includes starting and stopping the query; ``micro_batch_rows_per_s`` is
  what its micro-batches sustain (Spark's triggerExecution time).
- ``read.json``: ``spark.read.json`` on the cluster over the same messages written to a local
  directory store (files both workers see), as in bench/spark/local.py.

The breakdown, per kind of object (medians): the query's time outside its micro-batches
(start, stop) and inside them by Spark's progress durations (latestOffset: the driver's
claims; addBatch: the tasks; queryPlanning, walCommit, commitOffsets); the tasks' metrics from
the driver's REST API (run time, JVM CPU, deserialisation, scheduler delay, tasks per
executor); S3 requests by type from SeaweedFS's metrics. One more run goes through a traced
copy of the reader (bench/spark/trace.py) for what Spark does not show: the driver side's
store checks, claims and acks (Spark calls the acks of the last micro-batch in one more
latestOffset, after it, before the query stops), when its Python process made its first call,
and per task the wait for S3, the decoding into Arrow, the hand-over of each record batch to
the JVM, and the delay from the task's launch to its Python read (Python worker, unpickling).

    python -m bench.spark.cluster                 # JSON to bench/results/spark_cluster.json
    python -m bench.spark.cluster --batched 50000 --singles 1000 --runs 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import tempfile
import time
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from tests.helpers.spark_cluster import standalone_cluster
from tests.servers.seaweedfs import SeaweedFS

from bench.common import (
    REPO,
    RESULTS,
    delta,
    git_state,
    host_report,
    median,
    scrape,
    write_results,
)
from bench.spark.local import publish, read_json
from bench.spark.trace import TRACE_ENV, TracedSource
from pawn_queue.spark import register

ACCESS_KEY, SECRET_KEY = "bench-access-key", "bench-secret-key"
KINDS = (("batch objects of 1000", 1000), ("one message per object", 1))
PROGRESS_KEYS = ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets")
TASK_KEYS = ("executorRunTime", "executorCpuTime", "executorDeserializeTime", "jvmGcTime")


# -- the cluster session and Spark's REST API -------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cluster_session(master: str, trace_dir: Path) -> SparkSession:
    """A session on the cluster; credentials as the README says (the driver's environment,
    spark.executorEnv.*). Every Python process imports this checkout (its src, and bench/ for
    the traced reader), not another installed copy."""
    python_path = os.pathsep.join((str(REPO / "src"), str(REPO)))
    os.environ.update(
        PYSPARK_PYTHON=sys.executable,
        PYSPARK_DRIVER_PYTHON=sys.executable,
        PAWNQUEUE_S3_ACCESS_KEY=ACCESS_KEY,
        PAWNQUEUE_S3_SECRET_KEY=SECRET_KEY,
        PYTHONPATH=python_path,
        **{TRACE_ENV: str(trace_dir)},
    )
    executor_env = {
        "PAWNQUEUE_S3_ACCESS_KEY": ACCESS_KEY,
        "PAWNQUEUE_S3_SECRET_KEY": SECRET_KEY,
        "PYTHONPATH": python_path,
        TRACE_ENV: str(trace_dir),
    }
    builder = (
        SparkSession.builder.master(master)
        .appName("pawnqueue-bench-cluster")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.port", str(_free_port()))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
    )
    for key, value in executor_env.items():
        builder = builder.config(f"spark.executorEnv.{key}", value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    spark.dataSource.register(TracedSource)
    return spark


def _rest(spark: SparkSession, path: str) -> Any:
    sc = spark.sparkContext
    url = f"{sc.uiWebUrl}/api/v1/applications/{sc.applicationId}/{path}"
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def _jobs(spark: SparkSession, group: str, timeout: float = 30.0) -> list[dict[str, Any]]:
    """The jobs of ``group``, once every one has completed in the UI (its listener lags)."""
    deadline = time.monotonic() + timeout
    while True:
        jobs = [j for j in _rest(spark, "jobs") if j.get("jobGroup") == group]
        if (jobs and all(j.get("completionTime") for j in jobs)) or time.monotonic() > deadline:
            return jobs
        time.sleep(0.2)


def task_metrics(spark: SparkSession, group: str) -> dict[str, Any]:
    """The tasks of a job group: count, summed metrics (s), per executor, launch times."""
    tasks = []
    for job in _jobs(spark, group):
        for stage in job["stageIds"]:
            for attempt in _rest(spark, f"stages/{stage}"):
                path = f"stages/{stage}/{attempt['attemptId']}/taskList?length=100000"
                tasks += [dict(t, stageId=stage) for t in _rest(spark, path)]
    out: dict[str, Any] = {"tasks": len(tasks)}
    for key in TASK_KEYS:
        scale = 1e9 if key == "executorCpuTime" else 1e3  # ns, else ms
        out[key + "_s"] = round(sum(t["taskMetrics"][key] for t in tasks) / scale, 3)
    out["schedulerDelay_s"] = round(sum(t.get("schedulerDelay", 0) for t in tasks) / 1e3, 3)
    out["resultSerializationTime_s"] = round(
        sum(t["taskMetrics"]["resultSerializationTime"] for t in tasks) / 1e3, 3
    )
    per: dict[str, int] = {}
    for t in tasks:
        per[t["executorId"]] = per.get(t["executorId"], 0) + 1
    out["tasks_per_executor"] = dict(sorted(per.items()))
    out["launches"] = [
        (t["stageId"], t["index"], _epoch(t["launchTime"]), t["duration"] / 1e3) for t in tasks
    ]
    return out


def _epoch(stamp: str) -> float:
    """A time as Spark's REST API (``...GMT``) or query progress (``...Z``) writes it."""
    utc = stamp.replace("GMT", "+0000").replace("Z", "+0000")
    return datetime.strptime(utc, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()


# -- one run of each case ----------------------------------------------------------------


def run_source(
    spark: SparkSession, url: str, topic: str, checkpoint: Path, fmt: str = "pawnqueue"
) -> dict[str, Any]:
    started, started_at = time.perf_counter(), time.time()
    df = spark.readStream.format(fmt).option("url", url).option("topic", topic).load()
    loaded_at = time.time()  # load() asked the source for its schema (a Python process)
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query_started_at = time.time()
    query.awaitTermination()
    seconds = time.perf_counter() - started
    progress = query.recentProgress
    rows = sum(int(p["numInputRows"]) for p in progress)
    with_rows = [p for p in progress if p["numInputRows"]]
    inside = sum(p["durationMs"]["triggerExecution"] for p in with_rows) / 1e3
    durations = {
        key: round(sum(p["durationMs"].get(key, 0) for p in progress) / 1e3, 3)
        for key in (*PROGRESS_KEYS, "triggerExecution")
    }
    first_trigger = _epoch(progress[0]["timestamp"]) if progress else started_at
    return {
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds, 1),
        "micro_batch_rows_per_s": round(rows / inside, 1) if inside else 0.0,
        "micro_batches": len(with_rows),
        "triggers": len(progress),
        # Starting and stopping the query, and its empty triggers.
        "outside_micro_batches_s": round(seconds - inside, 3),
        "load_s": round(loaded_at - started_at, 3),
        "start_to_first_trigger_s": round(first_trigger - started_at, 3),
        "empty_triggers_s": round(durations["triggerExecution"] - inside, 3),
        "progress_durations_s": durations,
        "wall": {
            "start": started_at,
            "loaded": loaded_at,
            "query_started": query_started_at,
            "end": started_at + seconds,
        },
        "tasks": task_metrics(spark, str(query.runId)),
    }


def run_read_json(spark: SparkSession, root: Path, topic: str, batched: bool) -> dict[str, Any]:
    group = f"read-json-{topic}"
    spark.sparkContext.setJobGroup(group, group)
    started = time.perf_counter()
    rows = read_json(spark, root, topic, batched)
    seconds = time.perf_counter() - started
    spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    return {
        "rows": rows,
        "seconds": round(seconds, 3),
        "rows_per_s": round(rows / seconds, 1),
        "tasks": task_metrics(spark, group),
    }


def reader_trace(trace_dir: Path, run: dict[str, Any]) -> dict[str, Any]:
    """The traced run's reader calls: driver side, tasks, and when each read began."""
    events = [
        json.loads(line)
        for path in trace_dir.glob("*.jsonl")
        for line in path.read_text().splitlines()
    ]
    for path in trace_dir.glob("*.jsonl"):
        path.unlink()
    driver = [e for e in events if e["side"] == "driver"]
    reads = [e for e in events if e["side"] == "task"]
    tasks, wall = run["tasks"], run["wall"]
    out: dict[str, Any] = {}
    calls = ("schema", "initialOffset", "open", "latestOffset", "claim", "ack", "partitions")
    for call in (*calls, "commit"):
        seconds = [e["seconds"] for e in driver if e["call"] == call]
        out[f"driver_{call}"] = {"calls": len(seconds), "seconds": round(sum(seconds), 3)}
    opening = [e for e in driver if e["call"] == "initialOffset"]
    if opening:
        # The query's own Python process (Spark calls initialOffset first) and its start,
        # from load() on: the JVM starts the query and the process; Python starts and
        # imports PySpark; the source is unpickled (importing pawn_queue); the first call.
        opener = min(opening, key=lambda e: e["at"])
        own = [e for e in driver if e["pid"] == opener["pid"]]
        marks = [wall["loaded"], opener["process_started"], opener["import_started"]]
        marks += [opener["imported"], opener["at"]]
        names = ("to_process_start", "python_and_pyspark", "pawn_queue_import", "to_call")
        out["load_to_first_reader_call_s"] = round(opener["at"] - wall["loaded"], 3)
        out["reader_process_imports_pyspark_from_zip"] = opener.get("pyspark_from_zip")
        if None not in marks:
            out["query_start_s"] = {
                name: round(b - a, 3) for name, a, b in zip(names, marks, marks[1:], strict=False)
            }
        last = max(e["at"] + e["seconds"] for e in own)
        out["last_reader_call_to_query_end_s"] = round(wall["end"] - last, 3)
    total = sum(e["seconds"] for e in reads)
    reader = sum(e["reader_seconds"] for e in reads)
    fetch = sum(e["fetch_wait_seconds"] for e in reads)
    out["task_reads"] = {
        "reads": len(reads),
        "objects": sum(e["objects"] for e in reads),
        "rows": sum(e["rows"] for e in reads),
        "read_s": round(total, 3),
        "waiting_for_s3_s": round(fetch, 3),
        "decode_to_arrow_s": round(reader - fetch, 3),
        "hand_over_to_jvm_s": round(total - reader, 3),
        "python_worker_processes": len({e["pid"] for e in reads}),
    }
    # The data stage's tasks, matched to reads by partition index: launch to Python read.
    data_stage = max((s for s, _, _, _ in tasks["launches"]), default=None)
    launches = {i: at for s, i, at, _ in tasks["launches"] if s == data_stage}
    gaps = [e["began"] - launches[e["partition"]] for e in reads if e["partition"] in launches]
    out["launch_to_python_read_s"] = {
        "median": round(median(gaps), 3),
        "max": round(max(gaps, default=float("nan")), 3),
    }
    return out


# -- the whole benchmark ---------------------------------------------------------------------


def measure(
    spark: SparkSession, server: SeaweedFS, bucket: str, workdir: Path, args: argparse.Namespace
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    url = f"s3://{bucket}?endpoint_url={server.endpoint}"
    files = workdir / "files"
    trace_dir = Path(os.environ[TRACE_ENV])
    # Warm up: the first jobs pay for starting executors' Python workers.
    asyncio.run(publish(url, "warmup", 200, 1))
    run_source(spark, url, "warmup", workdir / "ck-warmup")
    asyncio.run(publish(f"file://{files}", "warmup", 200, 1))
    run_read_json(spark, files, "warmup", False)

    results, breakdown = [], {}
    for name, per_object in KINDS:
        count = args.batched if per_object > 1 else args.singles
        runs: dict[str, list[dict[str, Any]]] = {"source": [], "read.json": []}
        for i in range(args.runs + 1):  # the last run is the traced one
            topic = f"t{per_object}-{i}"
            asyncio.run(publish(url, topic, count, per_object))
            if i < args.runs:
                asyncio.run(publish(f"file://{files}", topic, count, per_object))
                runs["read.json"].append(run_read_json(spark, files, topic, per_object > 1))
            before = scrape(server.metrics_url, bucket)
            fmt = "pawnqueue" if i < args.runs else "pawnqueue_traced"
            run = run_source(spark, url, topic, workdir / f"ck-{topic}", fmt)
            run["s3_requests"] = delta(before, scrape(server.metrics_url, bucket))
            checked = [run, *runs["read.json"][i:]]
            if any(r["rows"] != count for r in checked):
                raise SystemExit(f"{name}: {[r['rows'] for r in checked]} rows, expected {count}")
            if i < args.runs:
                runs["source"].append(run)
            else:
                traced = reader_trace(trace_dir, run)
                traced["rows_per_s"] = run["rows_per_s"]
            print(json.dumps({"objects": name, "run": i, "rows_per_s": run["rows_per_s"]}))
        for case, case_runs in runs.items():
            results.append(summarise(case, name, case_runs))
        breakdown[name] = explain(runs["source"], traced, count)
        breakdown[name]["read_json_tasks"] = explain_read_json(runs["read.json"])
    return results, breakdown


def summarise(case: str, objects: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {"case": case, "objects": objects, "rows": runs[0]["rows"]}
    for key in ("seconds", "rows_per_s", "micro_batch_rows_per_s"):
        if key in runs[0]:
            out[key] = round(median(r[key] for r in runs), 1 if key != "seconds" else 3)
    out["runs"] = [{k: v for k, v in r.items() if k not in ("tasks", "wall")} for r in runs]
    return out


def explain(runs: list[dict[str, Any]], traced: dict[str, Any], rows: int) -> dict[str, Any]:
    """Medians over the runs of where a query's time went, and the traced run's reader."""

    def med(get: Any) -> float:
        return round(median(get(r) for r in runs), 3)

    requests = sorted({k for r in runs for k in r["s3_requests"] if ":" not in k})
    return {
        "query_s": med(lambda r: r["seconds"]),
        "outside_micro_batches_s": med(lambda r: r["outside_micro_batches_s"]),
        "load_s": med(lambda r: r["load_s"]),
        "start_to_first_trigger_s": med(lambda r: r["start_to_first_trigger_s"]),
        "empty_triggers_s": med(lambda r: r["empty_triggers_s"]),
        "inside_micro_batches_s": med(lambda r: r["progress_durations_s"]["triggerExecution"]),
        "progress_durations_s": {
            k: med(lambda r, k=k: r["progress_durations_s"][k]) for k in PROGRESS_KEYS
        },
        "tasks": {
            k: med(lambda r, k=k: r["tasks"][k])
            for k in ("tasks", *(f"{k}_s" for k in TASK_KEYS), "schedulerDelay_s")
        },
        "tasks_per_executor": [r["tasks"]["tasks_per_executor"] for r in runs],
        "s3_requests_per_1000_rows": {
            k: round(median(r["s3_requests"].get(k, 0) for r in runs) * 1000 / rows, 1)
            for k in requests
        },
        "traced_run": traced,
    }


def explain_read_json(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("tasks", "executorRunTime_s", "executorCpuTime_s", "schedulerDelay_s")
    return {k: round(median(r["tasks"][k] for r in runs), 3) for k in keys}


def report_lines(results: list[dict[str, Any]], breakdown: dict[str, Any]) -> list[str]:
    by = {(r["case"], r["objects"]): r for r in results}
    lines = []
    for name, _ in KINDS:
        source, baseline = by[("source", name)], by[("read.json", name)]
        b = breakdown[name]
        p, t, tr = b["progress_durations_s"], b["tasks"], b["traced_run"]
        reads, rj = tr["task_reads"], b["read_json_tasks"]
        driver = {k[7:]: v["seconds"] for k, v in tr.items() if k.startswith("driver_")}
        lines += [
            f"{name}: source {source['rows_per_s']:,.0f} rows/s with query start "
            f"({source['micro_batch_rows_per_s']:,.0f} inside the micro-batch), "
            f"spark.read.json {baseline['rows_per_s']:,.0f} rows/s",
            f"  query {b['query_s']} s: outside micro-batches {b['outside_micro_batches_s']} s "
            f"(load() {b['load_s']} s, to the first trigger {b['start_to_first_trigger_s']} s),"
            f" inside {b['inside_micro_batches_s']} s: latestOffset {p['latestOffset']}, "
            f"queryPlanning {p['queryPlanning']}, walCommit {p['walCommit']}, addBatch "
            f"{p['addBatch']}, commitOffsets {p['commitOffsets']}",
            f"  tasks {t['tasks']:.0f}: run {t['executorRunTime_s']} s, JVM cpu "
            f"{t['executorCpuTime_s']} s, deserialise {t['executorDeserializeTime_s']} s, "
            f"scheduler delay {t['schedulerDelay_s']} s",
            f"  query start (traced run): load() to the reader's first call "
            f"{tr.get('load_to_first_reader_call_s')} s = {_pairs(tr.get('query_start_s'))}",
            f"  driver side (traced run): open {driver['open']} s, claims {driver['claim']} s, "
            f"acks {driver['ack']} s (in a latestOffset after the last micro-batch)",
            f"  tasks' reads (traced run): {reads['read_s']} s = waiting for S3 "
            f"{reads['waiting_for_s3_s']} s + decoding to Arrow {reads['decode_to_arrow_s']} s "
            f"+ hand-over to the JVM {reads['hand_over_to_jvm_s']} s; launch to Python read "
            f"{tr['launch_to_python_read_s']['median']} s (median per task)",
            f"  S3 requests per 1,000 rows: {b['s3_requests_per_1000_rows']}",
            f"  spark.read.json: {baseline['seconds']} s, tasks {rj['tasks']:.0f}, run "
            f"{rj['executorRunTime_s']} s, JVM cpu {rj['executorCpuTime_s']} s",
        ]
    return lines


def _pairs(values: dict[str, float] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in (values or {}).items()) or "?"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--singles", type=int, default=2_000, help="one-message objects")
    parser.add_argument("--batched", type=int, default=200_000, help="messages in batch objects")
    parser.add_argument("--runs", type=int, default=3, help="runs per case (medians)")
    parser.add_argument("--out", type=Path, default=RESULTS / "spark_cluster.json")
    args = parser.parse_args(argv)
    started, load_at_start = time.perf_counter(), os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="pq-bench-spark-cluster-", dir=REPO / "bench") as tmp:
        workdir = Path(tmp)
        (workdir / "trace").mkdir()
        server = SeaweedFS.start(workdir / "seaweedfs")
        try:
            bucket = "bench-spark-cluster"
            server.create_bucket(bucket)
            with standalone_cluster(workdir / "cluster") as cluster:
                spark = cluster_session(cluster.master_url, workdir / "trace")
                try:
                    results, breakdown = measure(spark, server, bucket, workdir, args)
                finally:
                    spark.stop()
        finally:
            server.stop()
    report = {
        "benchmark": "spark_cluster",
        **host_report(load_at_start),
        "master": "standalone: 2 workers x 1 core, 1 GiB (loopback)",
        "store": "s3 (SeaweedFS); read.json: local files",
        "runs": args.runs,
        "git": git_state(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": results,
        "breakdown": breakdown,
    }
    write_results(args.out, report)
    print("\n".join(report_lines(results, breakdown)))
    print(f"load average: start {load_at_start}, end {report['load_average_at_end']}")


if __name__ == "__main__":
    main()
