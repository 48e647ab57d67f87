"""The operators' writes, repairs and server reads are written once as steps too
(jobqueue.ops.workers, gauges, capacity, repair, repartition, server_info): an AsyncJobQueue
driving the same steps does what the sync functions do."""

from __future__ import annotations

import json
from typing import Any

import pytest
from helpers import drive_async

from jobqueue.client.sync import JobQueue
from jobqueue.ops import capacity, gauges, queries, repair, repartition, server_info
from jobqueue.ops import workers as registry
from jobqueue.ops.queries import QueueTotals
from jobqueue.store.keys import WORKERS_KEY, WORKERS_SEEN_KEY

LEASE_MS = 30_000


def entry(worker_id: str, seen_ms: int) -> str:
    return json.dumps({"id": worker_id, "host": "h", "pid": 1, "queues": ["default"],
                       "tasks": ["t"], "concurrency": 1, "started_ms": seen_ms,
                       "last_seen_ms": seen_ms, "in_flight": 0, "lease_ms": LEASE_MS})  # fmt: skip


def test_the_async_client_announces_a_worker_as_the_sync_one_does(
    jq: JobQueue, redis_client: Any, async_redis_client: Any
) -> None:
    now = jq.server_time_ms()
    registry.announce(jq, "sync", entry("w", now), now, LEASE_MS)
    drive_async(async_redis_client, lambda _: registry.announce_steps("async", entry("w", now),
                                                                now, LEASE_MS))  # fmt: skip
    assert redis_client.hget(WORKERS_KEY, "async") == redis_client.hget(WORKERS_KEY, "sync")
    assert redis_client.zscore(WORKERS_SEEN_KEY, "async") == redis_client.zscore(
        WORKERS_SEEN_KEY, "sync"
    )


def test_the_async_client_withdraws_workers_as_the_sync_one_does(
    jq: JobQueue, async_redis_client: Any
) -> None:
    now = jq.server_time_ms()
    for worker_id in ("a", "b", "c"):
        registry.announce(jq, worker_id, entry(worker_id, now), now, LEASE_MS)
    registry.withdraw(jq, ["a"])
    drive_async(async_redis_client, lambda _: registry.withdraw_steps(["b"]))
    assert [w.id for w in queries.workers(jq)] == ["c"]


def test_the_async_client_prunes_the_silent_workers_the_sync_one_prunes(
    jq: JobQueue, async_redis_client: Any
) -> None:
    def plant() -> int:
        now = jq.server_time_ms()
        silent = now - 11 * LEASE_MS // 3
        for worker_id, seen in (("old-1", silent), ("old-2", silent), ("me", silent),
                                ("fresh", now)):  # fmt: skip
            registry.announce(jq, worker_id, entry(worker_id, seen), seen, LEASE_MS)
        return now

    by_sync = registry.prune_silent(jq, plant(), keep="me")
    now = plant()
    by_async = drive_async(
        async_redis_client, lambda _: registry.prune_silent_steps(now, keep="me")
    )
    assert sorted(by_async) == sorted(by_sync) == ["old-1", "old-2"]
    assert sorted(w.id for w in queries.workers(jq)) == ["fresh", "me"]


def test_the_async_client_claims_a_minute_that_the_sync_one_then_cannot(
    jq: JobQueue, async_redis_client: Any
) -> None:
    now = jq.server_time_ms()
    assert drive_async(async_redis_client, lambda _: gauges.claim_minute_steps(now)) is True
    assert gauges.claim_minute(jq, now) is False
    later = now + gauges.MINUTE_MS
    assert gauges.claim_minute(jq, later) is True


def totals(queue: str, due_now: int) -> QueueTotals:
    return QueueTotals(queue, 1, due_now, 0, 2, 0, 0, 0, 0, 1_500)


