"""Running the ``taskmesh`` command line as a real process against a real instance, for the CLI tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from taskmesh.errors import NonRetryableError
from taskmesh.runtime.supervisor import Instance
from taskmesh.tasks.registry import Registry
from tests.proc import ROOT

MARKUP_ERROR = "[bold red]boom[/bold red] <b>&amp;"
"""An error text a table must print as it is (rich must not read it as markup)."""


@dataclass(frozen=True)
class Ran:
    """One finished ``taskmesh`` process: its exit status and its output."""

    code: int
    out: str
    err: str

    def lines(self) -> list[str]:
        return self.out.splitlines()

    def json(self) -> Any:
        return orjson.loads(self.out)

    def json_lines(self) -> list[Any]:
        return [orjson.loads(line) for line in self.lines()]


def env(**extra: str) -> dict[str, str]:
    """The test's environment without any ``TASKMESH_*``, so that only the flags given count; ``taskmesh`` is
    imported from this checkout's ``src``."""
    out = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    if os.environ.get("TASKMESH_TEST_PG_POOLER"):  # the pooler suite: DATABASE_URL is a PgBouncer's
        out["TASKMESH_PG_POOLER"] = os.environ["TASKMESH_TEST_PG_POOLER"]
    if os.environ.get("TASKMESH_TEST_REDIS_TOPOLOGY") == "cluster":  # the cluster suite
        out["TASKMESH_REDIS_MODE"] = "cluster"
    # The checkout's own package first: an install elsewhere (another worktree's editable one) must not answer.
    out.update(PYTHONPATH=os.pathsep.join((str(ROOT / "src"), str(ROOT))), COLUMNS="1000", **extra)
    return out


def run_cli(*args: str, environ: dict[str, str] | None = None, timeout: float = 60) -> Ran:
    """``python -m taskmesh ARGS`` with stdin closed (no terminal), blocking until it ends."""
    proc = subprocess.run(
        [sys.executable, "-m", "taskmesh", *args],
        env=environ or env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return Ran(proc.returncode, proc.stdout, proc.stderr)


async def cli(inst: Instance, *args: str, environ: dict[str, str] | None = None) -> Ran:
    """``taskmesh ARGS --url`` the instance, run in a thread so that the instance in this loop can answer."""
    url = f"http://127.0.0.1:{inst.port}"
    return await anyio.to_thread.run_sync(lambda: run_cli(*args, "--url", url, environ=environ))


def register(registry: Registry) -> dict[str, int]:
    """``cli.ok`` returns its payload's ``n``; ``cli.fail`` fails for good with :data:`MARKUP_ERROR`;
    ``cli.flaky`` fails for good on its first attempt only; ``cli.slow`` takes a second."""
    calls: dict[str, int] = {}

    @registry.task("cli.ok")
    async def ok(payload: dict[str, Any]) -> Any:
        return payload.get("n")

    @registry.task("cli.fail", max_retries=0)
    async def fail(payload: dict[str, Any]) -> None:
        raise NonRetryableError(MARKUP_ERROR)

    @registry.task("cli.flaky", max_retries=0)
    async def flaky(payload: dict[str, Any], ctx: Any) -> int:
        calls[str(ctx.task_id)] = calls.get(str(ctx.task_id), 0) + 1
        if ctx.attempt == 1:
            raise NonRetryableError("first attempts fail")
        return int(ctx.attempt)

    @registry.task("cli.slow")
    async def slow(payload: dict[str, Any]) -> str:
        await anyio.sleep(1)
        return "slow done"

    return calls


def table(lines: list[str]) -> tuple[list[str], list[list[str]]]:
    """A table's header and rows, cells split on runs of 2+ spaces (a cell may hold single spaces)."""
    header, _rule, *rows = lines
    return re.split(r" {2,}", header.strip()), [re.split(r" {2,}", row.strip()) for row in rows]
