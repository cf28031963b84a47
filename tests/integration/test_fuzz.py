"""Property-based fuzzing of the whole OpenAPI document (schemathesis) against a live instance.

The instance runs on real PostgreSQL and Redis and serves HTTP on loopback; its own
``/openapi.json`` is loaded into schemathesis, and every operation gets generated
requests, valid ones (positive) and invalid ones (negative), each sent over HTTP and
checked. Three callers, one test each:

- ``admin``: a key holding every scope;
- ``anonymous``: no key at all, while keys exist (the instance enforces them);
- ``reader``: a key holding only ``tasks:read``.

Every answer must not be a 5xx, must have a status code, a content type and a body
that the document declares for its operation (schemathesis' response checks), and
must not be 429 (the rate limits are raised out of reach). On top of that, without a
key every ``/api/v1`` route answers 401 and nothing else (``/healthz``, ``/readyz`` and,
with ``metrics_auth = "open"``, ``/metrics`` answer 200), and with ``tasks:read`` alone
every route whose ``x-required-scope`` is another answers 403, never 2xx, and a bulk
action is only counted (a dry run), never carried out.

Before the run, the instance is given something to find: a completed task (with a
result), a dead-lettered one (with a traceback), a running, a queued, a delayed and a
cancelled one, a bulk operation, a schedule and a spare key. Each operation with path parameters
is fuzzed twice: with generated values (which name nothing: 404s and 422s) and with
those known ones, so that the answers about real objects are checked too. The instance
works one queue of its own (``fuzzwork``), where the seeded tasks run; what the fuzzing
enqueues elsewhere stays queued.

The run is bounded and deterministic: a fixed number of examples per operation and
generation mode, one Hypothesis seed, no shrinking, no example database, and a time
budget per caller past which the remaining cases are not sent (counted as ``unsent``)
and the remaining operations not fuzzed (``skipped``, named). ``make test`` runs a short
form (20, 5 and 8 examples; 59, 19 and 23 s over 41 operations on a quiet machine on 2026-12-06,
with budgets of 90, 30 and 40 s); ``make fuzz`` (``FUZZ=long``) runs
100, 25 and 40 examples with budgets of 600, 150 and 240 s.
Requests go to 127.0.0.1 only (no proxy from the environment). ``pytest -s`` shows one
line per caller, ``fuzz: mode=… operations=N cases=M failures=F …``, and for each kind of
failure (operation, status, check) its count and a curl command that reproduces its
first case (with ``<the admin key>`` standing for the key).
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import asyncpg
import hypothesis
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from hypothesis.strategies import SearchStrategy
from schemathesis import APIOperation, Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core import NotSet
from schemathesis.core.failures import Failure
from schemathesis.core.result import Ok
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from taskmesh import NonRetryableError
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.tasks.registry import Registry
from tests.conftest import http, wait_for

pytestmark = pytest.mark.anyio

SEED = 20260612
"""One Hypothesis seed for every operation: the same requests on every run."""
LONG = os.environ.get("FUZZ") == "long"
"""``FUZZ=long`` (``make fuzz``) sends four to five times the cases; ``make test`` runs the short form."""
EXAMPLES = {"admin": 100, "anonymous": 25, "reader": 40} if LONG else {"admin": 20, "anonymous": 5, "reader": 8}
"""Examples per operation, generation mode (positive, negative) and source of path values, by caller."""
BUDGET_SECONDS = (
    {"admin": 600.0, "anonymous": 150.0, "reader": 240.0}
    if LONG
    else {"admin": 90.0, "anonymous": 30.0, "reader": 40.0}
)
"""Past this, a caller's remaining cases and operations are not sent (they are counted as ``unsent``)."""
WAIT_MOST_SECONDS = 0.5
"""The longest ``GET /api/v1/tasks/{task_id}?wait=`` a case sends (see :func:`shorten_wait`)."""
REQUEST_TIMEOUT = 75.0
"""Longer than ``GET /api/v1/tasks/{task_id}?wait=60`` may rightly take."""
UNLIMITED = {
    "rate_limit_read_per_second": 1_000_000.0,
    "rate_limit_write_per_second": 1_000_000.0,
    "rate_limit_admin_per_second": 1_000_000.0,
    "auth_refusals_per_minute": 1_000_000.0,
}
"""The most the settings allow: a fuzzing run must meet its checks, not its rate limits (429)."""
WORK_QUEUE = "fuzzwork"
SCHEDULE = {"name": "fuzz-yearly", "cron": "@yearly", "task": "fuzz.idle", "queue": "default"}
KEY_HEADERS = ("authorization", "x-api-key")
"""Headers that carry a key: schemathesis generates them from the security schemes; the caller's own replace them."""
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
OPEN_ROUTES = {"/healthz", "/readyz", "/metrics"}
"""Routes answered without a key (``/metrics`` because ``metrics_auth`` is ``open`` here)."""


