"""The demo handler of the dev profile: the original platform's simulation.

It fails the first attempt of a delivery cycle when the task's priority is
odd, unless ``payload.skip_fail`` is true (a DLQ replay starts a new cycle,
so an odd-priority task replayed without ``override_priority`` fails again),
and it sleeps ``payload.sleep_seconds`` (0 to 60) first, so that
concurrency, cancellation and shutdown can be watched by hand.
"""

from __future__ import annotations

from typing import Any

import anyio

from taskmesh.errors import NonRetryableError
from taskmesh.tasks.models import TaskContext
from taskmesh.tasks.registry import Handler, make_handler

MAX_SLEEP_SECONDS = 60.0


class SimulatedFailure(Exception):
    """The demo's deliberate failure (retryable)."""


async def demo(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    """Sleep, then succeed or fail as the original simulation did.

    :raises NonRetryableError: ``sleep_seconds`` is not a number in 0..60.
    :raises SimulatedFailure: odd priority, first attempt of the cycle, no ``skip_fail``.
    """
    data = payload if isinstance(payload, dict) else {}
    sleep = data.get("sleep_seconds", 0)
    if isinstance(sleep, bool) or not isinstance(sleep, int | float) or not 0 <= sleep <= MAX_SLEEP_SECONDS:
        raise NonRetryableError("payload.sleep_seconds must be a number between 0 and 60")
    if sleep:
        await anyio.sleep(sleep)
    if ctx.priority % 2 == 1 and ctx.retries == 0 and data.get("skip_fail") is not True:
        raise SimulatedFailure("simulated failure: odd priority fails the first attempt of a delivery cycle")
    return {"ok": True, "attempt": ctx.attempt}


def demo_handler() -> Handler:
    """The demo as a fallback :class:`~taskmesh.tasks.registry.Handler` (any task name)."""
    return make_handler("demo", demo)
