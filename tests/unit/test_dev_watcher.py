"""The dev profile's watcher of its embedded servers, on fake servers and a manual clock; exit reasons from /proc."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from structlog.testing import capture_logs

from taskmesh.dev.stack import ServerProcess, ServerWatcher
from taskmesh.errors import EmbeddedServerError


class FakeServer:
    """An embedded server that is dead while ``dead`` is true; a restart revives it unless ``fail_starts``."""

    restarted_event = "embedded_fake_restarted"

    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.dead = False
        self.fail_starts = False
        self.restarts = 0

    def exit_reason(self) -> str | None:
        return "killed by SIGKILL" if self.dead else None

    def restart_dead(self) -> None:
        self.restarts += 1
        if self.fail_starts:
            raise EmbeddedServerError("fake: start failed")
        self.dead = False

    def describe(self) -> dict[str, object]:
        return {"pid": 1000 + self.restarts}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_live_server_is_left_alone() -> None:
    server = FakeServer()
    watcher = ServerWatcher([server], clock=Clock())
    with capture_logs() as logs:
        assert watcher.run_once() == {"restarted": 0, "failed": 0, "gave_up": 0}
    assert server.restarts == 0 and logs == []


def test_a_dead_server_is_restarted_and_the_restart_logged_with_its_reason() -> None:
    server = FakeServer()
    watcher = ServerWatcher([server], clock=Clock())
    server.dead = True
    with capture_logs() as logs:
        assert watcher.run_once()["restarted"] == 1
    assert not server.dead
    assert logs == [
        {
            "event": "embedded_fake_restarted",
            "log_level": "warning",
            "reason": "killed by SIGKILL",
            "restarts": 1,
            "pid": 1001,
        }
    ]


def test_a_server_started_again_is_handed_to_the_callback_and_one_that_failed_to_start_is_not() -> None:
    """The callback is how dev names the new process to its guard."""
    server, clock = FakeServer(), Clock()
    handed: list[object] = []
    watcher = ServerWatcher([server], clock=clock, on_restarted=handed.append)
    server.dead = server.fail_starts = True
    with capture_logs():
        assert watcher.run_once()["failed"] == 1
        assert handed == []
        server.fail_starts = False
        clock.now += 1  # past the backoff of the failed start
        assert watcher.run_once()["restarted"] == 1
    assert handed == [server]


def test_the_watcher_gives_up_on_the_sixth_death_within_a_minute_and_stops_watching_that_server() -> None:
    clock = Clock()
    flaky, steady = FakeServer("flaky"), FakeServer("steady")
    watcher = ServerWatcher([flaky, steady], clock=clock)
    for _ in range(5):
        flaky.dead = True
        assert watcher.run_once()["restarted"] == 1
        clock.now += 11.0  # five restarts in 44 s
    flaky.dead = True
    with capture_logs() as logs:
        assert watcher.run_once() == {"restarted": 0, "failed": 0, "gave_up": 1}
    assert logs[0]["event"] == "embedded_server_gave_up" and logs[0]["log_level"] == "error"
    assert logs[0]["server"] == "flaky" and logs[0]["restarts"] == 5
    assert flaky.restarts == 5 and watcher.watched == ["steady"]
    steady.dead = True
    assert watcher.run_once()["restarted"] == 1  # the other server is still looked after


def test_restarts_older_than_the_window_no_longer_count() -> None:
    clock = Clock()
    server = FakeServer()
    watcher = ServerWatcher([server], clock=clock)
    for _ in range(12):
        server.dead = True
        assert watcher.run_once()["restarted"] == 1
        clock.now += 15.0  # four per minute: never five within 60 s
    assert watcher.watched == ["fake"]


def test_failed_starts_are_retried_with_doubling_waits_up_to_eight_seconds_and_a_success_resets_them() -> None:
    clock = Clock()
    server = FakeServer()
    server.fail_starts = True
    watcher = ServerWatcher([server], clock=clock)
    server.dead = True
    attempts: list[float] = []
    with capture_logs() as logs:
        while clock.now < 30:
            tried = server.restarts
            watcher.run_once()
            if server.restarts > tried:
                attempts.append(clock.now)
            clock.now = round(clock.now + 0.5, 1)  # the check interval
    assert attempts == [0.0, 0.5, 1.5, 3.5, 7.5, 15.5, 23.5]
    assert {entry["event"] for entry in logs} == {"embedded_server_restart_failed"}
    assert logs[0]["error"] == "fake: start failed"
    assert [entry["retry_in_seconds"] for entry in logs] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    server.fail_starts = False
    clock.now = 31.5
    with capture_logs() as logs:
        assert watcher.run_once()["restarted"] == 1
    assert logs[0]["restarts"] == 1
    server.dead = True  # dies again: tried at once, not after the old backoff
    assert watcher.run_once()["restarted"] == 1


def test_a_server_that_cannot_be_started_for_a_minute_is_given_up() -> None:
    clock = Clock()
    server = FakeServer()
    server.fail_starts = True
    watcher = ServerWatcher([server], clock=clock)
    server.dead = True
    with capture_logs() as logs:
        while watcher.watched and clock.now < 120:
            watcher.run_once()
            clock.now += 0.5
    gave_up = [entry for entry in logs if entry["event"] == "embedded_server_gave_up"]
    assert len(gave_up) == 1 and clock.now == 60.5  # given up at the first check 60 s after the first failure
    assert gave_up[0]["error"] == "fake: start failed" and gave_up[0]["restarts"] == 0
    assert gave_up[0]["failed_starts"] == server.restarts == 11  # at 0, 0.5, 1.5, 3.5, 7.5, then every 8 s to 55.5


def test_the_watcher_refuses_a_limit_that_could_never_restart() -> None:
    with pytest.raises(ValueError, match="max_restarts >= 1"):
        ServerWatcher([FakeServer()], max_restarts=0)


def test_the_exit_reason_of_an_unreaped_process_is_read_from_proc_and_unknown_once_reaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    process = ServerProcess.of(child.pid)
    try:
        assert process.exit_reason() is None
        child.send_signal(signal.SIGKILL)
        # Until it is reaped the child is a zombie, as a daemonised server is when nobody reaps it.
        for _ in range(200):
            if (reason := process.exit_reason()) is not None:
                break
            time.sleep(0.01)
        assert reason == "killed by SIGKILL"
    finally:
        child.kill()
        child.wait()
    assert process.exit_reason() == "unknown (process gone)"


def test_the_exit_status_of_a_process_that_exited_is_reported() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    process = ServerProcess.of(child.pid)
    try:
        for _ in range(500):
            if (reason := process.exit_reason()) is not None:
                break
            time.sleep(0.01)
        assert reason == "exited with status 3"  # not reaped before the wait below, so never "gone"
    finally:
        child.wait()