@pytest.fixture(autouse=True)
async def no_keys_left(pool: asyncpg.Pool) -> AsyncIterator[None]:
    """Keys made here must not close the instances of later tests (they run open on loopback)."""
    yield
    await pool.execute("TRUNCATE api_keys, console_sessions")


@dataclass(frozen=True)
class Finding:
    """One check that one answer failed, with what reproduces it."""

    mode: str
    operation: str
    status: int
    check: str
    message: str
    reproduce: str

    def line(self, cases: int = 1) -> str:
        return (
            f"fuzz: FAIL mode={self.mode} {self.operation} -> {self.status}: {self.check} ({cases} cases): "
            f"{self.message}\n  {self.reproduce}"
        )


@dataclass
class Tally:
    """What one caller's run sent and found."""

    mode: str
    operations: int = 0
    cases: int = 0
    unsent: int = 0
    skipped: list[str] = field(default_factory=list)
    """Operations reached after the time budget, none of whose cases were generated."""
    statuses: dict[int, int] = field(default_factory=dict)
    with_body: set[str] = field(default_factory=set)
    """Operations that were sent at least one body."""
    findings: list[Finding] = field(default_factory=list)

    def distinct(self) -> list[tuple[Finding, int]]:
        """The first finding of each (operation, status, check), with how many cases failed it."""
        groups: dict[tuple[str, int, str], list[Finding]] = {}
        for f in self.findings:
            groups.setdefault((f.operation, f.status, f.check), []).append(f)
        return [(found[0], len(found)) for found in groups.values()]

    def summary(self) -> str:
        codes = " ".join(f"{code}:{n}" for code, n in sorted(self.statuses.items()))
        return (
            f"fuzz: mode={self.mode} operations={self.operations} cases={self.cases} "
            f"failures={len(self.findings)} distinct={len(self.distinct())} unsent={self.unsent} "
            f"skipped={len(self.skipped)} statuses=[{codes}]"
        )


AnyCase = Case[Any]
Operation = APIOperation[Any, Any, Any, Any]
Expectation = Callable[[AnyCase, int], str | None]
"""What a caller must see beyond the document: a message when an answer breaks it, else ``None``."""


def scope_of(operation: Operation) -> str | None:
    scope = operation.definition.raw.get("x-required-scope")
    return scope if isinstance(scope, str) else None


def path_names(operation: Operation) -> list[str]:
    return [p["name"] for p in operation.definition.raw.get("parameters", []) if p.get("in") == "path"]


def expect_admin(case: AnyCase, status: int) -> str | None:
    if status in (401, 403):
        return f"a key with every scope was refused ({status})"
    return None


def expect_anonymous(case: AnyCase, status: int) -> str | None:
    path = case.operation.path
    if path in OPEN_ROUTES:
        return None if status == 200 else f"an open route answered {status} without a key, expected 200"
    if path.startswith("/api/v1/") and status != 401:
        return f"no key was sent: expected 401 and nothing else, got {status}"
    return None