def test_points_the_async_client_records_are_those_the_sync_one_records(
    jq: JobQueue, async_redis_client: Any
) -> None:
    now = jq.server_time_ms()
    assert gauges.record(jq, now, [totals("by-sync", 5)]) == []
    found = drive_async(
        async_redis_client, lambda _: gauges.record_steps(now, [totals("by-async", 5)])
    )
    assert found == []
    for resolution in (gauges.MINUTES, gauges.HOURS):
        by_sync, by_async = gauges.history(jq, ["by-sync", "by-async"], resolution, now)
        assert by_async.points == by_sync.points != []


def test_the_async_client_reads_the_gauges_history_the_sync_one_reads(
    jq: JobQueue, async_redis_client: Any
) -> None:
    now = jq.server_time_ms()
    gauges.record(jq, now, [totals("mail", 3), totals("default", 1)])
    read = gauges.history(jq, ["mail", "default"], gauges.MINUTES, now)
    by_async = drive_async(
        async_redis_client, lambda _: gauges.history_steps(["mail", "default"], gauges.MINUTES, now)
    )
    assert list(by_async) == list(read)
    assert [h.points[0].due_now for h in by_async] == [3, 1]


@pytest.mark.real_only
def test_the_async_client_measures_what_runs_cost_as_the_sync_one_does(
    jq: JobQueue, redis_client: Any, async_redis_client: Any
) -> None:
    by_sync = capacity.measure_run_bytes(jq, samples=200)
    done_by_sync = queries.stats(jq)
    redis_client.flushall()
    by_async = drive_async(
        async_redis_client, lambda ajq: capacity.measure_run_bytes_steps(ajq, 200)
    )
    assert min(by_sync) > 0 and min(by_async) > 0
    assert [(r.queue, r.due_now, r.running) for r in queries.stats(jq)] == [
        (r.queue, r.due_now, r.running) for r in done_by_sync
    ]


def test_the_async_client_repairs_what_the_sync_one_finds_to_repair(
    jq: JobQueue, redis_client: Any, async_redis_client: Any
) -> None:
    jq.declare_task("t")
    for i in range(30):
        jq.enqueue("t", i)
    redis_client.delete(jq.partition_keys("default", 0).due)
    found = repair.repair_queue(jq, "default", dry_run=True).totals
    done = drive_async(async_redis_client, lambda ajq: repair.repair_queue_steps(ajq, "default"))
    assert done.totals == found and found.indexed == 30
    assert repair.repair_queue(jq, "default").totals.indexed == 0


def test_the_async_client_repartitions_a_queue_as_the_sync_one_does(
    redis_client: Any, async_redis_client: Any
) -> None:
    jq = JobQueue(redis_client, partitions={"a": 1, "b": 1})
    for queue in ("a", "b"):
        jq.declare_task(f"t-{queue}", queue=queue)
        for i in range(20):
            task = jq.resolve_task(f"t-{queue}").with_options(run_id=f"run-{i}")
            jq.enqueue(task, i)
    assert repartition.plan(jq, "a", 4).runs == repartition.plan(jq, "b", 4).runs
    by_sync = repartition.repartition(jq, "a", 4).to_dict()
    by_async = drive_async(
        async_redis_client, lambda ajq: repartition.repartition_steps(ajq, "b", 4)
    ).to_dict()
    assert {**by_async, "queue": "a", "seconds": 0} == {**by_sync, "seconds": 0}
    assert by_sync["moved"] > 0
    for p in range(4):
        a, b = (repartition.targets(q, 4)[p] for q in ("a", "b"))
        assert redis_client.zrange(a.due, 0, -1) == redis_client.zrange(b.due, 0, -1)


@pytest.mark.real_only
def test_the_async_client_reads_the_servers_info_the_sync_one_reads(
    jq: JobQueue, async_redis_client: Any
) -> None:
    (by_sync,) = server_info.servers(jq)
    (by_async,) = drive_async(async_redis_client, lambda _: server_info.servers_steps())
    assert (by_async.address, by_async.server, by_async.version, by_async.maxmemory) == (
        by_sync.address,
        by_sync.server,
        by_sync.version,
        by_sync.maxmemory,
    )
    assert by_sync.error is None and by_sync.version
