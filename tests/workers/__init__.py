"""Programs the tests run as separate processes (crash workers, Spark queries, pawn-queue 0.1.3)."""
