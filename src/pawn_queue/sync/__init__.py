"""The blocking API: the async core, run on a private event loop in a background thread.

Each sync :class:`PawnQueue` starts one daemon thread running an event loop (on first use)
and stops and joins it in :meth:`PawnQueue.close`. Every blocking method submits the
matching coroutine to that loop and waits for it, so any number of threads may share one
queue and its producers, consumers and messages. Errors are the core's own
(``TopicNotFoundError``, ``PayloadError``...), raised in the calling thread. A blocking call
made on the loop thread itself raises :class:`PawnQueueError` instead of deadlocking.
"""

from pawn_queue.sync._queue import PawnQueue, Registry
from pawn_queue.sync._workers import Consumer, Message, Producer

__all__ = ["Consumer", "Message", "PawnQueue", "Producer", "Registry"]
