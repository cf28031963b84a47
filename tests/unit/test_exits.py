"""How an early SIGTERM becomes the process's exit status."""

from __future__ import annotations

import os
import signal

from taskmesh.cli import exits
from taskmesh.cli.exit_codes import ExitCode


class _Named:
    """A descriptor whose ``__set_name__`` runs while its class is defined, as anyio's do at import."""

    def __set_name__(self, owner: type, name: str) -> None:
        os.kill(os.getpid(), signal.SIGTERM)


def _import_during_sigterm() -> None:
    class _Defined:
        field = _Named()


def test_a_sigterm_while_an_import_defines_a_class_is_a_clean_stop() -> None:
    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert exits.run(_import_during_sigterm) == ExitCode.OK
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_another_runtime_error_still_fails_the_command() -> None:
    def broken() -> None:
        raise RuntimeError("not a signal")

    previous = signal.getsignal(signal.SIGTERM)
    try:
        try:
            exits.run(broken)
        except RuntimeError as exc:
            assert str(exc) == "not a signal"
        else:
            raise AssertionError("the RuntimeError was swallowed")
    finally:
        signal.signal(signal.SIGTERM, previous)
