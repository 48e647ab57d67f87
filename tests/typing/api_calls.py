"""Calls that type checkers must accept, and (each marked ``# bad``) refuse: read by
tests/test_typing.py, never imported."""

from __future__ import annotations

from jobqueue import FROM_WORKER, JobQueue, RunContext
from jobqueue.aio import AsyncJobQueue
from jobqueue.handles import AsyncRunHandle, RunHandle
from jobqueue.models import Run

jq = JobQueue()


@jq.task(max_attempts=5)
def send_invoice(customer_id: int, *, amount: int) -> str:
    return "sent"


@jq.task
async def greet(name: str) -> int:
    return len(name)


@jq.task
def with_ctx(ctx: RunContext, region: str) -> None: ...


@jq.task
def import_file(path: str, ctx: RunContext = FROM_WORKER) -> int:
    return 0


handle: RunHandle[str] = jq.enqueue(send_invoice, 42, amount=990)
run: Run[str] = handle.wait(timeout=30)
text: str = run.result
by_task: str = send_invoice.enqueue(42, amount=990).wait().result
counted: int = jq.enqueue(greet, "x").wait().result
bound = send_invoice.with_options(queue="urgent", delay=60, run_id="inv-1")
bound.enqueue(42, amount=990)
jq.enqueue(bound, 42, amount=990)
jq.enqueue(with_ctx, region="eu")
jq.enqueue(with_ctx, "eu")  # ctx first: the other arguments may be positional
with_ctx.enqueue("eu")
imported: RunHandle[int] = import_file.enqueue("a.csv")  # ctx last, defaulted: left out
by_method: RunHandle[str] = send_invoice.enqueue(42, amount=990)
with_opts: RunHandle[str] = send_invoice.with_options(queue="q").enqueue(42, amount=990)
value: str = send_invoice.enqueue(42, amount=990).result(timeout=30)
jq.enqueue("send_invoice", 42, amount=990)  # by name: not checked
direct: str = send_invoice(1, amount=2)


ajq = AsyncJobQueue.from_url("redis://localhost:6379/0")


@ajq.task
def ping(times: int) -> int:
    return times


@ajq.task(queue="sms")
async def notify(ctx: RunContext, to: str) -> bool:
    return True


async def from_asyncio(ajq: AsyncJobQueue) -> None:
    h = await ajq.enqueue(send_invoice, 42, amount=990)
    done: Run[str] = await h.wait()
    got: str = await h.result(timeout=30)
    pinged: AsyncRunHandle[int] = await ping.enqueue(3)
    times: int = await pinged.result()
    sent: bool = await (await notify.with_options(delay=5).enqueue("+33")).result()
    await ping.enqueue("3")  # bad
    ping.enqueue(3)  # not awaited: # bad
    del done, got, times, sent
    await ajq.enqueue(send_invoice.with_options(queue="q"), 1, amount=2)
    await ajq.enqueue(send_invoice, "42", amount=990)  # bad


jq.enqueue(send_invoice, "not-an-int", amount="x")  # bad
jq.enqueue(send_invoice, 42)  # bad
jq.enqueue(send_invoice, 42, amount=990, queue="sms")  # bad
send_invoice.enqueue("not-an-int", amount=1)  # bad
send_invoice.with_options(queue="q").enqueue(42, amount="x")  # bad
send_invoice.with_options(priorty=3)  # misspelt: # bad
wrong: int = jq.enqueue(send_invoice, 42, amount=990).wait().result  # bad
wrong_result: int = send_invoice.enqueue(42, amount=990).result()  # bad
jq.enqueue(greet, 1)  # bad
import_file.enqueue(3)  # bad


# Workflows and batches: steps are checked against their task's function.
flow = jq.chain(send_invoice.s(1, amount=2), import_file.s("a.csv"))
batch = jq.batch([send_invoice.s(1, amount=2)], on_complete=import_file.s("a.csv"),
                 batch_id="b")
callback: RunHandle[object] = batch["on_complete"]


@jq.task
def splitter(ctx: RunContext) -> None:
    added: list[str] = ctx.add_to_flow(send_invoice.s(3, amount=4))
    del added


jq.batch([send_invoice.s("x", amount=2)], on_success=import_file.s("a"))  # bad
jq.batch([send_invoice.s(1, amount=2)], on_failure=import_file.s("a"))  # bad


# A chain's and a group's handles are typed by their steps: the chain's by its last step.
chained: str = jq.chain(import_file.s("a.csv"), send_invoice.s(1, amount=2)).result()
chained_wrong: int = jq.chain(import_file.s("a.csv"), send_invoice.s(1, amount=2)).result()  # bad
grouped: list[int] = [jq.group([import_file.s("a"), import_file.s("b")]).result()]
chorded: int = jq.chord([send_invoice.s(1, amount=2)], import_file.s("a")).result()
received = jq.chain(send_invoice.s(1, amount=2), import_file.receiving())
jq.chain(send_invoice.s(1, amount="2"))  # bad
waits: RunHandle[str] = send_invoice.with_options(depends_on=["inv-1", handle]).enqueue(
    7, amount=1
)


async def flows_from_asyncio(ajq: AsyncJobQueue) -> None:
    last: str = await (await ajq.chain(import_file.s("a"), send_invoice.s(1, amount=2))).result()
    chord = await ajq.chord([import_file.s("a")], send_invoice.s(1, amount=2))
    wrong: int = await chord.result()  # bad
    del last, wrong
