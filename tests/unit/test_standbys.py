"""The tasks an instance holds claimed ahead of a full limit key (``limits/standby.py``): which one an ended
run's slot goes to, and when none does."""

from __future__ import annotations

import uuid

from taskmesh.limits.standby import Standbys, standby_key
from taskmesh.tasks.models import ClaimedTask


def task(keys: list[str]) -> ClaimedTask:
    return ClaimedTask(
        task_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        name="t",
        queue="default",
        priority=0,
        payload=None,
        attempt=1,
        retries=0,
        max_retries=0,
        idempotency_key=None,
        trace_id=None,
        tenant_id=None,
        limit_keys=keys,
    )


def test_only_a_task_of_one_limit_key_may_be_claimed_ahead() -> None:
    assert standby_key(["api"]) == "api"
    assert standby_key(["api", "@acme"]) == "api"  # a fairness key is no limit's
    assert standby_key(["api", "per_customer:7"]) is None
    assert standby_key(None) is None


def test_an_ended_runs_slot_goes_to_the_oldest_waiting_task_of_its_key_unless_the_key_waits() -> None:
    standbys = Standbys()
    first, second, other = task(["api"]), task(["api"]), task(["db"])
    standbys.add(first, "api")
    standbys.add(second, "api")
    standbys.add(other, "db")
    assert standbys.counts() == {"api": 2, "db": 1}
    assert standbys.next_for(task(["api"])) == ("api", first)
    standbys.back_off("api", 60)
    assert standbys.next_for(task(["api"])) is None  # a RateLimited key hands nothing over
    assert standbys.next_for(task(["db"])) == ("db", other)
    standbys.stop("db", True)
    standbys.add(other, "db")
    assert standbys.next_for(task(["db"])) is None  # its limit was lowered below the slots it holds
    standbys.stop("db", False)
    assert standbys.next_for(task(["db"])) == ("db", other)
    assert standbys.take({second.task_id}) == [second]
    assert standbys.total == 0 and standbys.counts() == {}


def test_the_runs_of_a_key_are_counted_as_they_start_and_end() -> None:
    standbys = Standbys()
    a, b = task(["api"]), task(["api"])
    standbys.run_started(a)
    standbys.run_started(b)
    assert standbys.running("api") == 2
    standbys.run_ended(a)
    standbys.run_ended(b)
    assert standbys.running("api") == 0
