"""The operators' steps on the session cluster, driven by both clients: each master's INFO
(``EachMaster``), each partition's records scanned on the node that serves it (``NodeScan``)
and the gauges' pipelines over keys of many slots read and do the same on the asyncio client
as on the sync one."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.ops import gauges, repair, server_info
from jobqueue.ops.queries import QueueTotals
from jobqueue.store.io import Steps

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
