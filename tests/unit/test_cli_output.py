"""The command line's pieces that need no server: problem answers as one line, times and ages."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import httpx

from taskmesh.cli.api import _problem
from taskmesh.cli.exit_codes import ExitCode, for_http_status
from taskmesh.cli.output import ago, clean, duration, one_line, when


def answer(status: int, **body: object) -> httpx.Response:
    return httpx.Response(status, json=body, request=httpx.Request("GET", "http://127.0.0.1:8080/api/v1/tasks"))


def test_a_problem_is_its_title_and_detail_and_every_field_when_there_are_several() -> None:
    one = answer(404, title="Task not found", detail="no task has id x")
    assert _problem(one) == "Task not found: no task has id x"
    several = answer(
        422,
        title="Invalid request",
        detail="stauts: unknown filter",
        errors=[{"field": "stauts", "message": "unknown filter"}, {"field": "queu", "message": "unknown filter"}],
    )
    assert _problem(several) == "Invalid request: stauts: unknown filter; queu: unknown filter"
    not_problem = httpx.Response(502, text="<html>bad gateway</html>", request=httpx.Request("GET", "http://h/x"))
    assert _problem(not_problem) == "502 Bad Gateway from http://h/x"


def test_http_statuses_map_to_the_documented_exit_statuses() -> None:
    assert [for_http_status(s) for s in (400, 401, 403, 404, 409, 413, 422, 429, 500, 503)] == [
        ExitCode.USAGE,
        ExitCode.FAILED,
        ExitCode.FAILED,
        ExitCode.NOT_FOUND,
        ExitCode.CONFLICT,
        ExitCode.USAGE,
        ExitCode.USAGE,
        ExitCode.FAILED,
        ExitCode.UNAVAILABLE,
        ExitCode.UNAVAILABLE,
    ]


def test_times_print_in_utc_to_the_second_and_ages_in_their_largest_unit() -> None:
    assert when("2026-12-01T08:09:10.123456+02:00") == "2026-12-01 06:09:10"
    assert when(None) is None
    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    assert ago((now - timedelta(seconds=4.5)).isoformat(), now) == "4s"
    assert ago((now - timedelta(hours=3, minutes=5)).isoformat(), now) == "3h"
    assert [duration(s) for s in (0.0123, 59, 61, 86400 * 2)] == ["12ms", "59s", "1m", "2d"]
    assert one_line("first line\nsecond") == "first line"
    assert clean("a\x1b[2Jb\x07\tc") == "a\\x1b[2Jb\\x07\\tc"
    assert clean("line\nnext\x1b]0;title", newlines=True) == "line\nnext\\x1b]0;title"


def test_the_cli_keeps_the_apis_rules_without_importing_them() -> None:
    from taskmesh.cli.api import LIMIT_NAME_REGEX
    from taskmesh.cli.api import NAME_REGEX as CLI_NAME_REGEX
    from taskmesh.cli.common import SINGLE_FILTERS
    from taskmesh.limits.settings import LIMIT_NAME
    from taskmesh.tasks.search import FILTERS
    from taskmesh.tasks.validation import NAME_REGEX

    assert CLI_NAME_REGEX == NAME_REGEX
    assert LIMIT_NAME_REGEX == LIMIT_NAME.pattern
    assert SINGLE_FILTERS == tuple(f for f in FILTERS if f not in ("status", "order", "limit", "cursor"))


def test_the_operator_verbs_start_without_the_stores_drivers_and_the_package_names_still_resolve() -> None:
    import subprocess
    import sys

    code = (
        "import sys, taskmesh.cli.app; "
        "mods = ('asyncpg', 'redis', 'taskmesh.clients.client', 'taskmesh.store'); "
        "print(sorted(m for m in mods if m in sys.modules)); "
        "import taskmesh; print(taskmesh.Client.__name__, taskmesh.SyncClient.__name__, taskmesh.task.__name__)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines() == ["[]", "Client SyncClient task"], done.stderr
