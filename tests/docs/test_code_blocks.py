"""Every code block of the getting-started, concepts and guides pages runs (River compiles its examples as tests).

How each kind of block is checked (also stated in docs/internals/development.md, "The docs tests"):

- ``python``: a block whose first line names a file (``# myapp/tasks.py``) is written there, in the
  test's directory, and is a handler module of a real instance the test starts
  (``python -m taskmesh run``, queues ``default`` and ``reports``); every other block is executed,
  a page's blocks in order in one namespace, in a process of its own with ``DATABASE_URL`` and
  ``REDIS_URL`` naming that instance's stores;
- ``toml``: loaded as ``TASKMESH_CONFIG`` through :func:`load_settings`, so every key is a setting
  and every value valid;
- ``yaml`` and ``ini``: parsed;
- ``sh`` and ``console`` (lines after ``$ ``): each command line, continuations joined, comments and
  leading ``VAR=value`` assignments dropped: ``taskmesh ...`` (and ``python -m taskmesh``,
  ``docker compose run --rm migrate ...``) is parsed by the Typer app's own parser, command path and
  every flag, and then run (but ``dev``): the operator verbs through the test instance's API, then
  ``keys`` on its database (``KEY_ID`` a key the pages made), each must exit 0; ``make T`` needs
  a target ``T`` in the Makefile; ``pip install 'taskmesh[x]'`` needs the extra ``x``; ``curl`` to
  ``localhost:8080`` is sent to the test's instance and must be answered below 400;
- a block preceded by ``<!-- docs-test: skip (why) -->`` is not run; :data:`SKIPPED` holds their
  number, so a new unchecked block fails this test until it is counted on purpose.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator, Callable
from configparser import ConfigParser
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest
import redis.asyncio as aioredis
import typer.main
import yaml

from taskmesh.cli.app import app as cli_app
from taskmesh.config import load_settings
from taskmesh.store.postgres import migrate_url
from tests.conftest import scratch_database
from tests.proc import Proc, call, spawn, wait_until

__all__ = ["spawn"]  # the fixture, used by name

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(p for part in ("getting-started", "concepts", "guides") for p in (ROOT / "docs" / part).glob("*.md"))
SKIP = re.compile(r"<!-- docs-test: skip \((.+?)\) -->\s*$")
SKIPPED = 1
"""Blocks marked ``docs-test: skip``: the audit log query, which needs a key made first."""
PREFIX = "taskmesh"
"""The instance's Redis prefix: the pages' clients use the default, as a reader's would."""


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    body: str
    skip: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of ``page`` with their language and skip marker."""
    text = page.read_text()
    found = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```\s*$", text, flags=re.MULTILINE | re.DOTALL):
        before = text[: m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = SKIP.search(before)
        line = text[: m.start()].count("\n") + 1
        found.append(Block(page, line, m.group(1), m.group(2), marker.group(1) if marker else None))
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def command_lines(block: Block) -> list[str]:
    """A shell block's commands: ``$ `` lines of a console block; continuations joined; comments dropped."""
    lines = block.body.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    commands, current = [], ""
    for line in lines:
        current += line[:-1] + " " if line.endswith("\\") else line + "\n"
        if line.endswith("\\"):
            continue
        try:
            words = shlex.split(current, comments=True)
        except ValueError:  # a quoted argument (a JSON body) goes on on the next line
            continue
        current = ""
        if words:
            commands.append(shlex.join(words))
    assert not current.strip(), f"{block.where}: unterminated command {current!r}"
    return commands


def strip_env(words: list[str]) -> list[str]:
    """``words`` without the leading ``NAME=value`` assignments."""
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        words = words[1:]
    return words


def taskmesh_args(words: list[str]) -> list[str] | None:
    """The arguments of a ``taskmesh`` command line (also ``python -m taskmesh``), else ``None``."""
    if words[:1] == ["taskmesh"]:
        return words[1:]
    if len(words) > 2 and words[0].endswith("python") and words[1:3] == ["-m", "taskmesh"]:
        return words[3:]
    if words[:5] == ["docker", "compose", "run", "--rm", "migrate"]:  # its entry point is python -m taskmesh
        return words[5:]
    return None


def parse_cli(args: list[str]) -> None:
    """Parse ``args`` down the command path with the app's own parser; raises on a bad command or flag."""
    command: Any = typer.main.get_command(cli_app)
    ctx = command.make_context("taskmesh", list(args))
    while getattr(command, "commands", None):
        # Typer's copy of click keeps the group's unparsed rest (the command, its arguments) here.
        rest = [*ctx._protected_args, *ctx.args]
        if not rest:
            return
        name, *rest = rest
        sub = command.get_command(ctx, name)
        assert sub is not None, f"taskmesh has no command {name!r}"
        ctx = sub.make_context(name, rest, parent=ctx)
        command = sub


