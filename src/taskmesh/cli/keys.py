"""``taskmesh keys create|list|revoke|rotate``: API keys, over an instance's API or in PostgreSQL directly.

Given an instance's URL (``--url`` or ``TASKMESH_URL``, before or after the command),
they go through its ``/api/v1/keys`` routes with an API key holding ``keys:admin``
(which can give only what it holds, within its tenant and queues; the audit log names
it). Without one they work in the database directly (``DATABASE_URL``), so that the
first admin key can be made before any key exists (whoever holds the database URL
holds the deployment anyway); the audit log names the OS user. Both ways print the
same answers. A key is printed once, at creation, and never again: only its hash is
stored.
"""

from __future__ import annotations

import getpass
import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import anyio
import typer

from taskmesh.cli import common
from taskmesh.cli.api import Api, given_url, segment
from taskmesh.cli.apps import App
from taskmesh.cli.exit_codes import EPILOG, ExitCode
from taskmesh.cli.output import note, print_json, print_table, say, when
from taskmesh.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from taskmesh.store import PgStore

app = App(
    help="Make, list, revoke and rotate API keys: through an instance's API given --url or TASKMESH_URL, "
    "else in the database (DATABASE_URL).",
    epilog=EPILOG,
    rich_markup_mode="markdown",
    no_args_is_help=True,
)

T = TypeVar("T")
KeyId = Annotated[str, typer.Argument(help="The key's id (the part after tmk_, 16 characters).", metavar="KEY_ID")]
_DURATION = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str, flag: str) -> timedelta:
    """``90d``, ``12h``, ``30m`` or ``45s`` as a ``timedelta``.

    :raises typer.BadParameter: anything else (naming ``flag``).
    """
    match = _DURATION.fullmatch(text)
    if match is None or int(match.group(1)) == 0:
        raise typer.BadParameter(
            f"{text!r} is not a duration above zero such as 90d, 12h, 30m or 45s", param_hint=f"'{flag}'"
        )
    return timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])


_OPTION_OF = {"scopes": "--scope", "queues": "--queue", "tenant_id": "--tenant-id", "rate_limits": "--rate-limit"}
"""The option of each field ``api_keys.create`` may refuse."""


def _with_pg(action: Callable[[PgStore], Awaitable[T]], audit_as: str | None = None) -> T:
    """Open PostgreSQL (``DATABASE_URL``), run ``action``, close it.

    :param audit_as: record the action in the audit log under this name, as the ``cli`` actor
        with the OS user (what ``action`` notes, and how it ended).

    :raises ConfigError: ``DATABASE_URL`` missing (exit 2), naming ``--url`` too.
    :raises StoreError: PostgreSQL refused or is down (exit 1 or 5).
    """
    from taskmesh.config import load_settings
    from taskmesh.observability.logs import configure
    from taskmesh.store import PgStore

    settings = load_settings()
    configure("warning", settings.log_format)
    if not settings.database_url:
        raise ConfigError(
            "keys needs an instance's API (--url or TASKMESH_URL, with a key holding keys:admin) or the "
            "deployment's database (DATABASE_URL, as the instances have it)"
        )
    database_url = settings.database_url

    async def go() -> T:
        pg = await PgStore.connect(database_url, size=2, pooler=settings.pg_pooler)
        try:
            if audit_as is None:
                return await action(pg)
            return await _audited(pg, action, audit_as)
        finally:
            await pg.close()

    try:
        return anyio.run(go)
    except StoreError as exc:
        if exc.detail.startswith("UndefinedTableError"):
            raise ConfigError(
                "the database of DATABASE_URL has no taskmesh tables (or not those of this version) yet: run "
                "`taskmesh migrate` first"
            ) from None
        raise


def _through_api(url: str | None, api_key: str | None, call: Callable[[Api], T]) -> T | None:
    """``call`` on the API when a URL is given (:func:`~taskmesh.cli.api.given_url`), else ``None``.

    :raises ApiError: the API refused or could not be reached (its exit status: 3 for no such key).
    """
    if given_url(url) is None:
        return None
    with Api(url, api_key) as api:
        return call(api)


def _rates(given: list[str]) -> dict[str, float]:
    """``--rate-limit write=5`` options as ``{"write": 5.0}`` (classes and ranges are checked by create)."""
    rates: dict[str, float] = {}
    for item in given:
        name, sep, value = item.partition("=")
        try:
            rates[name.strip()] = float(value)
        except ValueError:
            sep = ""
        if not sep:
            raise typer.BadParameter(f"{item!r} is not <class>=<requests per second>", param_hint="'--rate-limit'")
    return rates


async def _audited(pg: PgStore, action: Callable[[PgStore], Awaitable[T]], name: str) -> T:
    """``action`` recorded in the audit log as the ``cli`` actor with the OS user."""
    from taskmesh.security import audit

    event = audit.AuditEvent(name, actor_type="cli", actor_id=getpass.getuser(), actor_name="taskmesh keys")
    async with audit.recorded(pg, event):
        return await action(pg)


