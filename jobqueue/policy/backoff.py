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


class Backoff:
    """The pause before each next try of a retry or cool-down loop: ``base`` seconds at first,
    doubling up to ``cap``; with ``jitter`` a uniform draw in [d/2, d] of it (equal jitter),
    so that many clients failing at once do not come back as a herd. :meth:`reset` after a
    success; :meth:`relax` shrinks the next pause towards ``base`` (a step of good health)."""

    __slots__ = ("_next", "base", "cap", "jitter", "rng")

    def __init__(
        self,
        base: float,
        cap: float,
        *,
        jitter: bool = True,
        rng: random.Random | None = None,
    ) -> None:
        if not 0 < base <= cap:
            raise ValueError(f"backoff needs 0 < base <= cap, got {base} and {cap}")
        self.base = base
        self.cap = cap
        self.jitter = jitter
        self.rng = rng
        self._next = base

    def next(self) -> float:
        """The pause before the next try; the one after it doubles (up to the cap)."""
        ceiling = self._next
        self._next = min(ceiling * 2, self.cap)
        if not self.jitter:
            return ceiling
        return ceiling * (0.5 + (self.rng or random).random() / 2)

    def reset(self) -> None:
        self._next = self.base

    def relax(self, factor: float) -> None:
        self._next = max(self.base, self._next * factor)
