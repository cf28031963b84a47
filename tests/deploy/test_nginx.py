"""deploy/nginx/taskmesh.conf under Debian's nginx: ``nginx -t``, then requests through it.

The shipped file goes into a wrapper main config (the ``http`` block that
nginx.conf gives it in the image) whose paths are in a temporary folder. Two
things are rendered, as nothing named ``api`` resolves here: the upstream
``api:8080`` becomes the test instance's 127.0.0.1 port, ``listen 80`` a free
port on 127.0.0.1.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.deploy import DEPLOY
from tests.proc import free_port, spawn, stores_env, wait_until
from tests.tools import require_tool

__all__ = ["spawn"]  # a fixture, used by name

pytestmark = pytest.mark.anyio

SHIPPED = DEPLOY / "nginx" / "taskmesh.conf"


@pytest.fixture
def nginx() -> str:
    return require_tool(
        "nginx", "Debian package nginx", "deploy/nginx/taskmesh.conf was not checked", also=["/usr/sbin/nginx"]
    )


def wrapper(folder: Path, api_port: int, listen_port: int) -> Path:
    """A main config around the rendered shipped file; returns its path."""
    text = SHIPPED.read_text()
    assert re.search(r"^\s*server api:8080\b", text, re.M) and re.search(r"^\s*listen 80;", text, re.M)
    text = re.sub(r"^(\s*)server api:8080\b", rf"\g<1>server 127.0.0.1:{api_port}", text, flags=re.M)
    text = re.sub(r"^(\s*)listen 80;", rf"\g<1>listen 127.0.0.1:{listen_port};", text, flags=re.M)
    (folder / "taskmesh.conf").write_text(text)
    temp = "\n".join(
        f"    {kind}_temp_path {folder}/{kind};" for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    main = folder / "nginx.conf"
    main.write_text(
        ("user root;\n" if os.geteuid() == 0 else "")  # workers read the root-only temporary folder
        + f"pid {folder}/nginx.pid;\nerror_log {folder}/error.log notice;\ndaemon off;\nworker_processes 1;\n"
        + "events { worker_connections 256; }\n"
        + f"http {{\n    access_log {folder}/access.log;\n{temp}\n    include {folder}/taskmesh.conf;\n}}\n"
    )
    return main


def test_nginx_t_accepts_the_config(nginx: str, tmp_path: Path) -> None:
    main = wrapper(tmp_path, free_port(), free_port())
    done = subprocess.run(
        [nginx, "-t", "-p", str(tmp_path), "-e", str(tmp_path / "error.log"), "-c", str(main)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert "syntax is ok" in done.stderr and "test is successful" in done.stderr
    assert "[warn]" not in done.stderr and "[emerg]" not in done.stderr, done.stderr


@pytest.fixture
def run_nginx(nginx: str, tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(api_port: int) -> int:
        port = free_port()
        folder = tmp_path / "nginx"
        folder.mkdir()
        main = wrapper(folder, api_port, port)
        procs.append(
            subprocess.Popen(
                [nginx, "-p", str(folder), "-e", str(folder / "error.log"), "-c", str(main)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        return port

    yield start
    for proc in procs:
        proc.send_signal(signal.SIGTERM)  # the master stops its workers
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.usefixtures("pool", "redis_client")
async def test_requests_through_nginx_reach_the_api_but_not_the_metrics(
    spawn: Any, run_nginx: Any, database_url: str, redis_url: str, prefix: str
) -> None:
    proc = spawn(**stores_env(database_url, redis_url, prefix))
    through_nginx(run_nginx(proc.port), proc)


def through_nginx(port: int, proc: Any) -> None:
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        wait_until(lambda: client.get("/readyz").status_code == 200, proc=proc)
        created = client.post("/api/v1/tasks", json={"name": "sleepy", "payload": {"seconds": 0}})
        assert created.status_code == 201, created.text
        assert created.headers["x-request-id"]  # made by nginx when the caller sends none
        tid = created.json()["task_id"]
        wait_until(lambda: client.get(f"/api/v1/tasks/{tid}").json()["task"]["status"] == "completed")
        # nginx's request id reached taskmesh, which took it as the task's trace id.
        assert client.get(f"/api/v1/tasks/{tid}").json()["task"]["trace_id"] == created.headers["x-request-id"]
        given = client.get(f"/api/v1/tasks/{tid}", headers={"X-Request-ID": "req-123"})
        assert given.status_code == 200 and given.headers["x-request-id"] == "req-123"
        # Prometheus scrapes the instances, not the public side.
        assert client.get("/metrics").status_code == 404
        assert httpx.get(f"http://127.0.0.1:{proc.port}/metrics").status_code == 200
        # An oversized body gets taskmesh's own answer, not nginx's HTML page.
        big = client.post(
            "/api/v1/tasks",
            content=b'{"name": "x", "payload": "' + b"a" * (1536 * 1024) + b'"}',
            headers={"Content-Type": "application/json"},
        )
        assert big.status_code == 413 and big.headers["content-type"] == "application/problem+json", big.text