def check_static_command(words: list[str]) -> bool:
    """Check a command that needs no instance; ``False`` when it is not one of those."""
    args = taskmesh_args(words)
    if args is not None:
        parse_cli(args)
        return True
    if words[:1] == ["make"]:
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
        assert set(w for w in words[1:] if "=" not in w) <= targets, words
        return True
    if words[:2] == ["pip", "install"]:
        extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for spec in words[2:]:
            m = re.fullmatch(r"taskmesh(?:\[([\w,-]+)\])?", spec)
            assert m, spec
            assert set((m.group(1) or "").split(",")) - {""} <= extras, spec
        return True
    return False


def curl_request(words: list[str], port: int, last_task: str | None, last_workflow: str | None = None) -> httpx.Request:
    """The request a ``curl`` command line sends, aimed at the test's instance (``<task_id>`` and
    ``<workflow_id>`` the ids the last answers named)."""
    method, headers, data, url = "GET", {}, None, None
    it = iter(words[1:])
    for word in it:
        if word == "-X":
            method = next(it)
        elif word == "-H":
            name, _, value = next(it).partition(":")
            headers[name.strip()] = value.strip()
        elif word == "-d":
            data = next(it)
            method = "POST" if method == "GET" else method
        elif not word.startswith("-"):
            url = word
    assert url is not None, words
    url = re.sub(r"^(https?://)?(localhost|127\.0\.0\.1):8080", f"http://127.0.0.1:{port}", url)
    if last_task:
        url = url.replace("<task_id>", last_task)
    if last_workflow:
        url = url.replace("<workflow_id>", last_workflow)
    return httpx.Request(method, url, headers=headers, content=data)


def cli_lines() -> list[tuple[Block, list[str]]]:
    """The ``taskmesh`` command lines of the pages, with their arguments, ``dev`` left out (it starts servers)."""
    found = []
    for block in ALL:
        if block.lang in ("sh", "console") and block.skip is None:
            for line in command_lines(block):
                args = taskmesh_args(strip_env(shlex.split(line)))
                if args is not None and args[:1] != ["dev"]:
                    found.append((block, args))
    return found