@app.command("create")
def create(
    name: Annotated[
        str,
        typer.Option("--name", help="Who the key is for (a person, a service); 1 to 128 characters.", metavar="NAME"),
    ],
    role: Annotated[
        str | None,
        typer.Option(
            "--role", help="viewer, operator or admin: a named set of scopes (see the README).", metavar="ROLE"
        ),
    ] = None,
    scope: Annotated[
        list[str] | None,
        typer.Option(
            "--scope",
            help="A scope (tasks:read, tasks:write, ...); repeat for several; adds to --role.",
            metavar="SCOPE",
        ),
    ] = None,
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="The key stops working after this: 90d, 12h, 30m.", metavar="DURATION"),
    ] = None,
    tenant_id: Annotated[
        str | None,
        typer.Option(
            "--tenant-id",
            help="Bind the key to this tenant: it sees and makes only the tenant's tasks.",
            metavar="TENANT",
        ),
    ] = None,
    queue: Annotated[
        list[str] | None,
        typer.Option(
            "--queue", help="Bind the key to this queue; repeat for several (default: every queue).", metavar="QUEUE"
        ),
    ] = None,
    rate_limit: Annotated[
        list[str] | None,
        typer.Option(
            "--rate-limit",
            help="The key's own requests per second of a class, instead of the settings': write=5; repeat for "
            "read, write, admin.",
            metavar="CLASS=RATE",
        ),
    ] = None,
    url: common.ApiOrStoresUrl = None,
    api_key: common.ApiKey = None,
    json: common.StoresJson = False,
) -> None:
    """Make an API key and print it once (only its hash is kept).

    Examples:

    ```
    taskmesh keys create --name admin --role admin
    taskmesh keys create --name grafana --scope tasks:read --scope workers:read --expires-in 90d
    taskmesh keys create --name acme-app --scope tasks:read --scope tasks:write --tenant-id acme
    taskmesh --url http://tm.internal:8080 keys create --name ci --role operator   # TASKMESH_API_KEY: keys:admin
    ```
    """
    from taskmesh.security import keys as api_keys

    scopes = list(api_keys.ROLES.get(role, ())) if role else []
    if role and role not in api_keys.ROLES:
        raise typer.BadParameter(f"{role!r} is not one of {', '.join(api_keys.ROLES)}", param_hint="'--role'")
    scopes += scope or []
    lifetime = duration(expires_in, "--expires-in") if expires_in else None
    rates = _rates(rate_limit) if rate_limit else None

    def api_create(api: Api) -> dict[str, Any]:
        body: dict[str, Any] = {"name": name, "scopes": scope or []}
        optional = {"role": role, "tenant_id": tenant_id, "queues": queue, "rate_limits": rates}
        body.update({k: v for k, v in optional.items() if v is not None})
        if lifetime is not None:
            body["expires_in_seconds"] = int(lifetime.total_seconds())
        made: dict[str, Any] = api.post("/api/v1/keys", body).body
        return made

    async def go(pg: PgStore) -> api_keys.NewKey:
        from taskmesh.security import audit

        expires_at = datetime.now(UTC) + lifetime if lifetime is not None else None
        new = await api_keys.create(
            pg, name, scopes, tenant_id=tenant_id, queues=queue, expires_at=expires_at, rate_limits=rates
        )
        audit.note(resource_type="key", resource_id=new.record["key_id"], tenant_id=tenant_id)
        return new

    made = _through_api(url, api_key, api_create)
    if made is None:
        new = _bad_input(lambda: _with_pg(go, "key.create"))
        made = {"key": new.key, **new.record, "state": "active"}
    if json:
        print_json(made)
        return
    say(made["key"])
    bound = "".join(
        [
            f" in tenant {made['tenant_id']}" if made["tenant_id"] else "",
            f" on queues {','.join(made['queues'])}" if made["queues"] else "",
        ]
    )
    note(
        f"key {made['key_id']} for {name}{bound}: {', '.join(made['scopes'])}; it is shown once, "
        "keep it now (Authorization: Bearer <key>, or TASKMESH_API_KEY for the CLI)"
    )


@app.command("list")
def list_keys(
    url: common.ApiOrStoresUrl = None, api_key: common.ApiKey = None, json: common.StoresJson = False
) -> None:
    """List the keys, newest first: name, scopes, tenant and queues, state, expiry, last use.

    Examples:

    ```
    taskmesh keys list
    taskmesh keys list --json | jq '.keys[] | select(.state == "active") | .key_id'
    ```
    """
    from taskmesh.security import keys as api_keys

    async def go(pg: PgStore) -> list[dict[str, Any]]:
        rows = await pg.keys.list(api_keys.LIST_MOST)
        return [{**api_keys.record(r), "state": api_keys.state(r)} for r in rows]

    keys = _through_api(url, api_key, lambda api: list(api.get("/api/v1/keys").body["keys"]))
    if keys is None:
        keys = _with_pg(go)
    if json:
        print_json({"keys": keys})
        return
    print_table(
        ("KEY ID", "NAME", "STATE", "SCOPES", "TENANT", "QUEUES", "EXPIRES (UTC)", "LAST USED (UTC)"),
        [
            (
                k["key_id"],
                k["name"],
                k["state"],
                ",".join(k["scopes"]),
                k["tenant_id"],
                None if k["queues"] is None else ",".join(k["queues"]),
                when(k["expires_at"]),
                when(k["last_used_at"]),
            )
            for k in keys
        ],
    )


