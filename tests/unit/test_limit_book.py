"""The limits as configured: their validation (each bad one named by its key) and the limit keys a task holds."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from taskmesh.config import load_settings
from taskmesh.errors import ConfigError, InvalidTaskError
from taskmesh.limits.book import LimitBook, key_value
from taskmesh.limits.settings import FairnessSettings, LimitSettings, parse_rate


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("TASKMESH_"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def book(**limits: dict[str, object]) -> LimitBook:
    return LimitBook({name: LimitSettings.model_validate(s) for name, s in limits.items()})


def test_a_task_holds_the_key_of_each_limit_that_selects_it_in_name_order() -> None:
    b = book(
        provider={"task": "grade", "rate": "20/s"},
        per_tenant={"queue": "ai", "key": "tenant_id", "concurrency": 2},
        per_customer={"key": "payload.customer.id", "concurrency": 1},
        customer={"concurrency": 1},  # selects nothing by itself: only a concurrency_key names it
    )
    keys = b.keys_for(queue="ai", name="grade", tenant_id="acme", payload={"customer": {"id": 42}})
    assert keys == ["per_customer:42", "per_tenant:acme", "provider"]
    assert b.keys_for(queue="other", name="export", tenant_id=None, payload={}) == ["per_customer:"]
    assert b.keys_for(queue="other", name="export", tenant_id=None, payload=[], concurrency_key="customer:7") == [
        "per_customer:",
        "customer:7",
    ]
    assert book().keys_for(queue="q", name="t", tenant_id="x", payload={}) is None


def test_a_task_of_a_queue_with_fair_shares_holds_its_fairness_key_last() -> None:
    fair = {"default": FairnessSettings(key="payload.account", weights={"big": 3})}
    b = LimitBook({"api": LimitSettings(queue="default", concurrency=2)}, fair)
    assert b.keys_for(queue="default", name="t", tenant_id=None, payload={"account": "big"}) == ["api", "@big"]
    assert b.keys_for(queue="other", name="t", tenant_id=None, payload={"account": "big"}) is None
    assert b.fair_args("default") == [1.0, 1, "big", 3.0] and b.fair_args("other") is None


def test_a_task_moved_into_another_queue_drops_the_old_queues_keys_and_takes_the_new_ones() -> None:
    fair = {"a": FairnessSettings(key="tenant_id"), "b": FairnessSettings(key="payload.account")}
    b = LimitBook(
        {
            "in_a": LimitSettings(queue="a", concurrency=1),
            "in_b": LimitSettings(queue="b", key="payload.account", concurrency=1),
            "grade": LimitSettings(task="grade", concurrency=2),  # of any queue: stays
            "vendor": LimitSettings(concurrency=1),  # named by a concurrency_key: stays
            "all_a": LimitSettings(queue="a", rate="5/s"),  # every task of a
        },
        fair,
    )
    held = b.keys_for(queue="a", name="grade", tenant_id="acme", payload={"account": 7}, concurrency_key="vendor:x")
    assert held == ["all_a", "grade", "in_a", "@acme", "vendor:x"]
    held = [*held, "in_a:y", "gone"]  # a counter of in_a a concurrency_key named; a limit no longer in force
    moved = b.keys_moved(held, queue="b", name="grade", tenant_id="acme", payload={"account": 7})
    assert moved == ["gone", "grade", "in_b:7", "vendor:x", "@7"]
    assert b.keys_moved(["in_a", "@acme"], queue="c", name="export", tenant_id="acme", payload={}) is None
    assert b.keys_moved(None, queue="b", name="export", tenant_id=None, payload={}) == ["in_b:", "@"]


def test_a_concurrency_key_naming_no_limit_is_refused_on_its_field() -> None:
    with pytest.raises(InvalidTaskError) as info:
        book(customer={"concurrency": 1}).keys_for(
            queue="q",
            name="t",
            tenant_id=None,
            payload={},
            concurrency_key="vendor:1",
            field="tasks[3].concurrency_key",
        )
    assert (info.value.field, info.value.message) == (
        "tasks[3].concurrency_key",
        "names no limit in force ('vendor'; limits: customer)",
    )


def test_a_long_or_unprintable_value_becomes_its_digest() -> None:
    assert key_value("acme") == "acme" and key_value(42) == "42" and key_value({"b": 1, "a": 2}) == '{"a":2,"b":1}'
    long = key_value("x" * 101)
    assert long.startswith("#") and len(long) == 33
    assert key_value("a\nb").startswith("#")


def test_rates_read_per_second_minute_and_hour() -> None:
    assert parse_rate("20/s") == 20 and parse_rate("600/m") == 10 and parse_rate("36/hour") == 0.01
    for bad in ("20", "0/s", "20/d", "1000001/s"):
        with pytest.raises(ValueError):
            parse_rate(bad)


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[limits.api]\nqueue = 'ai'\n", "limits.api: a limit needs concurrency, rate, or both"),
        ("[limits.api]\nconcurrency = 0\n", "limits.api.concurrency: Input should be greater than or equal to 1"),
        (
            "[limits.api]\nrate = '20 per second'\n",
            "limits.api.rate: rate '20 per second' must look like 20/s, 600/m or 5/h",
        ),
        (
            "[limits.api]\nkey = 'customer'\nconcurrency = 1\n",
            "limits.api.key: must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)",
        ),
        ("[limits.api]\nconcurency = 1\n", "limits.api.concurency: unknown setting"),
        (
            "[limits.'Bad:Name']\nconcurrency = 1\n",
            "limits: limit name 'Bad:Name' must match [a-z0-9][a-z0-9_-]{0,63}",
        ),
        (
            "[queues.default]\nfairness = {key = 'account'}\n",
            "queues.default.fairness.key: must be tenant_id or payload.<path> (names of [A-Za-z0-9_-], at most 8 deep)",
        ),
        (
            "[queues.default]\nfairness = {key = 'tenant_id', weights = {acme = 0}}\n",
            "queues.default.fairness.weights: weight of 'acme' must be above 0 and at most 1000",
        ),
        (
            "[queues.default]\nfairness = {key = 'tenant_id'}\npriority_aging_seconds = 60\n",
            "queues.default: give fairness or priority_aging_seconds, not both (they order the queue two ways)",
        ),
    ],
)
def test_a_bad_limit_is_refused_naming_its_key(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "taskmesh.toml").write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == f"invalid configuration: {message}"


def test_the_scripts_read_each_limit_as_name_concurrency_interval_and_burst() -> None:
    args = book(b={"rate": "4/s", "burst": 3}, a={"concurrency": 2}).script_args()
    assert args == [2, "a", 2, 0, 1, "b", 0, 250.0, 3]
