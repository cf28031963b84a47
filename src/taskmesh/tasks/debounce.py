"""Debounced and throttled creates.

A **debounced** task (``debounce = {key, seconds, max_wait}``) waits ``seconds``; a later create of
the same key and tenant, while that task has not started, replaces its payload and priority and
pushes its start back by ``seconds`` again, never past ``max_wait`` after the first create. A task
that started (or ran once: a retry) is never replaced; the next create makes a new task. The
create answers the task that will run (``created: false`` when it replaced one). PostgreSQL decides
(migration 0028's unique index of keys of tasks not started, ``task_debounce_many``), so two
instances creating at once still leave one task.

A **throttled** task (``throttle = {key, seconds}``) is created at most once per window of ``seconds``
(windows aligned to the Unix epoch, by PostgreSQL's clock as the instance keeps it): it takes the
dedup key ``throttle:<key>:<window>``, so the other creates of the window answer that task.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from taskmesh.tasks import enqueue_plan
from taskmesh.tasks.models import Enqueued, PushTarget
from taskmesh.tasks.states import TaskStatus
from taskmesh.tasks.validation import TaskSpec

if TYPE_CHECKING:
    from taskmesh.store import PgStore

THROTTLE_PREFIX = "throttle:"


def throttled(spec: TaskSpec, now_ms: int) -> TaskSpec:
    """``spec`` with the dedup key of its throttle's current window (``spec`` itself without a throttle).

    :param now_ms: the time, ms since the Unix epoch.
    """
    if spec.throttle is None:
        return spec
    window = int(now_ms // round(spec.throttle.seconds * 1000))
    return spec.model_copy(update={"dedup_key": f"{THROTTLE_PREFIX}{spec.throttle.key}:{window}"})


async def store(
    rules: enqueue_plan.PlanRules,
    pg: PgStore,
    items: Sequence[tuple[int, TaskSpec]],
    field_prefix: str,
) -> tuple[dict[int, Enqueued], list[PushTarget], list[PushTarget]]:
    """Create or replace debounced tasks in one statement (see module docs).

    :param items: ``(place in the caller's list, spec)``, each spec with a ``debounce``.
    :returns: ``(answer by place, targets to push, targets of replaced tasks to push again)``.
    :raises InvalidTaskError: a task is refused (named by its place); nothing is written.
    :raises StoreError: PostgreSQL failed; nothing was written.
    """
    rows = enqueue_plan.plan(rules, [s for _, s in items], field_prefix=field_prefix, positions=[i for i, _ in items])
    last: dict[tuple[str, str], int] = {}  # the last create of a key in the batch wins
    for n, (_, spec) in enumerate(items):
        assert spec.debounce is not None
        last[spec.debounce.key, spec.tenant_id or ""] = n
    chosen = sorted(last.values())
    specs = [items[n][1] for n in chosen]
    found = await pg.tasks.debounce_many(
        [
            [rows.ids[n] for n in chosen],
            [rows.names[n] for n in chosen],
            [rows.queues[n] for n in chosen],
            [rows.priorities[n] for n in chosen],
            [rows.payloads[n] for n in chosen],
            [rows.max_retries[n] for n in chosen],
            [rows.tenants[n] for n in chosen],
            [rows.traces[n] for n in chosen],
            [rows.timeouts[n] for n in chosen],
            [rows.limit_keys[n] for n in chosen],
            [s.debounce.key for s in specs if s.debounce is not None],
            [s.debounce.seconds for s in specs if s.debounce is not None],
            [s.debounce.max_wait for s in specs if s.debounce is not None],
        ]
    )
    by_key = {(r["debounce_key"], r["tenant_id"] or ""): r for r in found}
    answers: dict[int, Enqueued] = {}
    pushes: list[PushTarget] = []
    moved: list[PushTarget] = []
    for n, (place, spec) in enumerate(items):
        assert spec.debounce is not None
        row = by_key[spec.debounce.key, spec.tenant_id or ""]
        made = bool(row["inserted"]) and last[spec.debounce.key, spec.tenant_id or ""] == n
        answers[place] = Enqueued(
            row["id"], TaskStatus.QUEUED, created=made, trace_id=row["trace_id"], queue=row["queue"]
        )
    for row in found:
        target = PushTarget(
            row["id"], row["queue"], row["priority"], row["run_at"] if row["delayed"] else None, row["limit_keys"]
        )
        if row["inserted"]:
            pushes.append(target)
        else:
            moved.append(dataclasses.replace(target, moved=True))
    return answers, pushes, moved
