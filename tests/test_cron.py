"""Schedules: validation, fire times, the DST policy, and the fire-instant format of run ids.

DST expectations are checked against the real 2026 transitions (and Hebron's 2021 ones, the
last year its clocks changed at midnight); each DST test first asserts that the zone really
changes its offset on the day in question, so a tz-data update cannot make it pass vacuously.
"""

from __future__ import annotations

from collections import Counter
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest

from jobqueue.policy.cron import (
    Schedule,
    ScheduleError,
    fire_times_between,
    format_fire_instant,
    next_fire_after,
    parse_fire_instant,
    parse_schedule,
    period_ms,
)

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR

NEW_YORK = "America/New_York"
LONDON = "Europe/London"
LORD_HOWE = "Australia/Lord_Howe"
HEBRON = "Asia/Hebron"


def utc(text: str) -> int:
    """An instant written the way run ids write it."""
    return parse_fire_instant(text)


def ms_of(moment: datetime) -> int:
    return (moment - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(milliseconds=1)


def local(tz: str, year: int, month: int, day: int, hour: int, minute: int, fold: int = 0) -> int:
    """The instant of a local wall time (``fold=1``: the second pass of a repeated hour)."""
    return ms_of(datetime(year, month, day, hour, minute, tzinfo=ZoneInfo(tz), fold=fold))


def wall_clock(tz: str, ms: int) -> str:
    """An instant as local ISO time with its offset, e.g. ``2026-03-08T03:00:00-04:00``."""
    return datetime.fromtimestamp(ms / 1000, ZoneInfo(tz)).isoformat()


def cron(expression: str, tz: str = "UTC") -> Schedule:
    return parse_schedule(expression, None, tz)


def every(seconds: float) -> Schedule:
    return parse_schedule(None, seconds)


def changes_offset_on(tz: str, day: date) -> bool:
    """The test's premise: the zone's UTC offset differs between the noons around ``day``."""
    noon_before = datetime(day.year, day.month, day.day, 12, tzinfo=ZoneInfo(tz)) - timedelta(1)
    noon_after = noon_before + timedelta(days=2)
    return noon_before.utcoffset() != noon_after.utcoffset()


def fires_per_local_day(schedule: Schedule, first: date, last: date) -> list[int]:
    """How many times the schedule fires on each local calendar day from first to last."""
    zone = ZoneInfo(schedule.tz)
    window_start = datetime(first.year, first.month, first.day, tzinfo=UTC) - timedelta(days=2)
    window_end = datetime(last.year, last.month, last.day, tzinfo=UTC) + timedelta(days=2)
    fires = fire_times_between(schedule, ms_of(window_start), ms_of(window_end))
    per_day = Counter(datetime.fromtimestamp(ms / 1000, zone).date() for ms in fires)
    return [per_day[first + timedelta(days=i)] for i in range((last - first).days + 1)]


def gaps_between(fires: list[int]) -> set[int]:
    return {later - earlier for earlier, later in pairwise(fires)}


# --- parsing and validation -------------------------------------------------------------------


def test_a_cron_schedule_runs_in_utc_unless_a_zone_is_given() -> None:
    assert cron("0 9 * * *") == Schedule(cron="0 9 * * *", every_ms=None, tz="UTC")


def test_every_is_given_in_seconds_and_stored_in_milliseconds() -> None:
    assert every(0.25) == Schedule(cron=None, every_ms=250, tz="UTC")


def test_every_below_one_millisecond_is_rejected() -> None:
    with pytest.raises(ScheduleError, match=r"invalid every 0\.0001: must be at least 0\.001 s"):
        every(0.0001)


@pytest.mark.parametrize("seconds", [0, -60, float("nan"), float("inf")])
def test_every_must_be_a_positive_finite_number_of_seconds(seconds: float) -> None:
    with pytest.raises(ScheduleError, match=f"invalid every {seconds!r}"):
        every(seconds)


def test_a_schedule_needs_cron_or_every() -> None:
    with pytest.raises(ScheduleError, match="exactly one of cron or every"):
        parse_schedule(None, None)


def test_a_schedule_cannot_have_both_cron_and_every() -> None:
    with pytest.raises(ScheduleError, match="not both"):
        parse_schedule("* * * * *", 60)


def test_an_invalid_cron_expression_is_named_in_the_error() -> None:
    with pytest.raises(ScheduleError, match=r"^invalid cron expression '61 \* \* \* \*': .*range"):
        cron("61 * * * *")


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("* * *", "expected 5 fields"),
        ("0 0 1 1 * * 2030", "expected 5 fields"),
        ("@fortnightly", "expected 5 fields"),
        ("", "expected 5 fields"),
        ("*/0 * * * *", "step"),
        ("0 0 31 2 *", "never fires"),
        ("H * * * *", "hashed"),
        ("R 9 * * *", "random"),
    ],
)
def test_unsupported_cron_expressions_are_rejected_with_a_one_line_reason(
    expression: str, reason: str
) -> None:
    with pytest.raises(ScheduleError, match=reason) as error:
        cron(expression)
    assert str(error.value).startswith(f"invalid cron expression '{expression}': ")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("tz", ["Mars/Olympus", "", "../etc/passwd"])
