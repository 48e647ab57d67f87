"""The data behind the dashboard's charts and totals: queries.throughput and
queries.queue_totals (shared with the CLI), the home page's totals over every queue and what it
reads of the Redis servers (server_info). The history of depth and lateness is
tests/test_dashboard_history.py's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import redis

from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.overview import Overall, is_active, overall
from jobqueue.ops import queries, server_info
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


def test_the_overall_totals_add_up_every_partition_of_every_queue() -> None:
    def part(queue: str, p: int, counters: dict[str, int]) -> queries.PartitionStats:
        return queries.PartitionStats(queue, p, due_now=1, scheduled_later=2, running=3,
                                      expired_leases=0, dead=4, done_last_minute=0,
                                      done_last_hour=0, oldest_due_age_ms=None,
                                      counters=counters, waiting=5)  # fmt: skip

    rows = [part("a", 0, {"completed": 10, "failed": 1}), part("a", 1, {"completed": 5}),
            part("b", 0, {"failed": 2, "dead": 7})]  # fmt: skip
    assert overall(rows) == Overall(processed=15, failed=3, busy=9, enqueued=3, scheduled=6,
                                    waiting=15, dead=12)  # fmt: skip


def test_a_queue_with_nothing_due_running_or_finished_in_the_hour_is_idle(jq: JobQueue) -> None:
    jq.register_queue("quiet")
    (flow,) = queries.throughput(jq, "quiet")
    (row,) = queries.queue_totals(queries.stats(jq, "quiet"))
    assert is_active(row, flow, []) is False


def test_a_queue_that_finished_a_run_in_the_hour_is_active(jq: JobQueue) -> None:
    jq.declare_task("report", max_attempts=1)
    now = jq.server_time_ms()
    finish(jq, "a", now - 30 * MIN)
    (flow,) = queries.throughput(jq, now_ms=now)
    (row,) = queries.queue_totals(queries.stats(jq))
    assert (row.due_now, row.running) == (0, 0)
    assert is_active(row, flow, []) is True


class _Refusing:
    """A node's connection whose user may not run INFO."""

    def info(self) -> dict[str, Any]:
        raise redis.exceptions.NoPermissionError("this user has no permissions to run 'info'")


class _Cluster:
    """What server_info reads of a cluster client: its masters and a connection to each."""

    def __init__(self, masters: dict[str, Any]) -> None:
        self.masters = masters

    def get_primaries(self) -> list[SimpleNamespace]:
        return [SimpleNamespace(name=name) for name in self.masters]

    def get_redis_connection(self, node: SimpleNamespace) -> Any:
        return self.masters[node.name]


@pytest.mark.real_only
def test_a_clusters_servers_are_read_one_row_per_master(redis_client: Any) -> None:
    cluster = _Cluster({"10.0.0.2:7000": _Refusing(), "10.0.0.1:7000": redis_client})
    rows = server_info.servers(JobQueue(cluster))
    assert [r.address for r in rows] == ["10.0.0.1:7000", "10.0.0.2:7000"]
    assert rows[0].error is None and rows[0].version == redis_client.info()["redis_version"]
    assert rows[1].version is None
    assert rows[1].error == "INFO: this user has no permissions to run 'info'"
