"""The main job on the embedded default: a local directory as the queue, no server.

A producer publishes orders with a progress bar; several consumer workers process them
concurrently; a fraction of the orders fail and end in dead letter. Prints a summary.

    python examples/demo.py [--orders 3000] [--workers 4] [--dir ./queue-demo]

``--dir`` must be new, empty, or the queue of an earlier run (cleared: only what the demo
wrote); any other directory is refused, untouched.

The job itself lives in ``pawn_queue.cli.demo`` (also run by ``pawn-queue demo``).
"""

from __future__ import annotations

from pawn_queue.cli.demo import main

if __name__ == "__main__":
    main()