def test_an_unknown_time_zone_is_rejected_by_name(tz: str) -> None:
    with pytest.raises(ScheduleError) as error:
        cron("0 9 * * *", tz)
    assert str(error.value) == f"unknown time zone '{tz}'"


def test_a_time_zone_name_longer_than_a_file_name_is_rejected_by_its_start() -> None:
    with pytest.raises(ScheduleError) as error:
        cron("0 9 * * *", "x" * 400)
    assert str(error.value) == f"unknown time zone '{'x' * 60}'"


def test_schedule_errors_are_value_errors() -> None:
    assert issubclass(ScheduleError, ValueError)


def test_a_schedule_built_directly_is_validated_too() -> None:
    with pytest.raises(ScheduleError, match="at least 1 ms"):
        Schedule(cron=None, every_ms=0)


def test_six_field_cron_has_the_seconds_field_first() -> None:
    schedule = cron("30 0 9 * * *")
    assert next_fire_after(schedule, utc("2026-05-01T00:00:00Z")) == utc("2026-05-01T09:00:30Z")


def test_cron_aliases_are_accepted() -> None:
    assert next_fire_after(cron("@daily"), utc("2026-05-01T12:00:00Z")) == utc(
        "2026-05-02T00:00:00Z"
    )


# --- period -------------------------------------------------------------------------------------


def test_the_period_of_an_interval_schedule_is_its_interval() -> None:
    assert period_ms(every(90)) == 90_000


@pytest.mark.parametrize(
    ("expression", "period"),
    [
        ("*/15 * * * *", 15 * MINUTE),
        ("0 9 * * 1-5", DAY),
        ("0 0,23 * * *", HOUR),  # 23:00 to the next day's 00:00
        ("*/10 * * * * *", 10_000),
    ],
)
def test_the_period_of_a_cron_schedule_is_its_smallest_gap(expression: str, period: int) -> None:
    assert period_ms(cron(expression)) == period


# --- interval schedules -------------------------------------------------------------------------


def test_an_interval_schedule_fires_on_a_grid_anchored_at_the_epoch() -> None:
    assert next_fire_after(every(60), 370_000) == 420_000


def test_the_next_fire_is_strictly_after_the_given_instant() -> None:
    assert next_fire_after(every(60), 420_000) == 480_000


def test_an_anchor_shifts_the_grid() -> None:
    assert next_fire_after(every(60), 370_000, anchor_ms=1_000) == 421_000


def test_the_anchor_is_the_first_fire() -> None:
    assert next_fire_after(every(60), 0, anchor_ms=1_000_000) == 1_000_000


