"""What a store error says: the hint for named prepared statements behind a transaction pooler."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest
import redis.exceptions

from taskmesh.errors import StoreError
from taskmesh.store.classify import POOLER_HINT, postgres_error, redis_call, redis_error


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
