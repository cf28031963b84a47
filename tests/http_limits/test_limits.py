"""What one HTTP client can take from an instance is bounded (taskmesh.api.server).

A real uvicorn server on a loopback socket in the test's event loop, with small
limits; raw-socket clients in a worker thread. Each test says which bound it
proves: header size (431), read timeout (408, slowloris and stalled body),
connection cap, and that normal and keep-alive traffic is untouched.
"""

from __future__ import annotations

import socket
import time
from collections.abc import MutableMapping
from typing import Any

import anyio
import orjson
import pytest
import structlog

from taskmesh.api.server import HttpLimits
from tests.http_limits.harness import (
    Client,
    Response,
    closed_by_server,
    connect,
    request,
    reset_peak_rss,
    rss_kib,
    serving,
)

pytestmark = pytest.mark.anyio

PROBLEM = "application/problem+json"


def head_of(size: int, path: str = "/ok") -> bytes:
    """A GET whose request line and headers, through the blank line, are exactly ``size`` bytes."""
    base = f"GET {path} HTTP/1.1\r\nHost: test\r\nX-Pad: \r\n\r\n".encode()
    return base.replace(b"X-Pad: ", b"X-Pad: " + b"p" * (size - len(base)))


def events(logs: list[MutableMapping[str, Any]], name: str) -> list[MutableMapping[str, Any]]:
    return [line for line in logs if line["event"] == name]


def problem_of(response: Response) -> Any:
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["connection"] == "close"
    return orjson.loads(response.body)


async def test_ten_mib_of_headers_get_a_431_problem_and_cost_the_server_about_the_limit_in_memory() -> None:
    flood = b"GET /ok HTTP/1.1\r\nHost: test\r\nX-Flood: " + b"a" * (10 * 1024 * 1024)

    def client(port: int) -> tuple[bool, Response | None, float, bool]:
        started = time.monotonic()
        with Client(port) as client:
            try:
                client.send(flood)
                sent_all = True
            except (BrokenPipeError, ConnectionResetError):
                sent_all = False
            try:
                response: Response | None = client.response()
            except (ConnectionError, TimeoutError):
                response = None
            return sent_all, response, time.monotonic() - started, client.closed_by_server(3)

    async with serving(HttpLimits(read_timeout_seconds=10)) as served:
        with structlog.testing.capture_logs() as logs:
            before = rss_kib()
            peak = "VmHWM" if reset_peak_rss() else "VmRSS"
            sent_all, response, elapsed, closed = await anyio.to_thread.run_sync(client, served.port)
            grown_kib = rss_kib(peak) - before
            await served.wait_open(0)
    print(f"memory grew by {grown_kib} KiB ({peak}); the flood was {len(flood) // 1024} KiB")
    assert grown_kib < 3 * 1024, f"server memory grew by {grown_kib} KiB ({peak})"
    # The server reads and discards after answering: the client is not reset mid-send.
    assert sent_all, "the server reset the connection while the client was sending"
    assert response is not None, "no answer: lost to a reset, or never sent"
    assert response.status == 431
    assert problem_of(response) == {
        "type": "about:blank",
        "title": "Request header fields too large",
        "status": 431,
        "detail": "headers: larger than 65536 bytes",
    }
    assert closed
    assert elapsed < 2.0
    assert served.calls == []
    assert served.refused("headers_too_large") == 1
    [line] = events(logs, "http_headers_too_large")
    assert line["peer"].startswith("127.0.0.1:")
    assert line["bytes_received"] >= 65536
    assert (line["limit"], line["count"], line["log_level"]) == (65536, 1, "warning")


