"""A streaming query in a process of its own, for the kill -9 test.

``python -m tests.workers.spark_query_proc '{"options": {...}, "out": ..., "checkpoint": ...,
"fifo": ...}'``

Every row of the first micro-batch with data stalls in a UDF; the first one to get there says
``started`` on the FIFO, so the test knows the batch is mid-flight before it kills the process.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from pyspark.sql import functions
from pyspark.sql.types import StringType

from tests.helpers.spark_helpers import local_spark


def main() -> None:
    args = json.loads(sys.argv[1])
    fifo, started = args["fifo"], args["fifo"] + ".started"
    spark = local_spark()

    def stall(payload):  # type: ignore[no-untyped-def]  # hints would make a pandas UDF
        try:
            os.close(os.open(started, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            with open(fifo, "w") as pipe:
                pipe.write("started\n")
        threading.Event().wait()  # until the test kills this process
        return payload

    df = spark.readStream.format("pawnqueue").options(**args["options"]).load()
    df = df.withColumn("payload", functions.udf(stall, StringType())("payload"))
    query = (
        df.writeStream.format("parquet")
        .option("path", args["out"])
        .option("checkpointLocation", args["checkpoint"])
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    query.awaitTermination()


if __name__ == "__main__":
    main()