def test_interval_fires_between_two_instants_exclude_the_start_and_include_the_end() -> None:
    assert fire_times_between(every(60), 120_000, 360_000) == [180_000, 240_000, 300_000, 360_000]


def test_fire_times_between_stops_at_the_limit() -> None:
    assert fire_times_between(every(0.25), 0, 10_000, limit=3) == [250, 500, 750]


def test_fire_times_between_is_empty_when_the_window_is() -> None:
    assert fire_times_between(every(60), 360_000, 360_000) == []


def test_interval_schedules_ignore_the_time_zone() -> None:
    in_new_york = parse_schedule(None, 3600, NEW_YORK)
    fall_back_night = (local(NEW_YORK, 2026, 11, 1, 0, 0), local(NEW_YORK, 2026, 11, 1, 4, 0))
    assert gaps_between(fire_times_between(in_new_york, *fall_back_night)) == {HOUR}


# --- cron schedules -----------------------------------------------------------------------------


def test_a_cron_schedule_fires_strictly_after_the_given_instant() -> None:
    hourly = cron("0 * * * *")
    assert next_fire_after(hourly, utc("2026-05-01T09:59:59.999Z")) == utc("2026-05-01T10:00:00Z")
    assert next_fire_after(hourly, utc("2026-05-01T10:00:00Z")) == utc("2026-05-01T11:00:00Z")


def test_a_cron_schedule_follows_its_zones_wall_clock() -> None:
    nine_in_london = cron("0 9 * * *", LONDON)
    assert next_fire_after(nine_in_london, utc("2026-07-01T00:00:00Z")) == utc(
        "2026-07-01T08:00:00Z"
    )
    assert next_fire_after(nine_in_london, utc("2026-12-01T00:00:00Z")) == utc(
        "2026-12-01T09:00:00Z"
    )


def test_a_cron_anchor_means_no_fire_before_it() -> None:
    anchor = utc("2026-05-03T12:00:00Z")
    assert next_fire_after(cron("0 0 * * *"), utc("2026-05-01T12:00:00Z"), anchor) == utc(
        "2026-05-04T00:00:00Z"
    )


def test_stepping_with_next_fire_after_gives_the_same_fires_as_fire_times_between() -> None:
    schedule = cron("*/15 * * * *", NEW_YORK)
    start, end = local(NEW_YORK, 2026, 11, 1, 0, 0), local(NEW_YORK, 2026, 11, 1, 3, 0)
    stepped = [next_fire_after(schedule, start)]
    while (following := next_fire_after(schedule, stepped[-1])) <= end:
        stepped.append(following)
    assert stepped == fire_times_between(schedule, start, end)


# --- DST: spring forward (a wall time that does not exist) --------------------------------------


def test_new_york_daily_0230_fires_at_0300_edt_on_spring_forward_day() -> None:
    assert changes_offset_on(NEW_YORK, date(2026, 3, 8))
    fires = fire_times_between(
        cron("30 2 * * *", NEW_YORK), utc("2026-03-07T00:00:00Z"), utc("2026-03-10T00:00:00Z")
    )
    assert [wall_clock(NEW_YORK, ms) for ms in fires] == [
        "2026-03-07T02:30:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-09T02:30:00-04:00",
    ]


def test_all_wall_times_inside_the_gap_fire_once_at_its_end() -> None:
    quarter_hourly = cron("*/15 * * * *", NEW_YORK)
    fires = fire_times_between(
        quarter_hourly, local(NEW_YORK, 2026, 3, 8, 1, 30), local(NEW_YORK, 2026, 3, 8, 3, 15)
    )
    assert [wall_clock(NEW_YORK, ms) for ms in fires] == [
        "2026-03-08T01:45:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T03:15:00-04:00",
    ]


def test_lord_howe_daily_0215_fires_at_0230_at_the_end_of_its_half_hour_gap() -> None:
    assert changes_offset_on(LORD_HOWE, date(2026, 10, 4))
    fire = next_fire_after(cron("15 2 * * *", LORD_HOWE), local(LORD_HOWE, 2026, 10, 4, 0, 0))
    assert wall_clock(LORD_HOWE, fire) == "2026-10-04T02:30:00+11:00"