@pytest.mark.parametrize("pieces", [1, 50], ids=["at-once", "in-50-pieces"])
async def test_a_head_of_exactly_the_limit_is_served_and_one_byte_more_is_refused_with_431(pieces: int) -> None:
    limit = 4096

    def send(port: int, data: bytes, wait_for_close: float) -> tuple[Response, bool]:
        with Client(port) as client:
            step = -(-len(data) // pieces)
            for offset in range(0, len(data), step):
                client.send(data[offset : offset + step])
                if pieces > 1:
                    time.sleep(0.002)  # separate reads on the server side
            return client.response(), client.closed_by_server(wait_for_close)

    async with serving(HttpLimits(max_header_bytes=limit)) as served:
        fits, fits_closed = await anyio.to_thread.run_sync(send, served.port, head_of(limit), 0.3)
        over, over_closed = await anyio.to_thread.run_sync(send, served.port, head_of(limit + 1), 2.0)
    assert (fits.status, orjson.loads(fits.body), fits_closed) == (200, {"ok": True}, False)
    assert over.status == 431
    assert problem_of(over)["detail"] == "headers: larger than 4096 bytes"
    assert over_closed
    assert served.calls == ["ok"]
    assert served.refused("headers_too_large") == 1


async def test_header_fields_beyond_the_field_limit_are_refused_with_431() -> None:
    def send(port: int, fields: int) -> Response:
        extra = "".join(f"X-F{i}: v\r\n" for i in range(fields - 1))  # Host is one
        with Client(port) as client:
            client.send(request("/ok", headers=extra))
            return client.response()

    async with serving(HttpLimits(max_header_fields=10)) as served:
        fits = await anyio.to_thread.run_sync(send, served.port, 10)
        over = await anyio.to_thread.run_sync(send, served.port, 11)
    assert fits.status == 200
    assert over.status == 431
    assert problem_of(over)["detail"] == "headers: more than 10 fields"
    assert served.refused("headers_too_large") == 1


@pytest.mark.parametrize("field_limit", [100, 10**6], ids=["bounded", "unbounded"])
async def test_heads_of_tiny_fields_cost_little_memory_with_the_field_limit(field_limit: int) -> None:
    connections = 50
    head = b"GET /ok HTTP/1.1\r\nHost: test\r\n" + b"ab:c\r\n" * 10800  # ~64 KiB, never ended

    def clients(port: int) -> list[socket.socket]:
        socks = [connect(port) for _ in range(connections)]
        for sock in socks:
            sock.sendall(head)
        time.sleep(0.3)
        return socks

    async with serving(HttpLimits(max_header_fields=field_limit, max_connections=100)) as served:
        before = rss_kib()
        peak = "VmHWM" if reset_peak_rss() else "VmRSS"
        socks = await anyio.to_thread.run_sync(clients, served.port)
        grown_kib = rss_kib(peak) - before
        for sock in socks:
            sock.close()
        await served.wait_open(0)
    print(f"max_header_fields={field_limit}: {connections} heads of {len(head)} bytes: +{grown_kib} KiB ({peak})")
    if field_limit == 100:
        assert grown_kib < 8 * 1024
        assert served.refused("headers_too_large") == connections
    else:  # the comparison the docs quote: the same heads, held
        assert served.refused("headers_too_large") == 0


async def test_one_keep_alive_connection_serves_several_requests_sequential_and_pipelined() -> None:
    limit = 4096

    def client(port: int) -> list[Response]:
        responses = []
        with Client(port) as client:
            for _ in range(3):
                client.send(request("/ok"))
                responses.append(client.response())
            # Pipelined: a request with a body, then one whose head is the limit exactly,
            # arriving in the same read as the end of the previous one.
            client.send(request("/ok") + request("/echo", "POST", body=b"hello") + head_of(limit))
            responses += [client.response() for _ in range(3)]
            client.send(request("/ok"))
            responses.append(client.response())
        return responses

    async with serving(HttpLimits(max_header_bytes=limit)) as served:
        responses = await anyio.to_thread.run_sync(client, served.port)
    assert [r.status for r in responses] == [200] * 7
    assert orjson.loads(responses[4].body) == {"bytes": 5}
    assert served.calls == ["ok", "ok", "ok", "ok", "echo", "ok", "ok"]
    assert served.refused("headers_too_large") == 0


async def test_a_pipelined_request_over_the_limit_closes_the_connection() -> None:
    # The POST's head arrives alone; its body and the next request arrive in one read, which
    # the server feeds whole: the second head is metered by the parser's callbacks.
    def client(port: int) -> bool:
        with Client(port) as client:
            client.send(b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Length: 5\r\n\r\n")
            time.sleep(0.05)
            client.send(b"hello" + head_of(8192))
            return client.closed_by_server(3)

    async with serving(HttpLimits(max_header_bytes=4096)) as served:
        assert await anyio.to_thread.run_sync(client, served.port)
        await served.wait_open(0)
    assert served.refused("headers_too_large") == 1
    assert "ok" not in served.calls


async def test_a_slowloris_request_gets_408_after_the_read_timeout_and_loses_its_connection() -> None:
    sent = b"GET /ok HTTP/1.1\r\nHost: test\r\n"

    def client(port: int) -> tuple[Response, float, bool]:
        with Client(port) as client:
            client.send(sent)
            started = time.monotonic()
            response = client.response()
            return response, time.monotonic() - started, client.closed_by_server(1)

    async with serving(HttpLimits(read_timeout_seconds=1)) as served:
        with structlog.testing.capture_logs() as logs:
            response, waited, closed = await anyio.to_thread.run_sync(client, served.port)
            await served.wait_open(0)
    assert 0.9 <= waited < 1.8
    assert response.status == 408
    assert problem_of(response) == {
        "type": "about:blank",
        "title": "Request timeout",
        "status": 408,
        "detail": "request: not received within 1 seconds",
    }
    assert closed
    assert served.calls == []
    assert served.refused("read_timeout") == 1
    [line] = events(logs, "http_read_timeout")
    assert line["peer"].startswith("127.0.0.1:")
    assert (line["bytes_received"], line["answered"], line["timeout_s"], line["count"]) == (len(sent), True, 1, 1)


async def test_a_stalled_body_is_cut_by_the_read_timeout_and_the_app_lets_go_of_it() -> None:
    half = b"x" * (500 * 1024)
    head = b"POST /echo HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 1048576\r\n\r\n"

    def stall(port: int) -> tuple[Client, Response, float, bool]:
        client = Client(port)
        client.send(head + half)
        started = time.monotonic()
        response = client.response()
        return client, response, time.monotonic() - started, client.closed_by_server(1)

    async with serving(HttpLimits(read_timeout_seconds=1)) as served:
        client, response, waited, closed = await anyio.to_thread.run_sync(stall, served.port)
        with client:  # still open: what lets go of the body is the timeout, not the client leaving
            # The body-limit middleware got http.disconnect and returned: no request task is left.
            with anyio.fail_after(0.5):
                while served.server.server_state.tasks:
                    await anyio.sleep(0.01)
        await served.wait_open(0)
    assert waited < 1.8
    assert response.status == 408
    assert problem_of(response)["status"] == 408
    assert closed
    assert served.calls == [], "the route ran on a body that never arrived"
    assert served.refused("read_timeout") == 1


async def test_a_connection_over_the_cap_is_closed_at_once_and_new_ones_work_once_others_close() -> None:
    cap = 5

    async with serving(HttpLimits(max_connections=cap)) as served:
        with structlog.testing.capture_logs() as logs:
            idle = [connect(served.port) for _ in range(cap)]
            await served.wait_open(cap)
            extra = connect(served.port)
            started = time.monotonic()
            closed = await anyio.to_thread.run_sync(closed_by_server, extra, 1.0)
            refused_after = time.monotonic() - started
            extra.close()
            assert served.server.open_connections == cap
            for sock in idle:
                sock.close()
            await served.wait_open(0)

            def fresh(port: int) -> Response:
                with Client(port) as client:
                    client.send(request("/ok"))
                    return client.response()

            response = await anyio.to_thread.run_sync(fresh, served.port)
    assert closed and refused_after < 0.5
    assert response.status == 200
    assert served.refused("too_many_connections") == 1
    [line] = events(logs, "http_connections_capped")
    assert (line["count"], line["open"], line["limit"], line["log_level"]) == (1, cap, cap, "warning")


async def test_a_flood_over_the_cap_makes_one_log_line_and_the_rest_is_counted_when_the_server_stops() -> None:
    with structlog.testing.capture_logs() as logs:
        async with serving(HttpLimits(max_connections=1)) as served:
            holder = connect(served.port)
            await served.wait_open(1)
            flood = [connect(served.port) for _ in range(20)]
            closed = [await anyio.to_thread.run_sync(closed_by_server, sock, 1.0) for sock in flood]
            during = [line["count"] for line in events(logs, "http_connections_capped")]
            for sock in [holder, *flood]:
                sock.close()
    assert all(closed)
    assert during == [1]
    assert [line["count"] for line in events(logs, "http_connections_capped")] == [1, 19]
    assert served.refused("too_many_connections") == 20


async def test_a_new_connection_that_sends_nothing_is_closed_after_the_keep_alive_timeout_uncounted() -> None:
    async with serving(HttpLimits(read_timeout_seconds=30), keep_alive=1) as served:
        with connect(served.port) as sock:
            started = time.monotonic()
            closed = await anyio.to_thread.run_sync(closed_by_server, sock, 3.0)
            waited = time.monotonic() - started
        await served.wait_open(0)
    assert closed and 0.9 <= waited < 1.8
    assert served.refused("read_timeout") == 0


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to the server from ``source``, another loopback address (127.0.0.0/8 is all local)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5.0, source_address=(source, 0))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def get_ok(sock: socket.socket) -> int:
    """Send ``GET /ok`` on ``sock`` and return the answer's status."""
    sock.sendall(request("/ok"))
    answer = b""
    while b"\r\n\r\n" not in answer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer; got {answer!r}")
        answer += chunk
    return int(answer.split(b" ", 2)[1])


async def test_one_address_over_its_cap_is_closed_at_once_and_other_addresses_are_served() -> None:
    async with serving(HttpLimits(max_connections=20, max_connections_per_address=5)) as served:
        with structlog.testing.capture_logs() as logs:
            held = [connect_from("127.0.0.1", served.port) for _ in range(5)]
            await served.wait_open(5)
            extra = connect_from("127.0.0.1", served.port)
            started = time.monotonic()
            closed = await anyio.to_thread.run_sync(closed_by_server, extra, 1.0)
            refused_after = time.monotonic() - started
            extra.close()
            with connect_from("127.0.0.2", served.port) as other:
                other_status = await anyio.to_thread.run_sync(get_ok, other)
            held.pop().close()
            await served.wait_open(4)
            with connect_from("127.0.0.1", served.port) as again:
                again_status = await anyio.to_thread.run_sync(get_ok, again)
            for sock in held:
                sock.close()
            await served.wait_open(0)
    assert closed and refused_after < 0.5
    assert (other_status, again_status) == (200, 200)
    assert served.refused("too_many_connections_from_address") == 1
    assert served.refused("too_many_connections") == 0
    [line] = events(logs, "http_address_connections_capped")
    assert (line["address"], line["open"], line["limit"], line["count"]) == ("127.0.0.1", 5, 5, 1)


async def test_slow_connections_from_one_address_cannot_take_the_instance_from_the_others() -> None:
    # One address opens three times the instance's cap of slow requests (heads never ended, as a
    # slowloris sends them); another address must still be served at once, every time.
    limits = HttpLimits(max_connections=30, max_connections_per_address=10)

    def flood(port: int) -> list[socket.socket]:
        socks = []
        for _ in range(90):
            sock = connect_from("127.0.0.1", port)
            try:
                sock.sendall(b"GET /ok HTTP/1.1\r\nHost: test\r\n")
            except OSError:  # closed at accept: over the cap
                pass
            socks.append(sock)
        return socks

    def others(port: int) -> list[int]:
        statuses = []
        for _ in range(5):
            with connect_from("127.0.0.2", port) as sock:
                statuses.append(get_ok(sock))
        return statuses

    async with serving(limits) as served:
        with structlog.testing.capture_logs() as logs:
            socks = await anyio.to_thread.run_sync(flood, served.port)
            await served.wait_open(10)
            statuses = await anyio.to_thread.run_sync(others, served.port)
            for sock in socks:
                sock.close()
            await served.wait_open(0)
    assert statuses == [200] * 5
    assert served.refused("too_many_connections_from_address") == 80
    assert served.refused("too_many_connections") == 0
    assert [line["count"] for line in events(logs, "http_address_connections_capped")][:1] == [1]
