"""The operators' steps on the session cluster, driven by both clients: each master's INFO
(``EachMaster``), each partition's records scanned on the node that serves it (``NodeScan``),
the gauges' pipelines over keys of many slots and the scheduler partitions' move read and do
the same on the asyncio client as on the sync one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.ops import gauges, queries, repair, repartition, server_info
from jobqueue.ops.queries import QueueTotals
from jobqueue.recurring import repartition as srp
from jobqueue.recurring.definitions import SCHED_CONFIG_KEY, sched_keys, sched_partition_of
from jobqueue.store.io import Steps
from jobqueue.testing import run_due

T = TypeVar("T")


def drive(url: str, steps: Callable[[AsyncJobQueue], Steps[T]], **options: Any) -> T:
    async def go() -> T:
        ajq = AsyncJobQueue.from_url(url, **options)
        try:
            return await ajq.run_steps(steps(ajq))
        finally:
            await ajq.close()

    return asyncio.run(go())


def test_the_async_client_reads_each_masters_info_as_the_sync_one(
    cluster_url: str, cjq: JobQueue
) -> None:
    by_sync = server_info.servers(cjq)
    by_async = drive(cluster_url, lambda _: server_info.servers_steps())
    assert [(r.address, r.version, r.error) for r in by_async] == [
        (r.address, r.version, r.error) for r in by_sync
    ]
    assert len(by_sync) == 3 and all(r.error is None and r.version for r in by_sync)


def test_the_async_client_repairs_each_partition_on_its_node_as_the_sync_one(
    cluster_url: str, cluster_client: Any
) -> None:
    jq = JobQueue(cluster_client, partitions={"mail": 6})
    jq.declare_task("t", queue="mail")
    for i in range(60):
        jq.enqueue("t", i)
    for keys in jq.all_partition_keys("mail"):
        cluster_client.delete(keys.due)  # runs no claim can see, on every master
    found = repair.repair_queue(jq, "mail", dry_run=True).totals
    done = drive(
        cluster_url, lambda ajq: repair.repair_queue_steps(ajq, "mail"), partitions={"mail": 6}
    )
    assert done.totals == found and found.indexed == 60
    assert repair.repair_queue(jq, "mail").totals.indexed == 0


def test_the_async_client_records_gauges_over_many_slots_as_the_sync_one(
    cluster_url: str, cjq: JobQueue
) -> None:
    now = cjq.server_time_ms()
    queues = [f"q{i}" for i in range(8)]
    rows = [QueueTotals(q, 1, i, 0, 1, 0, 0, 0, 0, 0) for i, q in enumerate(queues)]
    assert gauges.record(cjq, now, rows[:4]) == []
    assert drive(cluster_url, lambda _: gauges.record_steps(now, rows[4:])) == []
    by_sync = gauges.history(cjq, queues, gauges.MINUTES, now)
    by_async = drive(cluster_url, lambda _: gauges.history_steps(queues, gauges.MINUTES, now))
    assert list(by_async) == list(by_sync)
    assert [h.points[0].due_now for h in by_sync] == list(range(8))


def stored_jobs(client: Any, count: int) -> dict[str, str]:
    """Every recurring job's definition under ``count`` spread partitions, each checked to
    sit in the partition its id hashes to."""
    out: dict[str, str] = {}
    for k in range(count):
        for job, text in client.hgetall(sched_keys(k, count, True).defs).items():
            assert sched_partition_of(job, count) == k and job not in out
            out[job] = text
    return out


def test_both_clients_move_recurring_jobs_across_the_masters(
    cluster_url: str, cjq: JobQueue, cluster_client: Any
) -> None:
    for i in range(40):
        cjq.schedule(f"job-{i}", "t", every=60)
    recorded = srp.plan(cjq, 5).recorded
    by_sync = srp.repartition(cjq, 5)
    assert (by_sync.old, by_sync.moved + by_sync.stayed) == (recorded, 40)
    jobs = stored_jobs(cluster_client, 5)
    by_async = drive(cluster_url, lambda ajq: srp.repartition_steps(ajq, 7))
    assert (by_async.old, by_async.moved + by_async.stayed) == (5, 40) and by_async.moved
    assert stored_jobs(cluster_client, 7) == jobs and len(jobs) == 40
    assert cluster_client.hget(SCHED_CONFIG_KEY, "partitions") == "7 spread"


def counters(jq: JobQueue, queue: str) -> dict[str, int]:
    """The queue's counters added up over its partitions."""
    out: dict[str, int] = {}
    for row in queries.stats(jq, queue):
        for name, value in row.counters.items():
            out[name] = out.get(name, 0) + value
    return out


def test_the_async_client_repartitions_a_queue_across_the_masters(
    cluster_url: str, cluster_client: Any
) -> None:
    """Going from 6 spread partitions to 4 (other tags, on other masters) folds the old
    partitions' counters into the new, each in one MULTI on its slot's master: the queue's
    counters add up as before, and every run is moved."""
    jq = JobQueue(cluster_client, partitions={"mail": 6})

    @jq.task(queue="mail")
    def send(i: int) -> int:
        return i

    for i in range(60):
        send.with_options(run_id=f"run-{i}").enqueue(i)
    assert run_due(jq, ["mail"]).completed == 60
    for i in range(60, 90):
        send.with_options(run_id=f"run-{i}").enqueue(i)
    before = counters(jq, "mail")
    report = drive(
        cluster_url, lambda ajq: repartition.repartition_steps(ajq, "mail", 4),
        partitions={"mail": 6},
    )
    assert len(report.folded) >= 2 and all(into == old % 4 for old, into in report.folded)
    assert report.total_moved > 0
    after = JobQueue(cluster_client)
    assert counters(after, "mail") == before and before.get("completed") == 60
    assert sum(r.due_now for r in queries.stats(after, "mail")) == 30