def test_hebron_daily_midnight_fires_at_0100_when_midnight_does_not_exist() -> None:
    assert changes_offset_on(HEBRON, date(2021, 3, 27))
    fire = next_fire_after(cron("0 0 * * *", HEBRON), utc("2021-03-26T12:00:00Z"))
    assert wall_clock(HEBRON, fire) == "2021-03-27T01:00:00+03:00"


# --- DST: fall back (a wall time that happens twice) --------------------------------------------


def test_new_york_daily_0130_fires_once_on_fall_back_day_at_the_first_0130() -> None:
    # croniter's own time-zone support fires this job at 01:30 EDT and again at 01:30 EST.
    assert changes_offset_on(NEW_YORK, date(2026, 11, 1))
    fires = fire_times_between(
        cron("30 1 * * *", NEW_YORK), utc("2026-10-31T00:00:00Z"), utc("2026-11-03T00:00:00Z")
    )
    assert [wall_clock(NEW_YORK, ms) for ms in fires] == [
        "2026-10-31T01:30:00-04:00",
        "2026-11-01T01:30:00-04:00",
        "2026-11-02T01:30:00-05:00",
    ]


def test_after_the_first_0130_a_daily_job_next_fires_the_following_day() -> None:
    first_pass = local(NEW_YORK, 2026, 11, 1, 1, 30, fold=0)
    fire = next_fire_after(cron("30 1 * * *", NEW_YORK), first_pass)
    assert wall_clock(NEW_YORK, fire) == "2026-11-02T01:30:00-05:00"


def test_new_york_quarter_hourly_job_fires_through_both_passes_of_the_repeated_hour() -> None:
    fires = fire_times_between(
        cron("*/15 * * * *", NEW_YORK),
        local(NEW_YORK, 2026, 11, 1, 0, 30),
        local(NEW_YORK, 2026, 11, 1, 2, 0),
    )
    assert len(fires) == 10  # 00:45, four in each pass of 01:xx, 02:00
    assert gaps_between(fires) == {15 * MINUTE}


def test_a_sub_shift_job_still_fires_the_second_pass_when_asked_from_inside_the_first() -> None:
    late_in_first_pass = local(NEW_YORK, 2026, 11, 1, 1, 50, fold=0)
    fire = next_fire_after(cron("*/15 * * * *", NEW_YORK), late_in_first_pass)
    assert wall_clock(NEW_YORK, fire) == "2026-11-01T01:00:00-05:00"


@pytest.mark.parametrize("tz", [NEW_YORK, LONDON])
def test_an_hourly_job_fires_every_real_hour_through_a_one_hour_fall_back(tz: str) -> None:
    night = date(2026, 11, 1) if tz == NEW_YORK else date(2026, 10, 25)
    assert changes_offset_on(tz, night)
    fires = fire_times_between(
        cron("0 * * * *", tz),
        local(tz, night.year, night.month, night.day, 0, 0),
        local(tz, night.year, night.month, night.day, 4, 0),
    )
    assert len(fires) == 5
    assert gaps_between(fires) == {HOUR}


def test_lord_howe_quarter_hourly_job_replays_its_half_hour_repeat() -> None:
    assert changes_offset_on(LORD_HOWE, date(2026, 4, 5))
    fires = fire_times_between(
        cron("*/15 * * * *", LORD_HOWE),
        local(LORD_HOWE, 2026, 4, 5, 1, 0),
        local(LORD_HOWE, 2026, 4, 5, 2, 15),
    )
    assert [wall_clock(LORD_HOWE, ms) for ms in fires] == [
        "2026-04-05T01:15:00+11:00",
        "2026-04-05T01:30:00+11:00",
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T01:30:00+10:30",
        "2026-04-05T01:45:00+10:30",
        "2026-04-05T02:00:00+10:30",
        "2026-04-05T02:15:00+10:30",
    ]


