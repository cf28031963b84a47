"""Validation of tasks to enqueue, shared by the HTTP API and the Python client.

Design.md principle 7: bad input is refused at the edge, before anything is
written. Limits: names and queue names match
``[A-Za-z0-9_.:-]{1,128}``; priority 0..1000 (higher runs first); max_retries
0..100; delay_seconds from 0 and run_at at most ``max_delay_seconds`` ahead
(a setting, default 31,536,000: one year); any past run_at means "now", as in
every peer (a client computing it from an old record must not break); payload
any JSON value nested at most 64 levels, its integers within 64 bits (-2^63 ..
2^64-1: orjson, which writes and reads payloads, rounds wider ones to floats);
no string anywhere may hold a NUL character (PostgreSQL text and jsonb cannot
store it); a tenant_id only printable characters, as an API key's tenant.

The bound on delays comes from the validation context (``{"max_delay_seconds": s}``,
see :func:`parse_task_spec`), so that an instance's setting applies; without one it is
:data:`MAX_DELAY_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from taskmesh.errors import InvalidTaskError
from taskmesh.store.keys import PRIORITY_MAX

MAX_PAYLOAD_DEPTH = 64
MAX_RETRIES_LIMIT = 100
MAX_DELAY_SECONDS = 365 * 24 * 3600
"""The default of the ``max_delay_seconds`` setting: how far ahead a task may be delayed."""
MAX_DELAY_LIMIT = 10 * MAX_DELAY_SECONDS
"""The most ``max_delay_seconds`` may be set to (ten years)."""
PAST_FLOOR = datetime(1970, 1, 1, tzinfo=UTC)
"""A past ``run_at`` before this is kept as this (it means now all the same), so that year 1 with an
offset, which Python cannot shift to UTC, is stored as an ordinary instant."""
NAME_REGEX = r"^[A-Za-z0-9_.:-]{1,128}$"
TENANT_CHARACTERS = "must be 1 to 128 printable characters"
"""The message of a ``tenant_id`` holding a control, zero-width, direction or other unprintable character
(Python's :meth:`str.isprintable`: categories C and Z but the space), as for an API key's tenant."""
INT_MIN = -(2**63)
INT_MAX = 2**64 - 1
BIG_INTEGER = "integer beyond 64 bits (-2^63 .. 2^64-1); send it as a string"
"""The message of an integer orjson cannot hold (it would be rounded to a float)."""
EXACT_FLOAT_LIMIT = 2**53
"""Integral floats at least this large may be integer literals orjson rounded (see :func:`may_hold_big_integers`)."""

StrictInt = Annotated[int, Strict()]
ORJSON_BIG_INTEGER = "Integer exceeds 64-bit range"
"""orjson's ``TypeError`` text for an integer it cannot write."""


def check_json(value: Any, path: str, max_depth: int = MAX_PAYLOAD_DEPTH) -> None:
    """Refuse JSON that PostgreSQL cannot store, that nests too deeply, or whose integers orjson cannot hold.

    :param value: a decoded JSON value (dict, list or tuple, str, number, bool, None).
    :param path: field name used in the error (``payload``).
    :param max_depth: most levels of nested arrays/objects (a scalar is depth 0).
    :raises InvalidTaskError: ``payload: nested deeper than 64 levels``,
        ``payload.a.b: contains a NUL character`` or
        ``payload.customer.id: integer beyond 64 bits (-2^63 .. 2^64-1); send it as a string``.
    """
    stack: list[tuple[Any, str, int]] = [(value, path, 0)]
    while stack:
        item, where, depth = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                raise InvalidTaskError(where, "contains a NUL character")
        elif isinstance(item, int):
            if not INT_MIN <= item <= INT_MAX and not isinstance(item, bool):
                raise InvalidTaskError(where, BIG_INTEGER)
        elif isinstance(item, dict):
            if depth >= max_depth:
                raise InvalidTaskError(path, f"nested deeper than {max_depth} levels")
            for k, v in item.items():
                if "\x00" in k:
                    raise InvalidTaskError(f"{where}.{k!r}", "key contains a NUL character")
                stack.append((v, f"{where}.{k}", depth + 1))
        elif isinstance(item, list | tuple):
            if depth >= max_depth:
                raise InvalidTaskError(path, f"nested deeper than {max_depth} levels")
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))


