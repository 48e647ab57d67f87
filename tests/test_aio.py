"""The asyncio client: same behaviour as the sync one, through the same scripts."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
import redis.asyncio

from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.errors import OperationRefused, PayloadError, RunNotFound, UnknownTask
from jobqueue.models import QueueLimits
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.keys import PartitionKeys


@pytest.fixture
def async_client(backend: str, request: pytest.FixtureRequest) -> Iterator[Any]:
    if backend == "fake":
        yield fakeredis.FakeAsyncRedis(server=fakeredis.FakeServer(), decode_responses=True)
        return
    server: EmbeddedServer = request.getfixturevalue("real_server")
    redis.Redis.from_url(server.url).flushall()
    yield redis.asyncio.Redis.from_url(server.url, decode_responses=True)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def make(client: Any) -> AsyncJobQueue:
    jq = AsyncJobQueue(client)
    jq.declare_task("report")
    return jq


def test_async_enqueue_creates_once_per_run_id(async_client: Any) -> None:
    async def go() -> tuple[bool, bool]:
        jq = make(async_client)
        first = await jq.enqueue(jq.resolve_task("report").with_options(run_id="r-1"), 1)
        second = await jq.enqueue(jq.resolve_task("report").with_options(run_id="r-1"), 1)
        return first.created, second.created

    assert run(go()) == (True, False)


def test_async_get_run_reads_what_enqueue_wrote(async_client: Any) -> None:
    async def go() -> Any:
        jq = make(async_client)
        await jq.enqueue(jq.resolve_task("report").with_options(run_id="r-2"), 7, region="eu")
        return await jq.get_run("r-2")

    stored = run(go())
    assert (stored.state, stored.task, stored.args, stored.kwargs) == (
        "pending",
        "report",
        [7],
        {"region": "eu"},
    )


def test_async_and_sync_clients_see_the_same_runs(async_client: Any, backend: str,
                                                  request: pytest.FixtureRequest) -> None:
    if backend == "fake":
        server = async_client.connection_pool.connection_kwargs["server"]
        sync = JobQueue(fakeredis.FakeRedis(server=server, decode_responses=True))
    else:
        sync = JobQueue.from_url(request.getfixturevalue("real_server").url)

    async def go() -> None:
        ajq = make(async_client)
        await ajq.enqueue(ajq.resolve_task("report").with_options(run_id="shared"))

    run(go())
    assert sync.get_run("shared").state == "pending"


def test_async_cancel_then_cancel_again_is_refused(async_client: Any) -> None:
    async def go() -> None:
        jq = make(async_client)
        await jq.enqueue(jq.resolve_task("report").with_options(run_id="r-3", delay=60))
        assert await jq.cancel("r-3") == "pending"
        with pytest.raises(OperationRefused):
            await jq.cancel("r-3")

    run(go())


def test_async_unknown_run_raises_run_not_found(async_client: Any) -> None:
    with pytest.raises(RunNotFound):
        run(make(async_client).get_run("nope"))


def test_async_bad_payload_is_refused_before_anything_is_written(async_client: Any) -> None:
    async def go() -> list[str]:
        jq = make(async_client)
        with pytest.raises(PayloadError):
            await jq.enqueue(jq.resolve_task("report").with_options(run_id="bad"), object())
        return [k async for k in async_client.scan_iter(PartitionKeys("default", 0).prefix + "*")]

    assert run(go()) == []


def test_async_client_recovers_from_an_empty_script_cache(async_client: Any) -> None:
    async def go() -> bool:
        jq = make(async_client)
        await jq.enqueue(jq.resolve_task("report").with_options(run_id="before"))
        await async_client.script_flush()
        return (await jq.enqueue(jq.resolve_task("report").with_options(run_id="after"))).created

    assert run(go()) is True


def test_async_client_given_the_apps_jobqueue_enqueues_its_tasks_by_function_and_name(
    async_client: Any, redis_client: Any
) -> None:
    app = JobQueue(redis_client)

    @app.task(queue="billing")
    def send_invoice(customer_id: int, *, amount: int) -> str:
        return "sent"

    async def go() -> list[Any]:
        ajq = AsyncJobQueue(async_client, tasks=app)
        by_function = await ajq.enqueue(send_invoice, 42, amount=990)
        by_name = await ajq.enqueue("send_invoice", 7, amount=10)
        return [await ajq.get_run(h.run_id) for h in (by_function, by_name)]

    runs = run(go())
    assert [(r.task, r.queue, r.args, r.kwargs) for r in runs] == [
        ("send_invoice", "billing", [42], {"amount": 990}),
        ("send_invoice", "billing", [7], {"amount": 10}),
    ]


def test_async_client_without_the_apps_tasks_refuses_a_task_name_it_does_not_know(
    async_client: Any,
) -> None:
    async def go() -> None:
        await AsyncJobQueue(async_client).enqueue("send_invoice", 42)

    with pytest.raises(UnknownTask, match="send_invoice"):
        run(go())


def test_async_pause_and_resume_a_queue(async_client: Any) -> None:
    async def go() -> list[bool]:
        jq = make(async_client)
        return [
            await jq.pause_queue("mail"),
            await jq.queue_paused("mail"),
            await jq.resume_queue("mail"),
            await jq.queue_paused("mail"),
        ]

    assert run(go()) == [True, True, True, False]


def test_async_set_queue_concurrency_and_rate(async_client: Any) -> None:
    async def go() -> list[Any]:
        jq = make(async_client)
        return [
            await jq.set_queue_concurrency("mail", 2),
            await jq.set_queue_concurrency("mail", 2),
            await jq.set_queue_rate("mail", 5, per=0.5),
            await jq.queue_limits("mail"),
            await jq.set_queue_concurrency("mail", None),
        ]

    assert run(go()) == [True, False, True, QueueLimits(2, (5, 500)), True]
