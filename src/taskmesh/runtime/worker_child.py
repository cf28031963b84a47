"""A worker process's own side: read the settings the primary sent, run the instance, watch the primary.

The primary starts ``python -m taskmesh.runtime.worker_child`` (:mod:`taskmesh.runtime.worker_processes`
supervises it). This module imports the supervisor to run the child's instance; the primary's side
does not import it, so the supervisor can start worker processes without a circle.
"""

from __future__ import annotations

import os
import threading
from functools import partial

import anyio
import orjson

from taskmesh.observability.logs import get_logger
from taskmesh.runtime import shutdown_signals
from taskmesh.runtime.worker_processes import PARENT_VARIABLE

log = get_logger("taskmesh.runtime.worker_processes")


def read_settings() -> dict[str, object]:
    """The settings the primary wrote on our stdin: one line of JSON (:func:`child_settings`).

    :raises SystemExit: (1) the primary ended before writing them.
    """
    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(0, 65536)
        if not chunk:
            raise SystemExit(1)
        line += chunk
    data: dict[str, object] = orjson.loads(line)
    return data


def watch_parent() -> None:
    """Stop this instance once the primary has ended (its end of our stdin closes), as one SIGTERM would.

    Runs in a daemon thread. Before the instance has started, or after it ended, the process exits at once.
    """
    try:
        while os.read(0, 4096):  # nothing more comes: only the primary's end, even by SIGKILL, ends this
            pass
    except OSError:
        pass
    log.warning("worker_process_orphaned", parent=os.environ.get(PARENT_VARIABLE))
    if not shutdown_signals.request_stop():
        os._exit(0)


def main() -> None:
    """A child's start (``python -m taskmesh.runtime.worker_child``): its settings, then the instance.

    Exits as ``taskmesh run`` does (:mod:`taskmesh.cli.exits`): 0 after a clean stop, 2 for a
    configuration the child cannot use (its port taken), 1 for a failure.
    """
    from taskmesh.cli import exits

    settings = read_settings()
    threading.Thread(target=watch_parent, name="taskmesh-watch-parent", daemon=True).start()
    exits.exit_process(exits.run(partial(_run_child, settings)))


def _run_child(data: dict[str, object]) -> None:
    from taskmesh.config import load_settings
    from taskmesh.observability.logs import configure
    from taskmesh.runtime import supervisor
    from taskmesh.runtime.event_loop import backend_options
    from taskmesh.tasks.registry import default_registry, load_modules

    settings = load_settings(**data)
    configure(settings.log_level, settings.log_format)
    load_modules(settings.handlers)
    anyio.run(supervisor.run, settings, default_registry, backend_options=backend_options())


if __name__ == "__main__":
    main()
