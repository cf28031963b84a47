"""Settings of one taskmesh instance: a TOML file overridden by environment variables.

Sources, highest first: environment variables, the TOML file named by
``TASKMESH_CONFIG`` (default ``taskmesh.toml`` in the working directory, if
present), the defaults below. The original platform's variables keep their
names (``HTTP_PORT``, ``DATABASE_URL``, ``REDIS_URL``, ``QUEUE_NAMES``,
``WORKER_CONCURRENCY``); every other key is ``TASKMESH_<KEY>`` in the
environment and ``<key>`` in the TOML file.

Invalid settings raise :class:`~taskmesh.errors.ConfigError` naming the key;
the CLI turns that into exit status 2.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from functools import cached_property
from pathlib import Path
from typing import Annotated, Any, Literal

import orjson
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from taskmesh.errors import ConfigError, CronSpecError, InvalidTaskError
from taskmesh.limits.settings import FairnessSettings, LimitSettings, check_names
from taskmesh.schedules.cron import CronSpec, load_zone
from taskmesh.store.redis_urls import check_redis_url, cluster_url_problem
from taskmesh.tasks.validation import MAX_DELAY_LIMIT, MAX_DELAY_SECONDS

MAX_WORKER_PROCESSES = 256
"""The most processes ``worker_processes`` may ask for."""


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), 1 to :data:`MAX_WORKER_PROCESSES`.

    What ``worker_processes = "auto"`` means.
    """
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(MAX_WORKER_PROCESSES, usable))


NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
"""Allowed task and queue names: letters, digits, ``_ . : -``, 1-128 chars."""
_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.\[\]:-]+$")
"""A web origin as browsers send it in ``Origin``: scheme and host, maybe a port, nothing after."""


def _aliases(key: str, legacy: str | None = None) -> AliasChoices:
    """A key's names: bare in TOML (and as a keyword), ``TASKMESH_<KEY>`` in the environment, then ``legacy``.

    :class:`EnvironmentSource` reads the environment by the names after the first, in order.
    """
    names = [key, f"TASKMESH_{key.upper()}"]
    if legacy:
        names.append(legacy)
    return AliasChoices(*names)


class EnvironmentSource(EnvSettingsSource):
    """The environment, by a key's ``TASKMESH_<KEY>`` and, for the original platform's six keys, its old name.

    pydantic-settings' own source reads every alias of a key, and its bare TOML name among them: a
    ``LOG_LEVEL`` or ``PREFETCH`` meant for another program in the same environment set taskmesh's,
    and ``HTTP_PORT`` (the bare name of ``http_port`` too) won over ``TASKMESH_HTTP_PORT``. Here a
    key is read from ``TASKMESH_<KEY>`` first, then from its old name when it has one
    (``DATABASE_URL``, ``REDIS_URL``, ``HTTP_HOST``, ``HTTP_PORT``, ``QUEUE_NAMES``,
    ``WORKER_CONCURRENCY``), and never from its bare name.
    """

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        """``(value or None, the name it was found by, whether it is complex)``, as the base class answers."""
        # (key, env name, complex): one per alias of _aliases in order (the bare one first), then the
        # field's own name again (populate_by_name), also bare: only those in between are read
        infos = self._extract_field_info(field, field_name)
        aliases = field.validation_alias.choices if isinstance(field.validation_alias, AliasChoices) else [field_name]
        for key, env_name, complex_ in infos[1 : len(aliases)]:
            value = self.env_vars.get(env_name)
            if value is not None:
                return value, key, complex_
        key, _, complex_ = infos[0]
        return None, key, complex_


class QueueSettings(BaseModel):
    """Per-queue settings (``[queues.<name>]`` in TOML)."""

    model_config = ConfigDict(extra="forbid")

    concurrency: int = Field(default=1, ge=1, le=1024)
    """Executors running handlers of this queue at once."""
    prefetch: int | None = Field(default=None, ge=0, le=1000)
    """Tasks claimed ahead of free executors (default: the global ``prefetch``)."""
    fairness: FairnessSettings | None = None
    """Fair shares between the keys of the queue (``limits/settings.py``); default none: first come, first served."""
    priority_aging_seconds: float | None = Field(default=None, gt=0, le=30 * 86400, allow_inf_nan=False)
    """Seconds of waiting worth one priority level: a waiting task's priority rises with its wait, so that low
    priority work starts within ``(difference in priority) x this`` under a flood of higher priority work.
    Default none: priority alone orders the queue."""

    @model_validator(mode="after")
    def _aging_or_fairness(self) -> QueueSettings:
        if self.fairness is not None and self.priority_aging_seconds is not None:
            raise ValueError("give fairness or priority_aging_seconds, not both (they order the queue two ways)")
        return self


