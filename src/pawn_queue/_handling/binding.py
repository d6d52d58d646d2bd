"""How an app's handler is called: which parameter gets the payload (validated against its
annotation), which gets the message.

A handler takes the payload, the message, or both, by annotation:

- a parameter annotated :class:`~pawn_queue.message.Message` (or
  :class:`~pawn_queue._handling.handlers.BlockingMessage`) receives the message: the async one in an
  ``async def`` handler, the blocking one in a plain function;
- the other parameter, if any, receives the payload. Annotated with a pydantic model, a
  dataclass, a ``TypedDict`` or any type pydantic validates, it receives the validated
  value; without an annotation (or ``Any``), the payload as decoded.

A payload that fails validation raises :class:`InvalidPayload`: the app dead-letters it at
once with reason ``invalid_payload``, since a retry would fail the same way.

A batch handler (``App.subscriber(batch=N)``) takes lists: a parameter annotated
``list[Message]`` receives the messages, the other one the payloads (``list[Order]``: each
validated as an ``Order``; ``list``, ``list[Any]`` or no annotation: as decoded), in the same
order.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core

from pawn_queue._handling.handlers import BlockingMessage
from pawn_queue._protocol.delivery import Message
from pawn_queue.exceptions import ArgumentError

_MESSAGE_TYPES = (Message, BlockingMessage)
_MAX_ERRORS = 5  # validation errors quoted in a dead letter


class InvalidPayload(Exception):
    """A payload its handler's annotation refuses; ``detail`` says why (one line)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


@dataclass(frozen=True, slots=True)
class Binding:
    """The parameters of one handler: where the message and the payload go."""

    message_parameter: str | None
    payload_parameter: str | None
    payload_type: pydantic.TypeAdapter[Any] | None  # None: the payload as decoded
    positional: bool  # pass the payload by position (a positional-only parameter)
    payload_annotation: str | None = None  # the payload parameter's annotation, as written
    batch: bool = False  # lists of messages and payloads (a batch handler)

    @classmethod
    def of(cls, handler: Callable[..., Any], *, batch: bool = False) -> Binding:
        """Read ``handler``'s signature; raise ArgumentError when it cannot be called with a
        payload and a message (with ``batch``: lists of them)."""
        name = getattr(handler, "__qualname__", repr(handler))
        try:
            signature = inspect.signature(handler)
            hints = _hints(handler)
        except (TypeError, ValueError, NameError) as exc:
            raise ArgumentError(f"cannot read the parameters of handler {name}: {exc}") from None
        message_parameter: str | None = None
        payload: inspect.Parameter | None = None
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                continue
            hint = hints.get(parameter.name)
            if _is_message_type(hint) and batch:
                raise ArgumentError(
                    f"batch handler {name}: parameter {parameter.name!r} gets a list of "
                    "messages: annotate it list[Message]"
                )
            if _is_message_type(hint) or (batch and _is_message_list(hint)):
                message_parameter = parameter.name
            elif payload is None:
                payload = parameter
            elif parameter.default is parameter.empty:
                raise ArgumentError(
                    f"handler {name} takes more than a payload and a message: parameter "
                    f"{parameter.name!r} would get nothing"
                )
        if payload is None:
            return cls(message_parameter, None, None, False, batch=batch)
        hint = hints.get(payload.name, Any)
        if batch:
            hint = _element_of(hint, name, payload.name)
        try:
            adapter = None if hint is Any else pydantic.TypeAdapter(hint)
        except pydantic.PydanticUserError as exc:  # a type pydantic cannot validate
            first = str(exc).splitlines()[0]
            raise ArgumentError(f"handler {name}: parameter {payload.name!r}: {first}") from None
        shown = hint.__name__ if isinstance(hint, type) else repr(hint)
        positional = payload.kind is payload.POSITIONAL_ONLY
        return cls(message_parameter, payload.name, adapter, positional, shown, batch)

    def describe(self) -> str:
        """What each parameter receives, for the worker's start-up log: a function written
        for ``listen()`` (``def handle(msg)``, unannotated) gets the payload, not the
        message, and says so here rather than failing on every message."""
        parts = []
        if self.batch:
            if self.payload_parameter is not None:
                how = (
                    "as decoded"
                    if self.payload_type is None
                    else f"each validated as {self.payload_annotation}"
                )
                parts.append(f"{self.payload_parameter}=the list of payloads, {how}")
            if self.message_parameter is not None:
                parts.append(f"{self.message_parameter}=the list of messages")
            return ", ".join(parts) or "nothing (no parameter)"
        if self.payload_parameter is not None:
            if self.payload_type is None:
                parts.append(
                    f"{self.payload_parameter}=the payload as decoded (unannotated; annotate "
                    "it with Message to get the message)"
                )
            else:
                parts.append(
                    f"{self.payload_parameter}=the payload validated as {self.payload_annotation}"
                )
        if self.message_parameter is not None:
            parts.append(f"{self.message_parameter}=the message")
        return ", ".join(parts) or "nothing (no parameter)"

    def call(self, handler: Callable[..., Any], message: Message | BlockingMessage) -> Any:
        """``handler`` called with what it takes of ``message``; raises InvalidPayload."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if self.message_parameter is not None:
            kwargs[self.message_parameter] = message
        if self.payload_parameter is not None:
            payload = self.validated(message.payload)
            if self.positional:
                args.append(payload)
            else:
                kwargs[self.payload_parameter] = payload
        return handler(*args, **kwargs)

    def call_batch(
        self,
        handler: Callable[..., Any],
        messages: list[Message] | list[BlockingMessage],
        payloads: list[Any],
    ) -> Any:
        """``handler`` called with the lists it takes: ``payloads`` validated already
        (:meth:`validated`, one by one), of ``messages`` in the same order."""
        args: list[Any] = []
        kwargs: dict[str, Any] = {}
        if self.message_parameter is not None:
            kwargs[self.message_parameter] = messages
        if self.payload_parameter is not None:
            if self.positional:
                args.append(payloads)
            else:
                kwargs[self.payload_parameter] = payloads
        return handler(*args, **kwargs)

    def validated(self, payload: Any) -> Any:
        """``payload`` as the handler's annotation wants it; raises InvalidPayload."""
        if self.payload_type is None:
            return payload
        try:
            return self.payload_type.validate_python(payload)
        except pydantic.ValidationError as exc:
            raise InvalidPayload(_describe(exc)) from None


