"""A handlers module that injects a bug into one service of the instance importing it (crash-policy tests).

``TASKMESH_HANDLERS=tests.broken_services`` with ``BREAK_SERVICE=sampler`` (or
``reclaimer``) replaces that service's tick with one that raises, as a bug in
taskmesh would; ``tests.process_handlers`` is imported too, so its handlers
run as usual.
"""

from __future__ import annotations

import os
from typing import Any

from taskmesh.services import reclaimer, sampler
from tests import process_handlers  # noqa: F401  # registers the usual handlers

WHICH = os.environ.get("BREAK_SERVICE", "")


async def _injected_bug(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(f"injected bug in the {WHICH}")


_module = {"sampler": sampler, "reclaimer": reclaimer}.get(WHICH)
if _module is not None:
    for name in ("run_once", "sample_once"):  # sample_once: the sampler's old tick
        if hasattr(_module, name):
            setattr(_module, name, _injected_bug)
