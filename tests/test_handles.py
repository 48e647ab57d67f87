"""What enqueue returns: ``handle.result()`` gives what the task returned, or raises what
became of the run (``RunFailed`` with its last error and traceback, ``RunCancelled``); a task
of an ``AsyncJobQueue`` is awaited to enqueue; a task's ``ctx`` is passed where the function
declares it, so the arguments around it may be positional."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import fakeredis
import pytest
import redis.asyncio

from jobqueue import JobQueue, RunHandle
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.context import FROM_WORKER, RunContext
from jobqueue.errors import Fatal, JobQueueError, RunCancelled, RunFailed, RunTimeout
from jobqueue.handles import AsyncRunHandle
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.testing import run_due


def register(jq: JobQueue) -> dict[str, Any]:
    @jq.task
    def add(a: int, b: int) -> int:
        return a + b

    @jq.task(max_attempts=1)
    def broken(why: str) -> None:
        raise ValueError(why)

    @jq.task
    def refuse() -> None:
        raise Fatal("no such customer")

    return {"add": add, "broken": broken, "refuse": refuse}


def test_result_is_what_the_task_returned(jq: JobQueue) -> None:
    tasks = register(jq)
    handle = tasks["add"].enqueue(2, 3)
    run_due(jq)
    assert handle.result(timeout=5) == 5


def test_result_of_a_dead_run_raises_run_failed_with_its_last_error_and_traceback(
    jq: JobQueue,
) -> None:
    tasks = register(jq)
    handle = tasks["broken"].enqueue("disk full")
    run_due(jq)
    with pytest.raises(RunFailed, match="disk full") as failed:
        handle.result(timeout=5)
    assert failed.value.run_id == handle.run_id
    assert failed.value.error == "ValueError: disk full"
    assert failed.value.traceback is not None
    assert "raise ValueError(why)" in failed.value.traceback


def test_result_of_a_run_failed_for_good_raises_run_failed(jq: JobQueue) -> None:
    tasks = register(jq)
    handle = tasks["refuse"].enqueue()
    run_due(jq)
    with pytest.raises(RunFailed, match="no such customer"):
        handle.result(timeout=5)


def test_result_of_a_cancelled_run_raises_run_cancelled_with_the_reason(jq: JobQueue) -> None:
    tasks = register(jq)
    handle = tasks["add"].enqueue(1, 1)
    jq.cancel(handle.run_id, reason="customer left")
    with pytest.raises(RunCancelled, match="customer left") as cancelled:
        handle.result(timeout=5)
    assert cancelled.value.reason == "customer left"


def test_result_of_a_run_not_finished_in_time_raises_run_timeout(jq: JobQueue) -> None:
    tasks = register(jq)
    handle = tasks["add"].enqueue(1, 1)
    with pytest.raises(RunTimeout):
        handle.result(timeout=0.05, poll=0.01)


def test_wait_on_a_dead_run_returns_the_run_without_raising(jq: JobQueue) -> None:
    tasks = register(jq)
    handle = tasks["broken"].enqueue("x")
    run_due(jq)
    run = handle.wait(timeout=5)
    assert (run.state, run.result) == ("dead", None)


def test_enqueue_through_the_task_gives_a_run_handle(jq: JobQueue) -> None:
    tasks = register(jq)
    assert isinstance(tasks["add"].enqueue(1, 2), RunHandle)
    assert isinstance(tasks["add"].with_options(queue="q").enqueue(1, 2), RunHandle)


# -- ctx where the function declares it --------------------------------------------------------


def test_a_task_with_ctx_first_takes_its_other_arguments_positionally(jq: JobQueue) -> None:
    @jq.task
    def report(ctx: RunContext, day: str, region: str = "eu") -> str:
        return f"{ctx.run_id}:{day}:{region}"

    handle = report.with_options(run_id="r1").enqueue("mon", "us")
    by_keyword = report.with_options(run_id="r2").enqueue(day="tue")
    run_due(jq)
    assert handle.result(timeout=5) == "r1:mon:us"
    assert by_keyword.result(timeout=5) == "r2:tue:eu"


def test_a_task_with_ctx_last_gets_it_by_keyword(jq: JobQueue) -> None:
    @jq.task
    def import_file(path: str, ctx: RunContext) -> str:
        return f"{path} {ctx.attempt}"

    handle = import_file.enqueue("a.csv")
    run_due(jq)
    assert handle.result(timeout=5) == "a.csv 1"


def test_a_task_with_ctx_last_defaulted_to_from_worker_gets_the_runs_context(
    jq: JobQueue,
) -> None:
    @jq.task
    def import_file(path: str, ctx: RunContext = FROM_WORKER) -> str:
        return f"{path} {ctx.run_id}"

    handle = import_file.with_options(run_id="imp").enqueue("a.csv")
    run_due(jq)
    assert handle.result(timeout=5) == "a.csv imp"


def test_from_worker_called_directly_says_no_context_was_given() -> None:
    with pytest.raises(JobQueueError, match="got no RunContext"):
        _ = FROM_WORKER.run_id


def test_a_task_with_ctx_between_its_arguments_gets_it_in_its_place(jq: JobQueue) -> None:
    @jq.task
    def copy(src: str, ctx: RunContext, dst: str) -> str:
        return f"{src}->{dst}@{ctx.task}"

    handle = copy.enqueue("a", "b")
    run_due(jq)
    assert handle.result(timeout=5) == "a->b@copy"


# -- the asyncio client ------------------------------------------------------------------------


@pytest.fixture
def ajq(backend: str, request: pytest.FixtureRequest, jq: JobQueue) -> Callable[[], AsyncJobQueue]:
    """Makes an AsyncJobQueue on the same server as ``jq`` (whose tasks it knows); called
    inside the event loop the test runs, to which its connections belong."""
    if backend == "fake":
        server = jq.redis.connection_pool.connection_kwargs["server"]
        return lambda: AsyncJobQueue(
            fakeredis.FakeAsyncRedis(server=server, decode_responses=True), tasks=jq
        )
    real: EmbeddedServer = request.getfixturevalue("real_server")
    return lambda: AsyncJobQueue(
        redis.asyncio.Redis.from_url(real.url, decode_responses=True), tasks=jq
    )


def test_a_task_of_an_async_job_queue_is_awaited_to_enqueue(
    jq: JobQueue, ajq: Callable[[], AsyncJobQueue]
) -> None:
    async def go() -> tuple[AsyncRunHandle[int], int]:
        client = ajq()

        @client.task
        def double(x: int) -> int:
            return 2 * x

        handle = await double.with_options(run_id="d1").enqueue(21)
        await asyncio.to_thread(run_due, jq)
        return handle, await handle.result(timeout=5)

    handle, value = asyncio.run(go())
    assert isinstance(handle, AsyncRunHandle)
    assert value == 42


def test_async_result_gives_the_value_or_raises_what_became_of_the_run(
    jq: JobQueue, ajq: Callable[[], AsyncJobQueue]
) -> None:
    tasks = register(jq)

    async def go() -> list[Any]:
        client = ajq()
        done = await client.enqueue(tasks["add"], 20, 22)
        dead = await client.enqueue(tasks["broken"], "gone")
        cancelled = await client.enqueue(tasks["add"], 0, 0)
        await client.cancel(cancelled.run_id)
        await asyncio.to_thread(run_due, jq)
        out: list[Any] = [await done.result(timeout=5)]
        for handle in (dead, cancelled):
            try:
                await handle.result(timeout=5)
            except (RunFailed, RunCancelled) as exc:
                out.append(type(exc))
        return out

    assert asyncio.run(go()) == [42, RunFailed, RunCancelled]