def big_integer_path(value: Any, path: str) -> str | None:
    """Where ``value`` holds an integer beyond 64 bits (``payload.customer.id``), or ``None``.

    Walks dicts, lists and tuples (what orjson serialises as objects and arrays).
    """
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, int) and not isinstance(item, bool) and not INT_MIN <= item <= INT_MAX:
            return where
        if isinstance(item, dict):
            stack.extend((v, f"{where}.{k}") for k, v in item.items())
        elif isinstance(item, list | tuple):
            stack.extend((v, f"{where}[{i}]") for i, v in enumerate(item))
    return None


def may_hold_big_integers(value: Any) -> bool:
    """Whether orjson's parse ``value`` holds an integral float of magnitude at least 2^53.

    orjson reads an integer literal beyond 64 bits as a float, silently rounded; such a
    float is integral and at least 2^53. Only then does the body need a second, exact
    parse (``json.loads``) to tell an integer from a genuine float like ``1e300``.
    """
    stack: list[Any] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            if abs(item) >= EXACT_FLOAT_LIMIT and item.is_integer():
                return True
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def _no_documented_default(schema: dict[str, Any]) -> None:
    """Leave the default out of the field's JSON Schema: it is not a constant, and a client generated from
    the OpenAPI document sends a documented default as if it were given (a queue named, not the handler's)."""
    schema.pop("default", None)


DEBOUNCE_MAX_SECONDS = 86_400.0
"""The longest a debounce or throttle window may be (a day); a debounce's ``max_wait`` at most a week."""
DEBOUNCE_MIN_SECONDS = 0.001
"""The shortest: a millisecond (a window is counted in whole milliseconds)."""


class Debounce(BaseModel):
    """A task that waits ``seconds`` for a later one of its ``key`` to replace it (the last one within the window
    wins), never longer than ``max_wait`` after the first; a task that started is never replaced."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, max_length=200)
    seconds: float = Field(ge=DEBOUNCE_MIN_SECONDS, le=DEBOUNCE_MAX_SECONDS, allow_inf_nan=False)
    max_wait: float | None = Field(
        default=None, ge=DEBOUNCE_MIN_SECONDS, le=7 * DEBOUNCE_MAX_SECONDS, allow_inf_nan=False
    )

    @model_validator(mode="after")
    def _wait_at_least_seconds(self) -> Debounce:
        if self.max_wait is not None and self.max_wait < self.seconds:
            raise ValueError("max_wait must be at least seconds")
        return self


class Throttle(BaseModel):
    """At most one task of ``key`` per window of ``seconds`` (windows aligned to the Unix epoch); the others
    are deduplicated to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str = Field(min_length=1, max_length=200)
    seconds: float = Field(ge=DEBOUNCE_MIN_SECONDS, le=DEBOUNCE_MAX_SECONDS, allow_inf_nan=False)


