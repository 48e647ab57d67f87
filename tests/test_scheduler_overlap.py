"""Overlap policies through the real scripts, with workers' claims and completions made by the
claim and complete scripts (explicit clock, fakeredis and a real server): ``allow`` runs every
fire, ``forbid`` skips (and counts) fires while the previous run is unfinished, ``buffer-one``
keeps at most one run waiting, buffered in Redis until the previous run has finished."""

from __future__ import annotations

from typing import Any

from helpers import claim

from jobqueue.client.sync import JobQueue
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.keys import PartitionKeys, SchedKeys
from jobqueue.store.runs import COMPLETE, ClaimedRun
from jobqueue.store.schedules import HOLD_MS, SCHED_RELEASE

S = 1000
PK = PartitionKeys("default", 0)


def scheduler(jq: JobQueue) -> Scheduler:
    return Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)


def claim_at(jq: JobQueue, now_s: float, pk: PartitionKeys = PK) -> list[ClaimedRun]:
    """The runs due at ``now_s`` (seconds), claimed with a ten-minute lease."""
    return claim(jq.scripts, pk, int(now_s * S), lease_ms=600 * S, retention_ms=3600 * S).runs


def complete(jq: JobQueue, run: ClaimedRun, now_s: int, pk: PartitionKeys = PK) -> None:
    call = COMPLETE.call(pk, [(run.run_id, run.fence, "null")], 3600 * S, now=now_s * S)
    assert COMPLETE.parse(jq.scripts.run(call))[0].accepted


def run_id(second: int) -> str:
    return f"j@1970-01-01T00:{second // 60:02d}:{second % 60:02d}Z"


def counters(jq: JobQueue) -> tuple[int, int]:
    info = jq.get_schedule("j")
    assert info is not None
    return info.state.fired, info.state.skipped


def test_allow_creates_every_fire_while_the_previous_run_is_running(jq: JobQueue) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    sched.tick(now=120 * S)
    assert [r.run_id for r in claim_at(jq, 120)] == [run_id(120)]  # while 60 still runs
    assert first.run_id == run_id(60)
    assert counters(jq) == (2, 0)


