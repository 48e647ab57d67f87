"""Misfire policies: what a scheduler does with fire times it is late for (docs/design.md).

A fire time ``t`` is *late* when ``now - t > misfire_grace_ms``: the scheduler was down or
stalled for longer than its own tick tolerance (its *misfire grace*). A running scheduler
handles a fire time up to one tick gap after it (jobs that are not looked ahead), so the
scheduler never uses a misfire grace below :func:`effective_misfire_grace_ms` (two tick
intervals): a fire is not missed merely because it fell between two ticks. Fire times within
the misfire grace (or still in the future, when a scheduler looks ahead) are on time and always
fire, whatever the policy; the policy decides only the late ones:

* ``fire-all`` / ``fire-all:<N>``: catch up on every late fire time, but at most the latest N
  (default 100) so a long outage does not unleash an unbounded backlog;
* ``fire-once``: collapse the backlog into one run, at the latest late fire time, or into the
  on-time run when there is one;
* ``skip``: no late fire time fires;
* ``deadline-<N>s`` / ``deadline-<N>ms``: late fire times fire while at most N late.

N is always a positive integer written without leading zeros.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

PolicyKind = Literal["fire-all", "fire-once", "skip", "deadline"]

DEFAULT_FIRE_ALL_CAP = 100
DEFAULT_MISFIRE_GRACE_MS = 1000
# The misfire grace a scheduler uses is at least this many tick intervals: a fire just after
# one tick's clock read is handled by the next tick, an interval later plus however long the
# tick itself overran (its clock read comes after its release pass and earlier partitions).
MISFIRE_GRACE_TICKS = 2

_VALID_FORMS = "fire-all, fire-all:<N>, fire-once, skip, deadline-<N>s, deadline-<N>ms"
_POLICY_RE = re.compile(
    r"fire-all(?::(?P<cap>[1-9]\d*))?"
    r"|(?P<simple>fire-once|skip)"
    r"|deadline-(?P<amount>[1-9]\d*)(?P<unit>s|ms)"
)


class MisfireError(ValueError):
    """A misfire policy text that is not one of the valid forms."""


@dataclass(frozen=True)
class MisfirePolicy:
    """A parsed policy; ``cap`` matters for fire-all only, ``deadline_ms`` for deadline only."""

    kind: PolicyKind
    cap: int = DEFAULT_FIRE_ALL_CAP
    deadline_ms: int = 0

    def __post_init__(self) -> None:
        if self.cap < 1:
            raise MisfireError(f"fire-all cap must be positive, got {self.cap}")
        if self.kind == "deadline" and self.deadline_ms < 1:
            raise MisfireError(f"deadline must be positive, got {self.deadline_ms} ms")

    def __str__(self) -> str:
        """The canonical text, as stored with a job definition; ``parse_policy`` reads it back."""
        match self.kind:
            case "fire-all":
                return "fire-all" if self.cap == DEFAULT_FIRE_ALL_CAP else f"fire-all:{self.cap}"
            case "deadline":
                seconds, millis = divmod(self.deadline_ms, 1000)
                return f"deadline-{seconds}s" if millis == 0 else f"deadline-{self.deadline_ms}ms"
            case _:
                return self.kind


@dataclass(frozen=True)
class MisfireDecision:
    """Which due fire times get a run; ``missed`` counts those that do not, cap drops included."""

    fire: list[int]
    missed: int
    dropped_by_cap: int


def effective_misfire_grace_ms(misfire_grace_ms: int, interval_ms: int) -> int:
    """The misfire grace a scheduler ticking every ``interval_ms`` applies: the configured one,
    but never less than MISFIRE_GRACE_TICKS intervals, so a healthy scheduler never counts a
    fire that fell between two of its ticks as late."""
    if misfire_grace_ms < 0 or interval_ms < 0:
        raise ValueError(
            f"misfire grace and interval must be >= 0, got {misfire_grace_ms} and {interval_ms} ms"
        )
    return max(misfire_grace_ms, MISFIRE_GRACE_TICKS * interval_ms)


def parse_policy(text: str) -> MisfirePolicy:
    """Parse a policy as users write it, e.g. ``fire-all:500`` or ``deadline-30s``."""
    match = _POLICY_RE.fullmatch(text.strip())
    if match is None:
        raise MisfireError(f"unknown misfire policy {text!r}: expected one of {_VALID_FORMS}")
    if match["amount"] is not None:
        scale = 1000 if match["unit"] == "s" else 1
        return MisfirePolicy("deadline", deadline_ms=int(match["amount"]) * scale)
    if match["simple"] is not None:
        return MisfirePolicy("fire-once" if match["simple"] == "fire-once" else "skip")
    return MisfirePolicy("fire-all", cap=int(match["cap"] or DEFAULT_FIRE_ALL_CAP))


def apply_misfire(
    policy: MisfirePolicy,
    due_fire_times: list[int],
    now_ms: int,
    misfire_grace_ms: int = DEFAULT_MISFIRE_GRACE_MS,
) -> MisfireDecision:
    """Decide which of a job's due fire times (any order) get a run at ``now_ms``."""
    if misfire_grace_ms < 0:
        raise ValueError(f"misfire_grace_ms must be >= 0, got {misfire_grace_ms}")
    due = sorted(due_fire_times)
    late = [t for t in due if now_ms - t > misfire_grace_ms]
    on_time = due[len(late) :]
    dropped_by_cap = 0
    match policy.kind:
        case "fire-all":
            kept = late[-policy.cap :]
            dropped_by_cap = len(late) - len(kept)
        case "fire-once":
            kept = [] if on_time else late[-1:]
        case "skip":
            kept = []
        case "deadline":
            kept = [t for t in late if now_ms - t <= policy.deadline_ms]
    fire = kept + on_time
    return MisfireDecision(fire=fire, missed=len(due) - len(fire), dropped_by_cap=dropped_by_cap)
