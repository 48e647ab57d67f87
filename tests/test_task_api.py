"""The app-facing enqueue API: run options (run id, delay, at, queue, ...) never share a
namespace with the task's arguments. They come with ``task.with_options(...)`` only; a keyword
named like a run option is the task's argument when it takes it, and refused at enqueue,
pointing to ``with_options``, when it does not."""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import pytest

from jobqueue import JobQueue, Request
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.errors import PayloadError


def test_a_task_argument_called_queue_is_the_tasks_argument(jq: JobQueue) -> None:
    @jq.task
    def notify(user: int, queue: str) -> None: ...

    handle = jq.enqueue(notify, 1, queue="sms")
    run = jq.get_run(handle.run_id)
    assert (run.queue, run.args, run.kwargs) == ("default", [1], {"queue": "sms"})


@pytest.mark.parametrize("name", ["run_id", "delay", "at"])
def test_every_run_option_name_is_an_argument_of_a_task_that_takes_it(
    jq: JobQueue, name: str
) -> None:
    def named(x: int, run_id: str = "", delay: str = "", at: str = "") -> None: ...

    t = jq.task(named)
    run = jq.get_run(jq.enqueue(t, 1, **{name: "v"}).run_id)
    assert run.kwargs == {name: "v"}


def test_with_options_sets_the_runs_queue_and_id(jq: JobQueue) -> None:
    @jq.task
    def send_invoice(customer_id: int, *, amount: int) -> str:
        return "sent"

    handle = send_invoice.with_options(queue="urgent", run_id="inv-1").enqueue(42, amount=990)
    run = jq.get_run("inv-1")
    assert (handle.run_id, run.queue, run.args, run.kwargs) == (
        "inv-1", "urgent", [42], {"amount": 990}
    )


def test_with_options_works_through_jq_enqueue_too(jq: JobQueue) -> None:
    @jq.task
    def send_invoice(customer_id: int) -> None: ...

    jq.enqueue(send_invoice.with_options(run_id="inv-2", delay=60), 42)
    run = jq.get_run("inv-2")
    assert run.due_ms is not None and run.created_ms is not None
    assert run.due_ms - run.created_ms == 60_000


def test_with_options_calls_add_up_the_later_winning(jq: JobQueue) -> None:
    @jq.task
    def t() -> None: ...

    t.with_options(queue="a", run_id="x").with_options(queue="b").enqueue()
    assert jq.get_run("x").queue == "b"


def test_with_options_leaves_the_registered_task_as_it_was(jq: JobQueue) -> None:
    @jq.task
    def t() -> None: ...

    t.with_options(queue="elsewhere")
    assert jq.get_run(t.enqueue().run_id).queue == "default"


def test_after_with_options_every_keyword_is_an_argument_even_for_kwargs_functions(
    jq: JobQueue,
) -> None:
    @jq.task
    def forward(**fields: Any) -> None: ...

    handle = forward.with_options().enqueue(queue="sms", run_id="r")
    run = jq.get_run(handle.run_id)
    assert (run.queue, run.kwargs) == ("default", {"queue": "sms", "run_id": "r"})


def test_a_run_option_keyword_for_a_kwargs_function_is_its_argument(jq: JobQueue) -> None:
    @jq.task
    def forward(**fields: Any) -> None: ...

    handle = jq.enqueue(forward, queue="sms", run_id="r")
    run = jq.get_run(handle.run_id)
    assert (handle.run_id != "r", run.queue, run.kwargs) == (
        True, "default", {"queue": "sms", "run_id": "r"}
    )


def test_a_run_option_keyword_the_function_does_not_take_is_refused_naming_with_options(
    jq: JobQueue,
) -> None:
    @jq.task
    def send_invoice(customer_id: int) -> None: ...

    with pytest.raises(
        PayloadError, match=r"send_invoice\.with_options\(run_id=\.\.\., queue=\.\.\.\)"
    ):
        jq.enqueue(send_invoice, 42, run_id="old", queue="billing")
    assert (jq.queues(), jq.find_run("old")) == ({}, None)


def test_a_run_option_keyword_is_refused_through_the_tasks_own_enqueue_too(
    jq: JobQueue,
) -> None:
    @jq.task
    def send_invoice(customer_id: int) -> None: ...

    with pytest.raises(PayloadError, match=r"with_options\(delay=\.\.\.\)"):
        send_invoice.enqueue(42, delay=60)
    assert jq.queues() == {}


def test_a_run_option_keyword_for_a_task_declared_by_name_is_refused_naming_with_options(
    jq: JobQueue,
) -> None:
    jq.declare_task("report")
    with pytest.raises(
        PayloadError, match=r"jq\.resolve_task\('report'\)\.with_options\(run_id=\.\.\.\)"
    ):
        jq.enqueue("report", 1, run_id="by-name")
    assert (jq.queues(), jq.find_run("by-name")) == ({}, None)


def test_after_with_options_a_task_declared_by_name_takes_a_run_option_keyword(
    jq: JobQueue,
) -> None:
    jq.declare_task("report")
    handle = jq.enqueue(jq.resolve_task("report").with_options(), 1, run_id="arg")
    run = jq.get_run(handle.run_id)
    assert (handle.run_id != "arg", run.args, run.kwargs) == (True, [1], {"run_id": "arg"})


def test_the_async_client_refuses_a_run_option_keyword_the_function_does_not_take() -> None:
    app = JobQueue(fakeredis.FakeRedis(decode_responses=True))

    @app.task
    def send_invoice(customer_id: int) -> None: ...

    async def go() -> None:
        ajq = AsyncJobQueue(fakeredis.FakeAsyncRedis(decode_responses=True), tasks=app)
        await ajq.enqueue(send_invoice, 42, run_id="old")

    with pytest.raises(PayloadError, match=r"send_invoice\.with_options\(run_id=\.\.\.\)"):
        asyncio.run(go())


def test_a_request_takes_a_task_with_options_its_own_fields_winning(jq: JobQueue) -> None:
    @jq.task
    def t(x: int) -> None: ...

    bound = t.with_options(queue="a", run_id="r1")
    jq.enqueue_many([Request(bound, (1,)), Request(bound, (2,), run_id="r2", queue="b")])
    assert [(jq.get_run(r).queue, jq.get_run(r).args) for r in ("r1", "r2")] == [
        ("a", [1]),
        ("b", [2]),
    ]


def test_the_async_client_takes_a_task_with_options() -> None:
    app = JobQueue(fakeredis.FakeRedis(decode_responses=True))

    @app.task
    def notify(user: int, queue: str) -> None: ...

    async def go() -> tuple[str, dict[str, Any]]:
        ajq = AsyncJobQueue(fakeredis.FakeAsyncRedis(decode_responses=True), tasks=app)
        handle = await ajq.enqueue(notify.with_options(queue="sms", run_id="a1"), 1, queue="x")
        run = await ajq.get_run(handle.run_id)
        return run.queue, run.kwargs

    assert asyncio.run(go()) == ("sms", {"queue": "x"})


def test_calling_an_async_task_gives_its_coroutine(jq: JobQueue) -> None:
    @jq.task
    async def double(x: int) -> int:
        return 2 * x

    assert asyncio.run(double(21)) == 42


def test_a_task_known_by_name_takes_options_through_resolve_task(jq: JobQueue) -> None:
    jq.declare_task("report")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="n1", queue="q"), 1, queue="x")
    run = jq.get_run("n1")
    assert (run.queue, run.args, run.kwargs) == ("q", [1], {"queue": "x"})