def expect_reader(case: AnyCase, status: int) -> str | None:
    scope = scope_of(case.operation)
    if status == 401:
        return "a valid key was refused (401)"
    if scope is not None and scope != "tasks:read":
        if 200 <= status < 300:
            return f"answered {status} to a key without {scope!r}"
        if status != 403:
            return f"a key without {scope!r} was answered {status}, expected 403"
    if case.operation.label == "POST /api/v1/tasks:bulk" and 200 <= status < 300:
        if not (isinstance(case.body, dict) and case.body.get("dry_run") is True):
            return f"a bulk action was carried out ({status}) for a key with tasks:read alone"
    return None


EXPECTATIONS: dict[str, Expectation] = {"admin": expect_admin, "anonymous": expect_anonymous, "reader": expect_reader}


def references(node: Any, where: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str]]:
    """Every ``$ref`` under ``node``, with the keys that lead to it."""
    if isinstance(node, dict):
        for name, value in node.items():
            if name == "$ref" and isinstance(value, str):
                yield where, value
            else:
                yield from references(value, (*where, name))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from references(value, (*where, str(i)))


def resolves(spec: dict[str, Any], ref: str) -> bool:
    """Whether a local ``$ref`` names something in the document (a JSON pointer from its root)."""
    if not ref.startswith("#/"):
        return False
    node: Any = spec
    for token in ref[2:].split("/"):
        token = token.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or token not in node:
            return False
        node = node[token]
    return True


def shorten_wait(case: AnyCase) -> None:
    """A valid ``wait`` (0..60 s, a number in the document) at most :data:`WAIT_MOST_SECONDS`: the answers are
    what is checked, and waits of up to a minute on the seeded queued tasks would spend the time budget."""
    wait = case.query.get("wait") if isinstance(case.query, dict) else None
    if isinstance(wait, int | float) and not isinstance(wait, bool) and 0 <= wait <= 60:
        case.query["wait"] = min(wait, WAIT_MOST_SECONDS)


def fuzz(spec: dict[str, Any], base_url: str, mode: str, key: str | None, known: dict[str, list[str]]) -> Tally:
    """Send every operation's generated cases to ``base_url`` as ``mode``'s caller and check each answer.

    ``known`` gives values of path parameters that name real objects, by parameter name.
    """
    config = schemathesis.Config()  # not discovered from a schemathesis.toml: the same run everywhere
    config.output.sanitization.update(enabled=False)  # reproductions show the values sent (the key stays out)
    schema = schemathesis.openapi.from_dict(spec, config=config)
    schema.config.update(base_url=base_url)  # the instance under test, also in the reproductions
    tally = Tally(mode)
    expect = EXPECTATIONS[mode]
    auth = {"Authorization": f"Bearer {key}"} if key is not None else {}
    deadline = time.monotonic() + BUDGET_SECONDS[mode]
    session = requests.Session()
    session.trust_env = False  # loopback only: no proxy from the environment

    def check(case: AnyCase) -> None:
        if time.monotonic() > deadline:
            tally.unsent += 1
            return
        if case.headers:
            for name in [h for h in case.headers if h.lower() in KEY_HEADERS]:
                del case.headers[name]
        shorten_wait(case)
        response = case.call(session=session, headers=auth, timeout=REQUEST_TIMEOUT)
        tally.cases += 1
        if not isinstance(case.body, NotSet):
            tally.with_body.add(case.operation.label)
        status = response.status_code
        tally.statuses[status] = tally.statuses.get(status, 0) + 1
        failures: list[tuple[str, str]] = []
        try:
            case.validate_response(response, checks=CHECKS, headers=auth)
        except* Failure as group:
            failures += [(f.title, f.message.strip()) for f in group.exceptions if isinstance(f, Failure)]
        if status == 429:
            failures.append(("Rate limited", response.text))
        broken = expect(case, status)
        if broken is not None:
            failures.append(("Scope", broken))
        if failures:
            shown = {"Authorization": f"Bearer <the {mode} key>"} if key is not None else {}
            reproduce = case.as_curl_command(headers=shown)
            label = case.operation.label
            tally.findings += [Finding(mode, label, status, title, message, reproduce) for title, message in failures]

    def strategy(operation: Operation, generation: GenerationMode, names: list[str] | None) -> SearchStrategy[AnyCase]:
        if names is None:
            return operation.as_strategy(generation_mode=generation)
        choices = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*(known[n] for n in names))]
        return st.sampled_from(choices).flatmap(
            lambda values: operation.as_strategy(generation_mode=generation, path_parameters=values)
        )

    try:
        for result in schema.get_all_operations():
            tally.operations += 1
            if not isinstance(result, Ok):
                error = result.err()
                where = f"{(error.method or '').upper()} {error.path}"
                tally.findings.append(Finding(mode, where, 0, "Invalid operation", str(error), ""))
                continue
            operation = result.ok()
            if time.monotonic() > deadline:
                tally.skipped.append(operation.label)  # generating cases that are not sent costs seconds
                continue
            names = path_names(operation)
            sources: list[list[str] | None] = [None]
            if names and all(known.get(n) for n in names):
                sources.append(names)
            for source, generation in itertools.product(sources, GenerationMode):
                run = hypothesis.settings(
                    max_examples=EXAMPLES[mode],
                    database=None,
                    deadline=None,
                    phases=[Phase.generate],
                    suppress_health_check=list(HealthCheck),
                )(hypothesis.seed(SEED)(given(strategy(operation, generation, source))(check)))
                try:
                    run()
                except Unsatisfiable:
                    # Nothing to make invalid (no parameters, no body): such an operation has no negative cases.
                    assert generation is GenerationMode.NEGATIVE, operation.label
            body = operation.definition.raw.get("requestBody", {})
            if body.get("required") and operation.label not in tally.with_body and time.monotonic() <= deadline:
                message = "its request body is required, yet no case could be given one (its schema?)"
                tally.findings.append(Finding(mode, operation.label, 0, "No body generated", message, ""))
    finally:
        session.close()
    return tally


