"""App: handlers declared with decorators, run by ``pawn-queue worker`` or ``App.run()``
(:mod:`pawn_queue.app._app`); the subscriptions its subscribers read
(:mod:`pawn_queue.app._subscriptions`)."""

from pawn_queue.app._app import App
from pawn_queue.app._subscriber import Subscriber

__all__ = ["App", "Subscriber"]
