"""What live instances advertise about their handlers: per task name, its queue, retries and payload schema.

Each instance writes, with every heartbeat, the options of the handlers it has registered
(``workers.handler_options``: ``{name: {"queue", "max_retries", "payload_schema"}}``, see
:func:`handler_options`). A create through an instance, or a client, that lacks a name's handler
routes and checks the task by that advertisement (``tasks.py``): the handler's queue when the
request names none, its ``max_retries``, its payload checked against the advertised JSON Schema
(``payload_schema.py``, with the ``schemas`` extra: without it, a base install logs
``payload_schemas_unchecked`` once and stores such payloads unchecked, for the handler's own check
to refuse a bad one when it runs). The dev profile's demo fallback refuses a name a live instance advertises
(``services/executor.py``), so that it never "completes" a task a real handler was waiting for.

:class:`AdvertisedHandlers` reads the advertisements of instances whose heartbeat is fresher than
``fresh_seconds`` at most every ``ttl`` seconds (one query per ``ttl`` whatever the number of
creates; other callers keep the last answer meanwhile). When a name has several advertisers, the
most recently started instance's options win (a rolling deploy's new version). A failed read is
logged (``advertised_handlers_unknown``) and the last answer kept. A create of a name no live
instance advertises, while none runs any name, is logged as ``task_name_unadvertised`` (at most
once per name per ``UNKNOWN_LOG_SECONDS``).
"""

from __future__ import annotations

import functools
import re
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from taskmesh import extras
from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.store import PgStore
from taskmesh.tasks.registry import Registry
from taskmesh.tasks.validation import MAX_RETRIES_LIMIT, NAME_REGEX

if TYPE_CHECKING:
    from taskmesh.tasks.payload_schema import PayloadSchema

log = get_logger("taskmesh.tasks.advertised")
_NAME = re.compile(NAME_REGEX)

ADVERTISED_TTL_SECONDS = 5.0
"""How long a read of the advertisements is trusted."""
FRESH_SECONDS = 90.0
"""A heartbeat older than this and the instance's advertisements no longer count (three default leases)."""
ADVERTISED_READ = 10_000
"""Most task names read (more than any deployment has)."""
UNKNOWN_LOG_SECONDS = 60.0
"""A name no live instance advertises is logged at most this often."""
UNKNOWN_NAMES_KEPT = 1000
"""Names whose last ``task_name_unadvertised`` line is remembered (forgotten all at once past it)."""


def handled_names(registry: Registry) -> list[str] | None:
    """The task names an instance advertises (``workers.handlers``); ``None``: any, it has a fallback."""
    return None if registry.fallback is not None else sorted(registry.names())


def handler_options(registry: Registry) -> str:
    """The JSON an instance advertises for the handlers it has registered (its fallback is not one).

    ``{name: {"queue": str | null, "max_retries": int | null, "payload_schema": object | null}}``;
    the schema is pydantic's JSON Schema of the payload type, null when the handler declares none
    or pydantic cannot write one.
    """
    out: dict[str, dict[str, Any]] = {}
    for name in registry.names():
        handler = registry.get(name)
        assert handler is not None  # names() lists registered handlers only
        schema: dict[str, Any] | None = None
        if handler.payload_adapter is not None:
            try:
                schema = handler.payload_adapter.json_schema()
            except Exception:  # pydantic refuses types it cannot describe (a callable field, say)
                schema = None
        out[name] = {"queue": handler.queue, "max_retries": handler.max_retries, "payload_schema": schema}
    return orjson.dumps(out).decode()


@dataclass(frozen=True)
class Advertisement:
    """One task name's handler as a live instance advertises it."""

    name: str
    queue: str | None
    max_retries: int | None
    payload: PayloadSchema | None
    worker_id: str


@dataclass
class AdvertisedHandlers:
    """The advertisements of live instances, read at most every ``ttl`` seconds (see the module docs).

    :param ttl: seconds a read is trusted.
    :param fresh_seconds: an instance whose last heartbeat is older does not count.
    """

    ttl: float = ADVERTISED_TTL_SECONDS
    fresh_seconds: float = FRESH_SECONDS
    _by_name: dict[str, Advertisement] = field(default_factory=dict)
    _any_name: bool = False
    _read_at: float | None = None
    _reading: bool = False
    _logged: dict[str, float] = field(default_factory=dict)

    async def refresh(self, pg: PgStore) -> None:
        """Read the advertisements again when the last read is older than ``ttl`` (never raises).

        A failed read keeps the last answer (none before the first), logging ``advertised_handlers_unknown``.
        """
        now = time.monotonic()
        if self._reading or (self._read_at is not None and now - self._read_at < self.ttl):
            return
        self._reading = True
        try:
            rows = await pg.workers.advertised_handlers(self.fresh_seconds, ADVERTISED_READ)
        except StoreError as exc:
            log.warning("advertised_handlers_unknown", error=str(exc))
            return
        finally:
            self._reading = False
        self._read_at = now
        self._any_name = any(r["name"] is None for r in rows)
        self._by_name = {r["name"]: _advertisement(r) for r in rows if r["name"] is not None}

    def get(self, name: str) -> Advertisement | None:
        """The handler of ``name`` a live instance advertises, as last read."""
        return self._by_name.get(name)

    @property
    def any_name(self) -> bool:
        """Whether a live instance runs any name (a fallback handler, or a version that does not say)."""
        return self._any_name

    def note_unknown(self, name: str) -> None:
        """Log ``task_name_unadvertised`` for a name created while no live instance advertises it.

        Nothing while a live instance runs any name, before the first read, or when the name was
        logged within ``UNKNOWN_LOG_SECONDS``.
        """
        if self._any_name or self._read_at is None:
            return
        now = time.monotonic()
        last = self._logged.get(name)
        if last is not None and now - last < UNKNOWN_LOG_SECONDS:
            return
        if len(self._logged) >= UNKNOWN_NAMES_KEPT:
            self._logged.clear()
        self._logged[name] = now
        log.warning(
            "task_name_unadvertised",
            task_name=name,
            reason="no live instance has a handler for it: stored unchecked, on the request's queue or 'default'",
        )


def _advertisement(row: Any) -> Advertisement:
    """One row of ``worker_list_advertised_handlers``; a schema that is not one is left out, logged."""
    options = orjson.loads(row["options"]) if row["options"] else {}
    options = options if isinstance(options, dict) else {}
    payload: PayloadSchema | None = None
    schema = options.get("payload_schema")
    if isinstance(schema, dict) and _schemas_installed():
        from taskmesh.tasks.payload_schema import PayloadSchema

        try:
            payload = PayloadSchema(schema)
        except ValueError as exc:
            log.warning("payload_schema_unusable", task_name=row["name"], worker_id=row["worker_id"], error=str(exc))
    queue = options.get("queue")
    retries = options.get("max_retries")
    return Advertisement(
        name=row["name"],
        queue=queue if isinstance(queue, str) and _NAME.fullmatch(queue) else None,
        max_retries=retries if type(retries) is int and 0 <= retries <= MAX_RETRIES_LIMIT else None,
        payload=payload,
        worker_id=row["worker_id"],
    )


@functools.cache
def _schemas_installed() -> bool:
    """Whether jsonschema is here to check advertised payload schemas; logged once when it is not."""
    if extras.installed("schemas"):
        return True
    log.warning(
        "payload_schemas_unchecked",
        reason=extras.message("schemas", "checking payloads against the schema another instance advertises"),
    )
    return False
