"""What a reader gets of one recurring job: its definition, next fire and counters
(``ScheduleInfo``), and the fire instants around now."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from jobqueue.anomalies import (
    Anomaly,
)
from jobqueue.policy.cron import (
    Schedule,
    fire_times_between,
    format_fire_instant,
    period_ms,
)
from jobqueue.recurring.definitions import Definition, JobState


class FiresAround(NamedTuple):
    """A job's fire instants around now: the last one passed (None: none yet), the next one
    (None: it has ended), and whether the next one's run is created already (early, up to
    the schedulers' lookahead)."""

    last_ms: int | None
    next_ms: int | None
    next_created: bool


def _last_fire_by(schedule: Schedule, now_ms: int, anchor_ms: int | None) -> int | None:
    """The latest fire instant at or before ``now_ms`` (looking back at most about 1,000
    periods), or None."""
    span = max(period_ms(schedule), 1_000)
    for factor in (2, 16, 128, 1024):
        lo = now_ms - factor * span
        fires = fire_times_between(schedule, lo, now_ms, anchor_ms=anchor_ms)
        if fires:
            return fires[-1]
    return None


@dataclass(frozen=True)
class ScheduleInfo:
    """What ``get_schedule`` and ``list_schedules`` return."""

    definition: Definition
    next_fire_ms: int | None
    state: JobState
    # Garbage met beside a usable definition (counters, next fire): shown with the job.
    anomalies: tuple[Anomaly, ...] = ()

    @property
    def job_id(self) -> str:
        return self.definition.job_id

    def fires_around(self, now_ms: int) -> FiresAround:
        """The fire instants on either side of ``now_ms`` (the schedulers create runs up to a
        lookahead early, so the last fire handled, ``state.last_fire_ms``, may be ahead)."""
        d, last = self.definition, self.state.last_fire_ms
        if last is None or last <= now_ms:
            return FiresAround(last, self.next_fire_ms, False)
        # Runs are created ahead: the next fire is among those, the last one passed before.
        schedule = d.schedule
        ahead = fire_times_between(schedule, now_ms, last, limit=1000, anchor_ms=d.start_ms)
        # A fire passed counts only if some run was created for one (not a fire from before
        # the job existed): more fired than created ahead.
        passed = _last_fire_by(schedule, now_ms, d.start_ms)
        if self.state.fired <= len(ahead):
            passed = None
        return FiresAround(passed, ahead[0] if ahead else last, True)

    def to_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        """Its fields as JSON. ``next_fire_ms`` is the next fire no run was created for yet
        and ``last_fire`` the latest one a run was created for (it may be ahead: runs are
        created a lookahead early); with ``now_ms``, also the fires on either side of now:
        ``last_fired_ms`` (None: none yet), ``next_due_ms`` (None: ended) and
        ``next_due_created`` (its run is created already)."""
        d = self.definition
        around = {} if now_ms is None else self._around_dict(now_ms)
        return {**self._fields(d), **around}

    def _around_dict(self, now_ms: int) -> dict[str, Any]:
        around = self.fires_around(now_ms)
        return {
            "last_fired_ms": around.last_ms,
            "next_due_ms": around.next_ms,
            "next_due_created": around.next_created,
        }

    def _fields(self, d: Definition) -> dict[str, Any]:
        return {
            "job_id": d.job_id,
            "task": d.task,
            "queue": d.queue,
            "cron": d.cron,
            "every_s": None if d.every_ms is None else d.every_ms / 1000,
            "tz": d.tz,
            "misfire": d.misfire,
            "jitter_s": d.jitter_ms / 1000,
            "overlap": d.overlap,
            "paused": d.paused,
            "origin": d.origin or "runtime",
            "next_fire": None
            if self.next_fire_ms is None
            else format_fire_instant(self.next_fire_ms),
            "next_fire_ms": self.next_fire_ms,
            "last_fire": None
            if self.state.last_fire_ms is None
            else format_fire_instant(self.state.last_fire_ms),
            "fired": self.state.fired,
            "missed": self.state.missed,
            "skipped_by_overlap": self.state.skipped,
            "dropped_by_cap": self.state.dropped,
            "anomalies": [a.to_dict() for a in self.anomalies],
        }
