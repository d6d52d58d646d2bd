"""The Spark source and sink: local[2], and a standalone cluster with a traced reader."""
