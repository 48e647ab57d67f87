"""``jobqueue schedules repartition K`` (issue 16): changing the scheduler partition count moves
every recurring job (definition, next fire, counters, buffered entry) to its partition under the
new count, spread; it is refused while schedulers run, finishes an interrupted move when run
again, and clients that write schedules follow the new count. Both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import drive_async

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.errors import OperationRefused
from jobqueue.recurring import repartition as srp
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.recurring.definitions import (
    ENV_SCHED_PARTITIONS,
    MOVING_FIELD,
    SCHED_CONFIG_KEY,
    sched_keys,
    sched_partition_of,
)

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

S = 1000
JOBS = 60


@pytest.fixture(autouse=True)
def one_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    """K as installed on a single server; the tests then change it."""
    monkeypatch.delenv(ENV_SCHED_PARTITIONS, raising=False)


def start(client: Any) -> int:
    """The clock of these tests: the server's next minute (leases and the registry are
    judged by the server's clock when the move checks for running schedulers)."""
    return (JobQueue(client).server_time_ms() // 60_000 + 1) * 60_000


def populate(client: Any) -> JobQueue:
    """Recurring jobs of every kind, after ticks at T0 + 60 s and + 120 s: a herd that fired
    (counters, next fire), a paused job (no next fire), buffer-one jobs whose second runs are
    buffered."""
    jq = JobQueue(client)
    t0 = start(client)
    for i in range(JOBS):
        jq.schedule(f"job-{i}", "t", every=60, misfire="fire-all", now=t0)
    jq.schedule("hourly", "t", cron="0 * * * *", now=t0)
    jq.schedule("paused", "t", every=60, now=t0)
    jq.pause_schedule("paused", now=t0)
    for job in ("slow-1", "slow-2"):
        jq.schedule(job, "t", every=60, overlap="buffer-one", now=t0)
    s = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    s.tick(now=t0 + 60 * S)
    s.tick(now=t0 + 120 * S)
    s.close()
    return jq


def running(jq: JobQueue) -> None:
    """A scheduler that ticked and did not stop: its leases and registry entry are live."""
    t0 = int(jq.redis.hget(jq.recurring.all_keys()[0].owner, "until") or 0)
    Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False).tick(
        now=max(t0, start(jq.redis))
    )


def snapshot(client: Any) -> dict[str, dict[str, Any]]:
    """Every job as stored, wherever it is, and whether it is in its partition."""
    stored, spread = client.hget(SCHED_CONFIG_KEY, "partitions").partition(" ")[::2]
    count = int(stored)
    out: dict[str, dict[str, Any]] = {}
    for k in range(count):
        sk = sched_keys(k, count, spread == "spread")
        for job, text in client.hgetall(sk.defs).items():
            assert job not in out, f"{job} stored twice"
            assert sched_partition_of(job, count) == k, f"{job} misplaced"
            out[job] = {
                "def": text,
                "next": client.zscore(sk.next, job),
                "state": client.hget(sk.state, job),
                "buffered": client.hget(sk.buffered, job),
            }
    return out


def invoke(client: Any, *args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, JobQueue(client)), input=input)


@pytest.mark.parametrize(("old", "new"), [(1, 8), (8, 3)])
def test_every_job_moves_with_its_definition_next_fire_counters_and_buffered_entry(
    redis_client: Any, old: int, new: int
) -> None:
    populate(redis_client)
    if old != 1:
        srp.repartition(JobQueue(redis_client), old)
    before = snapshot(redis_client)
    assert before["slow-1"]["buffered"] and before["job-0"]["state"]
    assert before["paused"]["next"] is None
    report = srp.repartition(JobQueue(redis_client), new)
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == f"{new} spread"
    assert snapshot(redis_client) == before  # also asserts every job sits in its partition
    assert report.moved + report.stayed == len(before) and report.moved > 0
    assert not redis_client.hexists(SCHED_CONFIG_KEY, MOVING_FIELD)


def test_after_the_move_every_job_fires_once_from_its_new_partition(redis_client: Any) -> None:
    populate(redis_client)
    srp.repartition(JobQueue(redis_client), 8)
    jq = JobQueue(redis_client)
    assert len(jq.recurring.all_keys()) == 8
    before = jq.get_schedule("job-7")
    assert before is not None and before.next_fire_ms is not None
    third = before.next_fire_ms  # the herd's third fire
    report = Scheduler(
        jq, SchedulerConfig(lookahead=0), install_signal_handlers=False
    ).tick(now=third)
    assert report.partitions == 8
    # The herd's 60 runs, and the hourly job's when this third fire is on the hour (the tests'
    # clock starts at the server's next minute: run at hh:57, it is).
    hourly = 1 if third % 3_600_000 == 0 else 0
    assert report.runs_created == JOBS + hourly and report.advanced >= JOBS
    info = jq.get_schedule("job-7")
    assert info is not None and info.state.fired == 3 and info.next_fire_ms == third + 60 * S


def test_refused_while_a_scheduler_runs_and_nothing_moves(redis_client: Any) -> None:
    jq = populate(redis_client)
    running(jq)
    before = snapshot(redis_client)
    with pytest.raises(OperationRefused, match=r"1 scheduler\(s\) running"):
        srp.repartition(JobQueue(redis_client), 8)
    assert snapshot(redis_client) == before
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "1"


