"""The operator verbs' way to the HTTP API: one request, its JSON answer, or an :class:`ApiError`.

The verbs go through the API rather than the stores so that they get the same
validation and authentication as any other client.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
import orjson

from taskmesh import __version__
from taskmesh.cli.exit_codes import ExitCode, for_http_status

DEFAULT_URL = "http://127.0.0.1:8080"
NAME_REGEX = r"^[A-Za-z0-9_.:-]{1,128}$"
"""The API's rule for queue names (``taskmesh.tasks.validation.NAME_REGEX``; a test keeps them equal)."""
_QUEUE = re.compile(NAME_REGEX)
LIMIT_NAME_REGEX = r"^[a-z0-9][a-z0-9_-]{0,63}$"
"""The API's rule for limit names (``taskmesh.limits.settings.LIMIT_NAME``; a test keeps them equal)."""
_LIMIT = re.compile(LIMIT_NAME_REGEX)
PROXY_OUTAGES = (502, 503, 504)
"""Statuses a proxy in front of an instance answers while it is down: transient, whatever the body."""
TIMEOUT_SECONDS = 15.0
"""How long one request may take (connect, write, read), beyond a ``wait`` the request asks for."""

Params = Sequence[tuple[str, str]]
"""Query parameters in order, a name as often as it has values (``status`` twice)."""


class ApiError(Exception):
    """The API refused the request, answered an error, or could not be reached.

    :param message: one line for a person, naming the field where the API named one.
    :param exit_code: the :class:`ExitCode` the command ends with.
    :param status: the HTTP status, ``None`` when no answer came.
    """

    def __init__(self, message: str, exit_code: ExitCode, status: int | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.status = status


@dataclass(frozen=True)
class Answer:
    """An API answer of status < 400: ``body`` is the decoded JSON (``None`` for an empty body)."""

    status: int
    body: Any


def given_url(url: str | None = None) -> str | None:
    """The instance URL the command line was given: a command's ``--url``, else ``TASKMESH_URL`` (which
    ``taskmesh --url`` sets too); ``None`` for neither (an empty value counts as none)."""
    return url or os.environ.get("TASKMESH_URL") or None


class Api:
    """A synchronous client of one taskmesh instance's HTTP API.

    :param url: the instance's base URL (``http://host:port``; a trailing ``/`` is ignored); ``None``:
        :func:`given_url`, else :data:`DEFAULT_URL`.
    :param api_key: sent as ``Authorization: Bearer``; ``None``: ``TASKMESH_API_KEY`` (which
        ``taskmesh --api-key`` sets too), else no key.
    """

    def __init__(self, url: str | None = None, api_key: str | None = None) -> None:
        self.url = (given_url(url) or DEFAULT_URL).rstrip("/")
        headers = {"User-Agent": f"taskmesh-cli/{__version__}", "Accept": "application/json"}
        key = api_key or os.environ.get("TASKMESH_API_KEY")
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._http = httpx.Client(base_url=self.url, timeout=TIMEOUT_SECONDS, headers=headers)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def __enter__(self) -> Api:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def get(self, path: str, params: Params | None = None, *, wait_seconds: float = 0.0) -> Answer:
        """``GET path``; ``wait_seconds`` lengthens the read timeout for a request that waits on the server."""
        return self.request("GET", path, params=params, wait_seconds=wait_seconds)

    def post(self, path: str, body: Mapping[str, Any] | None = None) -> Answer:
        """``POST path`` with a JSON body (none when ``body`` is ``None``)."""
        return self.request("POST", path, body=body)

    def put(self, path: str, body: Mapping[str, Any]) -> Answer:
        """``PUT path`` with a JSON body."""
        return self.request("PUT", path, body=body)

    def delete(self, path: str, params: Params | None = None) -> Answer:
        """``DELETE path``, with ``params`` in its query (a destructive action's ``reason``)."""
        return self.request("DELETE", path, params=params)

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        body: Mapping[str, Any] | None = None,
        wait_seconds: float = 0.0,
    ) -> Answer:
        """Send one request and decode its answer.

        :returns: the :class:`Answer` of a status below 400.
        :raises ApiError: an error answer (its problem+json title, detail and fields in the message),
            a connection that failed or timed out (:attr:`ExitCode.UNAVAILABLE`), or an answer that is
            not JSON.
        """
        content = orjson.dumps(body) if body is not None else None
        headers = {"Content-Type": "application/json"} if content is not None else None
        timeout = httpx.Timeout(TIMEOUT_SECONDS + wait_seconds)
        query: list[tuple[str, str | int | float | bool | None]] | None = (
            None if params is None else [(k, v) for k, v in params]
        )
        try:
            response = self._http.request(method, path, params=query, content=content, headers=headers, timeout=timeout)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as exc:
            raise ApiError(
                f"{self.url} is not a URL the CLI can call ({exc}): give --url as http://host:port",
                ExitCode.USAGE,
            ) from None
        except httpx.TimeoutException as exc:
            raise ApiError(
                f"the taskmesh API at {self.url} did not answer in time ({type(exc).__name__})",
                ExitCode.UNAVAILABLE,
            ) from None
        except httpx.HTTPError as exc:
            raise ApiError(
                f"cannot reach the taskmesh API at {self.url} ({_reason(exc)}); is an instance running "
                "there? Point --url or TASKMESH_URL at it",
                ExitCode.UNAVAILABLE,
            ) from None
        if response.status_code >= 400:
            if not _is_problem(response) and response.status_code not in PROXY_OUTAGES:
                # Not one of the API's answers: --url names another server, or a path under one.
                raise ApiError(
                    f"{self.url} answered {response.status_code} {response.reason_phrase} to {method} {path}, not "
                    "as a taskmesh API does: give --url as the instance's http://host:port",
                    ExitCode.USAGE,
                    response.status_code,
                )
            if response.status_code == 404 and _title(response) == "Not Found":
                # The API's answer for a path it has no route for (its own 404s name the task, schedule...).
                raise ApiError(
                    f"{self.url} has no route {method} {path}: give --url as the instance's http://host:port",
                    ExitCode.USAGE,
                    404,
                )
            message = _problem(response)
            if response.status_code == 401:
                message += " (give the key in TASKMESH_API_KEY or with taskmesh --api-key)"
            raise ApiError(message, for_http_status(response.status_code), response.status_code)
        if not response.content:
            return Answer(response.status_code, None)
        try:
            return Answer(response.status_code, orjson.loads(response.content))
        except orjson.JSONDecodeError:
            raise ApiError(
                f"{self.url} answered {response.status_code} with a body that is not JSON: is it a taskmesh API?",
                ExitCode.FAILED,
                response.status_code,
            ) from None


