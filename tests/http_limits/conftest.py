"""Every test of this folder runs on asyncio and on uvloop (the CLI's loop when installed)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from taskmesh.observability.logs import configure


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    configure(os.environ.get("TASKMESH_TEST_LOG_LEVEL", "warning"), "console")
    backend: tuple[str, dict[str, Any]] = request.param
    return backend
