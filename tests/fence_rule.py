"""The rule of fences, as the tests check it against the scripts."""

from __future__ import annotations


def fence_issued(now_ms: int, after: int = 0) -> int:
    """The fence a claim or cancel issues at now_ms (an explicit clock) when the last fence
    issued before was ``after``: greater than it, and at least the clock in microseconds
    (lua/lib/fences.lua, next_fence)."""
    return max(after + 1, now_ms * 1000)