def run_cli(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m taskmesh ARGS`` as a reader runs it; its output in the answer."""
    return subprocess.run(
        [sys.executable, "-m", "taskmesh", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60
    )


def test_every_block_is_of_a_checked_kind_or_marked() -> None:
    kinds = {"python", "toml", "yaml", "ini", "sh", "console"}
    unknown = [b.where for b in ALL if b.skip is None and b.lang not in kinds]
    assert unknown == []
    assert sum(b.skip is not None for b in ALL) == SKIPPED, [b.where for b in ALL if b.skip]


SHELL = [b for b in ALL if b.lang in ("sh", "console") and b.skip is None]
CONFIG = [b for b in ALL if b.lang in ("toml", "yaml", "ini") and b.skip is None]


@pytest.mark.parametrize("block", SHELL, ids=lambda b: b.where)
def test_a_shell_block_names_real_commands_flags_targets_and_extras(block: Block) -> None:
    for line in command_lines(block):
        words = strip_env(shlex.split(line))
        assert check_static_command(words) or words[0] == "curl", f"{block.where}: nothing checks {line!r}"


@pytest.mark.parametrize("block", CONFIG, ids=lambda b: b.where)
def test_a_config_block_parses_and_a_toml_one_is_valid_settings(
    block: Block, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block.lang == "yaml":
        assert yaml.safe_load(block.body) is not None
    elif block.lang == "ini":
        ConfigParser().read_string(block.body)
    else:
        config = tmp_path / "taskmesh.toml"
        config.write_text(block.body)
        monkeypatch.setenv("TASKMESH_CONFIG", str(config))
        settings = load_settings(database_url="postgresql://x@127.0.0.1/x", redis_url="redis://127.0.0.1:6379/0")
        assert settings.model_dump()


def redis_database(url: str, number: int) -> str:
    """``url`` with another database number: the pages' clients use the default prefix, kept apart here."""
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{number}", parts.query, parts.fragment))


@pytest.fixture
async def docs_stores(store_urls: tuple[str, str]) -> AsyncIterator[tuple[str, str]]:
    """A migrated database of its own and database 9 of the test Redis, its ``taskmesh:*`` keys emptied."""
    if os.environ.get("TASKMESH_TEST_REDIS_TOPOLOGY", "standalone") != "standalone":
        pytest.skip("the pages' examples run on the standalone Redis of the main suite")
    redis_url = redis_database(store_urls[1], 9)
    client = aioredis.Redis.from_url(redis_url)

    async def clean() -> None:
        keys = [k async for k in client.scan_iter(match=f"{PREFIX}:*", count=1000)]
        if keys:
            await client.delete(*keys)

    await clean()
    try:
        async with scratch_database(store_urls[0], "tm_docs") as url:
            await migrate_url(url)
            yield url, redis_url
    finally:
        await clean()
        await client.aclose()


RUNNER = """
import json, sys
namespace = {"__name__": "__docs__"}
for where, source in json.load(sys.stdin):
    print(f"--- {where}", flush=True)
    exec(compile(source, where, "exec"), namespace)
"""


@pytest.mark.anyio
@pytest.mark.timeout(300)  # an instance, two scripts, a dozen CLI processes: about 40 s here
async def test_the_pages_examples_run_against_a_real_instance(
    docs_stores: tuple[str, str], spawn: Callable[..., Proc], tmp_path: Path
) -> None:
    database_url, redis_url = docs_stores
    python = [b for b in ALL if b.lang == "python" and b.skip is None]
    files = [b for b in python if re.match(r"# [\w/]+\.py\n", b.body)]
    for block in files:
        path = tmp_path / block.body.split("\n", 1)[0][2:]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(block.body)
        (path.parent / "__init__.py").touch()
    modules = [b.body.split("\n", 1)[0][2:].removesuffix(".py").replace("/", ".") for b in files]
    env = {"DATABASE_URL": database_url, "REDIS_URL": redis_url, "TASKMESH_REDIS_PREFIX": PREFIX}
    proc = spawn(
        "run",
        **env,
        TASKMESH_HANDLERS=",".join([*modules, "examples.handlers"]),
        QUEUE_NAMES="default,reports",
        TASKMESH_MIGRATE_ON_START="false",
    )
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=30, proc=proc)

    # The python blocks, page by page, each page in a process of its own (a reader's script).
    by_page: dict[Path, list[Block]] = {}
    for block in python:
        if block not in files:
            by_page.setdefault(block.page, []).append(block)
    for page, page_blocks in by_page.items():
        done = subprocess.run(
            [sys.executable, "-c", RUNNER],
            input=json.dumps([[b.where, b.body] for b in page_blocks]),
            env={**os.environ, **env, "PYTHONPATH": str(tmp_path)},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, f"{page.relative_to(ROOT)}:\n{done.stdout}\n{done.stderr}\n{proc.output()[-3000:]}"

    # The curl requests of the shell blocks, in page order, against the instance.
    last_task: str | None = None
    last_workflow: str | None = None
    sent = 0
    async with httpx.AsyncClient(timeout=30) as client:
        for block in ALL:
            if block.lang not in ("sh", "console") or block.skip is not None:
                continue
            for line in command_lines(block):
                words = strip_env(shlex.split(line))
                if words[0] != "curl":
                    continue
                answer = await client.send(curl_request(words, proc.port, last_task, last_workflow))
                sent += 1
                assert answer.status_code < 400, f"{block.where}: {line}\n{answer.status_code} {answer.text}"
                body = answer.json() if answer.content else {}
                last_task = body.get("task_id", last_task) if isinstance(body, dict) else last_task
                last_workflow = body.get("workflow_id", last_workflow) if isinstance(body, dict) else last_workflow
    assert sent >= 6

    # The command lines: the operator verbs through the instance's API, then `keys` on its database
    # (last: the first key closes the open instance). KEY_ID is the id of the first key made.
    base = {
        k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_") and k not in ("DATABASE_URL", "REDIS_URL")
    }
    cli_env = {**base, **env, "TASKMESH_URL": f"http://127.0.0.1:{proc.port}"}
    lines = cli_lines()
    for block, args in sorted(lines, key=lambda line: line[1][:1] == ["keys"]):
        if "--url" in args:
            args = [*args[: args.index("--url") + 1], cli_env["TASKMESH_URL"], *args[args.index("--url") + 2 :]]
        if args[:1] == ["keys"]:
            if "KEY_ID" in args:
                listed = run_cli(["keys", "list", "--json"], {**cli_env, "TASKMESH_URL": ""}, tmp_path)
                key_id = json.loads(listed.stdout)["keys"][-1]["key_id"]
                args = [key_id if a == "KEY_ID" else a for a in args]
            done = run_cli(args, {**cli_env, "TASKMESH_URL": ""}, tmp_path)
        else:
            done = run_cli(args, cli_env, tmp_path)
        assert done.returncode == 0, f"{block.where}: taskmesh {shlex.join(args)}\n{done.stdout}\n{done.stderr}"
    assert len(lines) >= 10
    assert (tmp_path / "exports" / "sales-2024-q4.csv").exists() or wait_until(
        lambda: (tmp_path / "exports" / "sales-2024-q4.csv").exists(), proc=proc
    )


def test_the_readme_blocks_compile_and_name_real_commands() -> None:
    """The README's quick start: its Python compiles, its commands are real (its curls run in the pages' copy)."""
    readme = blocks(ROOT / "README.md")
    assert {b.lang for b in readme} == {"sh", "python"}
    for block in readme:
        if block.lang == "python":
            compile(block.body, block.where, "exec")
            continue
        for line in command_lines(block):
            words = strip_env(shlex.split(line))
            assert check_static_command(words) or words[0] == "curl", f"{block.where}: nothing checks {line!r}"
