"""A limit as the operator declares it (``[limits.<name>]`` in TOML, ``TASKMESH_LIMITS`` as JSON).

A limit applies to the tasks its ``queue`` and ``task`` select (each unset one selects any), and,
with a ``key``, separately to each value of that key (``tenant_id``, or ``payload.<path>``): one
counter per customer, per tenant, per model. A limit that selects nothing (no ``queue``, ``task``
or ``key``) applies only to tasks that name it at enqueue (``concurrency_key = "<name>:<value>"``).
It holds ``concurrency`` (runs at once) and/or ``rate`` (starts per second, minute or hour, with
``burst`` starts at once after a quiet spell).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator, model_validator

from taskmesh.errors import InvalidTaskError

LIMIT_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
"""A limit's name: it is the prefix of every limit key, so it holds no ``:``."""
RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*(s|sec|second|m|min|minute|h|hour)\s*$")
PER = {"s": 1.0, "sec": 1.0, "second": 1.0, "m": 60.0, "min": 60.0, "minute": 60.0, "h": 3600.0, "hour": 3600.0}
KEY_SOURCE = re.compile(r"^(tenant_id|payload(\.[A-Za-z0-9_-]{1,64}){1,8})$")
CONCURRENCY_MAX = 100_000
RATE_MAX = 100_000.0
"""Most starts per second a rate may allow."""

StrictInt = Annotated[int, Strict()]


def parse_rate(text: str) -> float:
    """A rate such as ``"20/s"``, ``"600/m"`` or ``"5/h"`` in starts per second.

    :raises ValueError: not of that shape, zero, or above :data:`RATE_MAX` a second.
    """
    found = RATE.fullmatch(text)
    if found is None:
        raise ValueError(f"rate {text!r} must look like 20/s, 600/m or 5/h")
    per_second = float(found.group(1)) / PER[found.group(2)]
    if not 0 < per_second <= RATE_MAX:
        raise ValueError(f"rate {text!r} must be above 0 and at most {RATE_MAX:g}/s")
    return per_second


class LimitSettings(BaseModel):
    """A limit: ``concurrency`` (runs at once) and/or ``rate`` (starts per second, minute or hour, ``burst`` at
    once), over the tasks its ``queue`` and ``task`` select, one counter per value of its ``key``. With no
    queue, task or key it holds only tasks that name it in their ``concurrency_key``."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    queue: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    """The queue whose tasks it applies to (unset: any queue)."""
    task: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    """The task name it applies to (unset: any task)."""
    key: str | None = None
    """``tenant_id`` or ``payload.<path>``: one counter per value (unset: one counter for all)."""
    concurrency: StrictInt | None = Field(default=None, ge=1, le=CONCURRENCY_MAX)
    """Most runs at once."""
    rate: str | None = None
    """Most starts per second, minute or hour: ``20/s``, ``600/m``, ``5/h``."""
    burst: StrictInt = Field(default=1, ge=1, le=100_000)
    """Starts allowed at once after a quiet spell (with ``rate``)."""

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: str | None) -> str | None:
        if value is not None and not KEY_SOURCE.fullmatch(value):
            raise ValueError("must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)")
        return value

    @field_validator("rate")
    @classmethod
    def _check_rate(cls, value: str | None) -> str | None:
        if value is not None:
            parse_rate(value)
        return value

    @model_validator(mode="after")
    def _holds_something(self) -> LimitSettings:
        if self.concurrency is None and self.rate is None:
            raise ValueError("a limit needs concurrency, rate, or both")
        if self.rate is None and self.burst != 1:
            raise ValueError("burst counts starts of a rate: give rate too, or no burst")
        return self

    @property
    def per_second(self) -> float | None:
        """The rate in starts per second (``None``: no rate)."""
        return None if self.rate is None else parse_rate(self.rate)

    @property
    def selects(self) -> bool:
        """Whether it selects tasks by itself (queue, task or key); else only a ``concurrency_key`` names it."""
        return self.queue is not None or self.task is not None or self.key is not None


def check_names(limits: dict[str, LimitSettings]) -> dict[str, LimitSettings]:
    """``limits`` when every name is a limit name (:data:`LIMIT_NAME`).

    :raises ValueError: naming the first bad name.
    """
    for name in limits:
        if not LIMIT_NAME.fullmatch(name):
            raise ValueError(f"limit name {name!r} must match [a-z0-9][a-z0-9_-]{{0,63}}")
    return limits


WEIGHT_MAX = 1000.0


class FairnessSettings(BaseModel):
    """Fair shares between the keys of one queue (``[queues.<q>] fairness = {key = "tenant_id", weights = {...}}``).

    Each task of the queue counts for its value of ``key``; keys with tasks waiting share the running
    slots in proportion to their weights (default ``default_weight``): each free executor goes to the key
    with the fewest runs for its weight (deficit round robin, ``store/lua/fair_lib.lua``), so that one
    key's backlog does not hold another key's first task back by more than one dispatch round, a key of
    long tasks does not take every executor, and a key alone gets every executor.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: str
    """``tenant_id`` or ``payload.<path>``: what a task counts for."""
    weights: dict[str, float] = Field(default_factory=dict)
    """Weight of a key's value (``{"acme": 3}``): its share against a key of weight 1."""
    default_weight: float = Field(default=1.0, gt=0, le=WEIGHT_MAX, allow_inf_nan=False)

    @field_validator("key")
    @classmethod
    def _check_key(cls, value: str) -> str:
        if not KEY_SOURCE.fullmatch(value):
            raise ValueError("must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)")
        return value

    @field_validator("weights")
    @classmethod
    def _check_weights(cls, value: dict[str, float]) -> dict[str, float]:
        for name, weight in value.items():
            if not 0 < weight <= WEIGHT_MAX:
                raise ValueError(f"weight of {name!r} must be above 0 and at most {WEIGHT_MAX:g}")
        return value


def check_limit(name: str) -> str:
    """``name`` when it is a limit's name.

    :raises InvalidTaskError: it is not (on ``limit``).
    """
    if not LIMIT_NAME.fullmatch(name):
        raise InvalidTaskError("limit", "must match [a-z0-9][a-z0-9_-]{0,63}")
    return name


def settings_of(values: Any) -> LimitSettings:
    """``values`` as a limit's settings.

    :raises InvalidTaskError: a setting is refused (naming it, as the API does).
    """
    try:
        return LimitSettings.model_validate(values)
    except ValidationError as exc:
        errors = [
            (".".join(str(p) for p in e["loc"]) or "body", e["msg"].removeprefix("Value error, ")) for e in exc.errors()
        ]
        raise InvalidTaskError(errors[0][0], errors[0][1], errors) from None
