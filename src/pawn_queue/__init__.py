"""pawn-queue: a reliable message queue on storage you already have.

An S3-compatible bucket, a local directory or memory is the broker: producers write
messages as objects, consumers claim them with leases made of conditional writes.
"""

from pawn_queue._version import __version__ as __version__
from pawn_queue.app import App
from pawn_queue.builder import PawnQueueBuilder
from pawn_queue.client import PawnQueue
from pawn_queue.config import PawnQueueConfig
from pawn_queue.consumer import Consumer
from pawn_queue.dead_letters import DeadLetter
from pawn_queue.exceptions import (
    ArgumentError,
    BatchFailureError,
    ConfigError,
    LeaseConflictError,
    LeaseLostError,
    LimitTimeoutError,
    PawnQueueError,
    PayloadError,
    PublishError,
    QueueFullError,
    RateLimited,
    RateLimitedError,
    ReplayUnavailableError,
    ScheduleExistsError,
    ScheduleNotFoundError,
    StoreError,
    SubscriptionConflictError,
    SubscriptionNotFoundError,
    TopicNotFoundError,
    TopicSettingsConflictError,
)
from pawn_queue.limits import LimitSlot
from pawn_queue.message import Message
from pawn_queue.producer import Producer
from pawn_queue.registry import RegistryEntry
from pawn_queue.retry import Retry
from pawn_queue.schedules import Schedule, ScheduleStats
from pawn_queue.subscriptions import Subscription
from pawn_queue.topics import PeekedMessage, TopicSettings, TopicStats

__all__ = [
    "App",
    "ArgumentError",
    "BatchFailureError",
    "ConfigError",
    "Consumer",
    "DeadLetter",
    "LeaseConflictError",
    "LeaseLostError",
    "LimitSlot",
    "LimitTimeoutError",
    "Message",
    "PawnQueue",
    "PawnQueueBuilder",
    "PawnQueueConfig",
    "PawnQueueError",
    "PayloadError",
    "PeekedMessage",
    "Producer",
    "PublishError",
    "QueueFullError",
    "RateLimited",
    "RateLimitedError",
    "RegistryEntry",
    "ReplayUnavailableError",
    "Retry",
    "Schedule",
    "ScheduleExistsError",
    "ScheduleNotFoundError",
    "ScheduleStats",
    "StoreError",
    "Subscription",
    "SubscriptionConflictError",
    "SubscriptionNotFoundError",
    "TopicNotFoundError",
    "TopicSettings",
    "TopicSettingsConflictError",
    "TopicStats",
]
