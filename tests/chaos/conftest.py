"""Stores the chaos tests own: an embedded PostgreSQL and Valkey they may stop, flush and restart."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from taskmesh.dev import EmbeddedPostgres, EmbeddedValkey


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
