"""ASGI middleware that records each ``/api/`` request's :class:`~taskmesh.security.audit.AuditEvent`.

Every request that changes something (POST, PUT, PATCH, DELETE on a route) and every
request refused for its key (401, 403, and 429 past an address's budget of refused
authentications), reads included, gets one event (refusals and 429s of a kind repeated
within a minute are counted into one summary row instead: :mod:`taskmesh.api.denials`): its actor (the
key's id and name, or ``anonymous`` with the id of the key that was presented), the
action (``task.cancel``, ``queue.pause``, ...), the resource of its path, the outcome
(``ok``, ``denied``, ``error``) and status, the trace id, the client's address and user
agent, and what the route added (``taskmesh.security.audit.note``: a reason, a bulk filter and
count). A change's event commits in the change's own transaction
(:data:`taskmesh.store.postgres.BEFORE_COMMIT`); the others are written when the answer
is sent. A failure to write an event is logged (``audit_unwritten``) and does not turn
a done change into an error.
"""

from __future__ import annotations

from functools import partial

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from taskmesh.api.state import AppState
from taskmesh.errors import StoreError
from taskmesh.observability.logs import get_logger
from taskmesh.observability.tracing import trace_id_from_headers
from taskmesh.security import audit
from taskmesh.security import keys as api_keys
from taskmesh.store.postgres import BEFORE_COMMIT

log = get_logger("taskmesh.security.audit")

ACTIONS = {
    "create_task": "task.create",
    "create_batch": "task.create_batch",
    "cancel_task": "task.cancel",
    "retry_task": "task.retry",
    "delete_task": "task.delete",
    "bulk": "tasks.bulk",
    "pause_queue": "queue.pause",
    "resume_queue": "queue.resume",
    "replay": "dlq.replay",
    "trigger_schedule": "schedule.trigger",
    "pause_schedule": "schedule.pause",
    "resume_schedule": "schedule.resume",
    "create_key": "key.create",
    "revoke_key": "key.revoke",
    "rotate_key": "key.rotate",
    "create_workflow": "workflow.create",
    "create_workflow_batch": "workflow.create_batch",
    "cancel_workflow": "workflow.cancel",
    "retry_workflow": "workflow.retry",
    "set_limit": "limit.set",
    "unset_limit": "limit.unset",
}
"""Each changing route's action name; other routes are named ``<method> <path template>``."""
RESOURCES = {
    "task_id": "task",
    "queue": "queue",
    "name": "schedule",
    "key_id": "key",
    "operation_id": "operation",
    "workflow_id": "workflow",
    "limit": "limit",
}
"""The path parameter that names each route's resource, and its type."""
_CHANGING = ("POST", "PUT", "PATCH", "DELETE")


class AuditTrail:
    """The middleware: ``state`` gives the PostgreSQL store events are written to."""

    def __init__(self, app: ASGIApp, state: AppState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        client = scope.get("client")
        event = audit.AuditEvent(
            action="",
            trace_id=trace_id_from_headers(headers),
            client_addr=client[0] if client else None,
            user_agent=headers.get("user-agent"),
        )
        event.prepare = partial(self._describe, scope, headers, event)
        finished = False

        async def send_status(message: Message) -> None:
            nonlocal finished
            if message["type"] == "http.response.start" and not finished:
                # Recorded before the answer leaves: a client that got its 403 finds the event, and
                # a client's calls one after another are recorded in that order.
                finished = True
                await self._finish(scope, headers, event, message["status"])
            await send(message)

        event_token = audit.CURRENT.set(event)
        hook_token = BEFORE_COMMIT.set(audit.write_before_commit)
        try:
            await self.app(scope, receive, send_status)
        finally:
            BEFORE_COMMIT.reset(hook_token)
            audit.CURRENT.reset(event_token)
            if not finished:  # no answer was started (the app raised): the server answers 500
                await self._finish(scope, headers, event, 500)

    async def _finish(self, scope: Scope, headers: dict[str, str], event: audit.AuditEvent, status: int) -> None:
        if scope.get("endpoint") is None:  # no route matched (404, 405): nothing was attempted
            return
        denied = status in (401, 403) or "refused" in event.details  # 429: too many refused authentications
        if not denied and (scope["method"] not in _CHANGING or event.read_only):
            return
        self._describe(scope, headers, event)
        outcome = "denied" if denied else ("ok" if status < 400 else "error")
        if event.written and outcome != "ok":
            # The change committed, then the request failed: a second event says how it ended.
            event.written = False
        event.outcome, event.status = outcome, status
        if (denied or status == 429) and not self.state.denials.admit(event):
            return  # one more of a kind already recorded in this window: counted in its summary row
        if not event.written and self.state.stores is not None:
            try:
                await audit.write(self.state.stores.pg, event)
            except StoreError as exc:
                log.warning("audit_unwritten", action=event.action, error=str(exc))
        audit.emit(event)

    @staticmethod
    def _describe(scope: Scope, headers: dict[str, str], event: audit.AuditEvent) -> None:
        endpoint = scope.get("endpoint")
        route = scope.get("route")
        path = getattr(route, "path", scope["path"])
        name = getattr(endpoint, "__name__", "")
        event.action = event.action or ACTIONS.get(name, f"{scope['method']} {path}")
        for param, value in (scope.get("path_params") or {}).items():
            if param in RESOURCES and event.resource_type is None:
                event.resource_type, event.resource_id = RESOURCES[param], str(value)[:200]
        principal = (scope.get("state") or {}).get("principal")
        if principal is not None and principal.key_id is not None:
            event.actor_type, event.actor_id, event.actor_name = "key", principal.key_id, principal.name
            event.tenant_id = principal.tenant_id or event.tenant_id
        elif principal is None:
            scheme, _, value = headers.get("authorization", "").partition(" ")
            presented = value.strip() if scheme.lower() == "bearer" else headers.get("x-api-key", "")
            parsed = api_keys.parse(presented)
            event.actor_id = parsed[0] if parsed else None  # the id only: never the secret
