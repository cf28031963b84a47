"""``taskmesh.Client`` refuses the Redis options an instance's settings refuse, with the same words.

Before, the client took them as given: a Redis Cluster URL with a database other than 0 met
redis-py's own exception on entry, a misread database number was silently database 0, and an
unknown ``redis_mode`` was the standalone one. Each is now a :class:`taskmesh.ConfigError` from
``Client(...)`` itself, before anything connects, worded as ``load_settings`` words it.
"""

from __future__ import annotations

import pytest

import taskmesh
from taskmesh.config import load_settings

DATABASE_URL = "postgresql://taskmesh@127.0.0.1:5432/taskmesh"

CASES = [
    (
        "redis://:secret@127.0.0.1:6379/3",
        "cluster",
        "redis_mode: a Redis Cluster has database 0 alone (it refuses SELECT): end redis_url with /0 or no number",
    ),
    (
        "redis://127.0.0.1:6379?db=2",
        "cluster",
        "redis_mode: a Redis Cluster has database 0 alone (it refuses SELECT): end redis_url with /0 or no number",
    ),
    (
        "redis+sentinel://s1,s2/tm/0",
        "cluster",
        'redis_mode: a redis+sentinel:// URL names one master, not a cluster: use redis_mode = "standalone"',
    ),
    (
        "unix:///run/redis.sock",
        "cluster",
        "redis_mode: a Redis Cluster is reached over TCP: redis_url must be redis:// or rediss:// in cluster mode",
    ),
    (
        "redis://:secret@127.0.0.1:6379/abc",
        "standalone",
        "redis_url: the database number 'abc' is not a whole number (0 to 15 on a default server)",
    ),
    (
        "127.0.0.1:6379",
        "standalone",
        "redis_url: must be a redis://, rediss://, unix:// or redis+sentinel:// URL, not no scheme",
    ),
    ("redis://127.0.0.1:6379/0", "sharded", "redis_mode: Input should be 'standalone' or 'cluster'"),
]


@pytest.mark.parametrize(("redis_url", "redis_mode", "message"), CASES)
def test_the_client_refuses_redis_options_as_the_settings_do(redis_url: str, redis_mode: str, message: str) -> None:
    with pytest.raises(taskmesh.ConfigError) as caught:
        taskmesh.Client(DATABASE_URL, redis_url, redis_mode=redis_mode)  # type: ignore[arg-type]  # a caller's typo
    assert str(caught.value) == message
    assert "secret" not in str(caught.value)


@pytest.mark.parametrize(("redis_url", "redis_mode", "message"), CASES)
def test_the_settings_refuse_the_same_options_in_the_same_words(
    redis_url: str, redis_mode: str, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TASKMESH_CONFIG", raising=False)
    with pytest.raises(taskmesh.ConfigError) as caught:
        load_settings(database_url=DATABASE_URL, redis_url=redis_url, redis_mode=redis_mode)
    assert str(caught.value) == "invalid configuration: " + message


def test_the_client_takes_what_the_settings_take() -> None:
    taskmesh.Client(DATABASE_URL, "redis://127.0.0.1:6379/0", redis_mode="cluster")
    taskmesh.Client(DATABASE_URL, "redis://127.0.0.1:6379/7")
    taskmesh.Client(DATABASE_URL, "redis+sentinel://s1,s2/tm/1")
