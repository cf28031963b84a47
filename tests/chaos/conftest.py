"""Stores the chaos tests own: an embedded PostgreSQL and Valkey they may stop, flush and restart."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import asyncpg
import pytest

from taskmesh.dev.stack import EmbeddedPostgres, EmbeddedValkey
from taskmesh.store.postgres import migrate_url
from tests.conftest import with_database


async def fresh_database(pg: EmbeddedPostgres, prefix: str) -> str:
    """Create and migrate a new database on ``pg``; returns its URL."""
    name = f"{prefix}_{secrets.token_hex(3)}"
    admin = await asyncpg.connect(pg.url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = with_database(pg.url, name)
    await migrate_url(url)
    return url


@pytest.fixture(scope="module")
def owned_stores(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedPostgres, EmbeddedValkey]]:
    root = tmp_path_factory.mktemp("chaos-stores")
    pg = EmbeddedPostgres(root)
    try:
        valkey = EmbeddedValkey(root, persist=False)
        try:
            yield pg, valkey
        finally:
            valkey.stop()
    finally:
        pg.stop()
