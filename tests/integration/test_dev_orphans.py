"""Nothing of ``taskmesh dev`` outlives it or its data directory: real dev processes, real embedded servers.

A dev killed with SIGKILL (as by the OOM killer) takes its embedded Valkey and
PostgreSQL along within seconds, and its restart from the same directory gets
the same URLs; removing the directory while dev runs ends its servers; a
Valkey left running in the directory (its guard was killed too) is stopped by
the next start, which keeps its port, and whose clean stop then leaves nothing.
Every server is checked by pid and by working directory: each embedded server
process works in its data directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.proc import Proc, call, running, spawn, stop, wait_until

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.slow

GONE_WITHIN_SECONDS = 10.0
"""How long the servers may take to go: a polite stop takes well under a second; the guard's grace is longer."""


def working_in(root: Path) -> list[int]:
    """Live processes whose working directory is ``root`` or below it, also after it was removed."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd").removesuffix(" (deleted)")
            if (cwd == str(root) or cwd.startswith(f"{root}/")) and running(int(entry.name)):
                found.append(int(entry.name))
    return found


def children(pid: int) -> list[int]:
    """The children of ``pid`` (PostgreSQL's backends and auxiliary processes of a postmaster)."""
    with contextlib.suppress(OSError):
        return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]
    return []


def server_pids(dev_dir: Path) -> list[int]:
    """The embedded servers' processes: Valkey's, the postmaster and its children."""
    valkey = int((dev_dir / "valkey" / "valkey.pid").read_text().strip())
    postmaster = int((dev_dir / "pg" / "postmaster.pid").read_text().split("\n", 1)[0])
    pids = [valkey, postmaster, *children(postmaster)]
    assert all(running(p) for p in pids[:2]), pids
    return pids


def event(proc: Proc, name: str) -> dict[str, Any] | None:
    return next((e for e in proc.events() if e.get("event") == name), None)


def all_gone(pids: list[int], dev_dir: Path, proc: Proc | None = None) -> float:
    """Wait until none of ``pids`` and nothing working in ``dev_dir`` runs; returns the seconds it took."""
    t0 = time.monotonic()
    try:
        wait_until(lambda: not [p for p in pids if running(p)] and not working_in(dev_dir), GONE_WITHIN_SECONDS)
    except AssertionError:
        left = [p for p in pids if running(p)], working_in(dev_dir)
        raise AssertionError(
            f"still running after {GONE_WITHIN_SECONDS} s: {left}" + (f"\n{proc.output()[-3000:]}" if proc else "")
        ) from None
    return time.monotonic() - t0


def remove(tree: Path) -> bool:
    """Remove ``tree``; False when the servers wrote new files in it meanwhile (and it is still there)."""
    shutil.rmtree(tree, ignore_errors=True)
    return not tree.exists()


@pytest.fixture
def dev_dir(tmp_path: Path) -> Iterator[Path]:
    """A dev data directory; whatever still works in it at the end is killed, so a failure leaks nothing."""
    path = tmp_path / "devdata"
    yield path
    for pid in working_in(path):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def test_a_dev_killed_with_sigkill_takes_its_servers_along_and_its_restart_gets_the_same_urls(
    spawn: Any, dev_dir: Path
) -> None:
    proc = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    first = wait_until(lambda: event(proc, "dev_stores"), timeout=60, proc=proc)
    pids = server_pids(dev_dir)
    proc.kill()
    print(f"servers gone {all_gone(pids, dev_dir, proc):.2f} s after SIGKILL")

    again = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    second = wait_until(lambda: event(again, "dev_stores"), timeout=60, proc=again)
    out = again.output()[-3000:]
    assert (second["database_url"], second["redis_url"]) == (first["database_url"], first["redis_url"]), out
    assert event(again, "embedded_valkey_port_changed") is None, out
    pids = server_pids(dev_dir)
    # SIGTERM once the instance runs: this test is not about a stop during start-up.
    wait_until(lambda: call(again.port, "GET", "/readyz")[0] == 200, timeout=90, proc=again)
    code, _, out = stop(again, 30)
    assert code == 0, out[-3000:]
    all_gone(pids, dev_dir, again)


def test_removing_the_dev_directory_ends_its_servers_and_dev_still_stops_cleanly(spawn: Any, dev_dir: Path) -> None:
    proc = spawn("dev", TASKMESH_DEV_DIR=str(dev_dir))
    wait_until(lambda: call(proc.port, "GET", "/readyz")[0] == 200, timeout=90, proc=proc)
    pids = server_pids(dev_dir)
    wait_until(lambda: remove(dev_dir), timeout=10)
    print(f"servers gone {all_gone(pids, dev_dir, proc):.2f} s after the directory")
    assert proc.alive() and not dev_dir.exists(), proc.output()[-3000:]  # nothing started them again in it
    code, _, out = stop(proc, 30)
    assert code == 0, out[-3000:]


LEAVE_A_VALKEY = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from taskmesh.dev.stack import EmbeddedValkey
    print(EmbeddedValkey(Path(sys.argv[1])).process.pid, flush=True)
    os._exit(0)  # as after a SIGKILL: no atexit, no stop
    """
)


def test_a_valkey_left_running_in_the_directory_is_stopped_by_the_next_start_which_keeps_its_port(
    dev_dir: Path,
) -> None:
    from taskmesh.dev.stack import EmbeddedValkey

    made = subprocess.run([sys.executable, "-c", LEAVE_A_VALKEY, str(dev_dir)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    leftover = int(made.stdout)
    port = int((dev_dir / "valkey" / "port").read_text())
    assert running(leftover)
    server = EmbeddedValkey(dev_dir)
    try:
        assert not running(leftover)
        assert server.port == port
    finally:
        server.stop()
    # The leftover did not exit after the new server started, taking its pidfile (and its stop) away.
    all_gone([leftover, server.process.pid], dev_dir)


@pytest.mark.skipif(os.geteuid() != 0, reason="only as root does PostgreSQL run as a user of its own")
def test_postgres_whose_directory_its_user_cannot_reach_any_more_is_still_stopped(tmp_path: Path) -> None:
    """As when another pytest session makes ``/tmp/pytest-of-root`` private again: pg_ctl then fails."""
    from taskmesh.dev.stack import EmbeddedPostgres

    root = tmp_path / "private"
    pg = EmbeddedPostgres(root)
    postmaster = pg.process.pid
    pids = [postmaster, *children(postmaster)]
    root.chmod(0o700)  # root's, out of reach of the server's user
    try:
        pg.stop()
        all_gone(pids, root)
    finally:
        root.chmod(0o755)
        pg.stop()


def test_a_valkey_that_outlived_its_directory_is_stopped_by_the_next_start_in_that_path(dev_dir: Path) -> None:
    from taskmesh.dev.stack import EmbeddedValkey

    made = subprocess.run([sys.executable, "-c", LEAVE_A_VALKEY, str(dev_dir)], capture_output=True, text=True)
    assert made.returncode == 0, made.stderr
    leftover = int(made.stdout)
    shutil.rmtree(dev_dir)
    server = EmbeddedValkey(dev_dir)
    try:
        assert not running(leftover)
    finally:
        server.stop()
