from __future__ import annotations

import pytest

from taskmesh.retry import backoff_seconds


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
