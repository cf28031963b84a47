"""How a command's end becomes the process's exit status (:class:`~taskmesh.cli.exit_codes.ExitCode`).

Shared by the whole command line (:mod:`taskmesh.cli.app`) and by the bare start of an
instance (``taskmesh`` or ``taskmesh run`` without options), which :mod:`taskmesh.entry` runs
without loading Typer, rich, httpx and the operator's verbs: about a tenth of an instance's
start-up CPU. So this module imports only what the instance needs anyway.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from taskmesh.cli.exit_codes import ExitCode
from taskmesh.errors import ConfigError, MigrationError, ServiceFailedError, StoreError


class Terminated(BaseException):
    """SIGTERM arrived before the supervisor took over the signals (nothing runs yet)."""


def terminate_early(signum: int, frame: object) -> None:
    """SIGTERM's handler until the supervisor installs its own: a clean stop, not a crash.

    :raises Terminated: always.
    """
    raise Terminated


def refused(exc: StoreError) -> bool:
    """A refused password: trying again will not help, though the failure model counts Redis's
    refusal as an outage (an instance waits for the password to be fixed rather than exit)."""
    return exc.detail.startswith("AuthenticationError")


def error(message: object) -> None:
    """Print ``taskmesh: error: <message>`` on stderr."""
    print(f"taskmesh: error: {message}", file=sys.stderr)


def run(command: Callable[[], object]) -> int:
    """Call ``command`` and return the exit status its end means; print the error of a failure.

    Until the supervisor installs its own handlers, SIGTERM is a clean stop (status 0); embedded
    servers already started are still stopped by the context managers on the way out.

    :param command: the command; a ``SystemExit`` it raises gives its code.
    :returns: 0 after a clean end or SIGTERM; 2 for invalid configuration; 5 for a store that may
        come back, 1 for one that refused (a wrong password) or a migration or critical service that
        failed; 130 after Ctrl-C.
    """
    signal.signal(signal.SIGTERM, terminate_early)
    try:
        command()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else ExitCode.FAILED)
    except ConfigError as exc:
        error(exc)
        return ExitCode.USAGE
    except StoreError as exc:
        # The operator's verbs that use the stores: an outage may pass (5), a refusal will not (1).
        error(exc)
        return ExitCode.UNAVAILABLE if exc.transient and not refused(exc) else ExitCode.FAILED
    except (MigrationError, ServiceFailedError) as exc:
        # Not an outage: a migration or a store refusing for good, or a critical service that
        # kept crashing. The instance has shut down gracefully; the process manager decides.
        error(exc)
        return ExitCode.FAILED
    except KeyboardInterrupt:
        return ExitCode.INTERRUPTED
    except Terminated:
        return ExitCode.OK
    except RuntimeError as exc:
        # Python 3.11 wraps what a class's __set_name__ raises: a SIGTERM while an import defines
        # such a class (anyio's, at start-up) arrives as a RuntimeError caused by Terminated.
        if isinstance(exc.__cause__, Terminated):
            return ExitCode.OK
        raise
    return ExitCode.OK


def exit_process(code: int) -> NoReturn:
    """Flush and exit with ``code``; threads of abandoned sync handlers do not hold the exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if any(t is not threading.main_thread() and t.is_alive() and not t.daemon for t in threading.enumerate()):
        os._exit(int(code))
    sys.exit(int(code))
