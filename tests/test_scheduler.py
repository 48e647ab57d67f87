"""The scheduler through the real scripts with an explicit clock, on fakeredis and a real
server: the misfire example of docs/design.md, several schedulers on one tick, a crash between
create and advance, upserts, overlap, caps, end times, DST; plus the pure decision functions."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from jobqueue.client.sync import JobQueue
from jobqueue.policy.cron import format_fire_instant, parse_fire_instant
from jobqueue.policy.jitter import jitter_ms
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.definitions import Definition
from jobqueue.recurring.planning import apply_overlap, plan_fires
from jobqueue.store.keys import SchedKeys
from jobqueue.store.schedules import HOLD_MS

S = 1000  # ms per second


def scheduler(jq: JobQueue, lookahead: float = 0.0, **kw: Any) -> Scheduler:
    return Scheduler(jq, SchedulerConfig(lookahead=lookahead, **kw), install_signal_handlers=False)


def fires_of(redis_client: Any, job_id: str) -> list[int]:
    """Nominal fire instants (ms) of the job's scheduled runs, as their run ids say."""
    out = []
    for key in redis_client.scan_iter(match="jq:{*}:run:*"):
        run_id = key.split(":run:", 1)[1]
        job, _, when = run_id.rpartition("@")
        if job == job_id and not when.startswith("manual-"):
            out.append(parse_fire_instant(when))
    return sorted(out)


