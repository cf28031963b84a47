"""The queues' history (the console's charts): the per-minute rollup that every instance's sampler writes.

Runs, waits and the sampled backlog go through the real sampler into ``queue_minutes`` on
PostgreSQL and come back through ``GET /api/v1/history``; two instances' counts add up.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest

from taskmesh import store
from taskmesh.observability.metrics import Metrics
from taskmesh.security import keys as api_keys
from taskmesh.security.keys import SCOPES
from taskmesh.services import sampler
from taskmesh.services.run_tally import WAIT_BOUNDS_SECONDS, RunTally
from taskmesh.tasks.history import wait_quantile
from taskmesh.tasks.states import Outcome
from tests.conftest import http

pytestmark = pytest.mark.anyio


def test_the_history_query_sums_every_bucket_of_the_wait_histogram() -> None:
    sql = (Path(store.__file__).parent / "queries.sql").read_text()
    query = sql.split("-- name: queue_minutes_history")[1].split("-- name:")[0]
    terms = re.findall(r"sum\(wait_counts\[(\d+)\]\)", query)
    assert [int(t) for t in terms] == list(range(1, len(WAIT_BOUNDS_SECONDS) + 2))


def test_the_wait_p95_is_the_upper_bound_of_the_bucket_that_holds_it() -> None:
    counts = [0] * (len(WAIT_BOUNDS_SECONDS) + 1)
    assert wait_quantile(counts) is None
    counts[WAIT_BOUNDS_SECONDS.index(0.01)] = 94  # 94 runs waited at most 10 ms
    counts[WAIT_BOUNDS_SECONDS.index(5)] = 6  # 6 at most 5 s
    assert wait_quantile(counts) == 5.0
    counts[-1] = 50  # a third of them waited over an hour
    assert wait_quantile(counts) is None
    assert wait_quantile(counts, 0.5) == 0.01


async def test_two_instances_runs_and_waits_add_up_and_the_sampled_backlog_is_kept_per_minute(
    start_instance: Any, stores: Any
) -> None:
    admin = (await api_keys.create(stores.pg, "admin", list(SCOPES))).key
    acme = (await api_keys.create(stores.pg, "acme", list(SCOPES), tenant_id="acme")).key
    auth = {"Authorization": f"Bearer {admin}"}
    first, second = RunTally(), RunTally()
    for tally, waits in ((first, [0.002] * 9), (second, [0.002, 40.0])):
        for wait in waits:
            tally.waited("charts", wait)
            tally.add("charts", Outcome.SUCCEEDED)
    second.add("charts", Outcome.FAILED)
    second.waited("other", 0.002)
    second.add("other", Outcome.SUCCEEDED)
    metrics = Metrics(queues=["charts"])
    async with start_instance(workers_enabled=False, queue_names=["idle"], metrics_sample_seconds=3600) as inst:
        async with http(inst) as client:
            for _ in range(3):
                made = await client.post("/api/v1/tasks", json={"name": "x", "queue_name": "charts"}, headers=auth)
                assert made.status_code == 201
            # The samples and the query must fall in one minute (a loaded machine crossed into the next).
            while await stores.pg.pool.fetchval("SELECT extract(second FROM clock_timestamp())") >= 45:
                await anyio.sleep(0.5)
            await sampler.run_once(stores, metrics, ["charts"], tally=first)
            await sampler.run_once(stores, metrics, ["charts"], tally=second)
            hour = (await client.get("/api/v1/history?window=hour&queue=charts", headers=auth)).json()
            day = (await client.get("/api/v1/history?window=day", headers=auth)).json()
            bad = await client.get("/api/v1/history?window=week", headers=auth)
            tenant = await client.get("/api/v1/history", headers={"Authorization": f"Bearer {acme}"})
    assert (hour["step_seconds"], len(hour["points"])) == (60, 60)
    assert (day["step_seconds"], len(day["points"])) == (300, 288)
    now = hour["points"][-1]
    assert (now["succeeded"], now["failed"], now["started"]) == (11, 1, 11)
    assert now["wait_p95_seconds"] == 60.0  # 1 run of 11 waited 40 s: the p95 is in the bucket up to 60 s
    assert (now["ready_max"], now["oldest_ready_max_seconds"] >= 0) == (3, True)
    assert hour["points"][0]["succeeded"] == 0 and hour["points"][0]["ready_max"] is None
    assert (day["points"][-1]["succeeded"], day["points"][-1]["started"]) == (12, 12)  # every queue: both
    assert hour["rollup"]["bytes"] > 0 and hour["rollup"]["since"] is not None
    assert (bad.status_code, bad.json()["detail"]) == (422, "window: must be one of hour, day, not 'week'")
    assert (tenant.status_code, tenant.json()["detail"]) == (
        403,
        "the queues' history covers every tenant; this key is bound to tenant 'acme'",
    )


def test_waits_that_could_not_be_written_are_put_back_and_written_with_the_next_ones() -> None:
    tally = RunTally()
    tally.waited("default", 0.002)
    taken = tally.take_waits()
    tally.waited("default", 0.002)
    tally.waited("default", 7200.0)  # over the last bound: the extra bucket
    tally.put_back_waits(taken)
    counts = tally.take_waits()["default"]
    assert (counts[WAIT_BOUNDS_SECONDS.index(0.0025)], counts[-1], sum(counts)) == (2, 1, 3)
