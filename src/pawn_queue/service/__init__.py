"""Running an :class:`~pawn_queue.app.App` as a service: ``pawn-queue worker``.

- :mod:`~pawn_queue.service.runner`: one process, its signals and exit codes;
- :mod:`~pawn_queue.service.supervisor`: ``--processes N`` children, restarted if they die;
- :mod:`~pawn_queue.service.health`: ``/metrics``, ``/healthz`` and ``/readyz`` over HTTP;
- :mod:`~pawn_queue.service.logs`: a line per handled message, as text or JSON.
"""
