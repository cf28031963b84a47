"""Fire times of cron specs in time zones: DST both ways, leap days, aliases, seconds, misfire plans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from taskmesh.errors import CronSpecError
from taskmesh.schedules.cron import CronSpec
from taskmesh.schedules.schedules import fire_idle_timeout_ms, fire_key, plan_fires


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def fires(expr: str, zone: str, after: str, until: str) -> list[str]:
    spec = CronSpec(expr, zone)
    return [f"{t:%Y-%m-%dT%H:%M:%S}Z" for t in spec.fires_between(utc(after), utc(until))]


def test_every_minute_over_an_hour_fires_sixty_times() -> None:
    out = fires("* * * * *", "UTC", "2026-06-01T10:00:00", "2026-06-01T11:00:00")
    assert len(out) == 60
    assert out[0] == "2026-06-01T10:01:00Z" and out[-1] == "2026-06-01T11:00:00Z"


def test_asia_shanghai_daily_at_two_lands_at_eighteen_utc_the_day_before() -> None:
    spec = CronSpec("0 2 * * *", "Asia/Shanghai")
    first = spec.next_fire(utc("2026-11-29T00:00:00"))
    assert first == utc("2026-11-29T18:00:00")
    assert spec.local(first).isoformat() == "2026-11-30T02:00:00+08:00"
    assert spec.next_fire(first) == utc("2026-11-30T18:00:00")


# America/New_York: spring forward 2026-03-08 02:00 EST -> 03:00 EDT (07:00Z);
# fall back 2026-11-01 02:00 EDT -> 01:00 EST (06:00Z).
def test_new_york_spring_forward_a_missing_time_fires_at_the_first_valid_instant() -> None:
    assert fires("30 2 * * *", "America/New_York", "2026-03-07T00:00:00", "2026-03-10T00:00:00") == [
        "2026-03-07T07:30:00Z",  # 02:30 EST
        "2026-03-08T07:00:00Z",  # 02:30 does not exist: 03:00 EDT, the transition
        "2026-03-09T06:30:00Z",  # 02:30 EDT
    ]


def test_new_york_spring_forward_an_interval_spec_keeps_its_rhythm_without_duplicates() -> None:
    assert fires("*/30 * * * *", "America/New_York", "2026-03-08T06:00:00", "2026-03-08T08:00:00") == [
        "2026-03-08T06:30:00Z",  # 01:30 EST
        "2026-03-08T07:00:00Z",  # 02:00 and 02:30 do not exist; 03:00 EDT, one fire
        "2026-03-08T07:30:00Z",  # 03:30 EDT
        "2026-03-08T08:00:00Z",
    ]


def test_new_york_fall_back_a_fixed_time_fires_once_not_twice() -> None:
    assert fires("30 1 * * *", "America/New_York", "2026-10-31T00:00:00", "2026-11-03T00:00:00") == [
        "2026-10-31T05:30:00Z",  # 01:30 EDT
        "2026-11-01T05:30:00Z",  # 01:30 EDT, the first pass; not again at 01:30 EST (06:30Z)
        "2026-11-02T06:30:00Z",  # 01:30 EST
    ]


def test_new_york_fall_back_an_hourly_spec_fires_every_real_hour() -> None:
    assert fires("0 * * * *", "America/New_York", "2026-11-01T03:30:00", "2026-11-01T08:00:00") == [
        "2026-11-01T04:00:00Z",  # 00:00 EDT
        "2026-11-01T05:00:00Z",  # 01:00 EDT
        "2026-11-01T06:00:00Z",  # 01:00 EST (the repeated hour)
        "2026-11-01T07:00:00Z",  # 02:00 EST
        "2026-11-01T08:00:00Z",
    ]


def test_a_fixed_time_asked_from_inside_the_repeated_hour_waits_for_the_next_day() -> None:
    spec = CronSpec("30 1 * * *", "America/New_York")
    # 06:10Z is 01:10 EST, in the second pass: 01:30 EST is a repeat, already fired at 05:30Z.
    assert spec.next_fire(utc("2026-11-01T06:10:00")) == utc("2026-11-02T06:30:00")


# Europe/Berlin: spring forward 2026-03-29 02:00 CET -> 03:00 CEST (01:00Z);
# fall back 2026-10-25 03:00 CEST -> 02:00 CET (01:00Z).
def test_berlin_spring_forward() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-03-28T00:00:00", "2026-03-31T00:00:00") == [
        "2026-03-28T01:30:00Z",  # 02:30 CET
        "2026-03-29T01:00:00Z",  # 02:30 does not exist: 03:00 CEST
        "2026-03-30T00:30:00Z",  # 02:30 CEST
    ]


def test_berlin_fall_back() -> None:
    assert fires("30 2 * * *", "Europe/Berlin", "2026-10-24T00:00:00", "2026-10-27T00:00:00") == [
        "2026-10-24T00:30:00Z",  # 02:30 CEST
        "2026-10-25T00:30:00Z",  # 02:30 CEST, first pass only (not 01:30Z, 02:30 CET)
        "2026-10-26T01:30:00Z",  # 02:30 CET
    ]
    assert fires("*/30 2 * * *", "Europe/Berlin", "2026-10-24T23:59:00", "2026-10-25T02:00:00") == [
        "2026-10-25T00:00:00Z",  # 02:00 CEST
        "2026-10-25T00:30:00Z",  # 02:30 CEST
        "2026-10-25T01:00:00Z",  # 02:00 CET: an interval spec (`*` in minute) fires in both passes
        "2026-10-25T01:30:00Z",  # 02:30 CET
    ]


def test_leap_day_fires_only_in_leap_years() -> None:
    out = fires("0 0 29 2 *", "UTC", "2026-01-01T00:00:00", "2037-01-01T00:00:00")
    assert out == ["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z", "2036-02-29T00:00:00Z"]
    berlin = CronSpec("0 0 29 2 *", "Europe/Berlin")
    assert berlin.next_fire(utc("2026-01-01T00:00:00")) == utc("2028-02-28T23:00:00")


def test_six_fields_put_seconds_first() -> None:
    assert fires("*/20 * * * * *", "UTC", "2026-01-01T00:00:00", "2026-01-01T00:01:00") == [
        "2026-01-01T00:00:20Z",
        "2026-01-01T00:00:40Z",
        "2026-01-01T00:01:00Z",
    ]


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@hourly", "2026-05-05T11:00:00Z"),
        ("@daily", "2026-05-06T00:00:00Z"),
        ("@midnight", "2026-05-06T00:00:00Z"),
        ("@weekly", "2026-05-10T00:00:00Z"),
        ("@monthly", "2026-06-01T00:00:00Z"),
        ("@yearly", "2027-01-01T00:00:00Z"),
        ("@annually", "2027-01-01T00:00:00Z"),
    ],
)
def test_aliases(alias: str, expected: str) -> None:
    nxt = CronSpec(alias).next_fire(utc("2026-05-05T10:30:00"))
    assert f"{nxt:%Y-%m-%dT%H:%M:%S}Z" == expected


def test_fire_times_are_whole_seconds_strictly_after_the_start() -> None:
    spec = CronSpec("* * * * * *")
    assert spec.next_fire(utc("2026-01-01T00:00:00.250000")) == utc("2026-01-01T00:00:01")
    assert spec.next_fire(utc("2026-01-01T00:00:01")) == utc("2026-01-01T00:00:02")


def test_a_naive_start_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        CronSpec("* * * * *").next_fire(datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("expr", "zone", "message"),
    [
        ("0 0 30 2 *", "UTC", "'0 0 30 2 *' can never fire (no such date)"),
        ("0 0 31 4 *", "UTC", "'0 0 31 4 *' can never fire (no such date)"),
        (
            "61 * * * *",
            "UTC",
            "'61 * * * *' is not a valid cron expression: [61 * * * *] is not acceptable, out of range",
        ),
        (
            "* * *",
            "UTC",
            "'* * *' has 3 fields; expected 5 (minute hour day month weekday), 6 (seconds first) "
            "or an alias like @daily",
        ),
        (
            "0 0 1 1 * 2030",
            "UTC",
            "'0 0 1 1 * 2030' is not a valid cron expression: [0 0 1 1 * 2030] is not acceptable, out of range",
        ),
        (
            "@often",
            "UTC",
            "unknown alias '@often'; use one of @annually, @daily, @hourly, @midnight, @monthly, @weekly, @yearly",
        ),
        ("0 2 * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
        ("0 2 * * *", "../../etc/passwd", "unknown time zone '../../etc/passwd'"),
    ],
)
def test_invalid_specs_say_what_is_wrong(expr: str, zone: str, message: str) -> None:
    with pytest.raises(CronSpecError) as err:
        CronSpec(expr, zone)
    assert str(err.value) == message


def test_fire_keys_are_utc_iso_8601() -> None:
    shanghai = datetime.fromisoformat("2026-11-30T02:00:00+08:00")
    assert fire_key("nightly-report", shanghai) == "cron:nightly-report:2026-11-29T18:00:00Z"


# Misfire policies after a 3-hour outage of an every-minute schedule: the row's next fire was
# 12:01, nothing ran until 15:00:59; the last due fire (15:00) is 59 s late, beyond a 10 s grace.
OUTAGE_FIRST = utc("2026-06-01T12:01:00")
OUTAGE_NOW = utc("2026-06-01T15:00:59")


@pytest.mark.parametrize(("policy", "made", "skipped"), [("skip", 0, 180), ("once", 1, 179), ("all", 180, 0)])
def test_misfire_policies_after_a_three_hour_outage(policy: str, made: int, skipped: int) -> None:
    plan, dropped = plan_fires(CronSpec("* * * * *"), OUTAGE_FIRST, OUTAGE_NOW, policy=policy, grace_seconds=10)
    assert (len(plan), dropped) == (made, skipped)
    assert all(late for _, late in plan)
    if policy == "once":
        assert plan == [(utc("2026-06-01T15:00:00"), True)]


def test_a_fire_within_grace_is_on_time_under_every_policy() -> None:
    for policy in ("skip", "once", "all"):
        plan, dropped = plan_fires(CronSpec("* * * * *"), OUTAGE_FIRST, OUTAGE_NOW, policy=policy, grace_seconds=60)
        assert (utc("2026-06-01T15:00:00"), False) in plan
        assert dropped == (179 if policy != "all" else 0)


def test_the_all_policy_is_capped_at_the_most_recent_thousand() -> None:
    plan, dropped = plan_fires(
        CronSpec("* * * * * *"), OUTAGE_FIRST, OUTAGE_FIRST + timedelta(hours=3), policy="all", grace_seconds=0
    )
    assert len(plan) == 1000 and dropped == 3 * 3600 + 1 - 1000
    assert plan[-1][0] == OUTAGE_FIRST + timedelta(hours=3)


def test_a_very_long_outage_walks_only_the_tail_and_estimates_the_count() -> None:
    first = utc("2026-06-01T00:00:01")
    now = first + timedelta(days=10)  # 864,001 due fires; about 22,000 are walked
    plan, dropped = plan_fires(CronSpec("* * * * * *"), first, now, policy="all", grace_seconds=0)
    assert len(plan) == 1000 and plan[-1][0] == now
    true_dropped = 10 * 86400 + 1 - 1000
    assert abs(dropped - true_dropped) <= true_dropped * 0.01


@pytest.mark.parametrize(
    ("graces", "timeout_ms"),
    [([4.0], 1000), ([8.0, 60.0], 2000), ([60.0], 5000), ([0.0, 3600.0], 1000), ([], 5000)],
)
def test_a_silent_fire_is_ended_within_a_quarter_of_the_shortest_grace(graces: list[float], timeout_ms: int) -> None:
    assert fire_idle_timeout_ms(graces) == timeout_ms