def test_a_stopped_scheduler_does_not_block(redis_client: Any) -> None:
    jq = populate(redis_client)
    s = Scheduler(jq, SchedulerConfig(lookahead=0), install_signal_handlers=False)
    s.tick(now=start(redis_client) + 120 * S)
    s.close()  # gives its partitions up and leaves the registry
    assert srp.repartition(JobQueue(redis_client), 4).new == 4


def test_a_rerun_after_a_crash_mid_move_completes_it(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The crash comes after a page's copies are written and before its old fields are
    deleted: those jobs are then defined twice, and the re-run leaves exactly one of each."""
    populate(redis_client)
    before = snapshot(redis_client)
    real, calls = srp._delete_sources, []

    def crashing(r: Any, source: Any, jobs: Any) -> None:
        calls.append(len(jobs))
        if len(calls) == 3:
            raise RuntimeError("killed")
        real(r, source, jobs)

    monkeypatch.setattr(srp, "_delete_sources", crashing)
    with pytest.raises(RuntimeError, match="killed"):
        srp.repartition(JobQueue(redis_client), 8, page=10)
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "1"  # not recorded yet
    assert redis_client.hget(SCHED_CONFIG_KEY, MOVING_FIELD) == "8 spread"
    new = [sched_keys(k, 8, True) for k in range(1, 8)]
    twice = [j for j in before if redis_client.hexists(sched_keys(0, 1, False).defs, j)
             and any(redis_client.hexists(sk.defs, j) for sk in new)]
    assert twice  # copies whose old fields were not deleted yet
    with pytest.raises(OperationRefused, match="being changed"):
        JobQueue(redis_client).schedule("meanwhile", "t", every=60)  # clients wait for it
    monkeypatch.setattr(srp, "_delete_sources", real)
    srp.repartition(JobQueue(redis_client), 8)
    assert snapshot(redis_client) == before
    assert not redis_client.hexists(SCHED_CONFIG_KEY, MOVING_FIELD)


def test_a_second_run_of_a_finished_move_changes_nothing(redis_client: Any) -> None:
    populate(redis_client)
    srp.repartition(JobQueue(redis_client), 8)
    before = snapshot(redis_client)
    report = srp.repartition(JobQueue(redis_client), 8)
    assert (report.moved, report.stayed) == (0, len(before))
    assert snapshot(redis_client) == before


def test_a_client_that_read_the_old_count_writes_to_the_new_layout(redis_client: Any) -> None:
    populate(redis_client)
    client = JobQueue(redis_client)
    assert client.get_schedule("job-3") is not None  # it read K = 1
    srp.repartition(JobQueue(redis_client), 8)
    client.schedule("late", "t", every=60)
    assert "late" in snapshot(redis_client)  # found in its partition under 8


def test_a_job_defined_differently_in_two_partitions_is_left_for_a_human(
    redis_client: Any,
) -> None:
    populate(redis_client)
    job = next(f"job-{i}" for i in range(JOBS) if sched_partition_of(f"job-{i}", 8) != 0)
    target = sched_keys(sched_partition_of(job, 8), 8, True)
    redis_client.hset(target.defs, job, '{"task":"other","queue":"default","every_ms":1000}')
    with pytest.raises(OperationRefused, match=f"1 recurring jobs are defined in two.*{job}"):
        srp.repartition(JobQueue(redis_client), 8)
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "1"


def test_the_async_client_moves_the_jobs_as_the_sync_one_does(
    redis_client: Any, async_redis_client: Any
) -> None:
    """The same store, moved once by each client (restored in between): the same report
    and the same jobs, each in its partition."""
    populate(redis_client)
    before = snapshot(redis_client)
    saved = {key: redis_client.dump(key) for key in redis_client.scan_iter()}
    by_sync = srp.repartition(JobQueue(redis_client), 8).to_dict()
    after_sync = snapshot(redis_client)
    redis_client.flushdb()
    for key, value in saved.items():
        redis_client.restore(key, 0, value)
    assert srp.plan(JobQueue(redis_client), 8).jobs == len(before)
    by_async = drive_async(async_redis_client, lambda ajq: srp.repartition_steps(ajq, 8))
    assert {**by_async.to_dict(), "seconds": 0} == {**by_sync, "seconds": 0}
    assert by_sync["moved"] > 0
    assert snapshot(redis_client) == after_sync == before
    assert redis_client.hget(SCHED_CONFIG_KEY, "partitions") == "8 spread"


# -- the CLI ------------------------------------------------------------------------------------


def test_cli_json_reports_the_move(redis_client: Any) -> None:
    populate(redis_client)
    total = len(snapshot(redis_client))
    result = invoke(redis_client, "schedules", "repartition", "8", "--yes", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["from"], report["to"]) == (1, 8)
    assert report["moved"] + report["stayed"] == total and report["conflicts"] == []


def test_cli_asks_first_and_no_moves_nothing(redis_client: Any) -> None:
    populate(redis_client)
    before = snapshot(redis_client)
    result = invoke(redis_client, "schedules", "repartition", "8", input="n\n")
    assert result.exit_code == 1
    assert f"scheduler partitions: 1 -> 8; {len(before)} recurring jobs" in result.stderr
    assert "nothing moved" in result.stderr
    assert snapshot(redis_client) == before


def test_cli_refusal_while_schedulers_run_is_one_line_and_exit_1(redis_client: Any) -> None:
    running(populate(redis_client))
    result = invoke(redis_client, "schedules", "repartition", "8", "--yes")
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and "scheduler(s) running" in result.stderr