def register_handlers(registry: Registry, release: anyio.Event) -> None:
    @registry.task("fuzz.ok", queue=WORK_QUEUE)
    async def ok(payload: Any) -> dict[str, Any]:
        return {"rows": 3, "echo": payload}

    @registry.task("fuzz.fail", queue=WORK_QUEUE, max_retries=0)
    async def fail(payload: Any) -> None:
        raise NonRetryableError("fuzz: refused on purpose")

    @registry.task("fuzz.slow", queue=WORK_QUEUE)
    async def slow(payload: Any) -> None:
        await release.wait()  # running (cancel answers 202) until the test lets it go

    @registry.task("fuzz.idle", queue="default")  # a queue this instance does not work: its tasks stay queued
    async def idle(payload: Any) -> None:
        return None


async def seed_objects(client: Any, headers: dict[str, str], pg: Any) -> dict[str, list[str]]:
    """Make one object of each kind the API names in a path; their names, by path parameter."""

    async def made(path: str, body: dict[str, Any], expected: int = 201) -> dict[str, Any]:
        answer = await client.post(path, json=body, headers=headers)
        assert answer.status_code == expected, f"{path}: {answer.text}"
        reply: dict[str, Any] = answer.json()
        return reply

    completed = (await made("/api/v1/tasks", {"name": "fuzz.ok", "payload": {"customer": {"id": 42}}}))["task_id"]
    failed = (await made("/api/v1/tasks", {"name": "fuzz.fail", "payload": {"n": 1}}))["task_id"]
    queued = (await made("/api/v1/tasks", {"name": "fuzz.idle", "dedup_key": "fuzz-queued", "priority": 7}))["task_id"]
    delayed = (await made("/api/v1/tasks", {"name": "fuzz.idle", "delay_seconds": 3600}))["task_id"]
    cancelled = (await made("/api/v1/tasks", {"name": "fuzz.idle", "tenant_id": "acme"}))["task_id"]
    await made(f"/api/v1/tasks/{cancelled}/cancel", {}, expected=200)
    for task_id, status in ((completed, "completed"), (failed, "failed")):
        answer = await client.get(f"/api/v1/tasks/{task_id}", params={"wait": 10}, headers=headers)
        assert answer.json()["task"]["status"] == status, answer.text
    running = (await made("/api/v1/tasks", {"name": "fuzz.slow"}))["task_id"]

    async def started() -> bool:
        answer = await client.get(f"/api/v1/tasks/{running}", headers=headers)
        return bool(answer.json()["task"]["status"] == "running")

    await wait_for(started)
    bulk = {"filter": {"queue": "fuzz-nothing"}, "action": "cancel", "reason": "fuzz"}
    operation = (await made("/api/v1/tasks:bulk", bulk, expected=202))["operation_id"]
    spare = (await api_keys.create(pg, "fuzz-spare", ["tasks:read"])).key
    return {
        "task_id": [completed, failed, running, queued, delayed, cancelled],
        "queue": ["default", WORK_QUEUE],
        "operation_id": [operation],
        "name": [str(SCHEDULE["name"])],
        "key_id": [spare[4:20]],
    }