StrictInt = Annotated[int, Strict()]
StrictBool = Annotated[bool, Strict()]
StrictFloat = Annotated[float, Strict()]  # ints are accepted, booleans and strings are not
MISFIRE_ALL_CAP = 1000
"""Most missed fires the ``all`` policy makes after one outage (the most recent ones)."""


class TenantQuota(BaseModel):
    """A tenant's quotas (``[tenant_quotas.<tenant>]`` in TOML; each unset one is no limit).

    Checked on every create through the API, whichever key makes the task; a refusal is a
    problem+json naming the quota (429, or 413 for payload bytes).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_queued: StrictInt | None = Field(default=None, ge=1, le=100_000_000)
    """Most tasks of the tenant queued or running at once; a create beyond it is refused (429)."""
    max_payload_bytes: StrictInt | None = Field(default=None, ge=2, le=64 * 1024 * 1024)
    """Most bytes of one task's payload as JSON (413)."""
    enqueue_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    """Tasks the tenant may create per second, over every key and instance, with bursts of
    ``rate_limit_burst_seconds`` of it (429 with ``Retry-After``)."""
    read_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    """Read requests per second of all the tenant's keys together (each key keeps its own limit too)."""
    write_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    """Write requests per second of all the tenant's keys together."""
    admin_per_second: StrictFloat | None = Field(default=None, gt=0, le=1_000_000, allow_inf_nan=False)
    """Admin requests per second of all the tenant's keys together."""


