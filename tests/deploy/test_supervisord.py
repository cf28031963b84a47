"""deploy/supervisor/taskmesh.conf under real supervisord: a graceful ``supervisorctl stop``.

The shipped program section is included as it is, except what points at a
real install: ``command`` runs this interpreter, ``directory`` and the log go
to a temporary folder, ``user`` is dropped (the test has no ``taskmesh``
user), and ``TASKMESH_CONFIG`` names a TOML file with the test's stores.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from taskmesh.config import Settings
from tests.deploy import DEPLOY
from tests.proc import ROOT, call, free_port, task_status, wait_until

pytestmark = pytest.mark.anyio

SHIPPED = DEPLOY / "supervisor" / "taskmesh.conf"


def program_options(text: str) -> dict[str, str]:
    """``key=value`` lines of the ``[program:taskmesh]`` section (Supervisor's ``;`` comments dropped)."""
    section = text.split("[program:taskmesh]", 1)[1]
    options = {}
    for line in section.splitlines():
        line = line.strip()
        if line.startswith("["):
            break
        if line and not line.startswith(";"):
            key, _, value = line.partition("=")
            options[key.strip()] = re.sub(r"\s+;.*$", "", value).strip()
    return options


def render(text: str, replace: dict[str, str | None]) -> str:
    """The shipped file with the options in ``replace`` set to new values (``None``: removed)."""
    out = []
    for line in text.splitlines():
        key = line.partition("=")[0].strip()
        if "=" in line and not line.lstrip().startswith(";") and key in replace:
            if replace[key] is not None:
                out.append(f"{key}={replace[key]}")
            continue
        out.append(line)
    return "\n".join(out) + "\n"


def test_the_shipped_program_waits_past_the_grace_period_and_signals_its_group() -> None:
    options = program_options(SHIPPED.read_text())
    grace = Settings.model_fields["shutdown_grace_seconds"].default
    assert options["stopsignal"] == "TERM"
    assert int(options["stopwaitsecs"]) >= grace + 15  # the exit comes within grace + 15 s
    assert options["stopasgroup"] == options["killasgroup"] == "true"
    assert options["autorestart"] == "true" and options["redirect_stderr"] == "true"
    assert options["command"].endswith("-m taskmesh run")


@pytest.fixture
def supervisor_dir() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="tmsv-"))  # short: the control socket's path must fit sun_path
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.usefixtures("pool", "redis_client")
async def test_supervisorctl_stop_lets_the_slow_task_finish_and_the_program_exits_0(
    supervisor_dir: Path, database_url: str, redis_url: str, prefix: str, pool: Any
) -> None:
    port = free_port()
    config = supervisor_dir / "taskmesh.toml"
    config.write_text(
        f'database_url = "{database_url}"\nredis_url = "{redis_url}"\nredis_prefix = "{prefix}"\n'
        f'handlers = ["tests.process_handlers"]\nhttp_port = {port}\n'
    )
    shipped = SHIPPED.read_text()
    environment = program_options(shipped)["environment"].replace("/etc/taskmesh/taskmesh.toml", str(config))
    program = supervisor_dir / "taskmesh.conf"
    program.write_text(
        render(
            shipped,
            {
                "command": f"{sys.executable} -m taskmesh run",
                "directory": str(supervisor_dir),
                "user": None,
                "environment": f'{environment},PYTHONPATH="{ROOT}"',
                "stdout_logfile": str(supervisor_dir / "taskmesh.log"),
            },
        )
    )
    main = supervisor_dir / "supervisord.conf"
    sock = supervisor_dir / "sv.sock"
    main.write_text(
        f"[supervisord]\nnodaemon=true\nlogfile={supervisor_dir}/supervisord.log\n"
        f"pidfile={supervisor_dir}/supervisord.pid\nchildlogdir={supervisor_dir}\n\n"
        f"[unix_http_server]\nfile={sock}\n\n"
        "[rpcinterface:supervisor]\n"
        "supervisor.rpcinterface_factory = supervisor.rpcinterface:make_main_rpcinterface\n\n"
        f"[supervisorctl]\nserverurl=unix://{sock}\n\n"
        f"[include]\nfiles={program}\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKMESH_")}
    env.pop("DATABASE_URL", None)
    env.pop("REDIS_URL", None)
    supervisord = subprocess.Popen(
        [sys.executable, "-m", "supervisor.supervisord", "-c", str(main)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    log = supervisor_dir / "supervisord.log"
    program_log = supervisor_dir / "taskmesh.log"

    def ctl(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "supervisor.supervisorctl", "-c", str(main), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=90,
        )
        return done.stdout + done.stderr

    def logs() -> str:
        def tail(p: Path) -> str:
            return p.read_text(errors="replace")[-3000:] if p.exists() else "(none)"

        return f"supervisord.log:\n{tail(log)}\ntaskmesh.log:\n{tail(program_log)}"

    try:
        try:
            wait_until(lambda: call(port, "GET", "/readyz")[0] == 200, timeout=30)
        except AssertionError:
            raise AssertionError(logs()) from None
        status, body = call(port, "POST", "/api/v1/tasks", {"name": "sleepy", "payload": {"seconds": 3}})
        assert status == 201, body
        tid = body["task_id"]
        wait_until(lambda: task_status(port, tid)["task"]["status"] == "running")
        t0 = time.monotonic()
        out = ctl("stop", "taskmesh")
        took = time.monotonic() - t0
        assert "taskmesh: stopped" in out, out + logs()
        assert "stopped: taskmesh (exit status 0)" in log.read_text(), logs()
        grace = Settings.model_fields["shutdown_grace_seconds"].default
        assert 1.5 < took < grace, (took, logs())  # the stop waited for the run, not for the grace period
        task = await pool.fetchrow("SELECT status FROM tasks WHERE id = $1", tid)
        run = await pool.fetchrow("SELECT status, attempt, error FROM task_runs WHERE task_id = $1", tid)
        assert task["status"] == "completed" and run["status"] == "succeeded" and run["attempt"] == 1, dict(run)
        events = program_log.read_text()
        assert '"event": "shutdown_requested"' in events and '"signal": "SIGTERM"' in events
        assert '"event": "instance_stopped"' in events and "runs_handed_back" not in events
        assert "(not expected)" not in log.read_text()
        ctl("shutdown")
        assert supervisord.wait(15) == 0
    finally:
        if supervisord.poll() is None:
            supervisord.send_signal(signal.SIGTERM)  # supervisord stops its program on the way out
            try:
                supervisord.wait(30)
            except subprocess.TimeoutExpired:
                supervisord.kill()
                supervisord.wait()
