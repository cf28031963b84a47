"""Make what handlers return and raise storable in PostgreSQL before it reaches the committer.

PostgreSQL's ``text`` cannot hold U+0000 and ``jsonb`` refuses ``\\u0000``;
neither can hold a lone surrogate (Python strings can). A run whose result or
error text held one used to make the committer retry the same batch for ever
Here, pure and cheap on the common path:

- error texts and tracebacks are escaped (``\\x00``, ``\\ud800``) and bounded,
  so they always store and still say what happened;
- a result that cannot be stored is refused with a message naming where the
  bad character is (``result.rows[3].name: contains a NUL character``); the
  executor then fails the run, not retryable (the same handler would return
  the same value again).
"""

from __future__ import annotations

from typing import Any

import orjson

MAX_ERROR_CHARS = 2000
"""Longest error text stored on a run (the start is kept)."""
MAX_TRACEBACK_CHARS = 16_384
"""Longest traceback stored on a run (the end is kept: the innermost frames matter)."""


def storable_text(text: str, limit: int, *, keep_end: bool = False) -> str:
    """``text`` with NUL characters and lone surrogates escaped, at most ``limit`` characters.

    :param keep_end: keep the last ``limit`` characters (tracebacks) instead of the first.
    """
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = "..." + text[-(limit - 3) :] if keep_end else text[: limit - 3] + "..."
    return text


def describe(exc: BaseException) -> str:
    """``"TypeName: message"`` of an exception, even when its ``__str__`` raises."""
    try:
        message = str(exc)
    except Exception:  # a handler's exception whose __str__ is broken must not break the executor
        message = "<the exception's message could not be rendered>"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def _find_unstorable(value: Any, where: str) -> str | None:
    """The first path in ``value`` holding a NUL or a lone surrogate, with what is wrong there."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = _text_problem(item)
            if problem:
                return f"{path}: {problem}"
        elif isinstance(item, dict):
            for key, child in item.items():
                if isinstance(key, str) and _text_problem(key):
                    return f"{path}: a key {_text_problem(key)}"
                stack.append((child, f"{path}.{key}"))
        elif isinstance(item, list | tuple):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(item))
    return None


def _text_problem(text: str) -> str | None:
    if "\x00" in text:
        return "contains a NUL character, which PostgreSQL cannot store"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "contains a lone surrogate (not valid Unicode), which PostgreSQL cannot store"
    return None


def storable_result(value: Any) -> tuple[str | None, str | None]:
    """Serialise a handler's return value for the ``result`` jsonb column.

    :returns: ``(json_text, None)`` when it can be stored, else ``(None, why)`` with
        ``why`` naming the offending path, e.g. ``handler result refused: result.a: contains
        a NUL character, which PostgreSQL cannot store``.
    """
    try:
        text = orjson.dumps(value)
    except TypeError as exc:
        where = _find_unstorable(value, "result")
        if where is not None:
            return None, f"handler result refused: {where}"
        return None, f"handler result is not JSON-serialisable: {exc}"
    if b"\\u0000" in text:  # orjson escapes NUL; only then is the walk worth its cost
        where = _find_unstorable(value, "result")
        if where is not None:
            return None, f"handler result refused: {where}"
    return text.decode(), None


def storable_json(text: str) -> tuple[str | None, str | None]:
    """Check a result already serialised (by a handler process) the way :func:`storable_result` does.

    :returns: ``(text, None)`` when it can be stored, else ``(None, why)``.
    """
    if "\\u0000" not in text:  # the one escape jsonb refuses; surrogates never pass orjson
        return text, None
    return storable_result(orjson.loads(text))
