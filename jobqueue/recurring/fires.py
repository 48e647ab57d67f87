"""The runs of a recurring job's fire times (pure): the first fire after an instant, the run of
one fire (its id ``<job_id>@<fire instant>``, due at the fire plus its jitter), a manual
trigger's run and a backfill's."""

from __future__ import annotations

from dataclasses import replace

from jobqueue.errors import (
    RecurringError,
)
from jobqueue.policy.cron import (
    ScheduleError,
    fire_times_between,
    next_fire_after,
)
from jobqueue.policy.jitter import jitter_ms
from jobqueue.policy.timeutil import Instant, instant_to_ms
from jobqueue.recurring.definitions import MAX_BACKFILL, Definition, refuse_future_end
from jobqueue.store.keys import (
    fire_run_id,
)
from jobqueue.store.runs import RunSpec


def fire_spec(defn: Definition, fire_ms: int, payload: str) -> RunSpec:
    """The run of one fire time: due = nominal + the job's deterministic jitter."""
    return RunSpec(
        run_id=fire_run_id(defn.job_id, fire_ms),
        task=defn.task,
        payload=payload,
        due_at_ms=fire_ms + jitter_ms(defn.job_id, defn.jitter_ms),
        max_attempts=defn.max_attempts,
        lease_ms=defn.lease_ms,
        timeout_ms=defn.timeout_ms,
        job_id=defn.job_id,
        scheduled_for_ms=fire_ms,
    )


def first_fire_after(defn: Definition, after_ms: int) -> int | None:
    """The first fire strictly after ``after_ms`` within start/end, or None when it has ended."""
    try:
        fire = next_fire_after(defn.schedule, after_ms, defn.start_ms)
    except ScheduleError:
        return None
    if defn.end_ms is not None and fire > defn.end_ms:
        return None
    return fire



def trigger_spec(defn: Definition, now_ms: int, max_payload_bytes: int) -> RunSpec:
    """The run of ``jq.trigger``: now, outside the schedule, with its own run id
    ``<job_id>@manual-<now>``; the schedule is untouched."""
    return RunSpec(
        run_id=fire_run_id(defn.job_id, now_ms, manual=True),
        task=defn.task,
        payload=defn.payload(max_payload_bytes),
        due_at_ms=now_ms,
        max_attempts=defn.max_attempts,
        lease_ms=defn.lease_ms,
        timeout_ms=defn.timeout_ms,
        job_id=defn.job_id,
        scheduled_for_ms=now_ms,
    )


def backfill_specs(
    defn: Definition, start: Instant, end: Instant, now_ms: int, max_payload_bytes: int
) -> list[RunSpec]:
    """The runs of every fire time in [start, end] (the run ids the scheduler would use, so
    fire times that already ran create nothing), due at once. ``end`` must not be after
    ``now_ms`` (BackfillInFuture): a future fire time's run created now would run early, and
    at its time the scheduler would find it already there and create nothing."""
    start_ms, end_ms = instant_to_ms(start), instant_to_ms(end)
    if end_ms < start_ms:
        raise RecurringError("backfill: end is before start")
    refuse_future_end(defn.job_id, end_ms, now_ms)
    fires = fire_times_between(
        defn.schedule, start_ms - 1, end_ms, limit=MAX_BACKFILL + 1, anchor_ms=defn.start_ms
    )
    if len(fires) > MAX_BACKFILL:
        raise RecurringError(
            f"backfill of {defn.job_id!r} covers more than {MAX_BACKFILL:,} fire times; "
            "split the range"
        )
    payload = defn.payload(max_payload_bytes)
    return [replace(fire_spec(defn, f, payload), due_at_ms=None) for f in fires]
