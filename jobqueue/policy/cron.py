"""Recurring-job schedules and their fire times, as pure functions of integer epoch milliseconds.

A schedule is either a cron expression evaluated on the wall clock of an IANA time zone, or a
fixed interval (``every``) measured in real elapsed time, for which the time zone plays no part.

Cron syntax: the standard 5 fields (minute hour day-of-month month day-of-week), or 6 fields with
the seconds field FIRST (``sec min hour dom month dow``, the Quartz / Spring / node-cron order),
or one of the aliases ``@yearly @annually @monthly @weekly @daily @midnight @hourly``. Anything
else croniter understands (``L``, ``W``, ``#``, names) works too, except its random ``R`` and
hashed ``H`` fields: those would make scheduler instances disagree on fire times (use jitter to
spread load instead), and 7-field expressions with a year.

DST policy. Cron fire times are computed on the naive local wall clock (pure calendar arithmetic,
no DST), and each matching wall time is then mapped to real instants by these rules:

* A wall time that does not exist (the spring-forward gap) fires at the first instant after the
  gap: a daily 02:30 job in America/New_York fires at 03:00 EDT on 2026-03-08. Several wall times
  inside one gap fire once, together, at that instant.
* A wall time that occurs twice (the fall-back repeat) fires at its first occurrence. It fires
  again at the second occurrence only when the schedule's period (``period_ms``) is no longer
  than the shift, i.e. when the job runs at least that often anyway: ``*/15 * * * *`` and hourly
  jobs keep firing on every real quarter hour / hour through a one-hour repeat, while a daily job
  fires exactly once per local day.

croniter's own time-zone support is not used because it fires a daily 01:30 New York job twice
on fall-back day.

Interval schedules fire at ``anchor + k * every`` for ``k >= 0``: the anchor (default: the epoch)
is both the phase of the grid and its first fire. For cron schedules an anchor only means "no
fire before it".
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterator
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from itertools import count, islice, pairwise, takewhile
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, CroniterError, croniter

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)
_ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
_SECONDS_FIRST_FIELDS = 6
# period_ms samples this many consecutive fires, starting on a fixed date so results are stable.
_PERIOD_SAMPLE_FIRES = 1000
_PERIOD_SAMPLE_START = datetime(2000, 1, 1)


class ScheduleError(ValueError):
    """A schedule that cannot be built: the message names the offending value."""


@dataclass(frozen=True)
class Schedule:
    """When a recurring job fires: exactly one of ``cron`` or ``every_ms``, plus a time zone.

    Build it with :func:`parse_schedule`; direct construction is validated the same way, so a
    ``Schedule`` that exists is always usable.
    """

    cron: str | None
    every_ms: int | None
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every_ms is None):
            raise ScheduleError("a schedule needs exactly one of cron or every")
        _zone(self.tz)
        if self.every_ms is not None and self.every_ms < 1:
            raise ScheduleError(f"invalid every_ms {self.every_ms}: must be at least 1 ms")
        if self.cron is not None:
            _check_cron(self.cron)


def parse_schedule(cron: str | None, every: float | None, tz: str = "UTC") -> Schedule:
    """Validate user input (``every`` in seconds, possibly fractional) into a :class:`Schedule`."""
    if cron is not None and every is not None:
        raise ScheduleError(f"give cron or every, not both (cron {cron!r}, every {every})")
    every_ms = None if every is None else _every_to_ms(every)
    return Schedule(cron=None if cron is None else cron.strip(), every_ms=every_ms, tz=tz)


def period_ms(schedule: Schedule) -> int:
    """The shortest gap between consecutive fires: ``every``, or for cron the smallest gap over
    a sample of wall-clock fires (a jitter window must stay below it)."""
    if schedule.every_ms is not None:
        return schedule.every_ms
    assert schedule.cron is not None  # guaranteed by Schedule.__post_init__
    return _cron_period_ms(schedule.cron)


def next_fire_after(schedule: Schedule, after_ms: int, anchor_ms: int | None = None) -> int:
    """The first fire instant strictly after ``after_ms``."""
    for fire in _fires_after(schedule, after_ms, anchor_ms):
        return fire
    raise ScheduleError(f"schedule {schedule} has no fire after {format_fire_instant(after_ms)}")


def fire_times_between(
    schedule: Schedule,
    start_exclusive_ms: int,
    end_inclusive_ms: int,
    limit: int | None = None,
    anchor_ms: int | None = None,
) -> list[int]:
    """Fire instants in ``(start_exclusive_ms, end_inclusive_ms]``, ascending, at most ``limit``."""
    fires = _fires_after(schedule, start_exclusive_ms, anchor_ms)
    return list(islice(takewhile(lambda t: t <= end_inclusive_ms, fires), limit))


def format_fire_instant(ms: int) -> str:
    """The canonical UTC form used in run ids: ``2026-11-29T10:00:00Z`` or ``...00.250Z``.

    Exactly one spelling per instant, so two schedulers always build the same run id.
    """
    instant = _EPOCH + ms * _MS
    millis = instant.microsecond // 1000
    fraction = f".{millis:03d}" if millis else ""
    return f"{instant.replace(tzinfo=None, microsecond=0).isoformat()}{fraction}Z"


def parse_fire_instant(text: str) -> int:
    """Inverse of :func:`format_fire_instant`; only the canonical spelling is accepted."""
    ms: int | None = None
    if text.endswith("Z"):
        with suppress(ValueError):
            ms = _to_ms(datetime.fromisoformat(text[:-1]).replace(tzinfo=UTC))
    if ms is None or format_fire_instant(ms) != text:
        raise ValueError(f"invalid fire instant {text!r}: expected e.g. 2026-11-29T10:00:00Z")
    return ms


MAX_EVERY_S = 100 * 365.25 * 86400


def _every_to_ms(every: float) -> int:
    if isinstance(every, bool) or not math.isfinite(every) or every <= 0:
        raise ScheduleError(f"invalid every {every!r}: must be a positive number of seconds")
    if every > MAX_EVERY_S:  # its fires would land past any due time a run may have
        raise ScheduleError(f"invalid every {every!r}: must be at most 100 years")
    every_ms = round(every * 1000)
    if every_ms < 1:
        raise ScheduleError(f"invalid every {every!r}: must be at least 0.001 s (1 ms)")
    return every_ms


def _zone(tz: str) -> ZoneInfo:
    try:
        return ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        # ValueError: keys like "../etc" or "" that cannot even be looked up; OSError: a name
        # the file system refuses (longer than a file name may be).
        raise ScheduleError(f"unknown time zone {tz[:60]!r}") from None


def _check_cron(cron: str) -> None:
    """Reject what croniter would reject, plus what we do not support, with one clear line."""
    fields = cron.split()
    is_alias = len(fields) == 1 and fields[0].lower() in _ALIASES
    if not (is_alias or len(fields) in (5, _SECONDS_FIRST_FIELDS)):
        raise ScheduleError(
            f"invalid cron expression {cron!r}: expected 5 fields (minute hour day month weekday), "
            "6 with seconds first, or an alias such as @daily"
        )
    if any(field[:1].lower() in ("h", "r") for field in fields):
        raise ScheduleError(
            f"invalid cron expression {cron!r}: random (R) and hashed (H) fields are not "
            "supported; use jitter to spread load"
        )
    try:
        _wall_clock_iter(cron, _PERIOD_SAMPLE_START).get_next(datetime)
    except CroniterBadDateError:
        raise ScheduleError(f"invalid cron expression {cron!r}: it never fires") from None
    except CroniterError as exc:
        reason = str(exc).strip().splitlines()[-1]
        raise ScheduleError(f"invalid cron expression {cron!r}: {reason}") from None


def _wall_clock_iter(cron: str, start: datetime) -> croniter:
    """croniter over naive wall-clock datetimes: calendar arithmetic with no DST at all."""
    return croniter(cron, start, second_at_beginning=len(cron.split()) == _SECONDS_FIRST_FIELDS)


@lru_cache(maxsize=4096)
def _cron_period_ms(cron: str) -> int:
    walls = _wall_clock_iter(cron, _PERIOD_SAMPLE_START)
    sample: list[datetime] = [walls.get_next(datetime) for _ in range(_PERIOD_SAMPLE_FIRES)]
    return min(later - earlier for earlier, later in pairwise(sample)) // _MS


def _to_ms(instant: datetime) -> int:
    return (instant - _EPOCH) // _MS


def _fires_after(schedule: Schedule, after_ms: int, anchor_ms: int | None) -> Iterator[int]:
    """Fire instants strictly after ``after_ms`` (and not before the anchor), ascending."""
    if schedule.every_ms is not None:
        anchor = 0 if anchor_ms is None else anchor_ms
        steps = max(0, (after_ms - anchor) // schedule.every_ms + 1)
        return count(anchor + steps * schedule.every_ms, schedule.every_ms)
    after = after_ms if anchor_ms is None else max(after_ms, anchor_ms - 1)
    return _cron_fires_after(schedule, after)


def _cron_fires_after(schedule: Schedule, after_ms: int) -> Iterator[int]:
    """Walk the wall-clock matches in order, map each to instants, yield those in time order.

    Mapping is not order-preserving in a fall-back repeat (the second 01:00 comes after the first
    01:30), so instants wait in a heap until no later wall time can produce an earlier one: the
    earliest instant of a wall time never decreases as the wall time grows.
    """
    assert schedule.cron is not None
    zone = _zone(schedule.tz)
    start = (_EPOCH + after_ms * _MS).astimezone(zone).replace(tzinfo=None)
    # If after_ms lies in the first pass of a repeat, earlier wall times may still fire again.
    start -= max(timedelta(0), _offset(start, zone, 0) - _offset(start, zone, 1))
    walls = _wall_clock_iter(schedule.cron, start.replace(microsecond=0) - timedelta(seconds=1))
    pending: list[int] = []
    last = after_ms
    while True:
        try:
            wall = walls.get_next(datetime)
        except CroniterBadDateError:
            break
        instants = _instants_of(schedule, wall, zone)
        while pending and pending[0] < instants[0]:
            fire = heapq.heappop(pending)
            if fire > last:
                last = fire
                yield fire
        for fire in instants:
            heapq.heappush(pending, fire)
    for fire in sorted(pending):
        if fire > last:
            last = fire
            yield fire


def _offset(wall: datetime, zone: ZoneInfo, fold: int) -> timedelta:
    offset = wall.replace(tzinfo=zone, fold=fold).utcoffset()
    assert offset is not None  # a ZoneInfo always has an offset
    return offset


def _instants_of(schedule: Schedule, wall: datetime, zone: ZoneInfo) -> list[int]:
    """The instants at which a matching wall time fires, earliest first (the DST policy)."""
    early_offset, late_offset = _offset(wall, zone, 0), _offset(wall, zone, 1)
    first = _to_ms(wall.replace(tzinfo=UTC) - early_offset)
    if early_offset == late_offset:
        return [first]
    second = _to_ms(wall.replace(tzinfo=UTC) - late_offset)
    if early_offset < late_offset:
        # A gap: ``second`` is an instant before the transition, ``first`` one after it.
        return [_transition_ms(second, first, zone)]
    if period_ms(schedule) <= second - first:
        return [first, second]
    return [first]


def _transition_ms(before_ms: int, after_ms: int, zone: ZoneInfo) -> int:
    """The instant the UTC offset changes between two instants (tz data uses whole seconds)."""

    def offset_at(seconds: int) -> timedelta | None:
        return (_EPOCH + timedelta(seconds=seconds)).astimezone(zone).utcoffset()

    low, high = before_ms // 1000, -(-after_ms // 1000)
    offset_before = offset_at(low)
    while high - low > 1:
        middle = (low + high) // 2
        if offset_at(middle) == offset_before:
            low = middle
        else:
            high = middle
    return high * 1000