def _is_message_type(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, _MESSAGE_TYPES)


def _is_message_list(hint: Any) -> bool:
    args = typing.get_args(hint)
    return typing.get_origin(hint) is list and len(args) == 1 and _is_message_type(args[0])


def _element_of(hint: Any, name: str, parameter: str) -> Any:
    """What each payload of a batch handler's payload parameter (``list[X]``) is validated
    as: ``X`` (``Any`` for a bare ``list`` or no annotation); ArgumentError for a type that
    is not a list."""
    if hint is Any or hint is list:
        return Any
    if typing.get_origin(hint) is list:
        args = typing.get_args(hint)
        return args[0] if args else Any
    shown = hint.__name__ if isinstance(hint, type) else repr(hint)
    raise ArgumentError(
        f"batch handler {name}: parameter {parameter!r} gets a list of payloads: annotate it "
        f"list[...], not {shown}"
    )


def _hints(handler: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of a function, or of a callable object's ``__call__``; none
    for what has neither (a ``functools.partial``: its payload is passed as decoded)."""
    for target in (handler, type(handler).__call__):
        try:
            return typing.get_type_hints(target)
        except TypeError:
            continue
    return {}


def _describe(error: pydantic.ValidationError) -> str:
    """A validation error in one line: where and what, for each of the first few problems."""
    problems = error.errors(include_url=False, include_input=False)
    parts = [
        f"{'.'.join(str(p) for p in problem['loc']) or 'payload'}: {problem['msg']}"
        for problem in problems[:_MAX_ERRORS]
    ]
    more = len(problems) - _MAX_ERRORS
    if more > 0:
        parts.append(f"and {more} more")
    return f"{error.title}: " + "; ".join(parts)


def jsonable(value: Any) -> Any:
    """A handler's result as a payload: models, dataclasses, dates and the like as JSON
    values (raises ArgumentError for a value that has none)."""
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as exc:
        raise ArgumentError(f"a handler returned a value that is not JSON: {exc}") from None