def seconds(ms: list[int]) -> list[int]:
    return [t // S for t in ms]


# -- the misfire example of docs/design.md -------------------------------------------------------

MISFIRE_EXAMPLE = {
    "fire-all": [180, 240, 300, 360],
    "fire-once": [360],
    "skip": [],
    "deadline-30s": [360],
}


@pytest.mark.parametrize("policy", list(MISFIRE_EXAMPLE))
def test_misfire_policy_after_downtime_from_130_to_370(
    jq: JobQueue, redis_client: Any, policy: str
) -> None:
    # every 60 s, last fired at 120, scheduler down until 370.
    jq.schedule("report", "report_task", every=60, misfire=policy, now=120 * S)
    report = scheduler(jq).tick(now=370 * S)
    assert seconds(fires_of(redis_client, "report")) == MISFIRE_EXAMPLE[policy]
    info = jq.get_schedule("report")
    assert info is not None and info.next_fire_ms == 420 * S
    fired = len(MISFIRE_EXAMPLE[policy])
    assert (info.state.fired, info.state.missed) == (fired, 4 - fired)
    assert report.advanced == 1


def test_fire_all_cap_drops_the_oldest_late_fires_and_counts_them(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.schedule("j", "t", every=60, misfire="fire-all:2", now=120 * S)
    scheduler(jq).tick(now=370 * S)
    assert seconds(fires_of(redis_client, "j")) == [300, 360]
    info = jq.get_schedule("j")
    assert info is not None
    assert (info.state.fired, info.state.missed, info.state.dropped) == (2, 2, 2)


def test_deadline_policy_fires_in_deadline_fires_past_max_fires_in_the_next_ticks(
    jq: JobQueue, redis_client: Any
) -> None:
    # 12 late fire times, all within the deadline, 5 per tick: three ticks fire them all.
    jq.schedule("j", "t", every=60, misfire="deadline-3600s", now=0)
    sched = scheduler(jq, max_fires=5)
    for now in (750 * S, 751 * S, 752 * S):
        sched.tick(now=now)
    assert seconds(fires_of(redis_client, "j")) == list(range(60, 721, 60))
    info = jq.get_schedule("j")
    assert info is not None and info.next_fire_ms == 780 * S
    assert (info.state.fired, info.state.missed) == (12, 0)


# -- runs ------------------------------------------------------------------------------------


def test_scheduled_run_has_job_id_fire_time_and_jittered_due(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, jitter=30, args=[1], kwargs={"k": 2}, now=0)
    scheduler(jq).tick(now=60 * S)
    run = jq.get_run("j@1970-01-01T00:01:00Z")
    assert run.job_id == "j"
    assert run.scheduled_for_ms == 60 * S
    assert run.due_ms == 60 * S + jitter_ms("j", 30 * S)
    assert (run.args, run.kwargs) == ([1], {"k": 2})


def test_lookahead_creates_runs_before_their_fire_time(jq: JobQueue, redis_client: Any) -> None:
    jq.schedule("j", "t", every=60, now=0)
    scheduler(jq, lookahead=60).tick(now=10 * S)
    assert seconds(fires_of(redis_client, "j")) == [60]
    assert jq.get_schedule("j").next_fire_ms == 120 * S  # type: ignore[union-attr]


def test_nothing_happens_before_the_next_fire_time(jq: JobQueue, redis_client: Any) -> None:
    jq.schedule("j", "t", every=60, now=0)
    report = scheduler(jq).tick(now=59 * S)
    assert report.due_jobs == 0 and fires_of(redis_client, "j") == []


def test_tick_without_now_uses_the_redis_server_clock(jq: JobQueue) -> None:
    server_now = jq.server_time_ms()
    jq.schedule("j", "t", every=1)
    report = scheduler(jq, lookahead=5).tick()
    assert abs(report.now_ms - server_now) < 5 * S
    assert report.runs_created >= 5


def test_end_at_stops_the_job_after_its_last_fire(jq: JobQueue, redis_client: Any) -> None:
    jq.schedule("j", "t", every=60, end_at=150, now=0)
    sched = scheduler(jq)
    sched.tick(now=400 * S)
    assert seconds(fires_of(redis_client, "j")) == [120]
    assert jq.get_schedule("j").next_fire_ms is None  # type: ignore[union-attr]


def test_a_corrupt_definition_does_not_stop_the_other_jobs(jq: JobQueue, redis_client: Any) -> None:
    jq.schedule("good", "t", every=60, now=0)
    redis_client.zadd("jq:{sched#0}:next", {"bad": 0})
    redis_client.hset("jq:{sched#0}:def", "bad", "{not json")
    scheduler(jq).tick(now=60 * S)
    assert seconds(fires_of(redis_client, "good")) == [60]


# -- several schedulers ------------------------------------------------------------------------


@pytest.mark.parametrize("instances", [2, 3])
def test_schedulers_ticking_the_same_moment_create_each_run_exactly_once(
    jq: JobQueue, redis_client: Any, instances: int
) -> None:
    for i in range(20):
        jq.schedule(f"job-{i}", "t", every=60, misfire="fire-all", now=0)
    schedulers = [scheduler(JobQueue(redis_client)) for _ in range(instances)]
    for now in (60 * S, 120 * S, 300 * S):
        # Worst interleaving: every instance reads and creates before any advances.
        batches = [s.fire(SchedKeys(0), now) for s in schedulers]
        for s, b in zip(schedulers, batches, strict=True):
            s.advance(b)
        assert sum(b.report.advanced for b in batches) == 20
        assert sum(b.report.runs_created for b in batches) == sum(
            b.report.runs_requested for b in batches[:1]
        )
    for i in range(20):
        assert seconds(fires_of(redis_client, f"job-{i}")) == [60, 120, 180, 240, 300]
        info = jq.get_schedule(f"job-{i}")
        assert info is not None and info.state.fired == 5  # counted once, not per instance
    assert int(redis_client.hget("jq:{default#0}:stats", "created")) == 100


# -- crash between the two steps ---------------------------------------------------------------


def test_crash_between_create_and_advance_loses_and_duplicates_nothing(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.schedule("j", "t", every=60, misfire="fire-all", now=0)
    crashed = scheduler(jq)
    batch = crashed.fire(SchedKeys(0), 60 * S)  # runs created, then the process dies
    assert batch.report.runs_created == 1
    assert jq.get_schedule("j").next_fire_ms == 60 * S  # type: ignore[union-attr]
    # The next fire time is left in the past; another scheduler (or a restart) recovers it.
    report = scheduler(jq).tick(now=200 * S)
    assert (report.runs_requested, report.runs_created, report.advanced) == (3, 2, 1)
    assert seconds(fires_of(redis_client, "j")) == [60, 120, 180]
    assert jq.get_schedule("j").next_fire_ms == 240 * S  # type: ignore[union-attr]


def test_a_late_advance_from_a_stale_scheduler_is_refused(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, now=0)
    stale, fresh = scheduler(jq), scheduler(jq)
    old = stale.fire(SchedKeys(0), 60 * S)
    fresh.tick(now=60 * S)
    fresh.tick(now=120 * S)
    stale.advance(old)  # expected next 60 s, but it is 180 s now: never moved backwards
    assert (old.report.advanced, old.report.conflicts) == (0, 1)
    assert jq.get_schedule("j").next_fire_ms == 180 * S  # type: ignore[union-attr]


# -- upsert ------------------------------------------------------------------------------------


def test_upsert_applies_from_the_next_fire_without_duplicate_or_drop(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq, lookahead=60)
    jq.schedule("j", "t", every=60, now=0)
    for now in range(0, 200 * S, 10 * S):
        sched.tick(now=now)
    jq.schedule("j", "t", every=30, now=200 * S)
    for now in range(200 * S, 400 * S, 10 * S):
        sched.tick(now=now)
    got = seconds(fires_of(redis_client, "j"))
    # Fires up to 260 were created under the old schedule (lookahead 60), then every 30 s.
    assert got == [60, 120, 180, 240, 270, 300, 330, 360, 390, 420, 450]
    assert len(got) == len(set(got))


def test_upsert_of_arguments_only_changes_later_runs(jq: JobQueue) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, args=[1], now=0)
    sched.tick(now=60 * S)
    jq.schedule("j", "t", every=60, args=[2], now=61 * S)
    sched.tick(now=120 * S)
    assert jq.get_run("j@1970-01-01T00:01:00Z").args == [1]
    assert jq.get_run("j@1970-01-01T00:02:00Z").args == [2]


# -- pause / resume / trigger / backfill through the scheduler ---------------------------------


def test_paused_job_does_not_fire_and_resume_fires_from_the_next_time(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, misfire="fire-all", now=0)
    sched.tick(now=60 * S)
    jq.pause_schedule("j", now=61 * S)
    sched.tick(now=300 * S)
    jq.resume_schedule("j", now=301 * S)
    sched.tick(now=360 * S)
    assert seconds(fires_of(redis_client, "j")) == [60, 360]


def test_trigger_and_backfill_do_not_disturb_the_schedule(jq: JobQueue, redis_client: Any) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, misfire="fire-all", now=0)
    jq.trigger("j", now=30 * S)
    jq.backfill("j", 60, 120, now=120 * S)  # past fire times, before the scheduler's tick
    report = sched.tick(now=120 * S)
    assert (report.runs_requested, report.runs_created) == (2, 0)  # both already there
    assert seconds(fires_of(redis_client, "j")) == [60, 120]
    assert jq.get_run("j@manual-1970-01-01T00:00:30Z").state == "pending"


def test_a_tick_drains_a_partition_in_many_batches_creating_each_run_once(
    jq: JobQueue, redis_client: Any
) -> None:
    for i in range(25):
        jq.schedule(f"j{i:02d}", "t", every=60, jitter=30, now=0)
    report = scheduler(jq, batch=4).tick(now=60 * S)
    assert (report.due_jobs, report.runs_created, report.advanced) == (25, 25, 25)
    assert all(seconds(fires_of(redis_client, f"j{i:02d}")) == [60] for i in range(25))


def test_jobs_that_cannot_fire_yet_do_not_hide_due_jobs_behind_them(
    jq: JobQueue, redis_client: Any
) -> None:
    for name in ("a", "b", "c"):  # overlap jobs are not looked ahead: not due before 120
        jq.schedule(name, "t", every=120, overlap="forbid", now=0)
    jq.schedule("z", "t", every=120, now=0)  # same next fire, read after them
    report = scheduler(jq, lookahead=60, batch=2).tick(now=70 * S)
    assert (report.runs_created, report.advanced) == (1, 1)
    assert seconds(fires_of(redis_client, "z")) == [120]


# -- overlap -----------------------------------------------------------------------------------


def test_overlap_forbid_skips_while_the_previous_run_is_unfinished_and_counts(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq, lookahead=60)
    jq.schedule("j", "t", every=60, overlap="forbid", now=0)
    sched.tick(now=60 * S)  # run 60 created, stays pending
    sched.tick(now=120 * S)  # skipped: 60 unfinished
    sched.tick(now=180 * S)  # skipped again
    assert seconds(fires_of(redis_client, "j")) == [60]
    jq.cancel("j@1970-01-01T00:01:00Z")  # finished (cancelled)
    sched.tick(now=240 * S)
    assert seconds(fires_of(redis_client, "j")) == [60, 240]
    info = jq.get_schedule("j")
    assert info is not None
    assert (info.state.fired, info.state.skipped) == (2, 2)


def test_overlap_buffer_one_buffers_one_run_and_skips_further_fires(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    sched.tick(now=60 * S)  # no previous run: 60 runs at once
    sched.tick(now=120 * S)  # 60 unfinished: 120 is buffered
    sched.tick(now=180 * S)  # one is buffered already: skipped
    assert seconds(fires_of(redis_client, "j")) == [60, 120]
    assert redis_client.zscore("jq:{default#0}:due", "j@1970-01-01T00:02:00Z") == HOLD_MS
    info = jq.get_schedule("j")
    assert info is not None and (info.state.fired, info.state.skipped) == (2, 1)


# -- DST ---------------------------------------------------------------------------------------


def _utc(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


# Real server only: the DST decisions are the scheduler's Python (the same on both backends),
# and 432 ticks a case on fakeredis cost three times the real server's.
@pytest.mark.real_only
@pytest.mark.parametrize(
    ("tz", "cron", "start", "days"),
    [
        ("America/New_York", "30 1 * * *", "2026-10-31T00:00:00", 3),  # fall back 1 Nov
        ("America/New_York", "30 2 * * *", "2026-03-07T00:00:00", 3),  # spring forward 8 Mar
        ("Australia/Lord_Howe", "45 1 * * *", "2026-04-04T00:00:00", 3),  # 30-minute shift
    ],
)
def test_daily_job_fires_once_per_local_day_across_dst_through_the_scheduler(
    jq: JobQueue, redis_client: Any, tz: str, cron: str, start: str, days: int
) -> None:
    t0 = _utc(start)
    jq.schedule("d", "t", cron=cron, tz=tz, misfire="fire-all", now=t0)
    sched = scheduler(jq, lookahead=60)
    for now in range(t0, t0 + days * 86_400 * S, 600 * S):
        sched.tick(now=now)
    fired = fires_of(redis_client, "d")
    assert len(fired) == days, [format_fire_instant(f) for f in fired]


# -- the pure decisions ------------------------------------------------------------------------


def _defn(**kw: Any) -> Definition:
    base: dict[str, Any] = {"job_id": "j", "task": "t", "queue": "default", "every_ms": 60 * S}
    base.update(kw)
    return Definition(**base)


def test_plan_fires_is_none_when_nothing_is_due() -> None:
    assert plan_fires(_defn(), 120 * S, 100 * S, lookahead_ms=0) is None


def test_plan_fires_counts_late_fires_of_a_long_outage_without_walking_them() -> None:
    # every second, down for a year: 31.5 M late fire times, fire-all keeps the latest 100.
    year = 365 * 86_400 * S
    plan = plan_fires(_defn(every_ms=S, misfire="fire-all"), S, year, lookahead_ms=0)
    assert plan is not None
    # 100 late + two on time (year - 1 s is within the 1 s misfire grace, and year itself)
    assert len(plan.fires) == 102
    assert plan.dropped == plan.missed == year // S - 102
    assert plan.new_next_ms == year + S


def test_plan_fires_with_deadline_over_max_fires_moves_only_past_the_fires_it_fires() -> None:
    # every second, down for 3,000 s with a one-hour deadline, 1,000 fires per tick at most
    defn = _defn(every_ms=S, misfire="deadline-3600s")
    first = plan_fires(defn, 7_000 * S, 10_000 * S, lookahead_ms=0, max_fires=1000)
    assert first is not None
    assert first.fires == list(range(7_000 * S, 8_000 * S, S))
    assert (first.missed, first.through_ms, first.new_next_ms) == (0, 7_999 * S, 8_000 * S)
    # Resumed when 8,000..8,499 are past the deadline: those are missed then, not before.
    second = plan_fires(defn, 8_000 * S, 12_100 * S, lookahead_ms=0, max_fires=1000)
    assert second is not None
    assert (second.fires[0], second.missed, second.new_next_ms) == (8_500 * S, 500, 9_500 * S)


def test_apply_overlap_rules() -> None:
    assert apply_overlap("allow", [1, 2], "running") == ([1, 2], 0)
    assert apply_overlap("forbid", [1, 2], "pending") == ([], 2)
    assert apply_overlap("forbid", [1, 2], "done") == ([2], 1)
    assert apply_overlap("forbid", [1], None) == ([1], 0)
    assert apply_overlap("buffer-one", [1], "running") == ([1], 0)
    assert apply_overlap("buffer-one", [1, 2], "running") == ([2], 1)
    assert apply_overlap("buffer-one", [1, 2], "done", buffered=True) == ([], 2)
