"""The Lua scripts of the Redis store, read from ``lua/`` (each registered once per client, called by SHA)."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def lua(name: str) -> str:
    """The text of ``lua/<name>.lua``."""
    return resources.files("taskmesh.store").joinpath("lua", f"{name}.lua").read_text()