def _reason(exc: httpx.HTTPError) -> str:
    """The innermost cause of a connection error, which names what went wrong (refused, no such host)."""
    cause: BaseException = exc
    while cause.__cause__ is not None or cause.__context__ is not None:
        cause = cause.__cause__ or cause.__context__  # type: ignore[assignment]
    text = str(cause) or type(cause).__name__
    return text.split("] ", 1)[-1] if text.startswith("[Errno") else text


def _title(response: httpx.Response) -> str | None:
    try:
        problem = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None
    return str(problem.get("title")) if isinstance(problem, dict) else None


def _is_problem(response: httpx.Response) -> bool:
    return str(response.headers.get("content-type", "")).startswith("application/problem+json")


def segment(value: str) -> str:
    """``value`` quoted as one path segment: an id or a queue name can never reach another route
    (``/`` and ``?`` are escaped, and so are the dots of ``.`` and ``..``, which a URL would resolve)."""
    return value.replace(".", "%2E") if value in (".", "..") else quote(value, safe="")


def task_path(task_id: str, suffix: str = "") -> str:
    """``/api/v1/tasks/{task_id}{suffix}``, once ``task_id`` is a UUID.

    :raises ApiError: not a UUID (exit 2), with the API's own message.
    """
    return f"/api/v1/tasks/{_uuid('task_id', task_id)}{suffix}"


def workflow_path(workflow_id: str, suffix: str = "") -> str:
    """``/api/v1/workflows/{workflow_id}{suffix}``, once ``workflow_id`` is a UUID.

    :raises ApiError: not a UUID (exit 2), with the API's own message.
    """
    return f"/api/v1/workflows/{_uuid('workflow_id', workflow_id)}{suffix}"


def operation_path(operation_id: str) -> str:
    """``/api/v1/operations/{operation_id}``, once ``operation_id`` is a UUID.

    :raises ApiError: not a UUID (exit 2), with the API's own message.
    """
    return f"/api/v1/operations/{_uuid('operation_id', operation_id)}"


def _uuid(field: str, value: str) -> str:
    try:
        parsed = uuid.UUID(value) if value.strip() == value else None
    except ValueError:
        parsed = None
    if parsed is None:
        raise ApiError(f"Invalid request: {field}: must be a UUID (got {value!r})", ExitCode.USAGE, 422)
    return str(parsed)


def queue_path(queue: str, suffix: str = "") -> str:
    """``/api/v1/queues/{queue}{suffix}``, once ``queue`` is a valid queue name.

    :raises ApiError: not a valid name (exit 2), with the API's own message.
    """
    if not _QUEUE.fullmatch(queue):
        pattern = NAME_REGEX.strip("^$")
        raise ApiError(f"Invalid request: queue: must match {pattern} (got {queue!r})", ExitCode.USAGE, 422)
    return f"/api/v1/queues/{segment(queue)}{suffix}"


def limit_path(name: str) -> str:
    """``/api/v1/limits/{name}``, once ``name`` is a valid limit name.

    :raises ApiError: not a valid name (exit 2), with the API's own message.
    """
    if not _LIMIT.fullmatch(name):
        pattern = LIMIT_NAME_REGEX.strip("^$")
        raise ApiError(f"Invalid request: limit: must match {pattern} (got {name!r})", ExitCode.USAGE, 422)
    return f"/api/v1/limits/{name}"


def _problem(response: httpx.Response) -> str:
    """One line from a problem+json answer: ``title: detail``, or the status line for another body."""
    try:
        problem = orjson.loads(response.content)
    except orjson.JSONDecodeError:
        problem = None
    if not isinstance(problem, dict) or "title" not in problem:
        return f"{response.status_code} {response.reason_phrase} from {response.request.url}"
    title, detail = str(problem.get("title")), problem.get("detail")
    errors = problem.get("errors")
    if isinstance(errors, list) and len(errors) > 1:
        detail = "; ".join(f"{e.get('field')}: {e.get('message')}" for e in errors if isinstance(e, dict))
    return f"{title}: {detail}" if detail else title