def test_forbid_skips_fires_while_the_previous_run_is_running_and_counts_them(
    jq: JobQueue,
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="forbid", now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    sched.tick(now=120 * S)
    sched.tick(now=180 * S)
    assert claim_at(jq, 181) == []
    complete(jq, first, 200)
    sched.tick(now=240 * S)
    assert [r.run_id for r in claim_at(jq, 240)] == [run_id(240)]
    assert counters(jq) == (2, 2)


def test_buffer_one_holds_the_buffered_run_until_the_previous_run_finishes(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    sched.tick(now=120 * S)  # 60 running: 120 is created, buffered
    assert redis_client.zscore(PK.due, run_id(120)) == HOLD_MS
    assert claim_at(jq, 130) == []  # buffered: no worker can start it
    sched.tick(now=180 * S)  # one already waits: skipped
    complete(jq, first, 190)
    sched.tick(now=191 * S)  # sees 60 finished: releases 120, due at its fire time
    (second,) = claim_at(jq, 191)
    assert second.run_id == run_id(120) and second.due_ms == 120 * S
    assert counters(jq) == (2, 1)


def test_buffer_one_runs_at_once_when_the_previous_run_has_finished(jq: JobQueue) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    complete(jq, first, 70)
    report = sched.tick(now=120 * S)
    assert [r.run_id for r in claim_at(jq, 120)] == [run_id(120)]
    assert (report.runs_created, counters(jq)) == (1, (2, 0))


def test_buffer_one_counts_a_waiting_run_that_is_still_pending_as_unfinished(
    jq: JobQueue,
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    sched.tick(now=60 * S)  # 60 pending, never claimed
    sched.tick(now=120 * S)  # buffered behind it
    sched.tick(now=180 * S)  # skipped
    assert [r.run_id for r in claim_at(jq, 200)] == [run_id(60)]  # only the first can start
    assert counters(jq) == (2, 1)


def test_buffer_one_release_survives_a_scheduler_crash_before_its_advance(
    jq: JobQueue,
) -> None:
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    scheduler(jq).tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    scheduler(jq).fire(SchedKeys(0), 120 * S)  # buffered run created, then the process dies
    complete(jq, first, 125)
    scheduler(jq).tick(now=130 * S)  # redoes fire 120: records the buffered run, releases it
    assert [r.run_id for r in claim_at(jq, 130)] == [run_id(120)]
    assert counters(jq) == (2, 0)


def test_release_script_checks_the_predecessor_and_releases_once(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    scheduler(jq).tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    scheduler(jq).tick(now=120 * S)
    call = SCHED_RELEASE.call(PK, [(run_id(120), run_id(60), 120 * S)], now=121 * S)
    assert SCHED_RELEASE.parse(jq.scripts.run(call)) == [0]  # predecessor running
    complete(jq, first, 122)
    assert SCHED_RELEASE.parse(jq.scripts.run(call)) == [1]  # released
    assert redis_client.zscore(PK.due, run_id(120)) == 120 * S
    assert SCHED_RELEASE.parse(jq.scripts.run(call)) == [2]  # nothing buffered any more


def test_get_schedule_reports_missed_dropped_skipped_and_last_fire(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, misfire="fire-all:2", now=0)
    scheduler(jq).tick(now=370 * S)  # 60..360 late: the cap keeps 300 and 360, 4 missed
    info = jq.get_schedule("j")
    assert info is not None
    shown = info.to_dict()
    assert (shown["fired"], shown["missed"], shown["dropped_by_cap"]) == (2, 4, 4)
    assert (shown["skipped_by_overlap"], shown["last_fire"]) == (0, "1970-01-01T00:06:00Z")


# -- a fire between two ticks is on time -------------------------------------------------------


def test_skip_policy_keeps_a_fire_that_lands_between_two_healthy_ticks(jq: JobQueue) -> None:
    # Default interval and misfire grace (1 s each); overlap jobs are not looked ahead, so the
    # fire at 60 s, 5 ms after one tick's clock read, is handled by the next tick 1.010 s later.
    sched = Scheduler(jq, install_signal_handlers=False)
    jq.schedule("j", "t", every=60, overlap="forbid", misfire="skip", now=0)
    sched.tick(now=60 * S - 5)
    sched.tick(now=60 * S + 1_005)
    assert [r.run_id for r in claim_at(jq, 61.005)] == [run_id(60)]
    info = jq.get_schedule("j")
    assert info is not None and (info.state.fired, info.state.missed) == (1, 0)


def test_skip_policy_still_skips_a_fire_the_schedulers_were_down_for(jq: JobQueue) -> None:
    sched = Scheduler(jq, install_signal_handlers=False)  # 1 s interval: late past 2 s
    jq.schedule("j", "t", every=60, overlap="forbid", misfire="skip", now=0)
    sched.tick(now=60 * S - 5)
    sched.tick(now=62 * S + 1)  # no tick for 2.006 s: more than two intervals
    assert claim_at(jq, 63) == []
    info = jq.get_schedule("j")
    assert info is not None and (info.state.fired, info.state.missed) == (0, 1)


# -- the previous run is looked up where it went: a queue change does not hide it --------------

OTHER = PartitionKeys("other", 0)


def test_forbid_finds_the_previous_run_in_its_old_queue_after_a_queue_change(
    jq: JobQueue,
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="forbid", now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    jq.schedule("j", "t", every=60, overlap="forbid", queue="other", now=61 * S)
    sched.tick(now=120 * S)  # 60 still runs in "default": 120 is skipped
    assert claim_at(jq, 120, OTHER) == []
    complete(jq, first, 150)
    sched.tick(now=180 * S)
    assert [r.run_id for r in claim_at(jq, 180, OTHER)] == [run_id(180)]
    assert counters(jq) == (2, 1)


def test_buffer_one_holds_its_run_until_the_previous_run_in_the_old_queue_finishes(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="buffer-one", now=0)
    sched.tick(now=60 * S)
    (first,) = claim_at(jq, 60)
    jq.schedule("j", "t", every=60, overlap="buffer-one", queue="other", now=61 * S)
    sched.tick(now=120 * S)  # 60 still runs in "default": 120 is created buffered in "other"
    assert redis_client.zscore(OTHER.due, run_id(120)) == HOLD_MS
    sched.tick(now=130 * S)  # the release pass looks in "default" too: still buffered
    assert claim_at(jq, 130, OTHER) == []
    complete(jq, first, 150)
    sched.tick(now=151 * S)
    (second,) = claim_at(jq, 151, OTHER)
    assert (second.run_id, second.due_ms) == (run_id(120), 120 * S)


def test_forbid_reads_a_state_written_before_the_last_fires_queue_was_recorded(
    jq: JobQueue, redis_client: Any
) -> None:
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="forbid", now=0)
    sched.tick(now=60 * S)
    assert [r.run_id for r in claim_at(jq, 60)] == [run_id(60)]  # running
    # The state text as earlier versions wrote it: no queue, which means the definition's.
    redis_client.hset(jq.recurring.keys("j").state, "j", f"1 0 0 0 {60 * S} {60 * S}")
    sched.tick(now=120 * S)
    assert claim_at(jq, 120) == []
    assert counters(jq) == (1, 1)


def test_a_policed_job_whose_state_is_garbage_is_left_alone_and_the_others_fire(
    jq: JobQueue, redis_client: Any, caplog: Any
) -> None:
    """Its overlap decision needs its previous fire, which its state no longer says: not
    fired (nor advanced, so nothing is lost once the state is repaired), logged; the rest of
    the tick goes on."""
    sched = scheduler(jq)
    jq.schedule("j", "t", every=60, overlap="forbid", now=0)
    jq.schedule("other", "t", every=60, now=0)
    sched.tick(now=60 * S)
    redis_client.hset(SchedKeys(0).state, "j", "garbage here")
    caplog.set_level("ERROR", logger="jobqueue.scheduler")
    sched.tick(now=120 * S)
    assert "recurring job j: unusable state" in caplog.text
    ids = {r.run_id for r in claim_at(jq, 121)}
    assert "other@1970-01-01T00:02:00Z" in ids and run_id(120) not in ids