def test_lord_howe_hourly_job_does_not_repeat_in_its_half_hour_fall_back() -> None:
    fires = fire_times_between(
        cron("45 * * * *", LORD_HOWE),
        local(LORD_HOWE, 2026, 4, 5, 0, 0),
        local(LORD_HOWE, 2026, 4, 5, 3, 0),
    )
    assert [wall_clock(LORD_HOWE, ms) for ms in fires] == [
        "2026-04-05T00:45:00+11:00",
        "2026-04-05T01:45:00+11:00",
        "2026-04-05T02:45:00+10:30",
    ]


def test_hebron_daily_midnight_fires_at_the_first_of_two_midnights() -> None:
    assert changes_offset_on(HEBRON, date(2021, 10, 29))
    fire = next_fire_after(cron("0 0 * * *", HEBRON), utc("2021-10-28T12:00:00Z"))
    assert wall_clock(HEBRON, fire) == "2021-10-29T00:00:00+03:00"


# --- DST: a daily job fires exactly once per local day ------------------------------------------


@pytest.mark.parametrize(
    ("tz", "transition_day", "expression"),
    [
        (NEW_YORK, date(2026, 3, 8), "30 2 * * *"),
        (NEW_YORK, date(2026, 3, 8), "0 0 * * *"),
        (NEW_YORK, date(2026, 11, 1), "30 1 * * *"),
        (NEW_YORK, date(2026, 11, 1), "0 1 * * *"),
        (LONDON, date(2026, 3, 29), "30 1 * * *"),
        (LONDON, date(2026, 10, 25), "30 1 * * *"),
        (LORD_HOWE, date(2026, 4, 5), "45 1 * * *"),
        (LORD_HOWE, date(2026, 10, 4), "15 2 * * *"),
        (HEBRON, date(2026, 3, 28), "30 2 * * *"),
        (HEBRON, date(2026, 10, 24), "30 1 * * *"),
        (HEBRON, date(2021, 3, 27), "0 0 * * *"),
        (HEBRON, date(2021, 10, 29), "0 0 * * *"),
    ],
)
def test_a_daily_job_fires_exactly_once_per_local_day_across_a_transition(
    tz: str, transition_day: date, expression: str
) -> None:
    assert changes_offset_on(tz, transition_day)
    day_before, day_after = transition_day - timedelta(days=1), transition_day + timedelta(days=1)
    assert fires_per_local_day(cron(expression, tz), day_before, day_after) == [1, 1, 1]


# --- fire instants in run ids -------------------------------------------------------------------


def test_a_fire_instant_is_written_in_utc_to_the_second() -> None:
    assert format_fire_instant(1_795_946_400_000) == "2026-11-29T10:00:00Z"


def test_milliseconds_are_written_only_when_not_zero() -> None:
    assert format_fire_instant(1_795_946_400_250) == "2026-11-29T10:00:00.250Z"


def test_an_instant_before_the_epoch_is_written_too() -> None:
    assert format_fire_instant(-1) == "1969-12-31T23:59:59.999Z"


@pytest.mark.parametrize("ms", [0, 1, 1_795_946_400_000, 1_795_946_400_250, -86_400_001])
def test_parse_fire_instant_is_the_inverse_of_format(ms: int) -> None:
    assert parse_fire_instant(format_fire_instant(ms)) == ms


@pytest.mark.parametrize(
    "text",
    [
        "2026-11-29T10:00:00.000Z",
        "2026-11-29T10:00:00.25Z",
        "2026-11-29T10:00:00",
        "2026-11-29 10:00:00Z",
        "2026-11-29T10:00:00+00:00",
        "2026-11-29T11:00:00+01:00Z",
        "1795946400000",
    ],
)
def test_only_the_canonical_spelling_parses_so_a_run_id_has_one_form(text: str) -> None:
    with pytest.raises(ValueError, match="invalid fire instant"):
        parse_fire_instant(text)
