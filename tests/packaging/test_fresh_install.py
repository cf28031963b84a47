"""``pip install taskmesh`` in an empty venv: at most 20 distributions, a worker and a client that work
on the machine's stores, and the commands of a missing extra refused in words that name it.

One venv per test session (the wheel built from the working tree, its dependencies from the package
index as pip is configured here): about half a minute of pip, hence the ``install`` marker. The venv's
Python is the tests' own, or TASKMESH_TEST_FRESH_PYTHON (``python3.13``: the supported versions of
``docs/getting-started/install.md`` were checked that way).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import asyncpg
import pytest

from tests.proc import ROOT

pytestmark = [pytest.mark.install, pytest.mark.timeout(600)]

MAX_DISTRIBUTIONS = 20
"""What the base install may bring, taskmesh included (pip and setuptools, the venv's own, not counted)."""
EXTRAS_ONLY = {"fastapi", "starlette", "uvicorn", "typer", "rich", "httpx", "jinja2", "jsonschema", "systemd-watchdog"}
"""Distributions of the extras (and the library sd_notify replaced) that the base install must not bring."""


class Venv:
    """A venv with the base install of the working tree's wheel."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.python = str(root / "bin" / "python")

    def run(self, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)

    def distributions(self) -> dict[str, str]:
        out = subprocess.run(
            [self.python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True
        ).stdout
        pairs = (line.split("==", 1) for line in out.splitlines() if "==" in line)
        return {name.lower(): version for name, version in pairs if name.lower() not in ("pip", "setuptools")}


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Venv:
    """The working tree's wheel installed with its dependencies (no extra) into a new venv."""
    root = tmp_path_factory.mktemp("fresh")
    wheels = root / "wheels"
    pip = [sys.executable, "-m", "pip", "--quiet"]
    subprocess.run([*pip, "wheel", "--no-deps", "--wheel-dir", str(wheels), str(ROOT)], check=True, timeout=300)
    interpreter = os.environ.get("TASKMESH_TEST_FRESH_PYTHON", sys.executable)
    subprocess.run([interpreter, "-m", "venv", str(root / "venv")], check=True, timeout=120)
    (wheel,) = wheels.glob("taskmesh-*.whl")
    python = str(root / "venv" / "bin" / "python")
    subprocess.run(
        [python, "-m", "pip", "--quiet", "install", "--find-links", str(wheels), str(wheel)], check=True, timeout=480
    )
    return Venv(root / "venv")


def clean_env(**extra: str) -> dict[str, str]:
    """No PYTHONPATH into the working tree and no TASKMESH_* of the test run: only what the test gives."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    return {**keep, **extra}


def test_the_base_install_has_at_most_20_distributions_and_none_of_the_extras(venv: Venv) -> None:
    dists = venv.distributions()
    assert "taskmesh" in dists
    assert len(dists) <= MAX_DISTRIBUTIONS, sorted(dists)
    assert not EXTRAS_ONLY & set(dists), sorted(EXTRAS_ONLY & set(dists))


@pytest.mark.anyio  # for the session's database (an async fixture); the test itself blocks on processes
async def test_a_worker_of_the_base_install_runs_a_task_a_client_of_it_enqueued(
    venv: Venv, database_url: str, pool: asyncpg.Pool, store_urls: tuple[str, str], prefix: str, tmp_path: Path
) -> None:
    # ``pool`` empties the session's database first: a queue an earlier test left paused would hold the task.
    (tmp_path / "fresh_handlers.py").write_text(
        textwrap.dedent(
            """
            import taskmesh

            @taskmesh.task("fresh.add")
            async def add(payload: dict, ctx: taskmesh.TaskContext) -> dict:
                return {"sum": payload["a"] + payload["b"]}
            """
        )
    )
    redis_url = store_urls[1]
    env = clean_env(
        DATABASE_URL=database_url,
        REDIS_URL=redis_url,
        TASKMESH_REDIS_PREFIX=prefix,
        TASKMESH_HANDLERS="fresh_handlers",
        TASKMESH_LOG_FORMAT="json",
        PYTHONPATH=str(tmp_path),
    )
    # The base install migrates (the suite's database is migrated already).
    migrated = venv.run(str(venv.root / "bin" / "taskmesh"), "migrate", cwd=tmp_path, env=env)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout == "migrations applied: none, schema is up to date\n", migrated.stdout
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [venv.python, "-m", "taskmesh", "worker"], cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    try:
        client = textwrap.dedent(
            f"""
            import json, sys
            import taskmesh

            with taskmesh.SyncClient({database_url!r}, {redis_url!r}, redis_prefix={prefix!r}) as client:
                result = client.wait(client.enqueue("fresh.add", {{"a": 2, "b": 3}}), timeout=60)
            extras = sorted({{m.split(".")[0] for m in sys.modules}} & {{"fastapi", "uvicorn", "starlette", "typer"}})
            print(json.dumps({{"result": result, "extras_imported": extras}}))
            """
        )
        done = venv.run(venv.python, "-c", client, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr + (tmp_path / "worker.log").read_text()[-3000:]
        assert done.stdout.strip().endswith('{"result": {"sum": 5}, "extras_imported": []}')
    finally:
        worker.send_signal(signal.SIGTERM)
        status = worker.wait(timeout=60)
        log.close()
    output = (tmp_path / "worker.log").read_text()
    assert status == 0, output[-3000:]
    assert '"instance_ready"' in output and '"http": null' in output


def test_the_http_api_and_the_command_line_name_the_extra_they_need(venv: Venv, tmp_path: Path) -> None:
    env = clean_env(DATABASE_URL="postgresql://nobody@127.0.0.1:1/none", REDIS_URL="redis://127.0.0.1:1/0")
    served = venv.run(venv.python, "-m", "taskmesh", cwd=tmp_path, env=env)
    assert served.returncode == 2, served.stderr
    assert "the HTTP API (taskmesh run, python -m taskmesh) needs the 'server' extra: " in served.stderr
    assert "pip install 'taskmesh[server]'" in served.stderr and "taskmesh worker" in served.stderr
    verbs = venv.run(str(venv.root / "bin" / "taskmesh"), "tasks", "list", cwd=tmp_path, env=env)
    assert verbs.returncode == 2, verbs.stderr
    assert "the command line needs the 'cli' extra: pip install 'taskmesh[cli]'" in verbs.stderr
