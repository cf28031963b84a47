"""Task limits on one instance, real stores: runs at once and starts per second held, waiting ids parked
(no attempt, no retry spent), a handler's ``RateLimited`` holding its whole key (an async handler's, and a ``def``
handler's raised in a handler process), a Redis flush mid-run keeping the limit, and a ``concurrency_key`` naming
no limit refused.

The limits across several instances, real processes and ``kill -9`` are in ``tests/chaos/test_limits_processes.py``.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
import redis.asyncio as aioredis

import taskmesh
from taskmesh.store.keys import Keys
from taskmesh.store.redis_limits import RedisLimits
from taskmesh.tasks.registry import Registry
from tests.conftest import REDIS_MODE, http, wait_for
from tests.integration.test_metrics_exposed import sample
from tests.process_pool import handlers

pytestmark = pytest.mark.anyio

TASKS = "/api/v1/tasks"


class Ledger:
    """What the handlers saw: runs at once, overall and per key, and each start's time."""

    def __init__(self) -> None:
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.starts: list[tuple[float, str]] = []
        self.ends: list[float] = []

    def start(self, key: str) -> None:
        self.starts.append((time.monotonic(), key))
        for k in (key, "*"):
            self.now[k] += 1
            self.most[k] = max(self.most[k], self.now[k])

    def end(self, key: str) -> None:
        self.ends.append(time.monotonic())
        for k in (key, "*"):
            self.now[k] -= 1


def register(registry: Registry, ledger: Ledger, seconds: float = 0.1) -> None:
    @registry.task("lim.job")
    async def job(payload: Any) -> None:
        key = str(payload.get("customer", ""))
        ledger.start(key)
        try:
            await anyio.sleep(seconds)
        finally:
            ledger.end(key)


async def create(client: Any, bodies: list[dict[str, Any]]) -> list[str]:
    r = await client.post(f"{TASKS}:batch", json={"tasks": bodies})
    assert r.status_code in (200, 201), r.text
    return [t["task_id"] for t in r.json()["results"]]


async def all_completed(pool: asyncpg.Pool, ids: list[str]) -> bool:
    n = await pool.fetchval("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'completed'", ids)
    return bool(n == len(ids))


async def spent(pool: asyncpg.Pool, ids: list[str]) -> tuple[int, int]:
    """``(most attempts, most retries)`` over the tasks: a parked id spends neither."""
    row = await pool.fetchrow("SELECT max(attempts) AS a, max(retries) AS r FROM tasks WHERE id = ANY($1::uuid[])", ids)
    assert row is not None
    return int(row["a"]), int(row["r"])