class TaskSpec(BaseModel):
    """A task to enqueue, in the original API's field names.

    ``dedup_key`` is the idempotency key; ``type`` says how the task is
    scheduled (``immediate`` or ``delayed``; a delay makes it ``delayed``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_REGEX, description="Handler name, [A-Za-z0-9_.:-]{1,128}.")
    type: Literal["immediate", "delayed"] = "immediate"
    queue_name: str = Field(
        default="default",
        pattern=NAME_REGEX,
        description="Default: the queue the handler names, else default.",
        json_schema_extra=_no_documented_default,
    )
    priority: StrictInt = Field(default=0, ge=0, le=PRIORITY_MAX, description="0..1000, higher runs first.")
    payload: Any = Field(default_factory=dict, description="Any JSON value, at most 64 levels deep.")
    dedup_key: str | None = Field(default=None, min_length=1, max_length=512)
    max_retries: StrictInt | None = Field(default=None, ge=0, le=MAX_RETRIES_LIMIT)
    delay_seconds: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="Seconds from now, at most the max_delay_seconds setting (default 31536000, 365 days).",
    )
    run_at: datetime | None = Field(
        default=None,
        description="RFC 3339 time with an offset, at most max_delay_seconds ahead; any past time means now.",
    )
    tenant_id: str | None = Field(default=None, min_length=1, max_length=128)
    trace_id: str | None = Field(default=None, min_length=1, max_length=128)
    debounce: Debounce | None = Field(
        default=None, description="{key, seconds, max_wait}: the last task of its key within the window runs."
    )
    throttle: Throttle | None = Field(
        default=None, description="{key, seconds}: at most one task of its key per window; the others dedup to it."
    )
    concurrency_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="<limit> or <limit>:<value>: a counter of a configured limit this task also holds.",
    )

    @field_validator("tenant_id")
    @classmethod
    def _printable_tenant(cls, value: str | None) -> str | None:
        # What an API key's tenant may hold: a task's tenant that no key could name (a zero-width
        # space, a right-to-left override) would look like another tenant in every list.
        if value is not None and not value.isprintable():
            raise ValueError(TENANT_CHARACTERS)
        return value

    @field_validator("delay_seconds", mode="before")
    @classmethod
    def _number_only(cls, value: Any) -> Any:
        if isinstance(value, bool) or not (value is None or isinstance(value, int | float)):
            raise ValueError("must be a number of seconds")
        return value

    @field_validator("run_at", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if value is None or isinstance(value, datetime):
            return value
        if not isinstance(value, str):
            raise ValueError("must be an RFC 3339 date-time string")
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            raise ValueError("must be an RFC 3339 date-time string") from None
        if "T" not in value.upper() and " " not in value:
            raise ValueError("must be an RFC 3339 date-time string")
        return parsed

    @field_validator("delay_seconds")
    @classmethod
    def _not_too_long(cls, value: float | None, info: ValidationInfo) -> float | None:
        most = max_delay_of(info)
        if value is not None and value > most:
            raise ValueError(f"Input should be less than or equal to {_seconds(most)}")
        return value

    @field_validator("run_at")
    @classmethod
    def _aware_and_near(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("must carry a UTC offset (RFC 3339), e.g. 2026-01-01T12:00:00Z")
        most = max_delay_of(info)
        try:
            when = value.astimezone(UTC)
        except OverflowError:  # year 1 or 9999 shifted by its offset beyond Python's range
            if value.year > 1:
                raise ValueError(run_at_range(most)) from None
            return PAST_FLOOR
        if (when - datetime.now(UTC)).total_seconds() > most:
            raise ValueError(run_at_range(most))
        return max(value, PAST_FLOOR)

    @model_validator(mode="after")
    def _one_delay(self) -> TaskSpec:
        if self.delay_seconds is not None and self.run_at is not None:
            raise ValueError("give delay_seconds or run_at, not both")
        if self.debounce is not None and (self.delay_seconds is not None or self.run_at is not None):
            raise ValueError("debounce decides when the task runs: give no delay_seconds or run_at")
        if (self.debounce is not None) + (self.throttle is not None) + (self.dedup_key is not None) > 1:
            raise ValueError("give one of dedup_key, debounce and throttle")
        if self.type == "delayed" and self.delay_seconds is None and self.run_at is None:
            raise ValueError("type 'delayed' needs delay_seconds or run_at")
        return self

    def due_at(self, now: datetime | None = None) -> datetime | None:
        """When the task becomes runnable, or ``None`` for now."""
        if self.run_at is not None:
            return self.run_at.astimezone(UTC)
        if self.delay_seconds:
            return (now or datetime.now(UTC)) + timedelta(seconds=self.delay_seconds)
        return None


def max_delay_of(info: ValidationInfo) -> float:
    """The ``max_delay_seconds`` of the validation context, else :data:`MAX_DELAY_SECONDS`."""
    context = info.context
    most = context.get("max_delay_seconds") if isinstance(context, dict) else None
    return float(most) if most is not None else float(MAX_DELAY_SECONDS)


def run_at_range(most: float) -> str:
    """The message of a ``run_at`` more than ``most`` seconds ahead."""
    span = f"{_seconds(most / 86400)} days" if most % 86400 == 0 else f"{_seconds(most)} seconds"
    return f"must be at most {span} ahead (max_delay_seconds, as delay_seconds); any past time means now"


def _seconds(value: float) -> str:
    """``31536000`` rather than ``3.1536e+07``; a fraction as it is."""
    return str(int(value)) if value == int(value) else str(value)


def field_errors(exc: ValidationError) -> list[tuple[str, str]]:
    """``(field, message)`` pairs of a pydantic error, fields as dotted paths."""
    out = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "body"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field"
        elif err["type"] == "missing":
            msg = "field required"
        out.append((loc, msg))
    return out


def parse_task_specs(
    items: Sequence[Any], *, first: int = 0, max_delay_seconds: float = MAX_DELAY_SECONDS
) -> list[TaskSpec]:
    """Validate decoded JSON objects as :class:`TaskSpec` s, all at once (one pydantic call for the batch).

    :param first: the index of ``items[0]`` in the whole batch, when ``items`` is a slice of it.
    :param max_delay_seconds: how far ahead a task may be delayed (the setting).
    :raises InvalidTaskError: the first invalid item's first problem, its field prefixed with
        ``tasks[i].`` (``tasks[3].priority``); ``errors`` lists that item's problems.
    """
    try:
        for item in items:
            if not isinstance(item, dict):
                raise InvalidTaskError("body", "must be a JSON object")
            for key in _JSON_CHECKED:
                if key in item:
                    check_json(item[key], key)
        return _TASK_SPECS.validate_python(items, context=_context(max_delay_seconds))
    except (InvalidTaskError, ValidationError):
        pass
    for i, item in enumerate(items, first):  # rare: find the first invalid item and say what parse_task_spec says
        try:
            parse_task_spec(item, max_delay_seconds=max_delay_seconds)
        except InvalidTaskError as exc:
            errors = [(f"tasks[{i}].{f}", m) for f, m in exc.errors]
            raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None
    raise AssertionError("a batch pydantic refused has an item parse_task_spec refuses")  # pragma: no cover


def parse_task_spec(data: Any, *, max_delay_seconds: float = MAX_DELAY_SECONDS) -> TaskSpec:
    """Validate a decoded JSON object as a :class:`TaskSpec`.

    :param max_delay_seconds: how far ahead a task may be delayed (the setting).

    :raises InvalidTaskError: the first problem, naming its field; ``errors``
        on the exception lists every ``(field, message)``.
    """
    if not isinstance(data, dict):
        raise InvalidTaskError("body", "must be a JSON object")
    for key in _JSON_CHECKED:
        if key in data:
            check_json(data[key], key)
    try:
        return TaskSpec.model_validate(data, context=_context(max_delay_seconds))
    except ValidationError as exc:
        errors = field_errors(exc)
        field, message = errors[0]
        raise InvalidTaskError(field, message, errors) from None


def _context(max_delay_seconds: float) -> dict[str, float] | None:
    """The validation context of a bound (none for the default: the validators' fallback)."""
    return None if max_delay_seconds == MAX_DELAY_SECONDS else {"max_delay_seconds": max_delay_seconds}


_JSON_CHECKED = ("payload", "dedup_key", "tenant_id", "trace_id", "name", "queue_name")
"""The fields :func:`check_json` checks before pydantic sees them."""
_TASK_SPECS = TypeAdapter(list[TaskSpec])


def dump_json(value: Any, field: str) -> str:
    """Serialise ``value`` for a jsonb column.

    :raises InvalidTaskError: it is not JSON-serialisable (naming ``field``), or it holds an
        integer beyond 64 bits, which orjson cannot write (naming its path, ``payload.customer.id``,
        when it sits in dicts, lists and tuples; else ``field``).
    """
    try:
        return orjson.dumps(value).decode()
    except TypeError as exc:
        if str(exc) == ORJSON_BIG_INTEGER:
            raise InvalidTaskError(big_integer_path(value, field) or field, BIG_INTEGER) from None
        raise InvalidTaskError(field, f"is not JSON-serialisable: {exc}") from None
