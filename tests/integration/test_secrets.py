"""Secrets: the stores' passwords are never logged nor answered, through a start, work,
an outage and a refused password, at the most talkative log level."""

from __future__ import annotations

import signal
from typing import Any

import httpx
import pytest

from taskmesh.observability.logs import store_address
from tests.proc import call, spawn, wait_until
from tests.urls import with_user

__all__ = ["spawn"]  # a fixture, used by name

PG_SECRET = "pg-S3cret-in-url"
RD_SECRET = "s3cret"  # the fixture's server requires it


def with_password(database_url: str) -> str:
    """The database URL with a password (this machine's PostgreSQL trusts loopback, so any is accepted)."""
    url = with_user(database_url, f"postgres:{PG_SECRET}")
    assert PG_SECRET in url
    return url


@pytest.mark.anyio
@pytest.mark.usefixtures("pool")
async def test_store_passwords_are_never_logged_or_answered(
    spawn: Any, database_url: str, redis_with_password: str, prefix: str
) -> None:
    proc = spawn(
        DATABASE_URL=with_password(database_url),
        REDIS_URL=f"redis://:{RD_SECRET}@{redis_with_password}/0",
        TASKMESH_REDIS_PREFIX=prefix,
        TASKMESH_LOG_LEVEL="debug",
        TASKMESH_HANDLERS="tests.process_handlers",
    )
    base = f"http://127.0.0.1:{proc.port}"
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, proc=proc)
    answers = [
        httpx.post(f"{base}/api/v1/tasks", json={"name": "sleepy", "payload": {"seconds": 0}}).text,
        httpx.get(f"{base}/api/v1/workers").text,
        httpx.get(f"{base}/readyz").text,
        httpx.get(f"{base}/metrics").text,
    ]
    proc.popen.send_signal(signal.SIGTERM)
    proc.popen.wait(30)
    log = proc.output()
    assert "instance_ready" in log
    # which stores it uses is logged (instance_starting), without their passwords
    assert store_address(database_url) in log and f"redis://{redis_with_password}/0" in log
    for text in [log, *answers]:
        assert PG_SECRET not in text and f":{RD_SECRET}@" not in text


@pytest.mark.anyio
@pytest.mark.usefixtures("pool")
async def test_a_refused_redis_password_is_reported_without_the_password(
    spawn: Any, database_url: str, redis_with_password: str, prefix: str
) -> None:
    wrong = "wr0ng-Pa55"
    proc = spawn(
        DATABASE_URL=with_password(database_url),
        REDIS_URL=f"redis://:{wrong}@{redis_with_password}/0",
        TASKMESH_REDIS_PREFIX=prefix,
        TASKMESH_LOG_LEVEL="debug",
    )
    assert proc.wait(30) == 2  # a refused password ends start-up, it is not waited out
    log = proc.output()
    assert "redis_url: Redis refused the user or password" in log
    assert wrong not in log and PG_SECRET not in log
