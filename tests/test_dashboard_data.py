"""The data behind the dashboard's charts: queries.throughput and queries.queue_totals (shared
with the CLI). The history of depth and lateness is tests/test_dashboard_history.py's."""

from __future__ import annotations

from jobqueue.client import queries
from jobqueue.client.sync import JobQueue
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL

MIN = 60_000
DAY = 24 * 60 * MIN  # retention: the done index keeps finished runs this long


def finish(jq: JobQueue, run_id: str, at_ms: int, *, fail: bool = False) -> None:
    """Create and claim one run now; complete (or kill) it at server time ``at_ms``."""
    jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    keys = jq.keys_for("default", run_id)
    claim = CLAIM.parse(jq.scripts.run(CLAIM.call(keys, 1, "w", 30_000, MIN)))
    fence = claim.runs[0].fence
    if fail:
        jq.scripts.run(FAIL.call(keys, run_id, fence, "boom", None, DAY, at_ms))
    else:
        jq.scripts.run(COMPLETE.call(keys, [(run_id, fence, "null")], DAY, at_ms))


def test_throughput_counts_finished_and_dead_runs_per_minute(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    now = jq.server_time_ms()
    finish(jq, "a", now - 30 * MIN - 1)  # 30 minutes ago
    finish(jq, "b", now - 30 * MIN - 2)
    finish(jq, "c", now - 1)  # the last minute
    finish(jq, "d", now - 5 * MIN - 1, fail=True)
    (flow,) = queries.throughput(jq, now_ms=now)
    assert flow.queue == "default" and flow.bucket_ms == MIN
    assert len(flow.finished) == len(flow.dead) == 60
    assert flow.start_ms == now - 60 * MIN
    assert flow.finished[29] == 2 and flow.finished[59] == 1 and sum(flow.finished) == 3
    assert flow.dead[54] == 1 and sum(flow.dead) == 1


def test_throughput_ignores_runs_older_than_the_window(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    now = jq.server_time_ms()
    finish(jq, "old", now - 61 * MIN)
    (flow,) = queries.throughput(jq, now_ms=now)
    assert sum(flow.finished) == 0


def test_throughput_adds_up_the_partitions_of_a_queue(redis_client: object) -> None:
    jq = JobQueue(redis_client, partitions={"default": 4})
    jq.declare_task("report", max_attempts=1)
    now = jq.server_time_ms()
    ids = [f"job-{i}" for i in range(8)]
    assert len({jq.keys_for("default", i).partition for i in ids}) > 1
    for run_id in ids:
        finish(jq, run_id, now - 10)
    (flow,) = queries.throughput(jq, now_ms=now)
    assert flow.finished[-1] == 8


def test_queue_totals_sum_partitions_and_keep_the_latest_due_run() -> None:
    def part(p: int, due: int, age: int | None) -> queries.PartitionStats:
        return queries.PartitionStats("q", p, due, 1, 2, 0, 1, 3, 4, age, {})

    (total,) = queries.queue_totals([part(0, 5, 100), part(1, 2, None), part(2, 1, 900)])
    assert (total.partitions, total.due_now, total.running, total.done_last_hour) == (3, 8, 6, 12)
    assert total.oldest_due_age_ms == 900
