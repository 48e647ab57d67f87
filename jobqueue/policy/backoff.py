"""Retry delays: exponential with a cap, jittered so that failures of many runs at once do not
come back as a herd. Pure: the random source is passed in."""

from __future__ import annotations

import random


def retry_delay_ms(
    attempt: int, base_ms: int, cap_ms: int, rng: random.Random | None = None
) -> int:
    """Delay before retry number ``attempt`` (1 = after the first failure): a uniform draw in
    [d/2, d] where d = min(cap, base * 2**(attempt-1)) ("equal jitter": never zero, never more
    than the cap)."""
    exponent = min(max(attempt - 1, 0), 62)
    ceiling = min(cap_ms, base_ms * (1 << exponent))
    draw = (rng or random).random()
    return max(1, int(ceiling / 2 + draw * ceiling / 2))
