"""Commands packed by hiredis (store/redis_packing.py): the same bytes as redis-py's packer, on every
kind of connection, and the same errors for what Redis cannot take."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio.connection import Connection, SSLConnection, UnixDomainSocketConnection
from redis.exceptions import DataError

from taskmesh.store.redis_clients import open_client
from taskmesh.store.redis_packing import HiredisPacking, packing_class
from tests.conftest import REDIS_MODE

pytestmark = pytest.mark.anyio

COMMANDS: list[tuple[Any, ...]] = [
    ("ZADD", "q", "NX", 1.5, "a", 0.1, "b", 1e20, "c", -3, "d", 1 / 3, "é", float("inf"), "f"),
    ("SET", b"k", b"\x00\xff binary", "EX", 12345678901234567890),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "x"),
]


@pytest.mark.parametrize("args", COMMANDS)
def test_packs_the_bytes_redis_py_packs(args: tuple[Any, ...]) -> None:
    ours, theirs = packing_class(Connection)(), Connection()
    assert b"".join(ours.pack_command(*args)) == b"".join(theirs.pack_command(*args))


def test_what_hiredis_does_not_take_goes_to_redis_py() -> None:
    conn = packing_class(Connection)()
    assert b"".join(conn.pack_command("SET", "k", bytearray(b"ab"))) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nab\r\n"
    for bad, kind in ((True, "bool"), (None, "NoneType")):
        with pytest.raises(DataError, match=f"Invalid input of type: '{kind}'"):
            conn.pack_command("SET", "k", bad)


@pytest.mark.parametrize(
    ("url", "base"),
    [
        ("redis://127.0.0.1:1/0", Connection),
        ("rediss://127.0.0.1:1/0", SSLConnection),
        ("unix:///tmp/nowhere.sock", UnixDomainSocketConnection),
    ],
)
def test_every_standalone_kind_keeps_its_transport(url: str, base: type[Any]) -> None:
    cls = open_client(url).connection_pool.connection_class  # type: ignore[union-attr]
    assert issubclass(cls, HiredisPacking)
    assert issubclass(cls, base)
    assert packing_class(cls) is cls


def test_cluster_nodes_pack_with_hiredis() -> None:
    client = open_client("redis://127.0.0.1:1/0", "cluster")
    manager = client.nodes_manager  # type: ignore[union-attr]
    assert issubclass(manager.connection_kwargs["connection_class"], HiredisPacking)
    assert all(issubclass(n.connection_class, HiredisPacking) for n in manager.startup_nodes.values())


async def test_a_real_server_reads_what_was_packed(redis_url: str, prefix: str) -> None:
    client = open_client(redis_url, REDIS_MODE)
    key = f"{prefix}packing"
    try:
        members = {f"id-{i}": 1_700_000_000_000.0 + i / 7 for i in range(1000)}
        assert await client.zadd(key, members, nx=True) == 1000
        async with client.pipeline(transaction=False) as pipe:
            pipe.zscore(key, "id-7")
            pipe.zcard(key)
            assert await pipe.execute() == [members["id-7"], 1000]
    finally:
        await client.delete(key)
        await client.aclose()
