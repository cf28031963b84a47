"""What a store error says: the hint for named prepared statements behind a transaction pooler, a schema mismatch."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
import redis.exceptions

from taskmesh.errors import StoreError
from taskmesh.store.classify import POOLER_HINT, postgres_error, redis_call, redis_error
from taskmesh.store.schema_watch import Mismatch, SchemaWatch


@pytest.mark.parametrize(
    "exc",
    [
        asyncpg.exceptions.InvalidSQLStatementNameError('prepared statement "__asyncpg_stmt_33__" does not exist'),
        asyncpg.exceptions.DuplicatePreparedStatementError('prepared statement "__asyncpg_stmt_1__" already exists'),
    ],
)
def test_a_prepared_statement_a_pooler_lost_or_kept_names_the_pg_pooler_setting(exc: Exception) -> None:
    error = postgres_error("key_lookup", exc)
    assert not error.transient
    assert str(error) == f"postgres error in key_lookup: {type(exc).__name__}: {exc} ({POOLER_HINT})"
    assert POOLER_HINT == 'behind a pooler in transaction mode (PgBouncer)? set pg_pooler = "transaction"'


def test_other_errors_carry_no_pooler_hint() -> None:
    error = postgres_error("task_insert", asyncpg.exceptions.UniqueViolationError("duplicate key"))
    assert str(error) == "postgres error in task_insert: UniqueViolationError: duplicate key"


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ("Redis Cluster cannot be connected. Please provide at least one reachable node: refused", True),
        ("startup_nodes could not agree on a valid slots cache: a vs b", True),
        ("Cluster mode is not enabled on this node", False),
        ("ZADD - all keys must map to the same key slot", False),
    ],
)
def test_the_cluster_clients_own_errors_are_outages_only_when_no_node_answered(message: str, transient: bool) -> None:
    """redis-py's RedisClusterException is not a RedisError: it is classified by what it says."""
    error = redis_error("push", redis.exceptions.RedisClusterException(message))
    assert error.transient is transient
    assert str(error).startswith("redis ")


def test_a_connection_closed_under_a_redis_call_is_an_outage_and_our_own_bug_is_not() -> None:
    """What redis-py's cluster reset does to calls in flight is transient; an AttributeError of ours propagates."""
    with pytest.raises(StoreError) as closed:
        with redis_call("pop_ready"):
            asyncio.Lock().release()  # a RuntimeError raised inside asyncio, as a closed transport's is
    assert closed.value.transient
    assert str(closed.value) == (
        "redis unavailable in pop_ready: RuntimeError: Lock is not acquired. "
        "(a connection the client closed under this call)"
    )
    gone: Any = None
    with pytest.raises(AttributeError):
        with redis_call("pop_ready"):
            gone.writelines([b"x"])  # raised in this module: a bug, not an outage


@pytest.mark.parametrize(
    ("exc", "sqlstate", "mismatch"),
    [
        (asyncpg.exceptions.UndefinedColumnError('column "priority" does not exist'), "42703", True),
        (asyncpg.exceptions.UndefinedTableError('relation "tasks" does not exist'), "42P01", True),
        (asyncpg.exceptions.InvalidColumnReferenceError("no unique or exclusion constraint matching"), "42P10", True),
        (asyncpg.exceptions.UndefinedFunctionError("function uuidv7() does not exist"), "42883", True),
        (asyncpg.exceptions.InsufficientPrivilegeError("permission denied for table tasks"), "42501", False),
        (asyncpg.exceptions.UniqueViolationError("duplicate key"), "23505", False),
        (asyncpg.exceptions.AdminShutdownError("terminating connection"), "57P01", False),
        (asyncpg.InterfaceError("connection is closed"), None, False),
        (ConnectionResetError("reset by peer"), None, False),
    ],
)
def test_a_statement_the_schema_refuses_is_a_schema_mismatch_and_nothing_else_is(
    exc: Exception, sqlstate: str | None, mismatch: bool
) -> None:
    """SQLSTATE class 42 but a missing privilege: the release and the schema disagree; never an outage."""
    error = postgres_error("task_insert_many", exc)
    assert (error.sqlstate, error.schema_mismatch) == (sqlstate, mismatch)
    if mismatch:
        assert not error.transient


def test_a_redis_error_is_never_a_schema_mismatch() -> None:
    error = redis_error("push", redis.exceptions.ResponseError("ERR unknown command"))
    assert (error.sqlstate, error.schema_mismatch) == (None, False)


def test_the_watch_counts_and_keeps_a_mismatch_for_its_window_only() -> None:
    now = [100.0]
    counts: list[str] = []
    watch = SchemaWatch(60.0, count=counts.append, clock=lambda: now[0])
    watch.error("task_claim_many", asyncpg.exceptions.UniqueViolationError("duplicate key"))
    assert (counts, watch.recent()) == ([], None)
    error = watch.error("task_claim_many", asyncpg.exceptions.UndefinedColumnError('column "x" does not exist'))
    assert error.schema_mismatch
    assert counts == ["task_claim_many"]
    assert watch.recent() == Mismatch(
        "task_claim_many", "42703", 'UndefinedColumnError: column "x" does not exist', 100.0
    )
    now[0] = 159.9
    assert watch.recent() is not None
    now[0] = 160.0
    assert watch.recent() is None
