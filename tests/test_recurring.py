"""The recurring-job definitions store: validation at declaration (nothing written on bad
input), upsert, pause/resume, trigger, backfill, list; on fakeredis and a real server."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from jobqueue.client.sync import JobQueue
from jobqueue.errors import (
    BackfillInFuture,
    ConfigError,
    OperationRefused,
    PayloadError,
    RecurringError,
    UnknownSchedule,
    UnknownTask,
)
from jobqueue.recurring.definitions import Definition, JobState

T0 = 1_800_000_000_000  # 2027-01-15T08:00:00Z, a whole hour
HOUR = 3_600_000


def keys(redis_client: Any) -> list[str]:
    return sorted(redis_client.keys("*"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"cron": "61 * * * *"}, "invalid cron expression '61 * * * *'"),
        ({"cron": "0 * * *"}, "expected 5 fields"),
        ({"cron": "0 * * * *", "tz": "Mars/Olympus"}, "unknown time zone 'Mars/Olympus'"),
        ({"every": 60, "jitter": 60}, "jitter 60 s must be shorter than the schedule's period"),
        ({"cron": "*/5 * * * *", "jitter": 300}, "jitter 300 s must be shorter"),
        ({"every": 60, "misfire": "sometimes"}, "unknown misfire policy 'sometimes'"),
        ({"every": 60, "overlap": "queue"}, "unknown overlap policy 'queue'"),
        ({"every": 60, "cron": "* * * * *"}, "give cron or every, not both"),
        ({}, "exactly one of cron or every"),
        ({"every": -1}, "invalid every -1"),
        ({"every": 60, "jitter": -1}, "invalid jitter -1"),
        ({"every": 60, "args": [object()]}, "not JSON-serialisable"),
        # (an enqueue takes bytes, tagged; a definition is stored as plain JSON)
        ({"every": 60, "args": [b"bytes"]}, "not JSON-serialisable"),
    ],
)
def test_invalid_definition_raises_a_clear_error_and_writes_nothing(
    jq: JobQueue, redis_client: Any, kwargs: dict[str, Any], message: str
) -> None:
    before = keys(redis_client)
    with pytest.raises((ConfigError, PayloadError), match=re.escape(message)):
        jq.schedule("job-1", "task", now=T0, **kwargs)
    assert keys(redis_client) == before


@pytest.mark.parametrize("job_id", ["a@b", "", "x" * 600, "tab\tjob"])
def test_invalid_job_id_is_refused_before_anything_is_written(
    jq: JobQueue, redis_client: Any, job_id: str
) -> None:
    with pytest.raises(RecurringError, match="invalid job id"):
        jq.schedule(job_id, "task", every=60, now=T0)
    assert keys(redis_client) == []


def test_schedule_stores_a_compact_definition_and_the_first_fire(
    jq: JobQueue, redis_client: Any
) -> None:
    info = jq.schedule("hourly", "report", cron="0 * * * *", now=T0 + 1)
    assert info.next_fire_ms == T0 + HOUR
    stored = redis_client.hget("jq:{sched#0}:def", "hourly")
    assert stored == '{"task":"report","queue":"default","cron":"0 * * * *"}'
    assert float(redis_client.zscore("jq:{sched#0}:next", "hourly")) == T0 + HOUR


def test_definition_round_trips_through_json_with_every_field() -> None:
    d = Definition(
        job_id="j",
        task="t",
        queue="q",
        every_ms=90_000,
        tz="Europe/Paris",
        args=(1, "a"),
        kwargs={"k": [1]},
        misfire="deadline-30s",
        jitter_ms=5000,
        overlap="forbid",
        max_attempts=7,
        lease_ms=1000,
        timeout_ms=2000,
        start_ms=5,
        end_ms=10**13,
        paused=True,
    )
    assert Definition.from_json("j", d.to_json()) == d


def test_job_state_text_round_trips() -> None:
    s = JobState(3, 2, 1, 4, T0, T0 + 5)
    assert JobState.parse(s.text()) == s
    assert JobState.parse("") == JobState()


def test_job_state_text_records_the_last_fires_queue_and_reads_texts_without_it() -> None:
    s = JobState(3, 2, 1, 4, T0, T0 + 5, last_queue="reports")
    assert s.text() == f"3 2 1 4 {T0} {T0 + 5} reports"
    assert JobState.parse(s.text()) == s
    # Written before the queue was recorded: None, i.e. the definition's queue.
    assert JobState.parse(f"3 2 1 4 {T0} {T0 + 5}").last_queue is None


def test_upsert_with_the_same_timing_keeps_the_next_fire(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, now=T0)
    info = jq.schedule("j", "t", every=60, args=[2], now=T0 + 30_000)
    assert info.next_fire_ms == T0 + 60_000
    assert info.definition.args == (2,)


def test_upsert_with_new_timing_applies_from_the_next_fire_after_now(jq: JobQueue) -> None:
    jq.schedule("j", "t", cron="0 * * * *", now=T0)
    info = jq.schedule("j", "t", cron="*/15 * * * *", now=T0 + 20 * 60_000)
    assert info.next_fire_ms == T0 + 30 * 60_000


def test_unschedule_removes_definition_next_fire_and_counters(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.schedule("j", "t", every=60, now=T0)
    assert jq.unschedule("j") is True
    assert jq.get_schedule("j") is None
    assert [k for k in keys(redis_client) if "sched#" in k] == []
    assert jq.unschedule("j") is False


def test_pause_removes_the_next_fire_and_resume_restarts_after_now(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, now=T0)
    paused = jq.pause_schedule("j", now=T0 + 1)
    assert paused.definition.paused and paused.next_fire_ms is None
    # An upsert of a paused job keeps it paused.
    assert jq.schedule("j", "t", every=120, now=T0 + 2).next_fire_ms is None
    resumed = jq.resume_schedule("j", now=T0 + 10 * 60_000 + 1)
    assert not resumed.definition.paused
    assert resumed.next_fire_ms == T0 + 12 * 60_000


def test_pause_of_an_unknown_job_is_refused(jq: JobQueue) -> None:
    with pytest.raises(UnknownSchedule):
        jq.pause_schedule("nope")
    assert isinstance(UnknownSchedule("x"), OperationRefused)


def test_trigger_creates_a_run_now_with_its_own_run_id(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=60, args=[7], now=T0)
    handle = jq.trigger("j", now=T0 + 5)
    assert handle.created
    assert handle.run_id == "j@manual-2027-01-15T08:00:00.005Z"
    run = jq.get_run(handle.run_id)
    assert (run.state, run.task, run.job_id, run.due_ms) == ("pending", "t", "j", T0 + 5)
    assert jq.get_schedule("j").next_fire_ms == T0 + 60_000  # type: ignore[union-attr]


def test_backfill_creates_each_fire_time_once(jq: JobQueue) -> None:
    jq.schedule("j", "t", cron="0 * * * *", now=T0)
    first = jq.backfill("j", (T0 - 3 * HOUR) / 1000, (T0 - HOUR) / 1000, now=T0)
    assert [h.run_id for h in first] == [
        "j@2027-01-15T05:00:00Z",
        "j@2027-01-15T06:00:00Z",
        "j@2027-01-15T07:00:00Z",
    ]
    assert all(h.created for h in first)
    again = jq.backfill("j", (T0 - 2 * HOUR) / 1000, T0 / 1000, now=T0)
    assert [h.created for h in again] == [False, False, True]


def test_backfill_refuses_an_end_after_now_and_writes_nothing(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.schedule("j", "t", cron="0 * * * *", now=T0 - 10 * HOUR)
    before = keys(redis_client)
    # "the last three hours", with an end typed two hours ahead: the future fire times would
    # run now, early, and the scheduler would find them already there at their time.
    with pytest.raises(BackfillInFuture, match="end 2027-01-15T10:00:00Z is after the server"):
        jq.backfill("j", (T0 - 3 * HOUR) / 1000, (T0 + 2 * HOUR) / 1000, now=T0)
    assert keys(redis_client) == before
    assert isinstance(BackfillInFuture("x"), RecurringError)
    up_to_now = jq.backfill("j", (T0 - HOUR) / 1000, T0 / 1000, now=T0)  # an end of now is fine
    assert [h.run_id for h in up_to_now] == ["j@2027-01-15T07:00:00Z", "j@2027-01-15T08:00:00Z"]


def test_backfill_refuses_a_range_with_too_many_fire_times(jq: JobQueue) -> None:
    jq.schedule("j", "t", every=1, now=T0)
    with pytest.raises(RecurringError, match="more than 10,000 fire times"):
        jq.backfill("j", 0, 20_000, now=T0)


def test_list_schedules_returns_every_job_sorted(jq: JobQueue) -> None:
    jq.schedule("b", "t", every=60, now=T0)
    jq.schedule("a", "t", cron="@daily", tz="Asia/Tokyo", now=T0)
    infos = jq.list_schedules()
    assert [i.job_id for i in infos] == ["a", "b"]
    assert infos[0].to_dict()["tz"] == "Asia/Tokyo"


def test_scheduler_partitions_are_a_setting_recorded_in_redis(redis_client: Any) -> None:
    from jobqueue.recurring.sync import Recurring

    jq = JobQueue(redis_client)
    store = Recurring(jq, partitions=4)
    assert store.record_partitions() == 4
    ids = [f"job-{i}" for i in range(40)]
    assert {store.keys(j).partition for j in ids} == {0, 1, 2, 3}
    with pytest.raises(ConfigError, match="4 scheduler partitions in Redis but 2"):
        _ = Recurring(jq, partitions=2).partitions


def test_reading_the_scheduler_partition_count_writes_nothing(redis_client: Any) -> None:
    from jobqueue.recurring.sync import Recurring

    store = Recurring(JobQueue(redis_client), partitions=4)
    assert (store.partitions, store.read_partitions()) == (4, 4)  # as configured
    assert keys(redis_client) == []


def test_schedule_of_a_task_the_registry_does_not_know_is_refused_as_enqueue_refuses_it(
    jq: JobQueue, redis_client: Any
) -> None:
    @jq.task
    def report() -> None: ...

    before = keys(redis_client)
    with pytest.raises(UnknownTask, match="unknown task 'no_such_task'") as refused:
        jq.schedule("x", "no_such_task", every=60, now=T0)
    with pytest.raises(UnknownTask) as by_enqueue:
        jq.enqueue("no_such_task")
    assert str(refused.value) == str(by_enqueue.value)
    with pytest.raises(UnknownTask, match="unknown task 'no_such_task'"):
        jq.declare_schedule("y", "no_such_task", every=60)
    assert keys(redis_client) == before and jq.declared_schedules == []


def test_schedule_of_a_task_declared_by_name_is_accepted(jq: JobQueue) -> None:
    jq.declare_task("report", queue="reports")
    info = jq.schedule("x", "report", every=60, now=T0)
    assert (info.definition.task, info.definition.queue) == ("report", "reports")


def test_schedule_by_name_from_a_process_without_any_registry_is_accepted(jq: JobQueue) -> None:
    # An ops process scheduling for workers elsewhere: it knows no task at all.
    assert jq.registry.names() == []
    info = jq.schedule("x", "report", every=60, now=T0)
    assert info.definition.task == "report" and jq.get_schedule("x") is not None


@pytest.mark.parametrize("value", [math.inf, 1.8e305], ids=["inf", "ms-overflow"])
@pytest.mark.parametrize("field", ["jitter", "every"])
def test_an_infinite_jitter_or_interval_is_refused_and_nothing_written(
    jq: JobQueue, field: str, value: float
) -> None:
    options: dict[str, float] = {"every": 60, field: value}
    with pytest.raises(RecurringError, match=f"invalid {field} "):
        jq.schedule("j", "t", **options)
    assert jq.get_schedule("j") is None


def test_a_negative_jitter_is_refused_as_negative_not_as_not_positive(jq: JobQueue) -> None:
    with pytest.raises(RecurringError, match="must not be negative"):
        jq.schedule("j", "t", every=60, jitter=-1)
