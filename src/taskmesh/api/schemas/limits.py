"""The answers of the limit routes."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class LimitUsage(BaseModel):
    """What one counter of a limit holds now, in one queue."""

    queue: str
    key: str = Field(description="The limit key: the limit's name, or <name>:<value> for a limit with a key.")
    in_use: int = Field(description="Runs holding its slots.")
    waiting: int = Field(description="Tasks parked until it has room.")
    backing_off_until_ms: int | None = Field(
        description="Until when (ms since the Unix epoch) it waits after a handler's RateLimited."
    )


class Limit(BaseModel):
    """A limit in force: as configured, or as set at run time."""

    name: str
    queue: str | None = Field(description="The queue whose tasks it holds (null: any queue).")
    task: str | None = Field(description="The task name it holds (null: any task).")
    key: str | None = Field(description="tenant_id or payload.<path>: one counter per value (null: one counter).")
    concurrency: int | None = Field(description="Most runs at once.")
    rate: str | None = Field(description="Most starts per second, minute or hour (20/s, 600/m, 5/h).")
    burst: int = Field(description="Starts allowed at once after a quiet spell (with rate).")
    source: Literal["config", "api"] = Field(description="config: the configuration's; api: set at run time.")
    updated_at: str | None
    updated_by: str | None = Field(description="The key that set it at run time.")
    usage: list[LimitUsage]


class LimitList(BaseModel):
    """Every limit in force, by name."""

    limits: list[Limit]
