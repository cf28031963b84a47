"""Backoff policy (pure).

The rule comes from docs/internals/design.md section 3 and the unified task table seed:
after the n-th failure of a delivery cycle (n = 0 for the first) the next
attempt waits ``min(2**n, 3600)`` seconds, the *base*. By default a uniform
jitter multiplies it by 0.5 to 1.5 (500 tasks that fail together
no longer retry in the same instant; on average the wait is the base). The
reclaimer's SQL applies the same rule to runs whose lease expired.
"""

from __future__ import annotations

import random

BACKOFF_CAP_SECONDS = 3600
JITTER_LOW = 0.5
JITTER_HIGH = 1.5
"""The jitter factor's range: the wait is ``base * uniform(0.5, 1.5)``."""


def backoff_seconds(failures: int, cap: int = BACKOFF_CAP_SECONDS, *, jitter: bool = False) -> float:
    """Seconds to wait after the ``failures``-th failure (0-based).

    :param failures: failures so far in this delivery cycle before this one, >= 0.
    :param cap: upper bound of the base in seconds (default 3600).
    :param jitter: multiply the base by a uniform factor in [0.5, 1.5).
    :returns: ``min(2**failures, cap)`` (times the factor); computed without building
        huge integers, so ``failures=1000`` is as cheap as ``failures=3``.
    :raises ValueError: if ``failures`` is negative.
    """
    if failures < 0:
        raise ValueError("failures must be >= 0")
    # 2**n exceeds any sane cap long before n reaches the cap's bit length.
    base = cap if failures >= cap.bit_length() else min(1 << failures, cap)
    return base * random.uniform(JITTER_LOW, JITTER_HIGH) if jitter else float(base)
