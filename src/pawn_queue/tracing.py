"""OpenTelemetry tracing on the core's observer hooks (:mod:`pawn_queue.observe`).

Needs the ``tracing`` extra (``opentelemetry-api``; a configured SDK exports the spans).
``PawnQueue(config, observers=[Tracing()])`` opens a PRODUCER span ``publish <topic>`` per
publish and carries its context in the message's ``traceparent`` attribute (W3C trace
context; a ``traceparent`` the caller set is kept), and a CONSUMER span ``process <topic>``
around each ``listen()`` handler, linked to the publish span and current while the handler
runs, so the handler's own spans nest in it. Span attributes follow OpenTelemetry's
messaging conventions (``messaging.system`` is ``pawn-queue``).
"""

from __future__ import annotations

from contextvars import Token
from typing import TYPE_CHECKING

from opentelemetry import context, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from pawn_queue._version import __version__
from pawn_queue.observe import Observer, Publication

if TYPE_CHECKING:
    from pawn_queue._protocol.delivery import Message

SYSTEM = "pawn-queue"
_propagator = TraceContextTextMapPropagator()


class Tracing(Observer):
    """Spans for publishes and handled messages, from ``tracer_provider`` (default: the
    global one)."""

    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self._tracer = trace.get_tracer("pawn_queue", __version__, tracer_provider)
        # The process spans of the handlers running now, by id(message), with the token
        # that made each current.
        self._processing: dict[int, tuple[trace.Span, Token[Context]]] = {}

    def __repr__(self) -> str:
        return "Tracing()"

    def before_publish(self, publication: Publication) -> None:
        attributes = {
            "messaging.system": SYSTEM,
            "messaging.destination.name": publication.topic,
            "messaging.operation.name": "publish",
            "messaging.operation.type": "send",
        }
        if publication.count > 1:
            attributes["messaging.batch.message_count"] = str(publication.count)
        span = self._tracer.start_span(
            f"publish {publication.topic}", kind=SpanKind.PRODUCER, attributes=attributes
        )
        publication.state[self] = span
        carrier: dict[str, str] = {}
        _propagator.inject(carrier, context=trace.set_span_in_context(span))
        if "traceparent" not in publication.attributes:
            publication.attributes.update(carrier)

    def published(self, publication: Publication) -> None:
        span = publication.state.pop(self, None)
        if not isinstance(span, trace.Span):
            return
        if len(publication.message_ids) == 1:
            span.set_attribute("messaging.message.id", publication.message_ids[0])
        span.end()

    def publish_failed(self, publication: Publication, error: BaseException) -> None:
        span = publication.state.pop(self, None)
        if not isinstance(span, trace.Span):
            return
        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()

    def handler_started(self, message: Message) -> None:
        created = trace.get_current_span(_propagator.extract(message.attributes))
        links = []
        if created.get_span_context().is_valid:
            links.append(Link(created.get_span_context()))
        span = self._tracer.start_span(
            f"process {message.topic}",
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": message.topic,
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
                "messaging.message.id": message.id,
                "messaging.pawn_queue.receive_count": message.receive_count,
            },
        )
        token = context.attach(trace.set_span_in_context(span))
        self._processing[id(message)] = (span, token)

    def handler_finished(
        self, message: Message, seconds: float, error: BaseException | None
    ) -> None:
        started = self._processing.pop(id(message), None)
        if started is None:
            return
        span, token = started
        context.detach(token)
        if error is not None:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, type(error).__name__))
        span.end()
