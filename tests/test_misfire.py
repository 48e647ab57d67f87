"""Misfire policies: which of a job's due fire times get a run after the scheduler was late."""

from __future__ import annotations

import pytest

from jobqueue.policy.cron import fire_times_between, next_fire_after, parse_schedule
from jobqueue.policy.misfire import (
    DEFAULT_FIRE_ALL_CAP,
    MisfireDecision,
    MisfireError,
    MisfirePolicy,
    apply_misfire,
    effective_misfire_grace_ms,
    parse_policy,
)

SECOND = 1000
EVERY_POLICY = ["fire-all", "fire-all:2", "fire-once", "skip", "deadline-30s", "deadline-1ms"]


# --- parsing ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "policy"),
    [
        ("fire-all", MisfirePolicy("fire-all", cap=DEFAULT_FIRE_ALL_CAP)),
        ("fire-all:500", MisfirePolicy("fire-all", cap=500)),
        ("fire-once", MisfirePolicy("fire-once")),
        ("skip", MisfirePolicy("skip")),
        ("deadline-30s", MisfirePolicy("deadline", deadline_ms=30_000)),
        ("deadline-1500ms", MisfirePolicy("deadline", deadline_ms=1_500)),
    ],
)
def test_each_policy_form_parses(text: str, policy: MisfirePolicy) -> None:
    assert parse_policy(text) == policy


def test_fire_all_is_capped_at_100_by_default() -> None:
    assert parse_policy("fire-all").cap == 100


def test_surrounding_whitespace_is_ignored() -> None:
    assert parse_policy("  skip\n") == MisfirePolicy("skip")


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("fire-all", "fire-all"),
        ("fire-all:100", "fire-all"),
        ("fire-all:500", "fire-all:500"),
        ("fire-once", "fire-once"),
        ("skip", "skip"),
        ("deadline-30s", "deadline-30s"),
        ("deadline-30000ms", "deadline-30s"),
        ("deadline-1500ms", "deadline-1500ms"),
    ],
)
def test_a_policy_prints_as_its_canonical_text(text: str, canonical: str) -> None:
    assert str(parse_policy(text)) == canonical
    assert parse_policy(canonical) == parse_policy(text)


@pytest.mark.parametrize(
    "text",
    [
        "sometimes",
        "",
        "FIRE-ALL",
        "fire-all:0",
        "fire-all:-5",
        "skip:5",
        "deadline-0s",
        "deadline-030s",
        "deadline-30",
        "deadline-5m",
    ],
)
def test_an_unknown_policy_is_rejected_listing_the_valid_forms(text: str) -> None:
    with pytest.raises(MisfireError) as error:
        parse_policy(text)
    assert str(error.value) == (
        f"unknown misfire policy '{text}': expected one of fire-all, fire-all:<N>, fire-once, "
        "skip, deadline-<N>s, deadline-<N>ms"
    )


def test_misfire_errors_are_value_errors() -> None:
    assert issubclass(MisfireError, ValueError)


# --- the misfire example of docs/design.md -------------------------------------------------------


@pytest.mark.parametrize(
    ("policy", "runs"),
    [
        ("fire-all", [180, 240, 300, 360]),
        ("fire-once", [360]),
        ("skip", []),
        ("deadline-30s", [360]),
    ],
)
def test_every_60s_last_fired_at_120_scheduler_down_until_370(
    policy: str, runs: list[int]
) -> None:
    job = parse_schedule(None, 60)
    last_fired, now = 120 * SECOND, 370 * SECOND
    due = fire_times_between(job, last_fired, now)
    assert due == [180 * SECOND, 240 * SECOND, 300 * SECOND, 360 * SECOND]

    decision = apply_misfire(parse_policy(policy), due, now)

    assert decision.fire == [t * SECOND for t in runs]
    assert next_fire_after(job, now, anchor_ms=0) == 420 * SECOND


# --- on time and late ---------------------------------------------------------------------------


@pytest.mark.parametrize("policy", EVERY_POLICY)
def test_a_fire_time_within_the_misfire_grace_fires_under_every_policy(policy: str) -> None:
    decision = apply_misfire(
        parse_policy(policy), [360_000], now_ms=361_000, misfire_grace_ms=1_000
    )
    assert decision == MisfireDecision(fire=[360_000], missed=0, dropped_by_cap=0)


