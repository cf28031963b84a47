"""Which store errors are outages (transient) and which are not: the failure model's one rule.

Transient means the same call can succeed later without anyone changing
anything: the connection dropped or timed out, the server is starting,
shutting down or failing over, it ran out of a resource, or the transaction
lost a serialization race. Everything else (a data, constraint or syntax
error, a client-side encoding error, a reply taskmesh did not write) would
fail again the same way, so retrying it for ever would stop the service that
met it; it is handled where it happens instead (``errors.StoreError``).
"""

from __future__ import annotations

import asyncpg
import redis.exceptions

from taskmesh.errors import StoreError

TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
"""Connection exception, transaction rollback (serialization, deadlock), insufficient resources,
operator intervention (shutdown, cancel, cannot connect now), system error (I/O)."""
TRANSIENT_SQLSTATES = frozenset({"55P03", "25006", "25P03"})
"""lock_not_available (lock_timeout), read_only_sql_transaction (a failover's old primary),
idle_in_transaction_session_timeout."""

_PLAN_OUTDATED = (asyncpg.exceptions.InvalidCachedStatementError, asyncpg.exceptions.OutdatedSchemaCacheError)

POSTGRES_ERRORS: tuple[type[BaseException], ...] = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)
"""What asyncpg raises for a failed call (network errors come as OSError or TimeoutError)."""

REDIS_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.RedisError,
    redis.exceptions.RedisClusterException,  # not a RedisError: the cluster client's own failures
    OSError,
    TimeoutError,
)
"""What redis-py raises for a failed call."""
_CLUSTER_UNREACHABLE = ("cannot be connected", "could not agree on a valid slots cache")
"""The cluster client's words for nodes that did not answer, or answered mid-reshard: outages."""

_TRANSIENT_REDIS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # includes AuthenticationError, BusyLoadingError
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,  # a replica promoted under us: a failover
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.MasterDownError,
    redis.exceptions.OutOfMemoryError,  # maxmemory reached: memory may be freed
    OSError,
    TimeoutError,
)


def postgres_is_transient(exc: BaseException) -> bool:
    """Whether a PostgreSQL failure is an outage (see module docs).

    :param exc: an exception raised by asyncpg (or the socket under it).
    """
    if isinstance(exc, _PLAN_OUTDATED):
        # A migration beside a running instance changed a table a prepared statement reads: in a
        # transaction asyncpg cannot prepare it again, but it has cleared its caches, so the same
        # call succeeds next time (its SQLSTATE, 0A000 feature_not_supported, says otherwise).
        return True
    if isinstance(exc, asyncpg.PostgresError):
        state = str(getattr(exc, "sqlstate", "") or "")
        if not state:  # a client-side error asyncpg raised as a PostgresError
            return isinstance(exc, asyncpg.PostgresConnectionError)
        return state[:2] in TRANSIENT_SQLSTATE_CLASSES or state in TRANSIENT_SQLSTATES
    if isinstance(exc, asyncpg.InterfaceError | asyncpg.InternalClientError):
        # "connection is closed", "pool is closing", "cannot switch to state 12; another operation
        # is in progress" (asyncpg's protocol state after a cancelled query, MagicStack/asyncpg#1069):
        # the connection failed, not the call; the store drops that connection (store/sql.py).
        return True
    return isinstance(exc, OSError | TimeoutError)


def redis_is_transient(exc: BaseException) -> bool:
    """Whether a Redis failure is an outage (see module docs); a command error (WRONGTYPE) is not."""
    if isinstance(exc, redis.exceptions.RedisClusterException):
        return any(words in str(exc) for words in _CLUSTER_UNREACHABLE)
    return isinstance(exc, _TRANSIENT_REDIS)


POOLER_HINT = 'behind a pooler in transaction mode (PgBouncer)? set pg_pooler = "transaction"'
"""Said with the errors asyncpg's named prepared statements meet behind a transaction pooler."""
_POOLER_SYMPTOMS: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidSQLStatementNameError,
    asyncpg.exceptions.DuplicatePreparedStatementError,
)


def postgres_error(operation: str, exc: BaseException) -> StoreError:
    """Wrap an asyncpg failure of ``operation`` as a :class:`StoreError` carrying its SQLSTATE.

    A prepared statement that does not exist, or already does, on the server connection is
    what a transaction pooler does to a client that keeps them: the detail then says which
    setting to change (:data:`POOLER_HINT`).
    """
    detail = _one_line(exc)
    if isinstance(exc, _POOLER_SYMPTOMS):
        detail = f"{detail} ({POOLER_HINT})"
    state = getattr(exc, "sqlstate", None) if isinstance(exc, asyncpg.PostgresError) else None
    constraint = getattr(exc, "constraint_name", None) if isinstance(exc, asyncpg.PostgresError) else None
    return StoreError(
        "postgres",
        operation,
        transient=postgres_is_transient(exc),
        detail=detail,
        sqlstate=str(state) if state else None,
        constraint=str(constraint) if constraint else None,
    )


def redis_error(operation: str, exc: BaseException) -> StoreError:
    """Wrap a redis-py failure of ``operation`` as a :class:`StoreError`."""
    return StoreError("redis", operation, transient=redis_is_transient(exc), detail=_one_line(exc))


def closed_under_the_call(exc: BaseException) -> bool:
    """Whether ``exc`` is a connection closed under a call by the client itself, not a bug of ours.

    redis-py's cluster client closes every node's connections when the cluster is down or
    its slots moved (``RedisCluster.aclose`` before it learns the topology again); a call on
    another node in flight then fails inside redis-py or asyncio with ``RuntimeError`` (``the
    handler is closed``) or ``AttributeError`` (a transport gone: ``None``). That is an outage
    of the call. The same exceptions raised in taskmesh's own code are bugs, and stay so.
    """
    if not isinstance(exc, RuntimeError | AttributeError) or exc.__traceback__ is None:
        return False
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    module = str(tb.tb_frame.f_globals.get("__name__", ""))
    return module.split(".")[0] in ("redis", "asyncio")


class redis_call:  # used as a statement: ``with redis_call("push"):``
    """Context manager turning what a redis-py call raises into a :class:`StoreError` naming ``name``.

    Redis and socket errors are classified by :func:`redis_error`; a connection the client closed
    under the call (:func:`closed_under_the_call`) is transient. Anything else propagates.
    """

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            return
        if isinstance(exc, REDIS_ERRORS):
            raise redis_error(self.name, exc) from exc
        if closed_under_the_call(exc):
            detail = f"{_one_line(exc)} (a connection the client closed under this call)"
            raise StoreError("redis", self.name, transient=True, detail=detail) from exc


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first}"[:500] if first else type(exc).__name__
