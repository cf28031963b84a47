"""Handler registry: the ``@taskmesh.task`` decorator, lookup by name, payload decoding.

A handler is an ``async def`` (run on the event loop) or a plain ``def`` (run
in a handler process of the instance's pool by default, where a timeout or a
cancel can really stop it; in a thread with ``pool="thread"``, see
``services/sync_handlers.py``). It receives the payload as its first argument, decoded
into the annotated type when that is a pydantic model or a dataclass, and a
:class:`~taskmesh.tasks.models.TaskContext` as ``ctx`` when it declares a parameter
of that name. A payload that cannot be decoded is not retryable (docs/internals/design.md
section 3).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from pydantic import BaseModel, TypeAdapter, ValidationError

from taskmesh.errors import ConfigError, InvalidTaskError, PayloadDecodeError
from taskmesh.tasks.validation import MAX_RETRIES_LIMIT, NAME_REGEX

_NAME = re.compile(NAME_REGEX)


@dataclass(frozen=True, slots=True)
class Handler:
    """A registered handler and its options.

    :param timeout: seconds a run may take before it is cancelled and counts
        as a failure; ``None`` for no limit.
    :param max_retries: default retries of tasks of this name (a request's own
        ``max_retries`` wins).
    :param pool: for a ``def`` handler, ``"process"`` or ``"thread"``; ``None`` follows the
        instance's ``sync_pool`` setting.
    """

    name: str
    func: Callable[..., Any]
    queue: str | None = None
    max_retries: int | None = None
    timeout: float | None = None
    is_async: bool = False
    wants_ctx: bool = False
    payload_adapter: TypeAdapter[Any] | None = None
    pool: str | None = None

    def payload_errors(self, payload: Any) -> list[tuple[str, str]]:
        """Why ``payload`` does not fit the handler's declared type: ``(path, message)`` pairs, paths
        under ``payload`` (``payload.customer.id``); empty when it fits or nothing is declared."""
        if self.payload_adapter is None:
            return []
        try:
            self.payload_adapter.validate_python(payload)
        except ValidationError as exc:
            return [
                (".".join(["payload", *(str(p) for p in err["loc"])]), err["msg"].removeprefix("Value error, "))
                for err in exc.errors()
            ]
        except Exception as exc:  # a dataclass's own __post_init__ may raise anything
            return [("payload", f"does not fit the handler: {exc}")]
        return []

    def decode(self, payload: Any) -> Any:
        """Decode ``payload`` into the handler's declared type.

        :raises PayloadDecodeError: it does not fit.
        """
        if self.payload_adapter is None:
            return payload
        try:
            return self.payload_adapter.validate_python(payload)
        except Exception as exc:  # pydantic raises ValidationError, dataclasses TypeError
            # One line naming every offending field: "1 validation error for X; order_id: Input should be ..."
            lines = [
                line.strip() for line in str(exc).splitlines() if line.strip() and "errors.pydantic.dev" not in line
            ]
            raise PayloadDecodeError("; ".join(lines)[:500]) from exc


class Registry:
    """Handlers by task name, plus an optional fallback for unknown names."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self.fallback: Handler | None = None

    def add(self, handler: Handler) -> None:
        """Register ``handler``.

        :raises ConfigError: another function already has this name.
        """
        existing = self._handlers.get(handler.name)
        if existing is not None and existing.func is not handler.func:
            raise ConfigError(f"handlers: task name {handler.name!r} is registered twice")
        self._handlers[handler.name] = handler

    def get(self, name: str) -> Handler | None:
        """The handler for ``name``, else the fallback, else ``None``."""
        return self._handlers.get(name, self.fallback)

    def __contains__(self, name: object) -> bool:
        """Whether a handler is registered under ``name`` (the fallback does not count)."""
        return name in self._handlers

    def check_payload(self, name: str, payload: Any) -> None:
        """Refuse a payload that does not fit the declared type of the handler registered as ``name``.

        A name without a handler of its own (the fallback's, or none here) is not checked:
        the instance that runs it decides.

        :raises InvalidTaskError: it does not fit (``payload.customer_id: Field required``; every
            refusal in ``errors``).
        """
        handler = self._handlers.get(name)
        errors = handler.payload_errors(payload) if handler is not None else []
        if errors:
            raise InvalidTaskError(errors[0][0], errors[0][1], errors)

    def names(self) -> list[str]:
        return sorted(self._handlers)

    def task(
        self,
        name: str,
        *,
        queue: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        pool: str | None = None,
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Decorator registering a handler under ``name`` (see module docs)."""
        return task(name, queue=queue, max_retries=max_retries, timeout=timeout, pool=pool, registry=self)


def make_handler(
    name: str,
    func: Callable[..., Any],
    *,
    queue: str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    pool: str | None = None,
) -> Handler:
    """Inspect ``func`` and build its :class:`Handler`.

    :raises ValueError: a bad name, ``max_retries`` outside 0..100, a
        non-positive ``timeout``, a ``pool`` other than ``"process"`` or ``"thread"``.
    """
    if not _NAME.fullmatch(name):
        raise ValueError(f"task name {name!r} must match [A-Za-z0-9_.:-]{{1,128}}")
    if queue is not None and not _NAME.fullmatch(queue):
        raise ValueError(f"queue name {queue!r} must match [A-Za-z0-9_.:-]{{1,128}}")
    if max_retries is not None and not 0 <= max_retries <= MAX_RETRIES_LIMIT:
        raise ValueError(f"max_retries must be between 0 and {MAX_RETRIES_LIMIT}")
    if timeout is not None and timeout <= 0:
        raise ValueError("timeout must be a positive number of seconds")
    if pool not in (None, "process", "thread"):
        raise ValueError(f"pool must be 'process' or 'thread', not {pool!r}")
    sig = inspect.signature(func)
    params = list(sig.parameters.values())
    adapter: TypeAdapter[Any] | None = None
    positional = [p for p in params if p.name != "ctx"]
    if positional:
        try:
            hints = get_type_hints(func)
        except Exception:  # unresolvable forward references: take the payload as is
            hints = {}
        ann = hints.get(positional[0].name)
        if isinstance(ann, type) and (issubclass(ann, BaseModel) or dataclasses.is_dataclass(ann)):
            adapter = TypeAdapter(ann)
    return Handler(
        name=name,
        func=func,
        queue=queue,
        max_retries=max_retries,
        timeout=timeout,
        is_async=inspect.iscoroutinefunction(func),
        wants_ctx="ctx" in sig.parameters,
        payload_adapter=adapter,
        pool=pool,
    )


default_registry = Registry()
"""The registry ``@taskmesh.task`` writes to and instances read from."""


def task(
    name: str,
    *,
    queue: str | None = None,
    max_retries: int | None = None,
    timeout: float | None = None,
    pool: str | None = None,
    registry: Registry | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the handler of tasks named ``name``.

    :param queue: the queue tasks of this name go to when a request names none.
    :param max_retries: default retry budget (0..100) of tasks of this name.
    :param timeout: seconds before a run is stopped and counted as a failure.
    :param pool: where a ``def`` handler runs: ``"process"`` (a handler process the instance
        stops at a timeout or cancel) or ``"thread"`` (shares the instance's memory; cannot be
        stopped, so a timed-out run keeps its lease until it returns); default the
        ``sync_pool`` setting.
    :returns: the function itself, unchanged.
    :raises ValueError: invalid options (see :func:`make_handler`).
    :raises ConfigError: ``name`` is already registered to another function.

    Example::

        @taskmesh.task("reports.export", timeout=120)
        async def export(payload: ExportRequest, ctx: TaskContext) -> dict: ...
    """

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        target = registry if registry is not None else default_registry
        target.add(make_handler(name, func, queue=queue, max_retries=max_retries, timeout=timeout, pool=pool))
        return func

    return decorate


def load_modules(modules: list[str]) -> None:
    """Import the handler modules named in config (``handlers = [...]``).

    :raises ConfigError: a module cannot be imported; names the module.
    """
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise ConfigError(f"handlers: cannot import {module!r}: {exc}") from None
