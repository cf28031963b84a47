"""An instance that owns its process freezes its start-up heap once ready (``gc.freeze()``);
one run inside a test's process does not, unless told to."""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable

import anyio
import asyncpg
import pytest

from taskmesh.config import Settings
from taskmesh.runtime import supervisor
from taskmesh.tasks.registry import Registry

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(("freeze_heap", "frozen"), [(None, False), (False, False), (True, True)])
async def test_the_ready_instance_freezes_its_heap_when_it_owns_the_process(
    make_settings: Callable[..., Settings],
    registry: Registry,
    pool: asyncpg.Pool,
    freeze_heap: bool | None,
    frozen: bool,
) -> None:
    gc.unfreeze()
    inst = supervisor.Instance()
    try:
        async with anyio.create_task_group() as tg:
            run = functools.partial(supervisor.run, signals=False, freeze_heap=freeze_heap)
            tg.start_soon(run, make_settings(), registry, inst)
            with anyio.fail_after(20):
                await inst.ready.wait()
            assert (gc.get_freeze_count() > 0) is frozen
            assert inst.freeze_heap is frozen
            inst.stop.set()
    finally:
        gc.unfreeze()  # the test process's objects go back to the collector
