"""Fire planning (pure): which fire times of a recurring job get a run this tick, what the
misfire policy makes of the late ones (``misfire.apply_misfire``) and where the job's next fire
moves (:func:`plan_fires`); what its overlap policy keeps, given its previous run
(:func:`apply_overlap`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from jobqueue.policy.cron import (
    Schedule,
    fire_times_between,
    next_fire_after,
    period_ms,
)
from jobqueue.policy.misfire import (
    DEFAULT_MISFIRE_GRACE_MS,
    MisfirePolicy,
    apply_misfire,
    parse_policy,
)
from jobqueue.recurring.config import DEFAULT_LOOKAHEAD_MS, MAX_FIRES_PER_TICK
from jobqueue.recurring.definitions import Definition, Overlap

# Counting late fire times of a cron schedule past this many is an estimate (by its period).
LATE_SCAN_LIMIT = 100_000
UNFINISHED = frozenset({"pending", "running"})


@dataclass(frozen=True)
class FirePlan:
    """What one tick does for one job (before the overlap policy)."""

    job_id: str
    expected_next_ms: int
    fires: list[int]
    missed: int
    dropped: int
    new_next_ms: int | None  # None: the schedule has ended
    through_ms: int


def _count_fires(schedule: Schedule, lo: int, hi: int, anchor: int | None) -> int:
    """Fire times in ``(lo, hi]``: exact for intervals, estimated past LATE_SCAN_LIMIT for cron."""
    if hi <= lo:
        return 0
    if schedule.every_ms is not None:
        first = next_fire_after(schedule, lo, anchor)
        return 0 if first > hi else (hi - first) // schedule.every_ms + 1
    fires = fire_times_between(schedule, lo, hi, limit=LATE_SCAN_LIMIT, anchor_ms=anchor)
    if len(fires) < LATE_SCAN_LIMIT:
        return len(fires)
    return len(fires) + (hi - fires[-1]) // period_ms(schedule)


def _last_fires(schedule: Schedule, lo: int, hi: int, k: int, anchor: int | None) -> list[int]:
    """The last ``k`` fire times in ``(lo, hi]``, without walking the whole range."""
    if k <= 0 or hi <= lo:
        return []
    window = (k + 1) * period_ms(schedule)
    while True:
        start = max(lo, hi - window)
        fires = fire_times_between(schedule, start, hi, anchor_ms=anchor)
        if len(fires) >= k or start == lo:
            return fires[-k:]
        window *= 4


@lru_cache(maxsize=8192)
def _plan_core(
    schedule: Schedule,
    anchor: int | None,
    end: int | None,
    policy: MisfirePolicy,
    next_ms: int,
    now_ms: int,
    horizon_ms: int,
    misfire_grace_ms: int,
    max_fires: int,
) -> tuple[tuple[int, ...], int, int, int | None, int]:
    """Shared by every job with the same timing and next fire in one tick (a herd: cheap)."""
    if end is not None:
        horizon_ms = min(horizon_ms, end)
    lo = next_ms - 1  # fire times >= next are unhandled
    late_end = now_ms - misfire_grace_ms - 1  # late: now - t > misfire grace
    late_end = min(late_end, horizon_ms)
    late_count, tail = 0, []
    truncated = False  # more late fire times to fire than max_fires: the rest next tick
    if late_end > lo:
        match policy.kind:
            case "fire-all":
                tail = _last_fires(schedule, lo, late_end, policy.cap, anchor)
            case "fire-once":
                tail = _last_fires(schedule, lo, late_end, 1, anchor)
            case "deadline":
                start = max(lo, now_ms - policy.deadline_ms - 1)
                tail = fire_times_between(
                    schedule, start, late_end, limit=max_fires, anchor_ms=anchor
                )
                if len(tail) == max_fires and tail[-1] < late_end:
                    # Still within the deadline but over this tick's budget: handle fire
                    # times only through the last one fired; the next tick continues there
                    # (those that pass the deadline meanwhile are missed then, not now).
                    truncated = True
                    late_end = tail[-1]
            case _:
                tail = []
        late_count = _count_fires(schedule, lo, late_end, anchor)
    on_lo = max(lo, late_end)
    on_time = (
        fire_times_between(schedule, on_lo, horizon_ms, limit=max_fires, anchor_ms=anchor)
        if horizon_ms > on_lo and not truncated
        else []
    )
    decision = apply_misfire(policy, tail + on_time, now_ms, misfire_grace_ms)
    hidden = late_count - len(tail)  # late fire times never handed to apply_misfire
    missed = decision.missed + hidden
    dropped = decision.dropped_by_cap + (hidden if policy.kind == "fire-all" else 0)
    if truncated:
        through = late_end
    elif len(on_time) == max_fires:
        through = on_time[-1]
    else:
        through = max(horizon_ms, lo)
    new_next: int | None = next_fire_after(schedule, through, anchor)
    if end is not None and new_next is not None and new_next > end:
        new_next = None
    return tuple(decision.fire), missed, dropped, new_next, through


def plan_fires(
    defn: Definition,
    next_ms: int,
    now_ms: int,
    lookahead_ms: int = DEFAULT_LOOKAHEAD_MS,
    misfire_grace_ms: int = DEFAULT_MISFIRE_GRACE_MS,
    max_fires: int = MAX_FIRES_PER_TICK,
) -> FirePlan | None:
    """Which fire times of one job get a run this tick, and where its next fire moves.

    Fire times in ``[next_ms, now + lookahead]`` are considered (``now`` alone for jobs with
    an overlap policy); those late by more than ``misfire_grace_ms`` go through the misfire
    policy.
    None when nothing is due yet (only possible without lookahead).
    """
    horizon = now_ms + (lookahead_ms if defn.overlap == "allow" else 0)
    if next_ms > horizon and (defn.end_ms is None or next_ms <= defn.end_ms):
        return None
    fires, missed, dropped, new_next, through = _plan_core(
        defn.schedule,
        defn.start_ms,
        defn.end_ms,
        parse_policy(defn.misfire),
        next_ms,
        now_ms,
        horizon,
        misfire_grace_ms,
        max_fires,
    )
    return FirePlan(defn.job_id, next_ms, list(fires), missed, dropped, new_next, through)


def apply_overlap(
    overlap: Overlap, fires: Sequence[int], previous_state: str | None, buffered: bool = False
) -> tuple[list[int], int]:
    """(fire times kept, number skipped) given the state of the job's previous run and, for
    ``buffer-one``, whether a buffered run is already waiting.

    * ``allow``: every fire time runs;
    * ``forbid``: nothing while the previous run is pending or running; otherwise only the
      latest fire time (the runs of several would overlap each other);
    * ``buffer-one``: at most one run waits: nothing while one is buffered, otherwise the
      latest fire time, whose run is buffered until the previous one finishes (see
      ``buffered.BufferedRuns.release_buffered``).
    """
    if overlap == "allow" or not fires:
        return list(fires), 0
    blocked = previous_state in UNFINISHED if overlap == "forbid" else buffered
    if blocked:
        return [], len(fires)
    return list(fires[-1:]), len(fires) - 1


# -- the daemon ---------------------------------------------------------------------------------
