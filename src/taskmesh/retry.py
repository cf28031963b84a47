"""Backoff policy (pure).

The rule comes from design.md section 3 and the unified task table seed:
after the n-th failure of a delivery cycle (n = 0 for the first) the next
attempt waits ``min(2**n, 3600)`` seconds.
"""

from __future__ import annotations

BACKOFF_CAP_SECONDS = 3600


def backoff_seconds(failures: int, cap: int = BACKOFF_CAP_SECONDS) -> int:
    """Seconds to wait after the ``failures``-th failure (0-based).

    :param failures: failures so far in this delivery cycle before this one, >= 0.
    :param cap: upper bound in seconds (default 3600).
    :returns: ``min(2**failures, cap)``; computed without building huge integers,
        so ``failures=1000`` is as cheap as ``failures=3``.
    :raises ValueError: if ``failures`` is negative.
    """
    if failures < 0:
        raise ValueError("failures must be >= 0")
    # 2**n exceeds any sane cap long before n reaches the cap's bit length.
    if failures >= cap.bit_length():
        return cap
    return min(1 << failures, cap)