@app.command("revoke")
def revoke(
    key_id: KeyId, url: common.ApiOrStoresUrl = None, api_key: common.ApiKey = None, json: common.StoresJson = False
) -> None:
    """Revoke a key: every instance refuses it within 5 seconds. Kept, as revoked, for the record.

    Examples:

    ```
    taskmesh keys revoke 3kq7vz2mfa4xw5rt
    ```
    """
    from taskmesh.security import keys as api_keys

    async def go(pg: PgStore) -> Any:
        from taskmesh.security import audit

        row = await pg.keys.revoke(key_id)
        if row is not None:
            audit.note(resource_type="key", resource_id=key_id, tenant_id=row["tenant_id"])
        return row

    revoked = _through_api(url, api_key, lambda api: dict(api.post(f"/api/v1/keys/{segment(key_id)}/revoke").body))
    if revoked is None:
        row = _with_pg(go, "key.revoke")
        if row is None:
            note(f"taskmesh: error: no key has id {key_id}")
            raise typer.Exit(int(ExitCode.NOT_FOUND))
        revoked = {**api_keys.record(row), "state": "revoked"}
    if json:
        print_json(revoked)
    else:
        say(f"{key_id}: revoked")


@app.command("rotate")
def rotate(
    key_id: KeyId,
    overlap: Annotated[
        str,
        typer.Option("--overlap", help="How long the old key keeps working: 24h, 30m, 7d.", metavar="DURATION"),
    ] = "24h",
    expires_in: Annotated[
        str | None,
        typer.Option("--expires-in", help="The new key stops working after this: 90d, 12h.", metavar="DURATION"),
    ] = None,
    url: common.ApiOrStoresUrl = None,
    api_key: common.ApiKey = None,
    json: common.StoresJson = False,
) -> None:
    """Make a new key like KEY_ID (name, scopes) and end the old one after --overlap (sooner if it expires).

    The new key is made with the old key's lifetime, counted from now (none if the old key had
    none), unless --expires-in gives one. A revoked or expired key is not rotated.

    Examples:

    ```
    taskmesh keys rotate 3kq7vz2mfa4xw5rt
    taskmesh keys rotate 3kq7vz2mfa4xw5rt --overlap 1h --expires-in 90d
    ```
    """
    from taskmesh.security import keys as api_keys

    window = duration(overlap, "--overlap")
    lifetime = duration(expires_in, "--expires-in") if expires_in else None

    def api_rotate(api: Api) -> dict[str, Any]:
        body: dict[str, Any] = {"overlap_seconds": int(window.total_seconds())}
        if lifetime is not None:
            body["expires_in_seconds"] = int(lifetime.total_seconds())
        rotated: dict[str, Any] = api.post(f"/api/v1/keys/{segment(key_id)}/rotate", body).body
        return rotated

    async def go(pg: PgStore) -> tuple[api_keys.NewKey, str | None] | None:
        from taskmesh.security import audit

        expires_at = datetime.now(UTC) + lifetime if lifetime is not None else None
        try:
            rotated = await api_keys.rotate(pg, key_id, window, expires_at=expires_at)
        except LookupError:
            return None
        audit.note(resource_type="key", resource_id=key_id, details={"new_key_id": rotated[0].record["key_id"]})
        return rotated

    made = _through_api(url, api_key, api_rotate)
    if made is None:
        rotated = _with_pg(go, "key.rotate")
        if rotated is None:
            note(f"taskmesh: error: no active key has id {key_id} (revoked, expired or unknown)")
            raise typer.Exit(int(ExitCode.NOT_FOUND))
        new, old_ends = rotated
        made = {
            "key": new.key,
            **new.record,
            "state": "active",
            "replaces": key_id,
            "replaced_key_expires_at": old_ends,
        }
    if json:
        print_json(made)
        return
    say(made["key"])
    note(
        f"key {made['key_id']} replaces {key_id}, which works until {when(made['replaced_key_expires_at'])} UTC; "
        "the new key is shown once"
    )


def _bad_input(call: Callable[[], T]) -> T:
    from taskmesh.errors import InvalidTaskError

    try:
        return call()
    except InvalidTaskError as exc:
        field, _, within = exc.field.partition(".")
        detail = f"{within}: {exc.message}" if within else exc.message  # rate_limits.write: the class
        raise typer.BadParameter(detail, param_hint=f"'{_OPTION_OF.get(field, '--' + field)}'") from None
