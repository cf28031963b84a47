from __future__ import annotations

from taskmesh.states import (
    TERMINAL_TASK_STATUSES,
    RunStatus,
    TaskStatus,
    can_transition_run,
    can_transition_task,
)


def test_a_task_moves_only_along_the_design_state_machine() -> None:
    allowed = {
        ("queued", "running"),
        ("queued", "cancelled"),
        ("running", "completed"),
        ("running", "queued"),
        ("running", "failed"),
        ("failed", "queued"),
    }
    for old in TaskStatus:
        for new in TaskStatus:
            assert can_transition_task(old, new) == ((old.value, new.value) in allowed), (old, new)


def test_completed_and_cancelled_tasks_never_move_again() -> None:
    for status in TERMINAL_TASK_STATUSES:
        assert not any(can_transition_task(status, new) for new in TaskStatus)


def test_a_run_ends_once_and_only_from_running_or_by_a_cancel_before_it_ran() -> None:
    assert can_transition_run(RunStatus.QUEUED, RunStatus.RUNNING)
    assert can_transition_run(RunStatus.QUEUED, RunStatus.FAILED)
    for end in (RunStatus.SUCCEEDED, RunStatus.RETRYING, RunStatus.FAILED):
        assert can_transition_run(RunStatus.RUNNING, end)
        assert not any(can_transition_run(end, new) for new in RunStatus)
    assert not can_transition_run(RunStatus.QUEUED, RunStatus.SUCCEEDED)
    assert not can_transition_run(RunStatus.QUEUED, RunStatus.RETRYING)
