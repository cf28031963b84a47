"""The command line's exit statuses: what a script can rely on.

======  =====================================================================
status  meaning
======  =====================================================================
0       done
1       refused or failed: the API refused the request (401, 403, 429, ...),
        a store refused for good, a migration failed, a bulk operation or an
        instance ended in failure, or some of several ids were not acted on
2       bad usage: an unknown flag, a bad value (also when the API answers
        400, 413 or 422 for it), or invalid configuration (the message names
        the key)
3       not found: no such task, queue, schedule, operation or limit (404)
4       conflict: the task's state does not allow the action (409); the
        message says what would
5       unavailable: the API could not be reached, timed out or answered 5xx;
        transient, so trying again later may succeed
130     interrupted (Ctrl-C)
======  =====================================================================
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit statuses of ``taskmesh``; see the module's table."""

    OK = 0
    FAILED = 1
    USAGE = 2
    NOT_FOUND = 3
    CONFLICT = 4
    UNAVAILABLE = 5
    INTERRUPTED = 130


def for_http_status(status: int) -> ExitCode:
    """The exit status for an error answer of the HTTP API.

    :param status: an HTTP status of 400 or more.
    :returns: :class:`ExitCode` per the module's table.
    """
    if status == 404:
        return ExitCode.NOT_FOUND
    if status == 409:
        return ExitCode.CONFLICT
    if status in (400, 413, 422):
        return ExitCode.USAGE
    if status >= 500:
        return ExitCode.UNAVAILABLE
    return ExitCode.FAILED


EPILOG = (
    "Exit status: 0 done; 1 refused or failed; 2 bad usage or configuration; 3 not found; "
    "4 the task's state does not allow it; 5 the API unavailable (try again); 130 interrupted."
)
