"""Batches (docs/workflows.md, "Batches"): children side by side and callbacks that run once,
on_success when every child is done, on_dead at the first death, on_complete when all
finished; children added by a running child (ctx.add_to_flow) are waited for too, counted
once however often an attempt adds them; the skip policy. Both backends; a burst worker in
this process (jobqueue.testing.run_due) runs the runs, relaying its commits as a worker
daemon does."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest

from jobqueue import RunContext
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.flows import add_to_flow_steps
from jobqueue.client.relay import audit_waiting_steps
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, Fatal, FlowFinished
from jobqueue.store.flows import EXTEND
from jobqueue.store.runs import CLAIM
from jobqueue.testing import run_due

# What the callbacks saw, per test (the tasks run in this process).
CALLS: list[tuple[str, Any]] = []


@pytest.fixture
def app(jq: JobQueue) -> JobQueue:
    CALLS.clear()

    @jq.task
    def square(x: int) -> int:
        return x * x

    @jq.task(max_attempts=1)
    def boom(x: int = 0) -> int:
        raise Fatal(f"boom {x}")

    @jq.task
    def callback(results: list[int | None], name: str) -> str:
        CALLS.append((name, results))
        return name

    @jq.task
    def signal(name: str) -> str:
        CALLS.append((name, None))
        return name

    @jq.task
    def fan_out(n: int, ctx: RunContext) -> int:
        # (a receiving callback gets the added children's results after the others')
        ctx.add_to_flow(*(square.s(10 + i) for i in range(n)))
        return n

    @jq.task
    def fan_out_twice(depth: int, ctx: RunContext) -> int:
        if depth > 0:
            ctx.add_to_flow(fan_out_twice.s(depth - 1))
        return depth

    return jq


def task(jq: JobQueue, name: str) -> Any:
    return jq.resolve_task(name)


def called(name: str) -> list[Any]:
    return [results for n, results in CALLS if n == name]


# -- the callbacks -----------------------------------------------------------------------------


def test_on_success_runs_once_with_every_result_when_all_children_are_done(
    app: JobQueue,
) -> None:
    square, callback = task(app, "square"), task(app, "callback")
    batch = app.batch([square.s(i) for i in range(5)],
                      on_success=callback.receiving("success"))
    assert batch["on_success"].state == "waiting"
    run_due(app)
    assert batch["on_success"].result(timeout=5) == "success"
    assert called("success") == [[0, 1, 4, 9, 16]]


def test_on_success_is_cancelled_at_a_death_while_the_other_children_still_run(
    app: JobQueue,
) -> None:
    square, boom, signal = task(app, "square"), task(app, "boom"), task(app, "signal")
    batch = app.batch([boom.s(1), square.s(2), square.s(3)], on_success=signal.s("success"))
    run_due(app)
    assert batch["on_success"].refresh().state == "cancelled"
    assert "dependency" in (batch["on_success"].refresh().error or "")
    assert [r.refresh().state for r in batch.runs[:3]] == ["dead", "done", "done"]
    assert called("success") == []


def test_on_dead_runs_once_at_the_first_death_however_many_children_die(app: JobQueue) -> None:
    boom, signal = task(app, "boom"), task(app, "signal")
    batch = app.batch([boom.s(i) for i in range(4)], on_dead=signal.s("dead"))
    run_due(app)
    assert batch["on_dead"].result(timeout=5) == "dead"
    assert called("dead") == [None]


def test_on_dead_is_cancelled_when_every_child_is_done(app: JobQueue) -> None:
    square, signal = task(app, "square"), task(app, "signal")
    batch = app.batch([square.s(i) for i in range(3)], on_dead=signal.s("dead"))
    run_due(app)
    run = batch["on_dead"].refresh()
    assert (run.state, run.error) == ("cancelled", "every dependency finished and none died")
    assert called("dead") == []


def test_on_complete_runs_when_all_finished_with_none_for_the_failures(app: JobQueue) -> None:
    square, boom, callback = task(app, "square"), task(app, "boom"), task(app, "callback")
    batch = app.batch([square.s(2), boom.s(), square.s(3)],
                      on_complete=callback.receiving("complete"))
    run_due(app)
    assert batch.result(timeout=5) == "complete"  # on_complete is the batch's last run
    assert called("complete") == [[4, None, 9]]
    assert [d.run_id for d in batch["on_complete"].failed_children()] == [batch.runs[1].run_id]


def test_all_three_callbacks_of_one_batch_each_decide_on_their_own(app: JobQueue) -> None:
    square, boom, signal = task(app, "square"), task(app, "boom"), task(app, "signal")
    batch = app.batch([square.s(1), boom.s()], on_success=signal.s("success"),
                      on_dead=signal.s("dead"), on_complete=signal.s("complete"))
    run_due(app)
    assert sorted(n for n, _ in CALLS) == ["complete", "dead"]
    assert batch["on_success"].refresh().state == "cancelled"


def test_a_batch_created_again_with_its_id_writes_nothing(app: JobQueue) -> None:
    square, signal = task(app, "square"), task(app, "signal")
    first = app.batch([square.s(1)], on_complete=signal.s("c"), batch_id="b1")
    again = app.batch([square.s(1)], on_complete=signal.s("c"), batch_id="b1")
    assert first.created and not again.created
    assert [r.run_id for r in again.runs] == ["b1:0", "b1:on_complete"]
    run_due(app)
    assert called("c") == [None]


def test_the_asyncio_client_makes_the_same_batch(app: JobQueue, async_redis_client: Any) -> None:
    square, callback = task(app, "square"), task(app, "callback")
    ajq = AsyncJobQueue(async_redis_client, tasks=app)

    async def make() -> list[str]:
        try:
            batch = await ajq.batch([square.s(3)], on_success=callback.receiving("s"),
                                    batch_id="ab")
            return [r.run_id for r in batch.runs]
        finally:
            await async_redis_client.aclose()

    assert asyncio.run(make()) == ["ab:0", "ab:on_success"]
    run_due(app)
    assert called("s") == [[9]]


# -- children added by a running child --------------------------------------------------------


def test_a_running_child_adds_children_the_callbacks_wait_for(app: JobQueue) -> None:
    fan_out, square, callback = task(app, "fan_out"), task(app, "square"), task(app, "callback")
    batch = app.batch([square.s(1), fan_out.s(3)],
                      on_complete=callback.receiving("complete"),
                      on_success=callback.receiving("success"))
    run_due(app)
    assert called("complete") == [[1, 3, 100, 121, 144]]
    assert called("success") == [[1, 3, 100, 121, 144]]
    added = [d.run_id for d in batch["on_complete"].dependencies()][2:]
    assert added == [f"{batch.runs[1].run_id}+{i}" for i in (1, 2, 3)]


def test_an_added_child_can_add_children_in_its_turn(app: JobQueue) -> None:
    fan_out_twice, signal = task(app, "fan_out_twice"), task(app, "signal")
    batch = app.batch([fan_out_twice.s(3)], on_complete=signal.s("complete"))
    run_due(app)
    deps = batch["on_complete"].dependencies()
    assert [d.outcome for d in deps] == ["done"] * 4
    assert deps[-1].run_id == batch.runs[0].run_id + "+1+1+1"
    assert called("complete") == [None]


def test_a_retried_attempt_adds_the_same_children_once(app: JobQueue) -> None:
    square, callback = task(app, "square"), task(app, "callback")

    @app.task(max_attempts=3, backoff=0.01, backoff_cap=0.01)
    def flaky_fan_out(ctx: RunContext) -> str:
        ctx.add_to_flow(square.s(5), square.s(6))
        if ctx.attempt == 1:
            raise RuntimeError("the first attempt dies after adding")
        return "ok"

    batch = app.batch([flaky_fan_out.s()], on_complete=callback.receiving("complete"))
    deadline = time.monotonic() + 10
    while not batch["on_complete"].refresh().finished and time.monotonic() < deadline:
        run_due(app)  # (until the retry, 10 ms after the first attempt, is due)
    assert batch.runs[0].refresh().attempt == 2
    assert called("complete") == [["ok", 25, 36]]


def test_adding_to_a_batch_whose_callbacks_moved_on_is_refused_and_adds_nothing(
    app: JobQueue,
) -> None:
    boom, square, signal = task(app, "boom"), task(app, "square"), task(app, "signal")
    seen: list[str] = []

    @app.task
    def late_adder(ctx: RunContext) -> str:
        try:
            ctx.add_to_flow(square.s(7))
        except FlowFinished as exc:
            seen.append(str(exc))
        return "late"

    # on_dead is the only callback: once boom died it waits on nothing more; the adder runs
    # after that (its queue is served second).
    batch = app.batch([boom.s(), late_adder.s().with_options(queue="later")],
                      on_dead=signal.s("dead"))
    run_due(app, ["default"])
    assert batch["on_dead"].result(timeout=5) == "dead"
    run_due(app, ["later"])
    assert len(seen) == 1 and "nothing was added" in seen[0]
    assert batch.runs[1].refresh().state == "done"  # refused before any write: not a failure
    assert app.find_run(batch.runs[1].run_id + "+1") is None


def test_adding_from_a_run_no_flow_waits_on_is_a_config_error(app: JobQueue) -> None:
    square = task(app, "square")
    errors: list[str] = []

    @app.task
    def lonely(ctx: RunContext) -> None:
        try:
            ctx.add_to_flow(square.s(1))
        except ConfigError as exc:
            errors.append(str(exc))

    handle = lonely.enqueue()
    run_due(app)
    assert handle.refresh().state == "done"
    assert errors and "not a step that other runs wait on" in errors[0]


def test_an_attempt_whose_add_failed_half_way_is_not_committed_done(
    app: JobQueue, redis_client: Any
) -> None:
    """The waiting run was told of the new child, then creating the child failed (its key
    holds foreign data): the task swallowed the error, and still its run is not done."""
    square, signal = task(app, "square"), task(app, "signal")

    @app.task(max_attempts=1)
    def swallowing(ctx: RunContext) -> str:
        with contextlib.suppress(Exception):  # what a careless task does
            ctx.add_to_flow(square.s(1).with_options(run_id="taken"))
        return "returned anyway"

    batch = app.batch([swallowing.s()], on_complete=signal.s("complete"))
    redis_client.set(app.keys_for("default", "taken").run("taken"), "foreign")
    run_due(app)
    run = batch.runs[0].refresh()
    assert run.state == "dead"
    assert "add_to_flow raised during this attempt" in (run.error or "")


def test_the_audit_cancels_an_added_run_never_created_once_its_adder_ended(
    app: JobQueue,
) -> None:
    """The adder told on_complete of a child, then died before creating it (its last
    attempt): nothing will create it, and on_complete would wait for ever."""
    signal = task(app, "signal")

    @app.task(max_attempts=1)
    def dies_half_way(ctx: RunContext) -> None:
        ctx.add_to_flow(signal.s("child").with_options(run_id="never"))

    batch = app.batch([dies_half_way.s()], on_complete=signal.s("complete"))
    keys = app.keys_for("default", batch.runs[0].run_id)
    app.redis.set(keys.run("never"), "foreign")  # creating it fails after the callback heard
    run_due(app)
    app.redis.delete(keys.run("never"))  # (its key cleaned up: the run is simply missing)
    assert batch["on_complete"].refresh().state == "waiting"
    cb_keys = app.keys_for("default", batch["on_complete"].run_id)
    assert app.run_steps(audit_waiting_steps(app, cb_keys, 0, 0)) == (0, 1)
    run_due(app)
    assert called("complete") == [None]
    (never,) = [d for d in batch["on_complete"].failed_children() if d.run_id == "never"]
    assert (never.outcome, never.error) == (
        "cancelled", f"never created: the run that added it ({batch.runs[0].run_id}) ended first"
    )


def test_the_audit_leaves_an_added_run_its_adder_may_still_create(app: JobQueue) -> None:
    square, signal = task(app, "square"), task(app, "signal")
    batch = app.batch([square.s(1)], on_complete=signal.s("complete"))
    adder = batch.runs[0]
    keys = app.keys_for("default", adder.run_id)
    app.scripts.run(CLAIM.call(keys, 1, "w", 30_000, 60_000))  # the adder runs
    # told, not yet created (the adder is between its two steps)
    app.scripts.run(EXTEND.call(app.keys_for("default", batch["on_complete"].run_id),
                                adder.run_id, [("later", "default")],
                                [batch["on_complete"].run_id]))
    cb_keys = app.keys_for("default", batch["on_complete"].run_id)
    assert app.run_steps(audit_waiting_steps(app, cb_keys, 0, 0)) == (0, 0)
    assert batch["on_complete"].refresh().dependencies_left == 2


def test_a_stale_attempt_adds_nothing(app: JobQueue, redis_client: Any) -> None:
    square, signal = task(app, "square"), task(app, "signal")
    batch = app.batch([square.s(1)], on_complete=signal.s("complete"))
    adder = batch.runs[0]
    keys = app.keys_for("default", adder.run_id)
    fence = CLAIM.parse(app.scripts.run(CLAIM.call(keys, 1, "w", 30_000, 60_000))).runs[0].fence
    before = keys_now(redis_client)
    with pytest.raises(FlowFinished, match="this attempt no longer holds run"):
        app.run_steps(add_to_flow_steps(app, adder.run_id, "default",
                                        [("x", square.s(2))], fence - 1))
    assert keys_now(redis_client) == before


def keys_now(redis_client: Any) -> dict[str, Any]:
    return {k: redis_client.dump(k) for k in redis_client.keys("*")}


def test_add_to_flow_outside_a_worker_says_where_it_works() -> None:
    ctx = RunContext("r", 1, 1, 1, "t", "default", "", None)
    with pytest.raises(Exception, match="only available inside a worker"):
        ctx.add_to_flow()


# -- bad input ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("children", "callbacks", "message"),
    [
        ([], {"on_complete": "cb"}, "at least one child"),
        (["sq"], {}, "needs a callback"),
        (["sq"], {"on_success": "not a signature"}, "on_success is a signature"),
        (["not a signature"], {"on_complete": "cb"}, "steps are signatures"),
    ],
)
def test_a_malformed_batch_is_refused_before_anything_is_written(
    app: JobQueue, redis_client: Any, children: list[Any], callbacks: dict[str, Any],
    message: str,
) -> None:
    square, signal = task(app, "square"), task(app, "signal")
    made = {"sq": square.s(1), "cb": signal.s("c")}
    before = set(redis_client.keys("*"))
    with pytest.raises(ConfigError, match=message):
        app.batch([made.get(c, c) for c in children],
                  **{k: made.get(v, v) for k, v in callbacks.items()})
    assert set(redis_client.keys("*")) == before


# -- the skip policy ---------------------------------------------------------------------------


def test_the_skip_policy_cancels_the_waiting_run_and_nothing_else(app: JobQueue) -> None:
    square, boom, signal = task(app, "square"), task(app, "boom"), task(app, "signal")
    flow = app.workflow({
        "a": boom.s(), "b": square.s(2),
        "after": signal.s("after").after("a", "b", on_failure="skip"),
    })
    run_due(app)
    assert flow["after"].refresh().state == "cancelled"
    assert flow["b"].refresh().state == "done"
    assert called("after") == []


# -- the docs ----------------------------------------------------------------------------------


def test_the_import_example_of_the_docs_runs_as_written(jq: JobQueue) -> None:
    """docs/workflows.md, "Batches": 50 chunks, one too big and split in 4 by its run."""
    def read_chunk(chunk: int) -> list[int]:
        return [chunk] * (20_000 if chunk == 7 else 10)

    def store(rows: list[int]) -> int:
        return len(rows)

    @jq.task
    def import_part(chunk: int, part: int) -> int:
        return 5_000

    @jq.task
    def notify(text: str) -> str:
        CALLS.append(("notify", text))
        return text

    @jq.task
    def alert(text: str) -> str:
        CALLS.append(("alert", text))
        return text

    @jq.task
    def report(results: list[int | None]) -> int:
        CALLS.append(("report", results))
        return sum(r or 0 for r in results)

    @jq.task
    def import_rows(chunk: int, ctx: RunContext) -> int:
        rows = read_chunk(chunk)
        if len(rows) > 10_000:          # too big: split it, the batch waits for the parts
            ctx.add_to_flow(*(import_part.s(chunk, part) for part in range(4)))
            return 0
        return store(rows)

    CALLS.clear()
    batch = jq.batch(
        [import_rows.s(c) for c in range(50)],
        on_success=notify.s("import finished"),
        on_dead=alert.s("an import chunk died"),
        on_complete=report.receiving(),          # gets the 50 (and more) results as a list
        batch_id="import-2026-12-03",
    )
    run_due(jq, concurrency=4)
    assert batch["on_complete"].result(timeout=3600) == 49 * 10 + 4 * 5_000
    assert called("report") == [[0 if c == 7 else 10 for c in range(50)] + [5_000] * 4]
    assert called("notify") == ["import finished"] and called("alert") == []
    assert batch["on_dead"].refresh().state == "cancelled"


def test_a_run_added_to_a_step_comes_after_the_other_dependencies(app: JobQueue) -> None:
    square, callback = task(app, "square"), task(app, "callback")

    @app.task
    def adds_one(ctx: RunContext) -> int:
        ctx.add_to_flow(square.s(7))
        return 1

    flow = app.workflow({"a": adds_one.s(), "b": square.s(3),
                         "c": callback.receiving("c").after("a", "b")}, flow_id="added")
    run_due(app)
    assert called("c") == [[1, 9, 49]]
    # (in index order: the added run's index is past b's)
    assert [d.run_id for d in flow["c"].dependencies()] == ["added:a", "added:b", "added:a+1"]
