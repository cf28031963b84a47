"""The event loop an instance runs on: uvloop when installed (the ``fast`` extra), else asyncio's."""

from __future__ import annotations


def backend_options() -> dict[str, bool]:
    """anyio's backend options: uvloop when installed, a quicker event loop with the same semantics."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return {}
    return {"use_uvloop": True}
