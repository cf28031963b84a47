"""The command line as a whole: help for every command and flag, exit statuses a script can
rely on, and no traceback for a closed pipe, an unreachable API or a store that refuses a password."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
import typer

from taskmesh.cli.app import app
from taskmesh.tasks.registry import Registry
from tests.cli_support import env, register, run_cli
from tests.conftest import http
from tests.integration.test_cli_tasks import create
from tests.proc import free_port
from tests.urls import with_user


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command of the tree, groups included, with its path of names."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from commands(sub, (*path, name))


def test_every_command_has_a_description_and_examples_and_every_flag_and_argument_a_help() -> None:
    root = typer.main.get_command(app)
    seen = []
    for path, command in commands(root):
        seen.append(" ".join(path))
        assert command.help and len(command.help.split()) >= 5, path
        if not getattr(command, "commands", None) or not path:
            assert "Examples:" in command.help, path
        for param in command.params:
            assert getattr(param, "help", None), (path, param.name)
    assert set(seen) >= {
        "run",
        "dev",
        "migrate",
        "schedules list",
        "schedules trigger",
        "schedules pause",
        "schedules resume",
        "tasks list",
        "tasks show",
        "tasks retry",
        "tasks cancel",
        "tasks delete",
        "queues list",
        "queues show",
        "queues pause",
        "queues resume",
        "dlq list",
        "dlq replay",
        "dlq discard",
        "workers",
        "bulk retry",
        "bulk replay",
        "bulk cancel",
        "bulk delete",
        "bulk show",
    }


def test_help_prints_the_description_and_examples_and_usage_errors_exit_2() -> None:
    helped = run_cli("bulk", "replay", "--help")
    assert helped.code == 0
    assert "Move dead-lettered (failed) tasks back to ready" in helped.out
    assert "taskmesh bulk replay --status failed --queue emails" in helped.out
    unknown = run_cli("tasks", "list", "--colour", "red")
    assert unknown.code == 2 and "No such option: --colour" in unknown.err
    out_of_range = run_cli("tasks", "list", "--limit", "501")
    assert (
        out_of_range.code == 2
        and "Invalid value for '--limit' / '-l': Input should be less than or equal to 500" in out_of_range.err
    )
    version = run_cli("--version")
    assert (version.code, version.out.startswith("taskmesh ")) == (0, True)


def test_an_unreachable_api_exits_5_saying_where_it_looked_and_what_to_set() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    for args in (("tasks", "list"), ("queues", "pause", "q"), ("workers",), ("bulk", "cancel", "-s", "queued")):
        ran = run_cli(*args, environ=env(TASKMESH_URL=url))
        assert (ran.code, ran.out) == (5, ""), args
        assert ran.err == (
            f"taskmesh: error: cannot reach the taskmesh API at {url} (Connection refused); is an instance "
            "running there? Point --url or TASKMESH_URL at it\n"
        )


@pytest.mark.anyio
async def test_output_into_a_closed_pipe_ends_quietly(start_instance: Any, registry: Registry) -> None:
    register(registry)
    async with start_instance() as inst, http(inst) as client:
        for _ in range(3):
            await create(client, {"name": "cli.ok", "delay_seconds": 3600})

        def closed_reader() -> tuple[int, str]:
            proc = subprocess.Popen(
                [sys.executable, "-m", "taskmesh", "tasks", "list", "--url", f"http://127.0.0.1:{inst.port}"],
                env=env(),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # as `| head` does when it has read enough: every write now fails with EPIPE
            with proc.stderr:
                err = proc.stderr.read().decode()
            return proc.wait(timeout=60), err

        code, err = await anyio.to_thread.run_sync(closed_reader)
    assert (code, err) == (1, "")


@pytest.mark.anyio
async def test_stores_that_refuse_a_password_or_a_role_end_with_one_line_and_exit_1(
    database_url: str, redis_with_password: str
) -> None:
    wrong = run_cli(
        "schedules", "list", environ=env(DATABASE_URL=database_url, REDIS_URL=f"redis://:wrong@{redis_with_password}/0")
    )
    assert (wrong.code, wrong.out) == (1, "")
    assert wrong.err == (
        "taskmesh: error: redis unavailable in ping: AuthenticationError: invalid username-password pair or user "
        "is disabled.\n"
    )
    right = run_cli(
        "schedules",
        "list",
        environ=env(DATABASE_URL=database_url, REDIS_URL=f"redis://:s3cret@{redis_with_password}/0"),
    )
    assert right.code == 0, right.err
    no_role = run_cli("migrate", environ=env(DATABASE_URL=with_user(database_url, "nobody:pw")))
    assert (no_role.code, no_role.err) == (
        1,
        'taskmesh: error: postgres error in connect: InvalidAuthorizationSpecificationError: role "nobody" does '
        "not exist\n",
    )


CTRL_C_WHILE_LOADING = """
import builtins, os, signal, sys
real_import = builtins.__import__

def interrupting_import(name, *args, **kwargs):
    if name.startswith("taskmesh.cli"):  # Ctrl-C lands while the command line loads
        os.kill(os.getpid(), signal.SIGINT)
    return real_import(name, *args, **kwargs)

builtins.__import__ = interrupting_import
sys.argv = ["taskmesh", *sys.argv[1:]]
from taskmesh.entry import main
main()
"""


@pytest.mark.parametrize("bare", [False, True], ids=["an-operator-verb", "a-bare-start"])
def test_ctrl_c_while_the_command_line_loads_ends_with_130_and_no_traceback(bare: bool) -> None:
    args = [] if bare else ["workers", "--url", f"http://127.0.0.1:{free_port()}"]
    done = subprocess.run(
        [sys.executable, "-c", CTRL_C_WHILE_LOADING, *args],
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "")


@pytest.mark.parametrize("args", [[], ["run"]], ids=["taskmesh", "taskmesh-run"])
def test_a_bare_start_maps_its_end_as_the_command_line_does_without_loading_it(args: list[str]) -> None:
    # -X importtime lists every module the process imported, on stderr
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "taskmesh", *args],
        env=env(TASKMESH_HTTP_PORT="eighty", DATABASE_URL="postgresql://x@127.0.0.1/x", REDIS_URL="redis://127.0.0.1"),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    errors = [line for line in done.stderr.splitlines() if not line.startswith("import time:")]
    assert (done.returncode, errors) == (
        2,
        [
            "taskmesh: error: invalid configuration: http_port: Input should be a valid integer, "
            "unable to parse string as an integer"
        ],
    )
    assert "taskmesh.runtime.supervisor" in imported
    assert not imported & {"typer", "taskmesh.cli.app", "httpx"}


@pytest.mark.parametrize("args", [["--version"], ["--version", "--url", "http://127.0.0.1:1"]], ids=["light", "typer"])
def test_version_prints_the_package_metadata_s_version_with_or_without_loading_the_command_line(
    args: list[str],
) -> None:
    # the light path answers `taskmesh --version` alone without typer; with more, the command line does
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "taskmesh", *args],
        env=env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert (done.returncode, done.stdout) == (0, f"taskmesh {importlib.metadata.version('taskmesh')}\n")
    assert ("typer" in imported) == (len(args) > 1)
