"""Typed calls of the ``key_*`` blocks of ``queries.sql``: API keys and the deployment's pepper."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

import asyncpg

from taskmesh.store.sql import Queries


class KeyQueries(Queries):
    """Queries on ``api_keys`` and ``auth_pepper`` (migration 0012)."""

    async def ensure_pepper(self, candidate: bytes) -> bytes:
        """``key_pepper_ensure``: the pepper, made from ``candidate`` when there is none yet."""
        value = await self._fetchval("key_pepper_ensure", candidate)
        return bytes(value)

    async def pepper(self) -> bytes | None:
        """``key_pepper``: the pepper, ``None`` before the first key was made."""
        value = await self._fetchval("key_pepper")
        return None if value is None else bytes(value)

    async def insert(
        self,
        key_id: str,
        name: str,
        secret_hash: bytes,
        scopes: Sequence[str],
        tenant_id: str | None,
        queues: Sequence[str] | None,
        expires_at: datetime | None,
        rate_limits_json: str | None = None,
    ) -> asyncpg.Record:
        """``key_insert``: the new key's row (without its hash); ``rate_limits_json`` a JSON object or ``None``."""
        row = await self._fetchrow(
            "key_insert", key_id, name, secret_hash, list(scopes), tenant_id, queues, expires_at, rate_limits_json
        )
        assert row is not None  # an INSERT ... RETURNING returns its row
        return row

    async def lookup(self, key_id: str) -> asyncpg.Record | None:
        """``key_lookup``: the key with its hash and the database's ``now``; ``None``: no such key."""
        return await self._fetchrow("key_lookup", key_id)

    async def mark_used(self, key_id: str) -> None:
        """``key_mark_used``: ``last_used_at`` is now."""
        await self._execute("key_mark_used", key_id)

    async def any(self) -> bool:
        """``key_any``: whether a key was ever made (revoked and expired ones count)."""
        return bool(await self._fetchval("key_any"))

    async def any_active(self) -> bool:
        """``key_any_active``: whether some key is neither revoked nor expired."""
        return bool(await self._fetchval("key_any_active"))

    async def list(self, limit: int) -> list[asyncpg.Record]:
        """``key_list``: newest first, with ``active``."""
        return await self._fetch("key_list", limit)

    async def get(self, key_id: str) -> asyncpg.Record | None:
        """``key_get``: one key without its hash."""
        return await self._fetchrow("key_get", key_id)

    async def revoke(self, key_id: str) -> asyncpg.Record | None:
        """``key_revoke``: the key, revoked (kept revoked at its first time); ``None``: no such key."""
        return await self._fetchrow("key_revoke", key_id)

    async def expire_at(self, key_id: str, when: datetime) -> asyncpg.Record | None:
        """``key_expire_at``: the key, expiring at ``when`` at the latest; ``None``: no such active key."""
        return await self._fetchrow("key_expire_at", key_id, when)
