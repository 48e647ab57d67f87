"""The operators' reads are written once as steps (``jobqueue.queries``, their documented
name, and jobqueue.ops.listing): an AsyncJobQueue drives the same steps as the sync functions
and reads the same."""

from __future__ import annotations

import asyncio
from typing import Any

from jobqueue import queries
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.ops.listing import RunQuery, runs_page, runs_page_steps


def _counts(rows: Any) -> list[tuple[Any, ...]]:
    return [(r.queue, r.partition, r.due_now, r.scheduled_later, r.running, r.dead) for r in rows]


def test_the_async_client_reads_what_the_sync_functions_read(
    jq: JobQueue, async_redis_client: Any
) -> None:
    jq.declare_task("report")
    for i in range(3):
        jq.enqueue("report", i)
    jq.enqueue(jq.resolve_task("report").with_options(queue="mail", delay=3600))
    jq.schedule("nightly", "report", cron="0 3 * * *")
    now = jq.server_time_ms()

    async def read() -> tuple[Any, ...]:
        ajq = AsyncJobQueue(async_redis_client)
        try:
            return (
                await ajq.run_steps(queries.stats_steps(ajq)),
                await ajq.run_steps(queries.leases_steps(ajq)),
                await ajq.run_steps(queries.workers_steps()),
                await ajq.run_steps(queries.runs_steps(ajq, state="pending", limit=10)),
                await ajq.run_steps(queries.throughput_steps(ajq, now_ms=now)),
                await ajq.run_steps(queries.top_snapshot_steps(ajq, "default")),
                await ajq.run_steps(runs_page_steps(ajq, RunQuery(queue="mail"))),
                await ajq.run_steps(queries.schedules_steps(ajq)),
            )
        finally:
            await async_redis_client.aclose()

    stats, held, registry, pending, rates, top, mail, recurring = asyncio.run(read())
    assert _counts(stats) == _counts(queries.stats(jq))
    assert _counts(stats) == [("default", 0, 3, 0, 0, 0), ("mail", 0, 0, 1, 0, 0)]
    assert list(held) == list(queries.leases(jq)) == []
    assert list(registry) == list(queries.workers(jq)) == []
    assert [r.run_id for r in pending] == [r.run_id for r in queries.runs(jq, state="pending")]
    assert len(pending) == 4
    assert rates == queries.throughput(jq, now_ms=now)
    assert _counts(top.stats) == _counts(queries.top_snapshot(jq, "default").stats)
    assert [r.run_id for r in mail] == [r.run_id for r in runs_page(jq, RunQuery(queue="mail"))]
    assert len(mail) == 1
    assert [s.job_id for s in recurring] == [s.job_id for s in queries.schedules(jq)] == ["nightly"]
