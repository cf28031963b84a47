"""``ReadyTargets``: a copied bulk's push targets, held by queue until the push."""

from __future__ import annotations

import uuid

from taskmesh.tasks.copy_enqueue import ReadyTargets
from taskmesh.tasks.models import PushTarget


def test_it_yields_every_task_added_with_its_queue_and_priority_and_counts_them() -> None:
    targets = ReadyTargets()
    ids = [uuid.uuid4() for _ in range(5)]
    for i, task_id in enumerate(ids):
        targets.add("a" if i % 2 else "b", str(task_id), i)
    assert len(targets) == 5
    assert targets.counts() == {"b": 3, "a": 2}
    assert sorted(targets, key=lambda t: t.priority) == [
        PushTarget(task_id, "a" if i % 2 else "b", i, None) for i, task_id in enumerate(ids)
    ]
    assert PushTarget(ids[1], "a", 1, None) in targets
    assert PushTarget(ids[1], "b", 1, None) not in targets
    assert not ReadyTargets() and list(ReadyTargets()) == []