class ScheduleSettings(BaseModel):
    """One ``[[schedules]]`` table: a cron spec that makes a task per fire.

    Each fire creates a task of ``type = "cron"`` whose idempotency key is
    ``cron:{name}:{fire time in UTC, ISO 8601}``, so instances firing the same
    time make one task. Field docs name units and defaults.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=NAME_PATTERN.pattern)
    """Unique name, ``[A-Za-z0-9_.:-]{1,128}``."""
    cron: str
    """5 fields, 6 with seconds first, or an alias (``@hourly``, ``@daily``, ...); see ``taskmesh.schedules.cron``."""
    timezone: str = "UTC"
    """IANA zone whose wall-clock time the spec follows."""
    task: str = Field(pattern=NAME_PATTERN.pattern)
    """Handler name of the tasks it makes."""
    queue: str | None = Field(default=None, pattern=NAME_PATTERN.pattern)
    """Queue of the tasks (default: the handler's queue, else ``default``)."""
    priority: StrictInt = Field(default=0, ge=0, le=1000)
    payload: Any = Field(default_factory=dict)
    """Any JSON value, given to every task as is."""
    max_retries: StrictInt | None = Field(default=None, ge=0, le=100)
    misfire: Literal["skip", "once", "all"] = "once"
    """What to do with fire times missed while no scheduler ran: none, the most recent, every one
    (at most 1,000)."""
    misfire_grace_seconds: StrictFloat = Field(default=60.0, ge=0, le=7 * 86400, allow_inf_nan=False)
    """A fire made later than this after its time is a misfire, seconds."""
    overlap: Literal["allow", "skip"] = "allow"
    """``skip``: no fire while the previous fire's task is still queued or running."""
    enabled: StrictBool = True
    tenant_id: str | None = Field(default=None, min_length=1, max_length=128)
    """The tenant its tasks belong to; only keys of that tenant (or of none) see the schedule."""

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be empty (5 fields, 6 with seconds first, or an alias like @daily)")
        try:
            CronSpec(value, "UTC")
        except CronSpecError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("timezone")
    @classmethod
    def _check_zone(cls, value: str) -> str:
        try:
            load_zone(value)
        except CronSpecError as exc:
            raise ValueError(str(exc)) from None
        return value

    @field_validator("payload")
    @classmethod
    def _check_payload(cls, value: Any) -> Any:
        from taskmesh.tasks.validation import check_json

        try:
            check_json(value, "payload")
            orjson.dumps(value)
        except InvalidTaskError as exc:
            raise ValueError(exc.message) from None
        except TypeError as exc:
            raise ValueError(f"is not JSON-serialisable: {exc}") from None
        return value

    @cached_property
    def spec(self) -> CronSpec:
        """The parsed cron spec in the schedule's zone."""
        return CronSpec(self.cron, self.timezone)

    def config_hash(self) -> str:
        """SHA-256 (hex) of the declaration; a change resets pause state and the next fire."""
        # Without a tenant the hash is what it was before tenants existed: an upgrade keeps pauses.
        declared = self.model_dump(exclude={"tenant_id"} if self.tenant_id is None else None)
        return hashlib.sha256(orjson.dumps(declared, option=orjson.OPT_SORT_KEYS)).hexdigest()


def _check_schedules(value: Any) -> list[ScheduleSettings]:
    """Validate every ``[[schedules]]`` entry; each error names the schedule and the key.

    :raises ValueError: ``schedules[nightly].cron: '0 0 30 2 *' can never fire (no such date)``,
        one line per problem, all entries checked.
    """
    if not isinstance(value, list):
        raise ValueError("schedules: must be a list of tables ([[schedules]] in TOML, a JSON array in the environment)")
    problems: list[str] = []
    out: list[ScheduleSettings] = []
    seen: set[str] = set()
    for i, entry in enumerate(value):
        label = entry.get("name") if isinstance(entry, dict) else None
        where = f"schedules[{label}]" if isinstance(label, str) and label else f"schedules[{i}]"
        if isinstance(entry, ScheduleSettings):
            parsed = entry
        elif not isinstance(entry, dict):
            problems.append(f"{where}: must be a table with at least name, cron and task")
            continue
        else:
            try:
                parsed = ScheduleSettings.model_validate(entry)
            except ValidationError as exc:
                for err in exc.errors():
                    key = ".".join(str(p) for p in err["loc"])
                    message = err["msg"].removeprefix("Value error, ")
                    if err["type"] == "extra_forbidden":
                        message = "unknown key"
                    elif err["type"] == "missing":
                        message = "required"
                    problems.append(f"{where}.{key}: {message}" if key else f"{where}: {message}")
                continue
        if parsed.name in seen:
            problems.append(f"{where}.name: duplicate schedule name {parsed.name!r}")
        seen.add(parsed.name)
        out.append(parsed)
    if problems:
        raise ValueError("; ".join(problems))
    return out


class Settings(BaseSettings):
    """All settings of an instance; field docs name units and defaults."""

    model_config = SettingsConfigDict(extra="forbid", populate_by_name=True)

    database_url: str | None = Field(default=None, validation_alias=_aliases("database_url", "DATABASE_URL"))
    """PostgreSQL URL (``postgresql://user@host:5432/db``); required except for ``dev``."""
    redis_url: str | None = Field(default=None, validation_alias=_aliases("redis_url", "REDIS_URL"))
    """Redis URL (``redis://host:6379/0``, ``rediss://`` for TLS, or
    ``redis+sentinel://host:26379,host:26379/master-name/0`` behind Sentinel); required except for ``dev``."""
    redis_mode: Literal["standalone", "cluster"] = Field(default="standalone", validation_alias=_aliases("redis_mode"))
    """``cluster`` when ``redis_url`` names a node of a Redis Cluster (the client learns the others;
    database 0 only); ``standalone`` for one server, perhaps behind Sentinel."""
    http_host: str = Field(default="127.0.0.1", validation_alias=_aliases("http_host", "HTTP_HOST"))
    """Address the HTTP API binds; ``0.0.0.0`` to serve other hosts."""
    http_port: int = Field(default=8080, ge=0, le=65535, validation_alias=_aliases("http_port", "HTTP_PORT"))
    """Port of the HTTP API (0 picks a free one)."""
    auth: Literal["keys", "none"] = Field(default="keys", validation_alias=_aliases("auth"))
    """``keys``: every ``/api/v1`` route needs an API key with its scope (``taskmesh keys create``);
    an instance on a loopback address runs open while no key exists, and one on another address
    refuses to start without a key. ``none``: no key is asked for anywhere (say so explicitly)."""
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias=_aliases("allowed_hosts")
    )
    """Names the API answers in the ``Host`` header (``*``: any; ``*.example.com``: its subdomains;
    comma-separated in the environment). Empty (the default): the loopback names when the API
    listens on a loopback address (DNS rebinding cannot reach it), any name otherwise."""
    rate_limit_read_per_second: float = Field(
        default=200.0, gt=0, le=1_000_000, validation_alias=_aliases("rate_limit_read_per_second")
    )
    """Sustained reads an API key may make, per second, over all instances (GET routes)."""
    rate_limit_write_per_second: float = Field(
        default=1000.0, gt=0, le=1_000_000, validation_alias=_aliases("rate_limit_write_per_second")
    )
    """Sustained writes an API key may make, per second, over all instances (creates, cancels,
    retries, replays, deletes, bulk actions)."""
    rate_limit_admin_per_second: float = Field(
        default=10.0, gt=0, le=1_000_000, validation_alias=_aliases("rate_limit_admin_per_second")
    )
    """Sustained admin calls (queue and schedule pause, resume, trigger) per key, per second."""
    rate_limit_burst_seconds: float = Field(
        default=2.0, gt=0, le=3600, validation_alias=_aliases("rate_limit_burst_seconds")
    )
    """A key may spend this many seconds' worth of its rate at once after a quiet spell (at least 1 request)."""
    auth_refusals_per_minute: float = Field(
        default=60.0, gt=0, le=1_000_000, validation_alias=_aliases("auth_refusals_per_minute")
    )
    """Refused authentications (401: no usable key or session; refused console sign-ins) one client
    address (an IPv6 /64) may have a minute over all instances, all at once after a quiet spell; past
    it they answer 429 with ``Retry-After``. Requests with a working key are not counted."""
    metrics_auth: Literal["open", "scope"] = Field(default="open", validation_alias=_aliases("metrics_auth"))
    """``open``: ``/metrics`` answers anyone (Prometheus scrapes it; put it behind your network's
    rules); ``scope``: it needs a key with ``metrics:read``, like the API."""
    console_enabled: bool = Field(default=True, validation_alias=_aliases("console_enabled"))
    """Serve the web console under ``/console`` wherever the API is served (``api_enabled``)."""
    console_session_hours: float = Field(default=8.0, gt=0, le=720, validation_alias=_aliases("console_session_hours"))
    """How long a console sign-in lasts, hours (the session also ends with its key)."""
    metrics_port: int | None = Field(default=None, ge=0, le=65535, validation_alias=_aliases("metrics_port"))
    """Serve ``/metrics`` (with ``/healthz`` and ``/readyz``) on this port of ``metrics_host``, and not
    on the API's port: the API may then face users while the metrics port faces only Prometheus
    (0: a free port). Unset (the default): ``/metrics`` is on the API's port."""
    metrics_host: str | None = Field(default=None, validation_alias=_aliases("metrics_host"))
    """Address of ``metrics_port`` (default: ``http_host``)."""
    cors_allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias=_aliases("cors_allowed_origins")
    )
    """Web origins (``https://ops.example.com``; ``*`` for any) whose pages may call the API from a
    browser with a key (CORS). Empty (the default): no CORS headers, so no other site's script can
    read an answer. Comma-separated in the environment."""
    http_max_header_bytes: int = Field(
        default=65536, ge=1024, le=1048576, validation_alias=_aliases("http_max_header_bytes")
    )
    """Largest request line plus headers of one request, bytes (through the blank line ending them);
    past it, or past 100 header fields, the answer is 431 and the connection closes. At most 1 MiB:
    an instance may hold this much for each of its ``http_max_connections`` connections."""
    http_read_timeout_seconds: float = Field(
        default=30.0, gt=0, le=3600, validation_alias=_aliases("http_read_timeout_seconds")
    )
    """Time a request's headers and body get to arrive, counted from its first byte, seconds;
    past it the answer is 408 (when nothing was answered yet) and the connection closes."""
    http_max_connections: int = Field(
        default=1000, ge=1, le=1_000_000, validation_alias=_aliases("http_max_connections")
    )
    """Open HTTP connections an instance keeps; one more is closed as soon as it is accepted."""
    http_max_connections_per_address: int = Field(
        default=100, ge=1, le=1_000_000, validation_alias=_aliases("http_max_connections_per_address")
    )
    """Open HTTP connections one client address keeps (an IPv6 one by its /64); one more is closed as
    soon as it is accepted, so one host cannot hold every connection of ``http_max_connections``.
    Behind a proxy every connection is the proxy's: raise it to ``http_max_connections`` there and let
    the proxy limit each client (the README's Deployment section)."""
    queue_names: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["default"], validation_alias=_aliases("queue_names", "QUEUE_NAMES")
    )
    """Queues this instance works (comma-separated in the environment)."""
    worker_concurrency: int = Field(
        default=1, ge=1, le=1024, validation_alias=_aliases("worker_concurrency", "WORKER_CONCURRENCY")
    )
    """Executors per queue unless ``[queues.<name>] concurrency`` says otherwise."""
    queues: dict[str, QueueSettings] = Field(default_factory=dict, validation_alias=_aliases("queues"))
    """Per-queue settings, ``[queues.<name>]``: ``concurrency``, ``prefetch``, ``fairness`` (fair shares
    between the keys of the queue) or ``priority_aging_seconds``; see the flow-control guide."""
    prefetch: int = Field(default=0, ge=0, le=1000, validation_alias=_aliases("prefetch"))
    """Tasks each queue claims ahead of its free executors. 0 (the default) keeps priority
    order strict; more overlaps the next claim with the current runs (throughput), at the
    price that a task claimed ahead runs before a higher-priority one enqueued after it."""
    handlers: Annotated[list[str], NoDecode] = Field(default_factory=list, validation_alias=_aliases("handlers"))
    """Modules imported at start so that their ``@taskmesh.task`` handlers register."""
    redis_prefix: str = Field(
        default="taskmesh", min_length=1, max_length=64, validation_alias=_aliases("redis_prefix")
    )
    """Prefix of every Redis key taskmesh writes."""
    shutdown_grace_seconds: float = Field(
        default=30.0, ge=0, le=3600, validation_alias=_aliases("shutdown_grace_seconds")
    )
    """Seconds in-flight runs get to finish after SIGTERM/SIGINT."""
    schema_error_window_seconds: float = Field(
        default=60.0, gt=0, le=3600, validation_alias=_aliases("schema_error_window_seconds")
    )
    """How long ``/readyz`` stays 503 after a statement PostgreSQL refused against its schema (this
    release and the database's schema disagree: run ``taskmesh migrate``, or replace the instance),
    seconds; it turns 200 again once none was refused for that long."""
    loop_block_threshold_seconds: float = Field(
        default=1.0, ge=0.25, le=600, validation_alias=_aliases("loop_block_threshold_seconds")
    )
    """Time the event loop may go without turning before it counts as blocked, seconds (logged as
    ``event_loop_blocked`` and counted; see ``taskmesh.runtime.loop_monitor``). At least 0.25: more than
    two of the loop monitor's 0.1 s ticks."""
    lease_seconds: float = Field(default=30.0, gt=0, le=3600, validation_alias=_aliases("lease_seconds"))
    """Length of a run's lease, seconds; the heartbeat renews it every third of that."""
    default_max_retries: int = Field(default=3, ge=0, le=100, validation_alias=_aliases("default_max_retries"))
    """Retries of a task whose request and handler name none."""
    max_delay_seconds: float = Field(
        default=MAX_DELAY_SECONDS, gt=0, le=MAX_DELAY_LIMIT, validation_alias=_aliases("max_delay_seconds")
    )
    """How far ahead a task may be delayed (``delay_seconds``, ``run_at``), seconds; a past ``run_at``
    is always allowed and means now."""
    delayed_poll_seconds: float = Field(default=0.1, gt=0, le=60, validation_alias=_aliases("delayed_poll_seconds"))
    """How often the delayed mover looks for due tasks, seconds."""
    reconcile_interval_seconds: float = Field(
        default=5.0, gt=0, le=3600, validation_alias=_aliases("reconcile_interval_seconds")
    )
    """How often the reconciler sweeps queued tasks missing from Redis, seconds (also their minimum age)."""
    reclaim_interval_seconds: float = Field(
        default=5.0, gt=0, le=3600, validation_alias=_aliases("reclaim_interval_seconds")
    )
    """How often the reclaimer looks for runs whose lease expired, seconds."""
    commit_batch_size: int = Field(default=500, ge=1, le=10000, validation_alias=_aliases("commit_batch_size"))
    """Most run results written by one committer statement."""
    commit_flush_ms: float = Field(default=5.0, ge=0, le=10000, validation_alias=_aliases("commit_flush_ms"))
    """Longest a result waits for companions before the committer writes it, milliseconds."""
    commit_interval_ms: float = Field(default=25.0, ge=0, le=10000, validation_alias=_aliases("commit_interval_ms"))
    """Least time between the starts of two result writes while results keep coming, milliseconds
    (a lone result still waits only ``commit_flush_ms``)."""
    retention_completed_days: float = Field(
        default=7, ge=0, le=36500, validation_alias=_aliases("retention_completed_days")
    )
    """Completed tasks are deleted after this many days (0 keeps them forever)."""
    retention_cancelled_days: float = Field(
        default=7, ge=0, le=36500, validation_alias=_aliases("retention_cancelled_days")
    )
    """Cancelled tasks are deleted after this many days (0 keeps them forever)."""
    retention_failed_days: float = Field(default=90, ge=0, le=36500, validation_alias=_aliases("retention_failed_days"))
    """Dead-lettered tasks are deleted after this many days (0 keeps them forever)."""
    retention_workflows_days: float = Field(
        default=30, ge=0, le=36500, validation_alias=_aliases("retention_workflows_days")
    )
    """Workflows over for this many days are deleted with all their tasks (0 keeps them forever); the
    tasks of a workflow are never deleted by the retention of their own state."""
    workflow_max_nodes: int = Field(default=10_000, ge=1, le=100_000, validation_alias=_aliases("workflow_max_nodes"))
    """Most nodes one workflow may have (a map node counts once)."""
    workflow_map_max_items: int = Field(
        default=10_000, ge=1, le=100_000, validation_alias=_aliases("workflow_map_max_items")
    )
    """Most tasks one map node makes, from its items or from the list its source returned."""
    workflow_parents_max_bytes: int = Field(
        default=4 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, validation_alias=_aliases("workflow_parents_max_bytes")
    )
    """Most bytes of JSON one task of a workflow is handed as its deps' results (``ctx.parents``); over it
    the task fails with an error naming this setting."""
    retention_stats_days: float = Field(default=30, ge=0, le=36500, validation_alias=_aliases("retention_stats_days"))
    """Days the per-minute counts of ended runs (``queue_minutes``) are kept (0 keeps them forever)."""
    retention_audit_days: float = Field(default=366, ge=0, le=36500, validation_alias=_aliases("retention_audit_days"))
    """Days the audit log is kept: a month's partition is dropped once its last day is this old (0: kept)."""
    pg_pool_size: int = Field(default=10, ge=2, le=200, validation_alias=_aliases("pg_pool_size"))
    """Connections in this instance's PostgreSQL pool."""
    pg_pooler: Literal["none", "transaction"] = Field(default="none", validation_alias=_aliases("pg_pooler"))
    """``transaction`` when ``database_url`` goes through a pooler in transaction mode (PgBouncer):
    no prepared statements are kept, and ``LISTEN`` uses ``database_direct_url`` or, without it,
    the scheduler re-reads its table every ``pg_poll_seconds``."""
    database_direct_url: str | None = Field(default=None, validation_alias=_aliases("database_direct_url"))
    """A URL to PostgreSQL itself, past the pooler, for ``LISTEN`` (``pg_pooler = "transaction"``)."""
    pg_poll_seconds: float = Field(default=1.0, gt=0, le=60, validation_alias=_aliases("pg_poll_seconds"))
    """How often the scheduler re-reads the schedules when ``LISTEN`` is not available, seconds."""
    log_level: str = Field(default="info", validation_alias=_aliases("log_level"))
    log_format: str = Field(default="auto", validation_alias=_aliases("log_format"))
    """``json``, ``console``, or ``auto`` (console on a terminal, JSON elsewhere)."""
    log_payloads: bool = Field(default=False, validation_alias=_aliases("log_payloads"))
    """Add task payloads to failure log lines (off by default: payloads may hold personal data)."""
    migrate_on_start: bool = Field(default=True, validation_alias=_aliases("migrate_on_start"))
    metrics_sample_seconds: float = Field(
        default=5.0, gt=0, le=3600, validation_alias=_aliases("metrics_sample_seconds")
    )
    """How often queue depths, the oldest ready age and workers by state are sampled, seconds."""
    sync_pool: Literal["process", "thread"] = Field(default="process", validation_alias=_aliases("sync_pool"))
    """Where ``def`` handlers run: ``process`` (handler processes the instance can stop at a timeout or a
    cancel; the handler must be a module-level function) or ``thread`` (threads of the instance, which
    cannot be stopped). A handler's own ``@task(..., pool=...)`` wins."""
    sync_processes: int = Field(default=0, ge=0, le=1024, validation_alias=_aliases("sync_processes"))
    """Most handler processes for ``def`` handlers, started as needed; 0: one per executor of the queues."""
    sync_stop_grace_seconds: float = Field(
        default=2.0, gt=0, le=300, validation_alias=_aliases("sync_stop_grace_seconds")
    )
    """Time a stopped handler process gets between SIGTERM and SIGKILL, seconds."""
    service_restarts: int = Field(default=5, ge=0, le=1000, validation_alias=_aliases("service_restarts"))
    """Crashes a service may have within ``service_restart_window_seconds`` and still be restarted;
    one more and a critical service shuts the instance down (exit 1), an optional one stays down."""
    service_restart_window_seconds: float = Field(
        default=60.0, gt=0, le=86400, validation_alias=_aliases("service_restart_window_seconds")
    )
    """The window of ``service_restarts``, seconds."""
    http_enabled: bool = Field(default=True, validation_alias=_aliases("http_enabled"))
    """Listen for HTTP at all (the ``server`` extra); off (``taskmesh worker``), the instance serves
    no port, not even ``/healthz``, ``/readyz`` or ``/metrics``: its heartbeat row and systemd's
    watchdog say it lives."""
    api_enabled: bool = Field(default=True, validation_alias=_aliases("api_enabled"))
    """Serve the ``/api/v1`` routes; off, the port still serves ``/healthz``, ``/readyz`` and ``/metrics``."""
    workers_enabled: bool = Field(default=True, validation_alias=_aliases("workers_enabled"))
    """Run fetchers and executors for ``queue_names`` (off: an API-only instance, no worker row)."""
    worker_processes: int | Literal["auto"] = Field(default=1, validation_alias=_aliases("worker_processes"))
    """Processes ``taskmesh run`` works the queues in, ``auto`` for one per core this process may use.
    Above 1, the process started runs as before and also starts, supervises and stops
    ``worker_processes - 1`` worker-only instances of the same settings (``taskmesh.runtime.worker_processes``):
    an instance's event loop is one core's, so async handlers use every core only this way."""
    scheduler_enabled: bool = Field(default=True, validation_alias=_aliases("scheduler_enabled"))
    """Run the cron scheduler in this instance (off: another instance fires the schedules)."""
    schedules: list[ScheduleSettings] = Field(default_factory=list, validation_alias=_aliases("schedules"))
    """Cron schedules (``[[schedules]]`` tables; ``TASKMESH_SCHEDULES`` as a JSON array)."""
    tenant_quotas: dict[str, TenantQuota] = Field(default_factory=dict, validation_alias=_aliases("tenant_quotas"))
    """Quotas by tenant (``[tenant_quotas.acme]`` tables; ``TASKMESH_TENANT_QUOTAS`` as a JSON object)."""
    tenant_quota_default: TenantQuota | None = Field(default=None, validation_alias=_aliases("tenant_quota_default"))
    """The quotas of every tenant not in ``tenant_quotas`` (default: none)."""
    limits: dict[str, LimitSettings] = Field(default_factory=dict, validation_alias=_aliases("limits"))
    """Task limits by name (``[limits.<name>]``): runs at once and starts per second across every instance
    (``limits/settings.py``)."""

    @field_validator("limits")
    @classmethod
    def _check_limit_names(cls, value: dict[str, LimitSettings]) -> dict[str, LimitSettings]:
        return check_names(value)

    @field_validator("schedules", mode="before")
    @classmethod
    def _validate_schedules(cls, value: Any) -> Any:
        return _check_schedules(value)

    @field_validator("worker_processes", mode="before")
    @classmethod
    def _check_worker_processes(cls, value: Any, info: ValidationInfo) -> int | str:
        parsed: int | str = int(value) if isinstance(value, str) and value.strip().isdigit() else value
        if parsed != "auto" and not (type(parsed) is int and 1 <= parsed <= MAX_WORKER_PROCESSES):
            raise ValueError(f"must be auto or a number from 1 to {MAX_WORKER_PROCESSES}, not {value!r}")
        if parsed != 1 and info.data.get("workers_enabled") is False:
            raise ValueError("more than one process needs workers_enabled (an API-only instance runs no workers)")
        count = usable_cores() if parsed == "auto" else int(parsed)
        for key in ("http_port", "metrics_port"):
            # child k serves on the primary's port + k (worker_processes.child_port): all must exist
            port = info.data.get(key)
            if port and port + count - 1 > 65535:
                raise ValueError(
                    f"{count} processes need {key} {port} to {port + count - 1} (one port up for each"
                    " worker process), past 65535"
                )
        return parsed

    def worker_process_count(self) -> int:
        """How many processes work the queues: ``worker_processes``, ``auto`` read as the cores usable here."""
        if self.worker_processes == "auto":
            return usable_cores()
        return self.worker_processes

    @field_validator("queue_names", "handlers", "allowed_hosts", "cors_allowed_origins", mode="before")
    @classmethod
    def _split_csv(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("queue_names")
    @classmethod
    def _check_queue_names(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one queue")
        for name in value:
            if not NAME_PATTERN.fullmatch(name):
                raise ValueError(f"queue name {name!r} must match [A-Za-z0-9_.:-]{{1,128}}")
        return list(dict.fromkeys(value))

    @field_validator("cors_allowed_origins")
    @classmethod
    def _check_origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            if origin != "*" and not _ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: give scheme://host[:port] (no path), or *")
        return list(dict.fromkeys(value))

    @field_validator("database_url", "database_direct_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL")
        return value or None

    @property
    def listen_url(self) -> str | None:
        """Where ``LISTEN`` connects: ``None`` when only a transaction pooler is reachable (poll instead)."""
        if self.database_direct_url:
            return self.database_direct_url
        return self.database_url if self.pg_pooler == "none" else None

    @field_validator("redis_url")
    @classmethod
    def _check_redis_url(cls, value: str | None) -> str | None:
        return check_redis_url(value) if value else None

    @field_validator("redis_mode")
    @classmethod
    def _check_redis_mode(cls, value: str, info: ValidationInfo) -> str:
        url = info.data.get("redis_url")
        if value == "cluster" and url:
            problem = cluster_url_problem(url)
            if problem:
                raise ValueError(problem)
        return value

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        if value.lower() not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return value.lower()

    @field_validator("log_format")
    @classmethod
    def _check_format(cls, value: str) -> str:
        if value not in {"auto", "json", "console"}:
            raise ValueError("must be one of auto, json, console")
        return value

    def retention_seconds(self) -> dict[str, float]:
        """Age in seconds after which a finished task is deleted, by status, and a workflow that is over,
        under ``workflows`` (kept forever: absent)."""
        days = {
            "completed": self.retention_completed_days,
            "cancelled": self.retention_cancelled_days,
            "failed": self.retention_failed_days,
            "workflows": self.retention_workflows_days,
        }
        return {status: d * 86400 for status, d in days.items() if d > 0}

    def prefetch_of(self, queue: str) -> int:
        """Tasks ``queue`` claims ahead: its ``[queues.<name>] prefetch``, else ``prefetch``."""
        entry = self.queues.get(queue)
        return entry.prefetch if entry and entry.prefetch is not None else self.prefetch

    def concurrency_of(self, queue: str) -> int:
        """Executors for ``queue``: its ``[queues.<name>]`` entry, else ``worker_concurrency``."""
        entry = self.queues.get(queue)
        return entry.concurrency if entry else self.worker_concurrency

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = config_path()
        sources: list[PydanticBaseSettingsSource] = [init_settings, EnvironmentSource(settings_cls)]
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
        return tuple(sources)


def config_path() -> Path | None:
    """The TOML file to read: ``TASKMESH_CONFIG`` or ``./taskmesh.toml`` when it exists.

    :raises ConfigError: ``TASKMESH_CONFIG`` names a file that does not exist.
    """
    named = os.environ.get("TASKMESH_CONFIG")
    if named:
        path = Path(named)
        if not path.is_file():
            raise ConfigError(f"TASKMESH_CONFIG: file {named} does not exist")
        return path
    default = Path("taskmesh.toml")
    return default if default.is_file() else None


def load_settings(**overrides: Any) -> Settings:
    """Read and validate the settings.

    :param overrides: values that win over every source (tests, the ``dev`` profile).
    :returns: the validated :class:`Settings`.
    :raises ConfigError: a key is invalid or the TOML file cannot be parsed; the
        message names the key (``http_port: Input should be ...``).
    """
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "settings"
            message = err["msg"].removeprefix("Value error, ")
            if key == "schedules" and message.startswith("schedules"):
                problems.append(message)  # already names each schedule and key
                continue
            if err["type"] == "extra_forbidden":
                message = "unknown setting"
            problems.append(f"{key}: {message}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"TASKMESH_CONFIG: cannot parse TOML: {exc}") from None
    except SettingsError as exc:  # an environment variable holding invalid JSON
        field = re.search(r'field "(\w+)"', str(exc))
        name = f"TASKMESH_{field.group(1).upper()}" if field else "environment"
        raise ConfigError(f"{name}: not valid JSON ({exc.__cause__ or exc})") from None


def check_schedule_tasks(settings: Settings, known: set[str], has_fallback: bool) -> None:
    """Refuse schedules naming a task no handler runs (nothing starts half-configured).

    :param known: registered handler names.
    :param has_fallback: a fallback handler runs unknown names (the ``dev`` profile).
    :raises ConfigError: ``schedules[nightly].task: no handler named 'reports.nigthly' is registered ...``.
    """
    if has_fallback:
        return
    problems = [
        f"schedules[{s.name}].task: no handler named {s.task!r} is registered "
        f"(import its module through the handlers setting)"
        for s in settings.schedules
        if s.task not in known
    ]
    if problems:
        raise ConfigError("invalid configuration: " + "; ".join(problems))


def require_stores(settings: Settings) -> tuple[str, str]:
    """Return ``(database_url, redis_url)`` or explain which one is missing.

    :raises ConfigError: naming ``DATABASE_URL`` or ``REDIS_URL`` and pointing to
        ``python -m taskmesh dev`` for a first try without any server.
    """
    missing = [
        name
        for name, value in (("DATABASE_URL", settings.database_url), ("REDIS_URL", settings.redis_url))
        if not value
    ]
    if missing:
        which = " and ".join(missing)
        raise ConfigError(
            f"{which} not set: set it in the environment or in taskmesh.toml "
            f"({', '.join(m.lower() for m in missing)}); for a first try without "
            "servers of your own run `python -m taskmesh dev`"
        )
    assert settings.database_url is not None and settings.redis_url is not None
    return settings.database_url, settings.redis_url
