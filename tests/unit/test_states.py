from __future__ import annotations

import re
from enum import StrEnum
from importlib import resources

from taskmesh.store.postgres import migrations
from taskmesh.tasks.states import (
    TERMINAL_TASK_STATUSES,
    BulkAction,
    DepFailure,
    NodeKind,
    NodeStatus,
    OperationStatus,
    Outcome,
    RunStatus,
    TaskStatus,
    TaskType,
    WorkerState,
    WorkflowStatus,
    can_transition_run,
    can_transition_task,
)


def _checked_values() -> dict[tuple[str, str], set[str]]:
    """``{(table, column): values}`` of every ``CHECK (column IN (...))`` the migrations create."""
    found: dict[tuple[str, str], set[str]] = {}
    for sql in (m.sql for m in migrations()):
        for table, body in re.findall(r"CREATE TABLE (\w+) \((.*?)\n\);", sql, re.S):
            for column, values in re.findall(r"^\s*(\w+)\s+text NOT NULL CHECK \(\w+ IN \(([^)]*)\)\)", body, re.M):
                found[(table, column)] = set(re.findall(r"'([^']*)'", values))
        # a CHECK widened later (ALTER TABLE t ADD CONSTRAINT c CHECK (column IN (...))) replaces the first
        for table, column, values in re.findall(
            r"ALTER TABLE (\w+) ADD CONSTRAINT \w+\s+CHECK \((\w+) IN \(([^)]*)\)\)", sql, re.S
        ):
            found[(table, column)] = set(re.findall(r"'([^']*)'", values))
    return found


def test_the_state_enums_are_exactly_what_the_migrations_allow() -> None:
    checked = _checked_values()
    expected: dict[tuple[str, str], type[StrEnum]] = {
        ("tasks", "status"): TaskStatus,
        ("tasks", "type"): TaskType,
        ("task_runs", "status"): RunStatus,
        ("workers", "state"): WorkerState,
        ("operations", "status"): OperationStatus,
        ("operations", "action"): BulkAction,
        ("workflows", "status"): WorkflowStatus,
        ("workflow_nodes", "status"): NodeStatus,
        ("workflow_nodes", "kind"): NodeKind,
        ("workflow_nodes", "on_dep_failure"): DepFailure,
    }
    for where, enum in expected.items():
        assert checked[where] == {m.value for m in enum}, where


def test_every_state_word_in_the_queries_is_a_known_state_or_outcome() -> None:
    sql = resources.files("taskmesh.store").joinpath("queries.sql").read_text()
    sql = "\n".join(line.split("--", 1)[0] for line in sql.splitlines())  # comments may say anything
    sql = re.sub(r"date_trunc\('[a-z]+'", "date_trunc(", sql)  # a unit of time, not a state
    words = set(re.findall(r"'([a-z_]+)'", sql))
    enums = (
        TaskStatus,
        RunStatus,
        Outcome,
        WorkerState,
        TaskType,
        OperationStatus,
        BulkAction,
        WorkflowStatus,
        NodeStatus,
        NodeKind,
        DepFailure,
    )
    known = {m.value for enum in enums for m in enum}
    assert words - known == set(), "a status literal in queries.sql that states.py does not know"


def test_a_task_moves_only_along_the_design_state_machine() -> None:
    allowed = {
        ("queued", "running"),
        ("queued", "cancelled"),
        ("running", "completed"),
        ("running", "queued"),
        ("running", "failed"),
        ("running", "cancelled"),  # an operator cancelled it while it ran
        ("failed", "queued"),
        ("blocked", "queued"),  # a workflow's deps ended
        ("blocked", "skipped"),  # a dep failed
        ("blocked", "cancelled"),  # the workflow was cancelled
        ("failed", "blocked"),  # a workflow's retry from failure
        ("cancelled", "queued"),  # an operator's retry
        ("cancelled", "blocked"),
        ("skipped", "queued"),
        ("skipped", "blocked"),
    }
    for old in TaskStatus:
        for new in TaskStatus:
            assert can_transition_task(old, new) == ((old.value, new.value) in allowed), (old, new)


def test_completed_tasks_never_move_again() -> None:
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
