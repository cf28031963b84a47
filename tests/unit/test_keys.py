from __future__ import annotations

from taskmesh.store.keys import PRIORITY_MAX, Keys, ready_score


def test_a_higher_priority_pops_before_an_older_lower_priority() -> None:
    old_low = ready_score(1, 1_800_000_000_000)
    new_high = ready_score(2, 1_900_000_000_000)
    assert new_high < old_low


def test_within_one_priority_the_older_task_pops_first() -> None:
    assert ready_score(5, 1_800_000_000_000) < ready_score(5, 1_800_000_000_001)


def test_scores_stay_exact_in_a_double_across_the_whole_priority_range() -> None:
    far_future_ms = 1_704_067_200_000 + (1 << 43) - 1
    for priority in (0, 1, PRIORITY_MAX):
        score = ready_score(priority, far_future_ms)
        assert score < 2**53
        assert score == int(score)
    assert ready_score(0, far_future_ms) != ready_score(0, far_future_ms - 1)


def test_every_key_of_a_queue_shares_its_hash_tag() -> None:
    k = Keys("tm")
    for key in (k.ready("q1"), k.delayed("q1"), k.dlq("q1"), k.priorities("q1")):
        assert "{q1}" in key and key.startswith("tm:")
