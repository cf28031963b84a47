"""A body over the limit gets its 413, also from a client that sends its whole body before reading.

The 413 comes from ``Content-Length`` before the body arrives. A client that sends ``Connection:
close`` (urllib) used to have its connection closed with the body unread, so the kernel reset it and
the client, still sending, saw a broken pipe in place of the 413 (9 of 100 tries at 1 MiB + 1 byte,
every try at 10 MiB). The server now half-closes and drains (``taskmesh.api.linger``), within bounds.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.request

import anyio
import orjson
import pytest

from taskmesh.api import linger
from taskmesh.api.server import HttpLimits
from tests.http_limits.harness import Client, serving

pytestmark = pytest.mark.anyio

OVER = {"1MiB+1": (1024 * 1024 + 1, 60), "10MiB": (10 * 1024 * 1024, 10)}
"""Body sizes over the 1 MiB limit, and how many tries of each."""
PROBLEM = {
    "type": "about:blank",
    "title": "Request body too large",
    "status": 413,
    "detail": "body: larger than 1048576 bytes",
    "errors": [{"field": "body", "message": "larger than 1048576 bytes"}],
}
JSON = {"Content-Type": "application/json"}


def urllib_post(port: int, body: bytes) -> tuple[int | str, bytes]:
    """POST ``body`` with urllib (``Connection: close``, the whole body sent before the answer is read)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/echo", data=body, method="POST", headers=JSON)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as refused:
        with refused:
            return refused.code, refused.read()
    except (urllib.error.URLError, OSError) as exc:
        return repr(exc), b""


@pytest.mark.parametrize("size", OVER.values(), ids=OVER.keys())
async def test_a_client_that_sends_its_whole_body_first_with_connection_close_reads_its_413(
    size: tuple[int, int],
) -> None:
    length, tries = size
    body = b"x" * length

    def client(port: int) -> list[tuple[int | str, bytes]]:
        return [urllib_post(port, body) for _ in range(tries)]

    async with serving(HttpLimits()) as served:
        answers = await anyio.to_thread.run_sync(client, served.port)
        await served.wait_open(0)  # each connection ended once its client had read the answer
    statuses = [status for status, _ in answers]
    assert statuses == [413] * tries, f"{sum(s != 413 for s in statuses)} of {tries} tries: {set(map(str, statuses))}"
    assert all(orjson.loads(answer) == PROBLEM for _, answer in answers)
    assert served.calls == []


@pytest.mark.parametrize("size", OVER.values(), ids=OVER.keys())
async def test_a_keep_alive_client_reads_its_413_and_its_connection_serves_the_next_request(
    size: tuple[int, int],
) -> None:
    length, tries = size
    body = b"x" * length

    def client(port: int) -> list[tuple[int, int]]:
        statuses = []
        for _ in range(tries):
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            try:
                connection.request("POST", "/echo", body=body, headers=JSON)  # all of it, then the answer
                refused = connection.getresponse()
                refused.read()
                connection.request("GET", "/ok")
                after = connection.getresponse()
                after.read()
                statuses.append((refused.status, after.status))
            finally:
                connection.close()
        return statuses

    async with serving(HttpLimits()) as served:
        statuses = await anyio.to_thread.run_sync(client, served.port)
    assert statuses == [(413, 200)] * tries
    assert served.calls == ["ok"] * tries


async def test_a_client_that_goes_quiet_after_its_413_is_let_go_after_the_linger() -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 10485760\r\n\r\n"

    def client(port: int) -> Client:
        client = Client(port)
        client.send(head + b"x" * (100 * 1024))
        assert client.response().status == 413
        return client  # open, sending nothing more

    async with serving(HttpLimits()) as served:
        quiet = await anyio.to_thread.run_sync(client, served.port)
        with quiet:
            await served.wait_open(1)
            started = time.monotonic()
            await served.wait_open(0, timeout=linger.LINGER_SECONDS + 2)
            waited = time.monotonic() - started
    assert waited < linger.LINGER_SECONDS + 1


async def test_a_client_that_keeps_sending_after_its_413_is_cut_after_the_longest_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(linger, "LINGER_MAX_SECONDS", 1.0)
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/json\r\n"
    head += b"Content-Length: 1073741824\r\n\r\n"

    def client(port: int) -> tuple[int, float]:
        with Client(port) as client:
            client.send(head)
            status = client.response().status
            started = time.monotonic()
            try:
                while time.monotonic() - started < 10:  # a steady trickle, never quiet for the linger
                    client.send(b"x" * 4096)
                    time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass
            return status, time.monotonic() - started

    async with serving(HttpLimits()) as served:
        status, sent_for = await anyio.to_thread.run_sync(client, served.port)
        await served.wait_open(0)
    assert status == 413
    assert sent_for < 5, f"still accepted after {sent_for:.1f} s"