@pytest.mark.parametrize("policy", EVERY_POLICY)
def test_a_fire_time_not_yet_due_counts_as_on_time(policy: str) -> None:
    decision = apply_misfire(parse_policy(policy), [365_000], now_ms=360_000)
    assert decision.fire == [365_000]


def test_a_fire_time_is_late_once_now_is_more_than_the_misfire_grace_past_it() -> None:
    decision = apply_misfire(
        parse_policy("skip"), [360_000], now_ms=361_001, misfire_grace_ms=1_000
    )
    assert decision == MisfireDecision(fire=[], missed=1, dropped_by_cap=0)


def test_the_misfire_grace_defaults_to_one_second() -> None:
    skip = parse_policy("skip")
    assert apply_misfire(skip, [360_000], now_ms=361_000).fire == [360_000]
    assert apply_misfire(skip, [360_000], now_ms=361_001).fire == []


def test_a_scheduler_never_uses_a_misfire_grace_below_two_tick_intervals() -> None:
    # A fire just after one tick's clock read is handled a tick gap later: never "late".
    assert effective_misfire_grace_ms(1_000, 1_000) == 2_000
    assert effective_misfire_grace_ms(0, 250) == 500
    assert effective_misfire_grace_ms(30_000, 1_000) == 30_000  # a longer one stays as configured


def test_a_negative_misfire_grace_is_rejected() -> None:
    with pytest.raises(ValueError, match="misfire_grace_ms"):
        apply_misfire(parse_policy("skip"), [0], now_ms=0, misfire_grace_ms=-1)


def test_nothing_due_decides_nothing() -> None:
    assert apply_misfire(parse_policy("fire-all"), [], now_ms=0) == MisfireDecision([], 0, 0)


def test_due_fire_times_may_arrive_in_any_order() -> None:
    decision = apply_misfire(parse_policy("fire-all"), [300_000, 180_000, 240_000], 370_000)
    assert decision.fire == [180_000, 240_000, 300_000]


# --- each policy --------------------------------------------------------------------------------


def test_fire_all_keeps_only_the_latest_cap_late_fire_times() -> None:
    late = [i * SECOND for i in range(250)]
    decision = apply_misfire(parse_policy("fire-all"), late, now_ms=1_000 * SECOND)
    assert decision.fire == late[-100:]
    assert decision.dropped_by_cap == 150
    assert decision.missed == 150


def test_fire_all_cap_does_not_count_on_time_fire_times() -> None:
    due = [100_000, 200_000, 300_000, 360_000]
    decision = apply_misfire(parse_policy("fire-all:2"), due, now_ms=360_500)
    assert decision == MisfireDecision(fire=[200_000, 300_000, 360_000], missed=1, dropped_by_cap=1)


def test_fire_once_fires_only_the_latest_late_fire_time() -> None:
    decision = apply_misfire(parse_policy("fire-once"), [180_000, 240_000, 300_000], 370_000)
    assert decision == MisfireDecision(fire=[300_000], missed=2, dropped_by_cap=0)


def test_fire_once_folds_the_backlog_into_an_on_time_run() -> None:
    due = [180_000, 240_000, 300_000, 360_000]
    decision = apply_misfire(parse_policy("fire-once"), due, now_ms=360_500)
    assert decision == MisfireDecision(fire=[360_000], missed=3, dropped_by_cap=0)


def test_skip_fires_no_late_fire_time() -> None:
    decision = apply_misfire(parse_policy("skip"), [180_000, 240_000, 300_000], 370_000)
    assert decision == MisfireDecision(fire=[], missed=3, dropped_by_cap=0)


def test_deadline_fires_late_fire_times_up_to_and_including_the_deadline() -> None:
    due = [330_000, 339_999, 340_000, 360_000]
    decision = apply_misfire(parse_policy("deadline-30s"), due, now_ms=370_000)
    assert decision == MisfireDecision(fire=[340_000, 360_000], missed=2, dropped_by_cap=0)


def test_a_deadline_in_milliseconds_is_honoured_to_the_millisecond() -> None:
    decision = apply_misfire(parse_policy("deadline-1500ms"), [368_499, 368_500], 370_000)
    assert decision.fire == [368_500]


def test_scheduler_misfire_grace_help_says_it_is_at_least_two_intervals() -> None:
    from click.testing import CliRunner

    from jobqueue.cli import main

    result = CliRunner().invoke(main, ["scheduler", "--help"], terminal_width=200)
    assert result.exit_code == 0
    assert "(at least 2 x --interval)" in result.output