async def test_a_concurrency_limit_holds_runs_at_once_and_parks_the_rest_without_spending_attempts(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ledger = Ledger()
    register(registry, ledger)
    limits = {"api": {"task": "lim.job", "concurrency": 2}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        ids = await create(client, [{"name": "lim.job"} for _ in range(20)])
        await wait_for(lambda: redis_client.exists(keys.limit_base("default") + "parked:api"), timeout=5)
        await wait_for(lambda: all_completed(pool, ids), timeout=20)
    assert ledger.most["*"] == 2
    assert len(ledger.starts) == 20
    assert await spent(pool, ids) == (1, 0)
    assert await redis_client.hlen(keys.limit_tasks("default")) == 0  # every task's keys forgotten at its end
    assert await redis_client.zcard(keys.limit_base("default") + "slots:api") == 0


async def test_tasks_claimed_ahead_of_a_full_key_take_its_slots_as_its_runs_end_and_the_limit_holds(
    start_instance: Any,
    registry: Registry,
    pool: asyncpg.Pool,
    redis_client: aioredis.Redis,
    keys: Keys,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    handed: list[int] = []
    hand_over = RedisLimits.hand_over

    async def counted(self: RedisLimits, queue: str, handoffs: Any, *args: Any) -> Any:
        handed.append(len(handoffs))  # observed, then done by the real script
        return await hand_over(self, queue, handoffs, *args)

    monkeypatch.setattr(RedisLimits, "hand_over", counted)
    ledger = Ledger()
    register(registry, ledger, seconds=0.2)
    limits = {"api": {"task": "lim.job", "concurrency": 2}}
    claimed: list[int] = []

    async def sample() -> None:
        while True:
            claimed.append(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'"))
            await anyio.sleep(0.05)

    queues = {"default": {"concurrency": 8, "prefetch": 8}}
    async with start_instance(queues=queues, limits=limits) as inst, http(inst) as client:
        async with anyio.create_task_group() as tg:
            tg.start_soon(sample)
            ids = await create(client, [{"name": "lim.job"} for _ in range(16)])
            await wait_for(lambda: all_completed(pool, ids), timeout=20)
            tg.cancel_scope.cancel()
    assert ledger.most["*"] == 2, ledger.most
    # two running, two claimed ahead (the limit's concurrency) waiting for their slots in the instance (a
    # sample may also count a run that ended and whose result is not written yet)
    assert sorted(claimed)[len(claimed) // 2] == 4, claimed
    assert await spent(pool, ids) == (1, 0)
    # each slot handed on in the instance as its run ends: the next run starts within milliseconds
    gaps = sorted(t - max(e for e in ledger.ends if e <= t) for t, _ in sorted(ledger.starts)[2:])
    assert gaps[len(gaps) // 2] < 0.02, gaps  # 0.2-0.4 ms here; through Redis and a claim, 2.2-3.3 ms
    assert sum(handed) >= 10, handed  # of the 14 runs after the first two, most took a slot handed over
    base = keys.limit_base("default")
    assert await redis_client.zcard(base + "slots:api") == 0
    assert int(await redis_client.hget(base + "inuse", "api") or 0) == 0
    assert await redis_client.hlen(keys.limit_tasks("default")) == 0


async def test_a_limit_lowered_at_run_time_holds_though_tasks_were_claimed_ahead_of_it(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()

    @registry.task("lim.job")
    async def job(payload: Any) -> None:
        ledger.start("")
        try:
            await anyio.sleep(payload["seconds"])  # ends apart: tasks claimed ahead refill in between
        finally:
            ledger.end("")

    limits = {"api": {"task": "lim.job", "concurrency": 4}}
    queues = {"default": {"concurrency": 8, "prefetch": 8}}
    async with start_instance(queues=queues, limits=limits) as inst, http(inst) as client:
        ids = await create(client, [{"name": "lim.job", "payload": {"seconds": 0.2 + i % 5 * 0.05}} for i in range(40)])
        await wait_for(lambda: _ran_at_once(ledger, 4), timeout=10)
        lowered = await client.put("/api/v1/limits/api", json={"task": "lim.job", "concurrency": 2})
        assert lowered.status_code == 200, lowered.text
        lowered_at = time.monotonic()
        await wait_for(lambda: all_completed(pool, ids), timeout=40)
    # held by the instance within a second, and the runs then going take 0.4 s; its two tasks claimed
    # ahead of the key would keep four running if the slots kept being handed over
    after = lowered_at + 1.0 + 0.3
    events = sorted([(t, 1) for t, _ in ledger.starts] + [(t, -1) for t in ledger.ends])
    running, most = 0, 0
    for t, step in events:
        running += step
        if t > after:
            most = max(most, running)
    assert most == 2, most


async def _ran_at_once(ledger: Ledger, n: int) -> bool:
    return ledger.most["*"] >= n


async def test_a_task_claimed_ahead_when_its_instance_stops_is_handed_back_and_holds_no_slot(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=0.5)
    limits = {"api": {"task": "lim.job", "concurrency": 1}}
    queues = {"default": {"concurrency": 4, "prefetch": 2}}
    async with start_instance(queues=queues, limits=limits) as inst, http(inst) as client:
        first, ahead = await create(client, [{"name": "lim.job"} for _ in range(2)])
        await wait_for(lambda: _status(pool, ahead, "running"))  # claimed, waiting for the slot
        assert len(ledger.starts) == 1
    # the running one finished in the grace period; the one claimed ahead never started, and went back
    assert len(ledger.starts) == 1
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", first) == "completed"
    assert await pool.fetchval("SELECT status FROM tasks WHERE id = $1", ahead) == "queued"
    base = keys.limit_base("default")
    assert await redis_client.zcard(base + "slots:api") == 0


async def test_one_at_a_time_per_key_lets_different_keys_run_side_by_side(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=0.2)
    limits = {"per_customer": {"task": "lim.job", "key": "payload.customer", "concurrency": 1}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        bodies = [{"name": "lim.job", "payload": {"customer": c}} for c in ("a", "b", "c") for _ in range(4)]
        ids = await create(client, bodies)
        await wait_for(lambda: all_completed(pool, ids), timeout=20)
    assert {ledger.most[c] for c in ("a", "b", "c")} == {1}
    assert ledger.most["*"] == 3  # the keys ran side by side
    keys_of = {
        r["limit_keys"][0] for r in await pool.fetch("SELECT limit_keys FROM tasks WHERE id = ANY($1::uuid[])", ids)
    }
    assert keys_of == {"per_customer:a", "per_customer:b", "per_customer:c"}


async def test_a_rate_limit_spaces_the_starts_and_no_second_holds_more_than_rate_plus_burst(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=0.0)
    limits = {"provider": {"task": "lim.job", "rate": "10/s", "burst": 2}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        ids = await create(client, [{"name": "lim.job"} for _ in range(25)])
        await wait_for(lambda: all_completed(pool, ids), timeout=20)
    times = sorted(t for t, _ in ledger.starts)
    # 2 at once, then one each 0.1 s: the 25th 2.3 s after the first is admitted (the first's own start
    # may come a claim's latency late: 0.3 s of slack)
    assert times[-1] - times[0] >= 2.0
    most_in_a_second = max(sum(1 for u in times if t <= u < t + 1.0) for t in times)
    assert most_in_a_second <= 10 + 2
    assert await spent(pool, ids) == (1, 0)


async def test_rate_limited_from_a_handler_holds_the_whole_key_and_spends_no_retry(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    starts: dict[str, list[float]] = defaultdict(list)
    raised: list[float] = []

    @registry.task("lim.call")
    async def call(payload: Any) -> None:
        starts[payload["n"]].append(time.monotonic())
        if payload["n"] == "first" and len(starts["first"]) == 1:
            raised.append(time.monotonic())
            raise taskmesh.RateLimited(retry_after=2)

    limits = {"provider": {"task": "lim.call", "rate": "100/s", "burst": 1}}
    async with start_instance(worker_concurrency=4, limits=limits) as inst, http(inst) as client:
        [first] = await create(client, [{"name": "lim.call", "payload": {"n": "first"}}])
        await wait_for(lambda: _run_written(pool, first))  # the back-off starts with the run's result
        held_from = time.monotonic()
        later = await create(client, [{"name": "lim.call", "payload": {"n": f"later{i}"}} for i in range(3)])
        await wait_for(lambda: all_completed(pool, [first, *later]), timeout=15)
    for n in ("later0", "later1", "later2"):
        assert starts[n][0] - held_from >= 1.9, (n, starts[n][0] - held_from)
    assert starts["first"][1] - raised[0] >= 1.9
    row = await pool.fetchrow("SELECT attempts, retries FROM tasks WHERE id = $1", first)
    assert row is not None
    assert (row["attempts"], row["retries"]) == (2, 0)
    error = await pool.fetchval("SELECT error FROM task_runs WHERE task_id = $1 AND attempt = 1", first)
    assert error == "RateLimited: rate limited (waits 2 s, no retry spent)"


async def test_rate_limited_holds_back_the_tasks_claimed_ahead_of_its_key_too(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    starts: dict[str, float] = {}
    raised: list[float] = []

    @registry.task("lim.ahead")
    async def call(payload: Any) -> None:
        starts.setdefault(payload["n"], time.monotonic())
        if payload["n"] == "first" and not raised:
            raised.append(time.monotonic())
            raise taskmesh.RateLimited(retry_after=2)
        await anyio.sleep(0.3)

    limits = {"provider": {"task": "lim.ahead", "concurrency": 2}}
    queues = {"default": {"concurrency": 8, "prefetch": 8}}
    async with start_instance(queues=queues, limits=limits) as inst, http(inst) as client:
        bodies = [{"name": "lim.ahead", "payload": {"n": n}} for n in ["first", *(f"later{i}" for i in range(5))]]
        ids = await create(client, bodies)
        await wait_for(lambda: all_completed(pool, ids), timeout=15)
    # the run beside the first one started with it; every other waited out the back-off, though two
    # of them were claimed ahead and a slot freed 0.3 s in
    held = sorted(round(t - raised[0], 2) for n, t in starts.items() if n != "first" and t - raised[0] > 0.05)
    assert len(held) >= 4 and held[0] >= 1.9, held
    assert await spent(pool, ids[1:]) == (1, 0)


async def test_rate_limited_from_a_def_handler_in_a_handler_process_holds_the_whole_key_and_spends_no_retry(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    # Importable by name: it runs in a handler process (sync_pool "process", the default), and its
    # RateLimited crosses the pipe as the child's outcome.
    registry.task("lim.sync")(handlers.rate_limited_first)
    limits = {"provider": {"task": "lim.sync", "rate": "100/s", "burst": 1}}

    def stamp(n: str, attempt: int) -> tuple[int, float]:
        pid, at = (tmp_path / f"{n}.{attempt}").read_text().split()
        return int(pid), float(at)

    async with start_instance(worker_concurrency=4, limits=limits) as inst, http(inst) as client:
        [first] = await create(client, [{"name": "lim.sync", "payload": {"n": "first", "dir": str(tmp_path)}}])
        await wait_for(lambda: _run_written(pool, first))  # the back-off starts with the run's result
        held_from = time.monotonic()
        later = await create(
            client, [{"name": "lim.sync", "payload": {"n": f"later{i}", "dir": str(tmp_path)}} for i in range(3)]
        )
        await wait_for(lambda: all_completed(pool, [first, *later]), timeout=15)
    raised_by, raised_at = stamp("first", 1)
    assert raised_by != os.getpid()  # it ran in a handler process, not in a thread of this one
    for n in ("later0", "later1", "later2"):
        assert stamp(n, 1)[1] - held_from >= 1.9, (n, stamp(n, 1)[1] - held_from)
    assert stamp("first", 2)[1] - raised_at >= 1.9
    row = await pool.fetchrow("SELECT attempts, retries FROM tasks WHERE id = $1", first)
    assert row is not None
    assert (row["attempts"], row["retries"]) == (2, 0)
    error = await pool.fetchval("SELECT error FROM task_runs WHERE task_id = $1 AND attempt = 1", first)
    assert error == "RateLimited: rate limited (waits 2 s, no retry spent)"


async def _run_written(pool: asyncpg.Pool, task_id: str) -> bool:
    status = await pool.fetchval("SELECT status FROM task_runs WHERE task_id = $1 AND attempt = 1", task_id)
    return bool(status == "retrying")


async def test_a_redis_flush_mid_run_keeps_the_limit(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, prefix: str
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=2.5)  # the runs outlast the resync (a second): their slots must come back
    limits = {"api": {"task": "lim.job", "concurrency": 2}}
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        ids = await create(client, [{"name": "lim.job"} for _ in range(4)])
        await wait_for(lambda: _running(pool, 2))
        async for key in redis_client.scan_iter(match=f"{prefix}:*"):  # the prefix's keys: a flush of this deployment
            await redis_client.delete(key)
        ids += await create(client, [{"name": "lim.job"} for _ in range(2)])
        await wait_for(lambda: all_completed(pool, ids), timeout=30)
    assert ledger.most["*"] == 2
    assert len(ledger.starts) == 6


async def test_a_task_retried_into_another_queue_holds_that_queues_limits_and_leaves_nothing_behind(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool, redis_client: aioredis.Redis, keys: Keys
) -> None:
    spans: dict[str, list[float]] = {}

    @registry.task("lim.move")
    async def move(payload: Any, ctx: Any) -> None:
        if ctx.queue == "qa":
            await anyio.sleep(0.6 if payload["n"] == "h0" else 0)  # h0 holds in_a's slot a while
            raise ValueError("fails in qa")  # created with max_retries 0: failed, for an operator to retry
        spans[payload["n"]] = [time.monotonic()]
        await anyio.sleep(0.5)
        spans[payload["n"]].append(time.monotonic())

    limits = {
        "in_a": {"queue": "qa", "task": "lim.move", "concurrency": 1},  # must not hold a task that runs in qb
        "in_b": {"queue": "qb", "task": "lim.move", "key": "payload.customer", "concurrency": 1},  # must hold it there
        "any_queue": {"task": "lim.move", "concurrency": 2},  # counted in each queue: holds it in qb too
    }
    parked_in_a = keys.limit_base("qa") + "parked:in_a"

    def body(n: str, queue: str) -> dict[str, Any]:
        return {"name": "lim.move", "queue_name": queue, "max_retries": 0, "payload": {"n": n, "customer": n[0]}}

    async def retry_into_qb(client: Any, ids: list[str]) -> None:
        for task_id in ids:
            r = await client.post(f"{TASKS}/{task_id}/retry", json={"queue_name": "qb"})
            assert r.status_code == 200, r.text

    async with start_instance(queue_names=["qa", "qb"], worker_concurrency=4, limits=limits) as inst:
        async with http(inst) as client:
            [holder] = await create(client, [body("h0", "qa")])
            await wait_for(lambda: _running(pool, 1))
            [parked] = await create(client, [body("p0", "qa")])  # parked under in_a, then cancelled there
            await wait_for(lambda: redis_client.zscore(parked_in_a, parked))
            assert (await client.post(f"{TASKS}/{parked}/cancel")).json()["status"] == "cancelled"
            moved = await create(client, [body(n, "qa") for n in ("x1", "y1", "z1", "x3")])
            await wait_for(lambda: _all_failed(pool, [holder, *moved]))
            await retry_into_qb(client, moved[:3])
            await wait_for(lambda: all_completed(pool, moved[:3]), timeout=10)
            [direct] = await create(client, [body("x2", "qb")])
            await wait_for(lambda: _began(spans, "x2"))  # customer x's task created in qb runs...
            await retry_into_qb(client, [moved[3], parked])  # ...when customer x's moved task comes
            await wait_for(lambda: all_completed(pool, [*moved, parked, direct]), timeout=10)
    in_qb = [spans[n] for n in ("x1", "y1", "z1")]
    at_once = max(sum(1 for s, e in in_qb if s <= t < e) for t, _ in in_qb)
    assert at_once == 2, in_qb  # in_a (1 at once) no longer held them; any_queue (2 at once) did
    assert spans["x3"][0] >= spans["x2"][1], (spans["x2"], spans["x3"])  # in_b held customer x's second
    found = await pool.fetch("SELECT queue, limit_keys FROM tasks WHERE id = ANY($1::uuid[])", [*moved, parked])
    assert sorted((r["queue"], *r["limit_keys"]) for r in found) == [("qb", "any_queue", f"in_b:{c}") for c in "pxxyz"]
    for queue in ("qa", "qb"):
        base = keys.limit_base(queue)
        left = {str(k)[len(base) :] async for k in redis_client.scan_iter(match=f"{base}*")}
        assert left <= {"inuse"}, (queue, sorted(left))  # no slot, parked id, wake or back-off left
        held = await redis_client.hgetall(f"{base}inuse")
        assert all(int(v) == 0 for v in held.values()), (queue, held)


async def _began(spans: dict[str, list[float]], n: str) -> bool:
    return n in spans


async def _all_failed(pool: asyncpg.Pool, ids: list[str]) -> bool:
    n = await pool.fetchval("SELECT count(*) FROM tasks WHERE id = ANY($1::uuid[]) AND status = 'failed'", ids)
    return bool(n == len(ids))


async def _running(pool: asyncpg.Pool, n: int) -> bool:
    return bool(await pool.fetchval("SELECT count(*) FROM tasks WHERE status = 'running'") >= n)


async def test_a_concurrency_key_naming_no_limit_is_refused_and_nothing_is_written(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    limits = {"customer": {"concurrency": 1}}
    async with start_instance(limits=limits) as inst, http(inst) as client:
        r = await client.post(TASKS, json={"name": "lim.any", "concurrency_key": "vendor:42"})
        assert r.status_code == 422, r.text
        assert r.json()["errors"][0] == {
            "field": "concurrency_key",
            "message": "names no limit in force ('vendor'; limits: customer)",
        }
        ok = await client.post(TASKS, json={"name": "lim.any", "concurrency_key": "customer:42"})
        assert ok.status_code == 201, ok.text
        keys_of = await pool.fetchval("SELECT limit_keys FROM tasks WHERE id = $1", ok.json()["task_id"])
    assert keys_of == ["customer:42"]
    assert await pool.fetchval("SELECT count(*) FROM tasks") == 1


def register_order(registry: Registry) -> list[str]:
    """``fair.job`` records its tenant in start order."""
    order: list[str] = []

    @registry.task("fair.job")
    async def job(payload: Any, ctx: Any) -> None:
        order.append(str(ctx.tenant_id))
        await anyio.sleep(0.001)

    return order


async def enqueue_many(client: Any, tenant: str, n: int) -> None:
    for start in range(0, n, 1000):
        await create(client, [{"name": "fair.job", "tenant_id": tenant} for _ in range(min(1000, n - start))])


async def test_a_tenant_arriving_behind_another_tenants_backlog_starts_within_a_few_dispatch_rounds(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    order = register_order(registry)
    queues = {"default": {"concurrency": 4, "fairness": {"key": "tenant_id"}}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
        await enqueue_many(client, "bulk", 10_000)
        assert (await client.post("/api/v1/queues/default/resume")).status_code == 200
        await wait_for(lambda: _started(order, 200), timeout=20)
        arrived_at = len(order)
        await create(client, [{"name": "fair.job", "tenant_id": "interactive"} for _ in range(10)])
        await wait_for(lambda: _started_of(order, "interactive", 10), timeout=20)
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
    last = max(i for i, tenant in enumerate(order) if tenant == "interactive")
    # 4 executors claim 4 at a time: what was claimed when they arrived, then turns of one each
    assert last - arrived_at <= 40, (arrived_at, last)
    print(f"\nfairness: the 10 tasks arriving behind 10,000 all started within {last - arrived_at} starts")


async def test_weights_of_three_to_one_share_the_executors_three_to_one_under_contention(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    order = register_order(registry)
    fairness = {"key": "tenant_id", "weights": {"gold": 3}}
    queues = {"default": {"concurrency": 4, "fairness": fairness}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
        await enqueue_many(client, "gold", 1000)
        await enqueue_many(client, "basic", 1000)
        assert (await client.post("/api/v1/queues/default/resume")).status_code == 200
        await wait_for(lambda: _started(order, 800), timeout=30)
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
    first = order[:800]
    ratio = first.count("gold") / first.count("basic")
    print(f"\nfairness: weights 3:1 gave {first.count('gold')}:{first.count('basic')} = {ratio:.2f}")
    assert 2.7 <= ratio <= 3.3


async def test_fair_shares_count_running_slots_so_a_key_of_long_tasks_holds_its_share_of_executors(
    start_instance: Any, registry: Registry
) -> None:
    running: Counter[str] = Counter()
    done: Counter[str] = Counter()

    @registry.task("share.job")
    async def job(payload: Any, ctx: Any) -> None:
        tenant = str(ctx.tenant_id)
        running[tenant] += 1
        try:
            await anyio.sleep(0.4 if tenant == "long" else 0.02)
        finally:
            running[tenant] -= 1
            done[tenant] += 1

    queues = {"default": {"concurrency": 8, "fairness": {"key": "tenant_id"}}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
        await create(client, [{"name": "share.job", "tenant_id": "long"} for _ in range(200)])
        await create(client, [{"name": "share.job", "tenant_id": "short"} for _ in range(1000)])
        assert (await client.post("/api/v1/queues/default/resume")).status_code == 200
        await wait_for(lambda: _ran(done, 8), timeout=20)
        samples: list[tuple[int, int]] = []
        for _ in range(60):  # 3 s, both keys backlogged throughout
            samples.append((running["long"], running["short"]))
            await anyio.sleep(0.05)
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
    assert done["short"] < 1000 and done["long"] < 200, done  # neither ran out of work
    long_share = sum(a for a, _ in samples) / max(1, sum(a + b for a, b in samples))
    print(f"\nfairness: long tasks held {long_share:.0%} of the busy executors ({dict(done)})")
    # counting starts, the key of 0.4 s tasks would hold ~95% of them (one start each in turn)
    assert 0.3 <= long_share <= 0.7, (long_share, samples)


async def test_a_task_waiting_its_fairness_keys_turn_says_so_in_blocked_by(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    release = anyio.Event()

    @registry.task("turn.job")
    async def job(payload: Any) -> None:
        await release.wait()

    queues = {"default": {"concurrency": 1, "prefetch": 0, "fairness": {"key": "tenant_id"}}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        try:
            [running] = await create(client, [{"name": "turn.job", "tenant_id": "acme"}])
            await wait_for(lambda: _status(pool, running, "running"))
            waiting = await create(client, [{"name": "turn.job", "tenant_id": "acme"} for _ in range(3)])
            said = [(await client.get(f"{TASKS}/{t}")).json()["task"]["blocked_by"] for t in waiting]
        finally:
            release.set()
    # one fetch's worth waits in the ready set (an executor frees: it is popped), the rest their key's turn
    turn = [{"reason": "fair_share", "key": "acme"}]
    assert sorted(said, key=len) == [[], turn, turn]


async def _status(pool: asyncpg.Pool, task_id: str, status: str) -> bool:
    return bool(await pool.fetchval("SELECT status = $2 FROM tasks WHERE id = $1", task_id, status))


async def _ran(done: Counter[str], n: int) -> bool:
    return sum(done.values()) >= n


async def _started(order: list[str], n: int) -> bool:
    return len(order) >= n


async def _started_of(order: list[str], tenant: str, n: int) -> bool:
    return order.count(tenant) >= n


async def test_delayed_tasks_of_a_queue_with_fair_shares_are_scored_fairly_when_they_come_due(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    order = register_order(registry)
    queues = {"default": {"concurrency": 1, "fairness": {"key": "tenant_id"}}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        # one statement: all 200 due at one instant, first's ahead of second's in the delayed set
        bodies = [
            {"name": "fair.job", "tenant_id": t, "delay_seconds": 1} for t in ("first", "second") for _ in range(100)
        ]
        await create(client, bodies)
        await wait_for(lambda: _started(order, 200), timeout=30)
    # taken in turns as they come due, not first's hundred before second's
    assert 17 <= order[:40].count("second") <= 23, order[:40]


async def test_priority_aging_starts_low_priority_work_within_its_bound_under_a_high_priority_flood(
    start_instance: Any, registry: Registry
) -> None:
    started: dict[str, float] = {}

    @registry.task("age.job")
    async def job(payload: Any, ctx: Any) -> None:
        started.setdefault(f"{ctx.priority}:{ctx.task_id}", time.monotonic())
        await anyio.sleep(0.05)

    queues = {"default": {"concurrency": 1, "priority_aging_seconds": 0.2}}
    async with start_instance(queues=queues) as inst, http(inst) as client:
        assert (await client.post("/api/v1/queues/default/pause")).status_code == 200
        await create(client, [{"name": "age.job", "priority": 5} for _ in range(20)])
        [low] = await create(client, [{"name": "age.job", "priority": 0}])
        t0 = time.monotonic()
        assert (await client.post("/api/v1/queues/default/resume")).status_code == 200
        while time.monotonic() - t0 < 10 and f"0:{low}" not in started:  # a flood of priority 5, faster than served
            await create(client, [{"name": "age.job", "priority": 5}])
            await anyio.sleep(0.04)
        flooding = sum(1 for k in started if k.startswith("5:"))
    assert f"0:{low}" in started, f"still waiting after 10 s, behind {flooding} of the flood"
    waited = started[f"0:{low}"] - t0
    # 5 levels at 0.2 s each: it ranks with the flood created within a second after it, then goes first
    assert waited <= 6.0, waited
    assert flooding >= 20  # it waited for the higher priority tasks created before it: priority still counts
    print(f"\naging: the priority-0 task started {waited:.2f} s into a priority-5 flood, after {flooding} of it")


async def test_a_client_holds_the_instances_limits_and_passes_keys_debounce_and_throttle(
    database_url: str,
    redis_url: str,
    prefix: str,
    pool: asyncpg.Pool,
    make_settings: Any,
    redis_client: aioredis.Redis,  # its teardown sweeps the prefix's keys the client pushed
) -> None:
    settings = make_settings(
        limits={"per_customer": {"key": "payload.customer", "concurrency": 1}, "vendor": {"concurrency": 2}}
    )
    book = taskmesh.LimitBook.of_settings(settings)
    async with taskmesh.Client(database_url, redis_url, redis_prefix=prefix, redis_mode=REDIS_MODE, limits=book) as c:
        held = await c.enqueue("lim.any", {"customer": 7}, concurrency_key="vendor:acme")
        first = await c.enqueue_detailed("lim.any", {"n": 1}, debounce={"key": "d", "seconds": 30})
        again = await c.enqueue_detailed("lim.any", {"n": 2}, debounce={"key": "d", "seconds": 30})
        throttled = [await c.enqueue("lim.any", throttle={"key": "t", "seconds": 3600}) for _ in range(2)]
    assert await pool.fetchval("SELECT limit_keys FROM tasks WHERE id = $1", held) == ["per_customer:7", "vendor:acme"]
    assert (first.created, again.created, again.task_id) == (True, False, first.task_id)
    assert await pool.fetchval("SELECT payload FROM tasks WHERE id = $1", first.task_id) == '{"n": 2}'
    assert throttled[0] == throttled[1]


async def test_each_limit_has_its_runs_its_waiting_and_its_refusals_in_the_metrics(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=1.5)
    limits = {"api": {"task": "lim.job", "concurrency": 2}, "idle": {"task": "none", "rate": "1/s"}}
    async with (
        start_instance(worker_concurrency=8, limits=limits, metrics_sample_seconds=0.1) as inst,
        http(inst) as client,
    ):
        await create(client, [{"name": "lim.job"} for _ in range(6)])

        async def gauges() -> tuple[float | None, ...] | None:
            text = (await client.get("/metrics")).text
            found = (
                sample(text, "taskmesh_limit_in_use", limit="api"),
                sample(text, "taskmesh_limit_waiting", limit="api"),
                sample(text, "taskmesh_limit_in_use", limit="idle"),
                sample(text, "taskmesh_limit_refused_total", limit="api"),
            )
            return found if found[:3] == (2.0, 4.0, 0.0) else None

        *_, refused = await wait_for(gauges, timeout=10)
    assert refused is not None and refused >= 4


async def test_a_limit_holds_the_tasks_of_workflows_those_a_map_makes_from_a_result_too(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=0.2)

    @registry.task("lim.items")
    async def items(payload: Any) -> list[dict[str, str]]:
        return [{"customer": f"c{n}"} for n in range(6)]

    limits = {"api": {"task": "lim.job", "concurrency": 2}}
    body = {
        "name": "limited",
        "nodes": [
            {"id": "listed", "task": "lim.job", "map": [{"customer": f"l{n}"} for n in range(6)]},
            {"id": "items", "task": "lim.items"},
            {"id": "made", "task": "lim.job", "deps": ["items"], "map": {"from": "items"}},
        ],
    }
    async with start_instance(worker_concurrency=8, limits=limits) as inst, http(inst) as client:
        r = await client.post("/api/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        workflow_id = r.json()["workflow_id"]

        async def over() -> bool:
            return bool((await client.get(f"/api/v1/workflows/{workflow_id}")).json()["status"] == "completed")

        await wait_for(over, timeout=30)
    assert len(ledger.starts) == 12
    assert ledger.most["*"] == 2
    keys = await pool.fetch("SELECT DISTINCT limit_keys FROM tasks WHERE name = 'lim.job'")
    assert [r["limit_keys"] for r in keys] == [["api"]]


async def test_a_run_longer_than_its_lease_keeps_its_slot_while_its_heartbeat_beats(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=3.5)  # past the lease: only the heartbeat keeps the slot
    async with start_instance(worker_concurrency=4, lease_seconds=1.5) as inst, http(inst) as client:
        r = await client.put("/api/v1/limits/long", json={"task": "lim.job", "concurrency": 1})  # set at run time
        assert r.status_code == 200, r.text
        ids = await create(client, [{"name": "lim.job"} for _ in range(2)])
        await wait_for(lambda: all_completed(pool, ids), timeout=20)
    assert await spent(pool, ids) == (1, 0)  # no lease was lost on the way
    assert ledger.most["*"] == 1


async def test_the_counters_tasks_name_by_concurrency_key_show_in_the_limits_usage(
    start_instance: Any, registry: Registry, pool: asyncpg.Pool
) -> None:
    ledger = Ledger()
    register(registry, ledger, seconds=1.0)
    async with start_instance(worker_concurrency=4, limits={"customer": {"concurrency": 1}}) as inst, http(inst) as c:
        await create(c, [{"name": "lim.job", "concurrency_key": "customer:42"} for _ in range(3)])

        async def usage() -> list[dict[str, Any]] | None:
            found: list[dict[str, Any]] = (await c.get("/api/v1/limits/customer")).json()["usage"]
            return found if any(u["key"] == "customer:42" and u["waiting"] == 2 for u in found) else None

        found = await wait_for(usage, timeout=10)
    assert [(u["key"], u["in_use"], u["waiting"]) for u in found] == [("customer:42", 1, 2)]
