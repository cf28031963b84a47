from __future__ import annotations

import pytest

from taskmesh.tasks.retry import backoff_seconds


@pytest.mark.parametrize(
    ("failures", "expected"),
    [(0, 1), (1, 2), (2, 4), (3, 8), (10, 1024), (11, 2048), (12, 3600), (13, 3600), (40, 3600), (1000, 3600)],
)
def test_backoff_doubles_from_one_second_and_caps_at_an_hour(failures: int, expected: int) -> None:
    assert backoff_seconds(failures) == expected


def test_backoff_of_a_huge_failure_count_is_capped_without_building_a_huge_integer() -> None:
    assert backoff_seconds(10**9) == 3600


def test_backoff_refuses_a_negative_failure_count() -> None:
    with pytest.raises(ValueError, match="failures must be >= 0"):
        backoff_seconds(-1)


@pytest.mark.parametrize("failures", range(14))
def test_jittered_backoff_stays_within_half_and_one_and_a_half_times_the_base_and_reaches_both_ends(
    failures: int,
) -> None:
    base = min(2**failures, 3600)
    waits = [backoff_seconds(failures, jitter=True) for _ in range(2000)]
    assert all(0.5 * base <= w <= 1.5 * base for w in waits), (min(waits), max(waits))
    # Uniform over the range: near both ends, centred on the base, hardly a value twice.
    assert min(waits) < 0.52 * base and max(waits) > 1.48 * base, (min(waits), max(waits))
    assert sum(waits) / len(waits) == pytest.approx(base, rel=0.04)
    assert len(set(waits)) > 1990


@pytest.mark.parametrize("failures", range(14))
def test_backoff_without_jitter_is_exactly_the_base_every_time(failures: int) -> None:
    base = min(2**failures, 3600)
    assert backoff_seconds(failures, jitter=False) == base
    assert {backoff_seconds(failures) for _ in range(100)} == {base}  # jitter is off by default