@pytest.mark.timeout(int(max(BUDGET_SECONDS.values())) + 240)
@pytest.mark.parametrize("mode", ["admin", "anonymous", "reader"])
async def test_every_operation_of_the_openapi_document_holds_under_fuzzing(
    mode: str, start_instance: Any, stores: Any, registry: Registry
) -> None:
    release = anyio.Event()
    register_handlers(registry, release)
    admin = (await api_keys.create(stores.pg, "fuzz-admin", list(SCOPES))).key
    reader = (await api_keys.create(stores.pg, "fuzz-reader", ["tasks:read"])).key
    key = {"admin": admin, "anonymous": None, "reader": reader}[mode]
    settings = {
        "queue_names": [WORK_QUEUE],
        "worker_concurrency": 2,
        "schedules": [SCHEDULE],
        **UNLIMITED,
    }
    async with start_instance(**settings) as inst, http(inst) as client:
        try:
            assert (await client.get("/api/v1/workers")).status_code == 401  # the instance enforces keys
            known = await seed_objects(client, {"Authorization": f"Bearer {admin}"}, stores.pg)
            spec = (await client.get("/openapi.json")).json()
            base_url = f"http://127.0.0.1:{inst.port}"
            started = time.monotonic()
            tally = await anyio.to_thread.run_sync(lambda: fuzz(spec, base_url, mode, key, known))
            took = time.monotonic() - started
        finally:
            release.set()
    print(f"\n{tally.summary()} seconds={took:.1f}")
    if tally.unsent or tally.skipped:
        print(
            f"fuzz: mode={mode}: the time budget ({BUDGET_SECONDS[mode]:g} s) left {tally.unsent} cases unsent "
            f"and {len(tally.skipped)} operations not fuzzed: {', '.join(tally.skipped)}"
        )
    report = "\n".join(finding.line(cases) for finding, cases in tally.distinct())
    if report:
        print(report)
    assert tally.operations == sum(len(methods) for methods in spec["paths"].values())
    assert tally.cases > 0
    assert not tally.findings, report


async def test_every_reference_of_the_openapi_document_resolves(start_instance: Any) -> None:
    """A ``$ref`` that names nothing leaves tools (schemathesis, client generators) without that schema."""
    async with start_instance(workers_enabled=False) as inst, http(inst) as client:
        spec = (await client.get("/openapi.json")).json()
    broken: dict[str, set[str]] = {}
    for where, ref in references(spec):
        if not resolves(spec, ref):
            place = f"{where[2].upper()} {where[1]}" if where[0] == "paths" and len(where) > 2 else "/".join(where)
            broken.setdefault(place, set()).add(ref)
    assert not broken, "references that name nothing in the document: " + "; ".join(
        f"{place}: {', '.join(sorted(refs))}" for place, refs in sorted(broken.items())
    )
