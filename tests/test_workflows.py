"""Workflows (docs/workflows.md): chains, groups, chords and dependency graphs; what a
dependency's death does under each policy; each dependency counted once, however often its
outcome is delivered; bad input refused before anything is written. Both backends; a
burst worker in this process (jobqueue.testing.run_due) runs the steps, relaying its
commits as a worker daemon does."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import (
    claim_one,
    make_worker,
    resume,
    running,
    server_time_past,
    until_call,
    until_relayed,
    wait_for,
)
from keyspace import keyspace as keys
from starlette.testclient import TestClient

import jobqueue.client.relay as relay
from jobqueue import RunFailed
from jobqueue.cli import main
from jobqueue.cli.common import State
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.flows import create_flow
from jobqueue.client.relay import (
    STAGED_RUNS,
    Committed,
    audit_waiting_steps,
    settle_staged_steps,
)
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import (
    ConfigError,
    Fatal,
    FlowAborted,
    FlowConflict,
    OperationRefused,
    PayloadError,
    RunNotFound,
    ScriptError,
)
from jobqueue.handles import AsyncFlowHandle, RunHandle
from jobqueue.ops import queries
from jobqueue.settings import Settings
from jobqueue.store.admin import PURGE
from jobqueue.store.flows import DELIVER, FLOW_ABORT, FLOW_CREATE, Delivery, Edge, NodeSpec
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, FAIL
from jobqueue.testing import run_due
from jobqueue.worker.relaying import CommitRelay
from jobqueue.workflows.canvas import batch_graph, chord_graph, group_graph, workflow_graph


@pytest.fixture
def app(jq: JobQueue) -> JobQueue:
    @jq.task
    def add(x: int, y: int) -> int:
        return x + y

    @jq.task
    def double(x: int) -> int:
        return 2 * x

    @jq.task
    def total(xs: list[int | None], bonus: int = 0) -> int:
        return sum(x or 0 for x in xs) + bonus

    @jq.task(max_attempts=1)
    def boom(x: int = 0) -> int:
        raise Fatal(f"boom {x}")

    @jq.task
    def note(x: Any = None) -> str:
        return "noted"

    return jq


def task(jq: JobQueue, name: str) -> Any:
    return jq.resolve_task(name)


def claim_fence(jq: JobQueue, keys: PartitionKeys) -> int:
    """One run claimed by hand (as a worker that dies right after would); its fence."""
    return claim_one(jq.scripts, keys, owner="w", retention_ms=60_000).fence


# -- shapes ------------------------------------------------------------------------------------


def test_a_chain_passes_each_result_to_a_receiving_step(app: JobQueue) -> None:
    add, double = task(app, "add"), task(app, "double")
    flow = app.chain(add.s(1, 2), double.receiving(), double.receiving())
    assert [r.state for r in flow.runs] == ["pending", "waiting", "waiting"]
    run_due(app)
    assert flow.results(timeout=5) == [3, 6, 12]


def test_a_chain_step_made_with_s_does_not_receive_the_result(app: JobQueue) -> None:
    add = task(app, "add")
    flow = app.chain(add.s(1, 2), add.s(10, 20))
    run_due(app)
    assert flow.result(timeout=5) == 30


def test_a_chord_callback_runs_once_with_every_result_in_the_headers_order(
    app: JobQueue,
) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(i, i) for i in range(10)], total.receiving(bonus=1))
    run_due(app, concurrency=4)
    assert flow.result(timeout=5) == sum(2 * i for i in range(10)) + 1
    assert flow.last.children_results() == [2 * i for i in range(10)]
    assert flow.last.refresh().attempt == 1


def test_a_group_runs_its_steps_side_by_side(app: JobQueue) -> None:
    add = task(app, "add")
    flow = app.group([add.s(i, 1) for i in range(5)])
    assert {r.state for r in flow.runs} == {"pending"}
    run_due(app)
    assert flow.results(timeout=5) == [1, 2, 3, 4, 5]


def test_a_workflow_step_waits_on_the_steps_its_after_names(app: JobQueue) -> None:
    add, total = task(app, "add"), task(app, "total")
    a = add.s(1, 1)
    flow = app.workflow({
        "a": a,
        "b": add.s(2, 2),
        "sum": total.receiving().after(a, "b"),
    }, flow_id="dag")
    assert flow["sum"].run_id == "dag:sum"
    run_due(app)
    assert flow["sum"].result(timeout=5) == 6


def test_a_step_may_wait_on_a_run_created_before_even_a_finished_one(app: JobQueue) -> None:
    add, total = task(app, "add"), task(app, "total")
    older = add.enqueue(20, 1)
    run_due(app)
    flow = app.workflow({"sum": total.receiving().after(older)})
    assert flow["sum"].state == "pending"  # it heard of the finished run at its creation
    run_due(app)
    assert flow["sum"].result(timeout=5) == 21


# -- waiting -----------------------------------------------------------------------------------


def test_a_waiting_run_is_listed_as_waiting_and_never_claimed(app: JobQueue) -> None:
    add, boom = task(app, "add"), task(app, "boom")
    gate = boom.with_options(queue="gates").s()
    flow = app.chain(gate, add.s(1, 1))
    run_due(app, queues=["default"])  # the gate's queue is not served: nothing to wait for
    assert flow.runs[1].state == "waiting"
    waiting = queries.runs(app, state="waiting")
    assert [r.run_id for r in waiting] == [flow.runs[1].run_id]
    assert waiting[0].dependencies_left == 1


def test_waiting_runs_are_counted_per_queue_by_stats_queues_and_top(app: JobQueue) -> None:
    add = task(app, "add")
    flow = app.chain(add.s(1, 1), add.s(2, 2), add.s(3, 3))
    assert [s.waiting for s in queries.stats(app, "default")] == [2]
    assert [t.waiting for t in queries.queue_totals(queries.stats(app))] == [2]
    listed = CliRunner().invoke(main, ["queues", "--json"], obj=State(None, app)).output
    assert [row["waiting"] for row in json.loads(listed)] == [2]
    frame = CliRunner().invoke(main, ["top", "--once"], obj=State(None, app)).output
    assert "waiting 2" in frame
    page = TestClient(create_app(app)).get("/queues").text
    assert '<a href="/runs?queue=default&amp;state=waiting">2</a>' in page
    run_due(app)
    assert flow.runs[2].result(timeout=5) == 6
    assert [s.waiting for s in queries.stats(app, "default")] == [0]


def test_a_dependency_record_keeps_until_the_run_waiting_on_it_heard_of_it(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    flow = app.chain(add.s(1, 1), add.s(2, 2))
    first = flow.runs[0]
    key = app.keys_for("default", first.run_id).run(first.run_id)
    run_due(app)
    assert flow.result(timeout=5) == 4
    assert redis_client.pttl(key) > 0  # relayed: its retention runs now


def test_children_are_handles_on_the_runs_a_step_waits_on(app: JobQueue) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1), add.s(2, 2)], total.receiving())
    children = flow.last.children()
    assert [(c.run_id, c.queue, c.created) for c in children] == [
        (r.run_id, "default", False) for r in flow.runs[:2]
    ]
    run_due(app)
    assert [c.result(timeout=5) for c in children] == [2, 4]


def test_the_asyncio_client_gives_children_and_their_results(
    app: JobQueue, async_redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")

    async def main() -> tuple[list[str], list[Any], list[Any]]:
        ajq = AsyncJobQueue(async_redis_client, tasks=app)
        try:
            flow = await ajq.chord([add.s(1, 1), boom_s(app)], total.receiving(),
                                   on_failure="ignore")
            await asyncio.to_thread(run_due, app)
            children = await flow.last.children()
            return ([c.run_id for c in children], await flow.last.children_results(),
                    [d.run_id for d in await flow.last.failed_children()])
        finally:
            await ajq.close()

    ids, results, failed = asyncio.run(main())
    assert results == [2, None] and failed == [ids[1]]


def boom_s(app: JobQueue) -> Any:
    return task(app, "boom").s(3)


def test_a_waiting_run_takes_no_slot_of_the_queues_concurrency_cap(app: JobQueue) -> None:
    add, total = task(app, "add"), task(app, "total")
    never = add.with_options(queue="later").enqueue(1, 1)  # not served: stays pending
    app.set_queue_concurrency("default", 1)
    waiting = total.with_options(depends_on=[never]).enqueue([1])
    ready = add.enqueue(2, 2)
    assert run_due(app, ["default"]).claimed == 1
    assert ready.refresh().state == "done" and waiting.state == "waiting"


# -- policies ----------------------------------------------------------------------------------


def test_a_dead_dependency_fails_the_run_waiting_on_it_and_cancels_the_pending_rest(
    app: JobQueue,
) -> None:
    boom, note, total = task(app, "boom"), task(app, "note"), task(app, "total")
    slow = note.with_options(queue="later")  # not served: stays pending
    flow = app.chord([boom.s(1), slow.s()], total.receiving())
    run_due(app, queues=["default"])
    last = flow.last.refresh()
    assert last.state == "dead"
    assert f"dependency {flow.runs[0].run_id} died: Fatal: boom 1" in (last.error or "")
    assert flow.runs[1].state == "cancelled"
    with pytest.raises(RunFailed):
        flow.result(timeout=5)


def test_a_fail_cascade_cancels_running_siblings_through_their_fences_when_asked(
    app: JobQueue,
) -> None:
    """``cancel_running=True``: a running sibling's worker is fenced out (its commit refused,
    its run cancelled), not left to finish."""
    boom, total = task(app, "boom"), task(app, "total")
    started, release = threading.Event(), threading.Event()

    @app.task(queue="slow")
    def hold() -> int:
        started.set()
        release.wait(10)
        return 1

    flow = app.chord([hold.s(), boom.s(1)], total.receiving().with_options(cancel_running=True))
    with running(make_worker(app, queues=["slow"])):
        assert started.wait(10)
        run_due(app, queues=["default"])  # boom dies: the callback dies, its cascade runs
        wait_for(lambda: flow.runs[0].state == "cancelled", what="the running sibling cancelled")
        release.set()
    assert flow.runs[0].refresh().result is None  # its late commit was refused
    assert flow.last.state == "dead"


def test_without_cancel_running_a_running_sibling_finishes(app: JobQueue) -> None:
    boom, total = task(app, "boom"), task(app, "total")
    started, release = threading.Event(), threading.Event()

    @app.task(queue="slow")
    def hold() -> int:
        started.set()
        release.wait(10)
        return 1

    flow = app.chord([hold.s(), boom.s(1)], total.receiving())
    with running(make_worker(app, queues=["slow"])):
        assert started.wait(10)
        run_due(app, queues=["default"])
        release.set()
        assert flow.runs[0].wait(timeout=10).state == "done"


def test_a_dead_dependency_ends_the_whole_rest_of_a_chain(app: JobQueue) -> None:
    boom, add = task(app, "boom"), task(app, "add")
    flow = app.chain(boom.s(), add.s(1, 1), add.s(2, 2))
    run_due(app)
    assert [r.state for r in flow.runs] == ["dead", "dead", "dead"]


def test_an_ignored_dead_dependency_is_listed_and_the_run_still_runs(app: JobQueue) -> None:
    boom, add, total = task(app, "boom"), task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1), boom.s(2)], total.receiving(), on_failure="ignore")
    run_due(app)
    assert flow.result(timeout=5) == 2  # the failed one's place holds None
    failed = flow.last.failed_children()
    assert [(d.run_id, d.outcome) for d in failed] == [(flow.runs[1].run_id, "dead")]
    assert "boom 2" in (failed[0].error or "")


def test_a_removed_dead_dependency_is_left_out_of_the_results(app: JobQueue) -> None:
    boom, add, total = task(app, "boom"), task(app, "add"), task(app, "total")
    seen = task(app, "note")
    flow = app.chord([add.s(1, 1), boom.s(2)], seen.receiving(), on_failure="remove")
    run_due(app)
    assert flow.result(timeout=5) == "noted"
    assert flow.last.failed_children() == []
    assert [d.outcome for d in flow.last.dependencies()] == ["done", "removed"]
    assert total  # (the fixture's other tasks stay registered)


def test_continue_releases_the_waiting_run_at_the_first_death(app: JobQueue) -> None:
    boom, note = task(app, "boom"), task(app, "note")
    later = note.with_options(queue="later")  # never runs here
    flow = app.chord([boom.s(), later.s()], note.s(), on_failure="continue")
    run_due(app, queues=["default"])
    assert flow.result(timeout=5) == "noted"
    assert flow.runs[1].state == "pending"  # not cancelled, not waited for


def test_cancelling_a_waiting_run_cancels_its_pending_dependencies(app: JobQueue) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = app.chain(add.s(1, 1), add.s(2, 2), total.s([1]))
    assert app.cancel(flow.last.run_id) == "waiting"
    assert [r.state for r in flow.runs] == ["cancelled", "cancelled", "cancelled"]


# -- exactly once ------------------------------------------------------------------------------


def test_a_dependency_delivered_twice_is_counted_once(app: JobQueue) -> None:
    """Deliveries are at least once (a relay that dies before removing its outbox entries
    delivers again): a second delivery of the same dependency changes nothing."""
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1), add.s(2, 2)], total.receiving())
    last = flow.last
    keys = app.keys_for("default", last.run_id)
    twice = [Delivery(last.run_id, flow.runs[0].run_id, "d2")] * 2
    again = DELIVER.call(keys, twice, 1, 1 << 20, 1)
    assert DELIVER.parse(app.scripts.run(again)).counted == [True, False]
    assert DELIVER.parse(app.scripts.run(again)).counted == [False, False]
    assert last.refresh().state == "waiting"  # one of two heard of, not two
    assert last.refresh().dependencies_left == 1


def test_a_completion_counts_toward_a_waiting_run_of_its_partition_in_its_own_call(
    app: JobQueue, redis_client: Any
) -> None:
    """No relay: the commit's script releases the callback (same partition) and writes no
    outbox entry; a waiting run of another queue hears of it through the outbox."""
    add, total = task(app, "add"), task(app, "total")
    side_total = total.with_options(queue="side")
    here = app.chord([add.s(1, 1)], total.receiving(), flow_id="here")
    there = app.workflow({"t": side_total.receiving().after(here.runs[0])}, flow_id="there")
    header = here.runs[0]
    keys = app.keys_for("default", header.run_id)
    fence = claim_fence(app, keys)
    (out,) = COMPLETE.parse(app.scripts.run(COMPLETE.call(keys, [(header.run_id, fence, "2")],
                                                          60_000)))
    assert here.last.refresh().state == "pending"  # released in the same call
    assert out.relay and redis_client.zrange(keys.outbox, 0, -1) == [header.run_id]
    assert there["t"].refresh().state == "waiting"  # (another queue: the relay's)
    app.relay("default")
    assert there["t"].refresh().state == "pending"
    assert here.last.refresh().dependencies_left == 0


def lose_the_delivery(app: JobQueue, flow: Any) -> None:
    """The header finished, and what told the callback (in another queue: the relay's) is
    gone: the state a failover of the callback's master leaves when it lost the delivery
    after the outbox entry was cleared (or a failover of the header's master that lost the
    outbox entry)."""
    header = flow.runs[0]
    keys = app.keys_for("default", header.run_id)
    fence = claim_fence(app, keys)
    app.scripts.run(COMPLETE.call(keys, [(header.run_id, fence, "2")], 60_000))
    app.redis.zrem(keys.outbox, header.run_id)
    assert app.relay("default") == 0


def test_the_workers_audit_delivers_an_outcome_a_failover_lost(redis_client: Any) -> None:
    jq = JobQueue(redis_client, settings=Settings(flow_audit_s=0.05))
    add = jq.task(lambda x, y: x + y, name="add")
    total = jq.task(lambda xs: sum(xs), name="total", queue="side")
    flow = jq.chord([add.s(1, 1)], total.receiving())
    lose_the_delivery(jq, flow)
    # The audit looks at runs that have waited flow_audit_s by the server's clock.
    server_time_past(jq, jq.server_time_ms() + 50)
    run_due(jq, ["default", "side"])  # a worker audits the partitions it serves at its first
    run_due(jq, ["default", "side"])  # sweep (and may release the callback after its claims)
    assert flow.result(timeout=5) == 2


def test_the_audit_leaves_runs_that_waited_less_than_its_period(app: JobQueue) -> None:
    """Their deliveries may still be on the way (the relay runs right after a commit)."""
    add, total = task(app, "add"), task(app, "total").with_options(queue="side")
    flow = app.chord([add.s(1, 1)], total.receiving())
    lose_the_delivery(app, flow)
    keys = app.keys_for("side", flow.last.run_id)
    assert app.run_steps(audit_waiting_steps(app, keys, 0, 60_000)) == (0, 0)
    assert flow.last.refresh().state == "waiting"
    assert app.run_steps(audit_waiting_steps(app, keys, 0, 0)) == (0, 1)
    assert flow.last.refresh().state == "pending"


def test_the_audit_reports_a_dependency_whose_record_is_gone_and_guesses_nothing(
    app: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1)], total.receiving())
    header = flow.runs[0]
    app.redis.delete(app.keys_for("default", header.run_id).run(header.run_id))
    keys = app.keys_for("default", flow.last.run_id)
    assert app.run_steps(audit_waiting_steps(app, keys, 0, 0)) == (0, 0)
    assert flow.last.refresh().state == "waiting"
    assert f"waits on {header.run_id} of queue 'default', which has no record" in caplog.text


@pytest.mark.real_only
def test_deliveries_no_replica_acknowledged_keep_their_outbox_entries(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """With durable_replicas, a delivery is relayed only once a replica has it (a failover
    of the waiting run's master could lose it); this server has none."""
    plain = JobQueue(redis_client)
    add = plain.task(lambda x, y: x + y, name="add")
    total = plain.task(lambda xs: sum(xs), name="total", queue="side")  # (relayed)
    flow = plain.chord([add.s(1, 1)], total.receiving())
    header = flow.runs[0]
    keys = plain.keys_for("default", header.run_id)
    fence = claim_fence(plain, keys)
    plain.scripts.run(COMPLETE.call(keys, [(header.run_id, fence, "2")], 60_000))
    durable = JobQueue(redis_client, settings=Settings(durable_replicas=1,
                                                       durable_timeout_s=0.05))
    durable.relay("default")
    assert redis_client.zscore(keys.outbox, header.run_id) is not None
    assert "were not acknowledged by 1 replica(s) in time" in caplog.text


def test_an_entry_written_again_in_the_millisecond_a_slow_relay_read_is_not_cleared_by_it(
    app: JobQueue,
) -> None:
    """A slow relay read x's entry at version T; x ran again, a new step waits on it, and its
    new entry has version T too (the same ms): the slow relay clears only what it delivered."""
    add, note = task(app, "add"), task(app, "note").with_options(queue="side")  # (relayed)
    flow = app.chain(add.s(1, 1), note.s(), flow_id="f")
    x, keys = flow.runs[0], app.keys_for("default", flow.runs[0].run_id)
    t = app.server_time_ms() + 60_000  # one worker millisecond for all its commits

    def commit(fail: bool = False) -> None:
        (c,) = [r for r in CLAIM.parse(app.scripts.run(
            CLAIM.call(keys, 10, "w", 30_000, 60_000, now=t))).runs if r.run_id == x.run_id]
        call = (FAIL.call(keys, x.run_id, c.fence, "boom", None, 60_000, now=t) if fail
                else COMPLETE.call(keys, [(x.run_id, c.fence, "2")], 60_000, now=t))
        app.scripts.run(call)

    commit()
    slow = relay.relay_steps(app, keys)
    held = app.run_steps(until_relayed(slow))
    app.relay("default")  # another relay delivers and clears x @ t
    app.requeue(x.run_id, force=True)
    later = app.workflow({"w2": note.s().after(x)}, flow_id="g")
    commit(fail=True)  # x dies: its entry is x @ t again, for w2
    app.run_steps(resume(slow, held))
    app.relay("default")
    assert later["w2"].refresh().state == "dead"  # it heard of x's death (policy fail)


def test_a_run_waiting_on_a_dependency_that_ran_twice_runs_once(app: JobQueue) -> None:
    """The dependency is requeued after it finished and runs again: its second outcome is
    not counted again, and the waiting run is not released a second time."""
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1)], total.receiving())
    run_due(app)
    assert flow.result(timeout=5) == 2
    app.requeue(flow.runs[0].run_id, force=True)
    run_due(app)
    assert flow.last.refresh().attempt == 1
    assert flow.last.refresh().state == "done"


# -- depends_on: a plain run waiting on runs created before ---------------------------------


def test_a_run_enqueued_with_depends_on_waits_for_runs_named_by_id_or_handle(
    app: JobQueue,
) -> None:
    add, total = task(app, "add"), task(app, "total")
    a = add.with_options(run_id="invoice-42").enqueue(1, 1)
    b = add.with_options(queue="side").enqueue(2, 2)
    after = total.with_options(depends_on=["invoice-42", b]).enqueue([10])
    assert after.created and after.state == "waiting"
    assert [d.run_id for d in after.dependencies()] == [a.run_id, b.run_id]
    run_due(app, ["default", "side"])
    assert after.result(timeout=5) == 10


def test_a_step_with_depends_on_waits_for_older_runs_and_receives_their_results(
    app: JobQueue,
) -> None:
    add, total = task(app, "add"), task(app, "total")
    add.with_options(run_id="older").enqueue(5, 5)
    flow = app.workflow({
        "a": add.s(1, 1),
        "t": total.receiving().after("a").with_options(depends_on=["older"]),
    })
    run_due(app)
    assert flow.result(timeout=5) == 12  # [2, 10]


def test_depends_on_a_run_id_no_queue_has_is_refused_and_nothing_is_written(
    app: JobQueue, redis_client: Any
) -> None:
    total = task(app, "total")
    before = keys(redis_client)
    with pytest.raises(RunNotFound, match="'ghost', which exists in no queue"):
        total.with_options(depends_on=["ghost"]).enqueue([1])
    assert keys(redis_client) == before


@pytest.mark.parametrize(
    ("options", "message"),
    [({"delay": 5}, "run_id, queue and depends_on"), ({"priority": 3}, "run_id, queue"),
     ({"on_failure": "shrug"}, "on_failure")],
    ids=["delay", "priority", "policy"],
)
def test_depends_on_with_an_option_a_waiting_run_cannot_take_is_refused(
    app: JobQueue, options: dict[str, Any], message: str
) -> None:
    add = task(app, "add")
    older = add.enqueue(1, 1)
    with pytest.raises(ConfigError, match=message):
        add.with_options(depends_on=[older], **options).enqueue(2, 2)


def test_the_asyncio_client_enqueues_a_run_with_depends_on(
    app: JobQueue, async_redis_client: Any
) -> None:
    add = task(app, "add")
    older = add.enqueue(1, 1)

    async def main() -> Any:
        ajq = AsyncJobQueue(async_redis_client, tasks=app)
        try:
            return await ajq.enqueue(add.with_options(depends_on=[older.run_id]), 2, 2)
        finally:
            await ajq.close()

    handle = asyncio.run(main())
    assert app.get_run(handle.run_id).state == "waiting"
    run_due(app)
    assert app.get_run(handle.run_id).result == 4


# -- created whole or not at all ---------------------------------------------------------------


def flow_keys(redis_client: Any, fid: str) -> list[str]:
    """Every key a workflow's creation writes, but the queues' registry, counters and event
    logs: its runs' records and dependency keys, its flow sets, its flows index entries and
    its runs' index entries."""
    found = [k for k in redis_client.scan_iter(count=1000) if f":{fid}:" in k or
             k.endswith(f":flow:{fid}")]
    for index in ("waiting", "due", "flows", "dead", "done", "outbox"):
        for k in redis_client.scan_iter(match=f"jq:*:{index}", count=1000):
            if any(fid in member for member in redis_client.zrange(k, 0, -1)):
                found.append(k)
    return sorted(found)


def test_a_workflow_over_two_queues_that_fails_part_way_leaves_nothing_of_it(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    app.register_queue("side")
    redis_client.set(app.keys_for("side", "x").flows, "foreign")  # side refuses the call
    with pytest.raises(ScriptError, match="holds a string, not a zset; nothing was changed"):
        app.chord([add.s(1, 1), side.s(2, 2)], total.receiving(), flow_id="torn")
    redis_client.delete(app.keys_for("side", "x").flows)
    assert flow_keys(redis_client, "torn") == []
    assert run_due(app, ["default", "side"]).claimed == 0


def test_a_creator_killed_before_the_commit_leaves_nothing_that_runs_and_the_audit_undoes_it(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    steps = create_flow(app, chord_graph([add.s(1, 1), side.s(2, 2)], total.receiving()),
                        "killed")
    assert app.run_steps(until_call(steps, "flow_commit")) is not None  # and it dies there
    assert flow_keys(redis_client, "killed") != []
    assert run_due(app, ["default", "side"]).claimed == 0  # staged: nothing runs
    for queue in ("default", "side"):
        keys = app.keys_for(queue, "killed:0")
        app.run_steps(settle_staged_steps(app, keys, 0))
    assert flow_keys(redis_client, "killed") == []
    again = app.chord([add.s(1, 1), side.s(2, 2)], total.receiving(), flow_id="killed")
    run_due(app, ["default", "side"])
    assert again.result(timeout=5) == 6


def test_a_creator_killed_after_the_commit_is_finished_by_the_audit(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    graph = chord_graph([side.s(1, 1), add.s(2, 2)], total.receiving())
    steps = create_flow(app, graph, "half-done")
    # the home (side's first step) committed, the release of 'default' never sent
    assert app.run_steps(until_call(steps, "flow_commit", nth=2)) is not None
    assert run_due(app, ["default"]).claimed == 0  # still staged there
    app.run_steps(settle_staged_steps(app, app.keys_for("default", "half-done:1"), 0))
    run_due(app, ["default", "side"])
    assert app.get_run("half-done:2").result == 6


def test_a_workers_audit_rolls_back_a_workflow_whose_creator_died(
    backend: str, redis_client: Any
) -> None:
    settings = Settings(flow_audit_s=0.05, flow_stage_timeout_s=0.05)
    jq = JobQueue(redis_client, settings=settings)

    @jq.task
    def add(x: int, y: int) -> int:
        return x + y

    steps = create_flow(jq, group_graph([add.s(1, 1), add.with_options(queue="side").s(2, 2)]),
                        "orphan")
    assert jq.run_steps(until_call(steps, "flow_commit")) is not None
    with running(make_worker(jq, queues=["default", "side"])):
        wait_for(lambda: flow_keys(redis_client, "orphan") == [], what="the rollback")


def staged_mark(redis_client: Any, app: JobQueue, queue: str, run_id: str) -> str:
    mark: str = redis_client.hget(app.keys_for(queue, run_id).run(run_id), "staged")
    return mark


def test_a_committed_workflow_whose_home_record_expired_is_released_not_rolled_back(
    app: JobQueue, redis_client: Any
) -> None:
    """The commit is recorded apart from the home run's record (which may expire or be
    purged first): the audit releases the partitions still staged."""
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    steps = create_flow(app, chord_graph([add.s(1, 1), side.s(2, 2)], total.receiving()), "G")
    assert app.run_steps(until_call(steps, "flow_commit", nth=2)) is not None  # dies there
    run_due(app, ["default"])  # the home run G:0 runs...
    redis_client.delete(app.keys_for("default", "G:0").run("G:0"))  # ... and expires
    assert app.run_steps(settle_staged_steps(app, app.keys_for("side", "G:1"), 0))[1:] == (1, 0)
    run_due(app, ["default", "side"])
    assert app.get_run("G:1").state == "done"


def test_a_committed_workflow_whose_runs_expired_is_not_created_again(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    side = add.with_options(queue="side")
    steps = create_flow(app, group_graph([add.s(1, 1), side.s(2, 2)]), "G2")
    assert app.run_steps(until_call(steps, "flow_commit", nth=2)) is not None
    assert run_due(app, ["default"]).completed == 1
    redis_client.delete(app.keys_for("default", "G2:0").run("G2:0"))  # its retention ran out
    again = app.group([add.s(1, 1), side.s(2, 2)], flow_id="G2")
    assert not again.created
    assert run_due(app, ["default"]).claimed == 0  # G2:0 does not run a second time


def test_creating_again_after_a_crash_undoes_the_dead_attempt_before_its_own(
    app: JobQueue, redis_client: Any
) -> None:
    """A crash before the commit; the audit has undone the home but not yet the other
    partition; a new attempt undoes the rest first, and its commit stands whole."""
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    graph = chord_graph([add.s(1, 1), side.s(2, 2)], total.receiving())
    assert app.run_steps(until_call(create_flow(app, graph, "F"), "flow_commit")) is not None
    dead = staged_mark(redis_client, app, "side", "F:1")
    home = app.keys_for("default", "F:0")
    app.scripts.run(FLOW_ABORT.call(home, "F", dead, "F:0"))  # (the audit, half way)
    again = app.chord([add.s(1, 1), side.s(2, 2)], total.receiving(), flow_id="F")
    assert [r.created for r in again.runs] == [True, True, True]
    assert app.run_steps(settle_staged_steps(app, app.keys_for("side", "F:1"), 0))[1:] == (0, 0)
    run_due(app, ["default", "side"])
    assert again.result(timeout=5) == 6


def test_of_two_creations_at_once_one_commits_and_the_other_finds_it_made(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    graph = chord_graph([add.s(1, 1), side.s(2, 2)], total.receiving())
    slow = create_flow(app, graph, "twice")
    held = app.run_steps(until_call(slow, "flow_commit"))  # the first, stalled before it
    assert held is not None
    fast = app.chord([add.s(1, 1), side.s(2, 2)], total.receiving(), flow_id="twice")
    assert fast.created  # it undid the stalled attempt first
    late = app.run_steps(resume(slow, held))  # its commit finds the other's
    assert [created for _, _, created in late.runs] == [False, False, False]
    run_due(app, ["default", "side"])
    assert fast.result(timeout=5) == 6
    assert [app.get_run(r.run_id).attempt for r in fast.runs] == [1, 1, 1]  # each ran once


def test_a_commit_after_the_attempt_was_rolled_back_is_refused(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    side = add.with_options(queue="side")
    slow = create_flow(app, chord_graph([add.s(1, 1), side.s(2, 2)], total.receiving()), "gone")
    held = app.run_steps(until_call(slow, "flow_commit"))
    assert held is not None
    for queue, run_id in (("side", "gone:1"), ("default", "gone:0")):  # the audit, whole
        app.run_steps(settle_staged_steps(app, app.keys_for(queue, run_id), 0))
    with pytest.raises(FlowAborted):
        app.run_steps(resume(slow, held))
    assert flow_keys(redis_client, "gone") == []


def test_a_staged_run_a_continue_released_early_hears_nothing_more(
    app: JobQueue, redis_client: Any
) -> None:
    """A batch's on_dead (edges 'continue') staged until the commit: the first death releases
    it (held for the commit); a later success must not cancel it as 'none died'."""
    boom, add, note = task(app, "boom"), task(app, "add"), task(app, "note")
    graph = batch_graph([boom.s(1), add.s(1, 1)],
                        {"on_dead": note.with_options(queue="side").s("died")})
    steps = create_flow(app, graph, "B")
    assert app.run_steps(until_call(steps, "flow_commit", nth=2)) is not None
    run_due(app, ["default"])  # boom dies, add completes: both heard of by on_dead, staged
    app.relay("default")
    assert app.get_run("B:on_dead").state == "waiting"
    app.run_steps(settle_staged_steps(app, app.keys_for("side", "B:on_dead"), 0))
    run_due(app, ["side"])
    assert app.get_run("B:on_dead").result == "noted"


def test_the_commit_releases_a_staged_run_a_continue_released_early(
    app: JobQueue, redis_client: Any
) -> None:
    """Released early (its older dependency died, edge 'continue') while staged: the commit
    releases it, though another dependency is still unfinished."""
    boom, add, note = task(app, "boom"), task(app, "add"), task(app, "note")
    older = boom.enqueue(1)
    run_due(app)  # it dies
    graph = workflow_graph({
        "n": add.with_options(queue="later").s(1, 1),  # never runs here
        "t": note.with_options(queue="side", depends_on=[older], on_failure="continue")
        .s("x").after("n", on_failure="continue"),
    })
    steps = create_flow(app, graph, "B2")
    held = app.run_steps(until_call(steps, "flow_commit"))  # stalled before its commit
    assert held is not None
    app.relay("default")  # older's death reaches t: released early, held while staged
    assert app.get_run("B2:t").state == "waiting"
    app.run_steps(resume(steps, held))
    run_due(app, ["side"])
    assert app.get_run("B2:t").result == "noted"


@pytest.mark.parametrize("bound", [1 << 20, 40], ids=["released", "past-the-bound"])
def test_a_staged_step_whose_dependencies_finished_is_released_by_the_commit_with_results(
    redis_client: Any, bound: int
) -> None:
    jq = JobQueue(redis_client, settings=Settings(max_results_bytes=bound))

    @jq.task
    def add(x: int, y: int) -> int:
        return x + y

    @jq.task
    def text(n: int) -> str:
        return "y" * n

    @jq.task(queue="side")
    def total(xs: list[str]) -> int:
        return sum(map(len, xs))

    older = text.enqueue(100)
    run_due(jq)
    graph = workflow_graph({"x": add.s(1, 1),
                            "t": total.receiving().with_options(depends_on=[older])})
    steps = create_flow(jq, graph, "S")
    held = jq.run_steps(until_call(steps, "flow_commit"))
    assert held is not None
    jq.relay("default")  # older (finished) is delivered to t, staged: held
    assert jq.get_run("S:t").state == "waiting"
    jq.run_steps(resume(steps, held))
    t = jq.get_run("S:t")
    if bound == 40:
        assert t.state == "dead" and "past the bound of 40" in (t.error or "")
    else:
        run_due(jq, ["side"])
        assert jq.get_run("S:t").result == 100


def test_a_staged_run_that_died_before_the_roll_back_leaves_no_index_entry(
    app: JobQueue, redis_client: Any
) -> None:
    boom, total = task(app, "boom"), task(app, "total")
    older = boom.enqueue(1)
    graph = workflow_graph({"x": task(app, "add").s(1, 1),
                            "t": total.with_options(queue="side", depends_on=[older]).s([1])})
    steps = create_flow(app, graph, "D")
    assert app.run_steps(until_call(steps, "flow_commit")) is not None
    run_due(app, ["default"])  # older dies: t (staged) dies of it, into the dead index
    app.relay("default")
    assert app.get_run("D:t").state == "dead"
    for queue, run_id in (("side", "D:t"), ("default", "D:x")):
        app.run_steps(settle_staged_steps(app, app.keys_for(queue, run_id), 0))
    assert flow_keys(redis_client, "D") == []


def test_a_staged_run_does_not_requeue(app: JobQueue, redis_client: Any) -> None:
    add = task(app, "add")
    steps = create_flow(app, group_graph([add.s(1, 1), add.with_options(queue="side").s(2, 2)]),
                        "R")
    assert app.run_steps(until_call(steps, "flow_commit")) is not None
    app.cancel("R:1", "side")
    with pytest.raises(OperationRefused, match="workflow step"):
        app.requeue("R:1", "side")
    assert run_due(app, ["side"]).claimed == 0


def test_the_staged_runs_audit_goes_round_its_index_past_an_attempt_it_cannot_undo(
    app: JobQueue, redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    add = task(app, "add")
    side = add.with_options(queue="side")
    bad = create_flow(app, group_graph([add.s(0, 0), *(side.s(i, i) for i in range(
        STAGED_RUNS))]), "X")  # the oldest entries of side's staged index, all X's
    assert app.run_steps(until_call(bad, "flow_commit")) is not None
    server_time_past(app, app.server_time_ms())
    good = create_flow(app, group_graph([add.s(1, 1), side.s(2, 2)]), "Y")
    assert app.run_steps(until_call(good, "flow_commit")) is not None
    redis_client.set(app.keys_for("side", "X:1").history("X:1"), "foreign")
    keys = app.keys_for("side", "X:1")
    start, *_ = app.run_steps(settle_staged_steps(app, keys, 0))
    assert start == STAGED_RUNS and "settling workflow X" in caplog.text  # passed over
    app.run_steps(settle_staged_steps(app, keys, 0, start))
    assert flow_keys(redis_client, "Y") == []  # Y rolled back all the same


def test_a_dead_waiting_runs_cancel_order_keeps_it_from_the_purge(
    app: JobQueue, redis_client: Any
) -> None:
    """Its order '!<run_id>' is carried out by the relay, which reads its record."""
    boom, add, total = task(app, "boom"), task(app, "add"), task(app, "total")
    later = add.with_options(queue="later")
    flow = app.chord([boom.s(1), later.s(2, 2)], total.receiving(), flow_id="P2")
    keys = app.keys_for("default", flow.runs[0].run_id)
    fence = claim_fence(app, keys)
    app.scripts.run(FAIL.call(keys, flow.runs[0].run_id, fence, "boom", None, 60_000))
    app.relay("default")  # the callback dies: its order waits in its outbox ...
    last = app.keys_for("default", flow.last.run_id)
    redis_client.zadd(last.outbox, {"!" + flow.last.run_id: 1})  # (... not carried out yet)
    assert PURGE.parse(app.scripts.run(PURGE.call(last, [flow.last.run_id]))) == (0, 1)


def test_flow_create_refuses_a_waiting_step_whose_run_id_exists_outside_the_workflow(
    app: JobQueue, redis_client: Any
) -> None:
    """The check the client makes before writing, made again by the script itself (a run
    created in between)."""
    add = task(app, "add")
    add.with_options(run_id="taken").enqueue(1, 1)
    keys = app.keys_for("default", "taken")
    before = data(redis_client)
    node = NodeSpec("taken", "add", "{}", flow="W", deps=[Edge("x", "default")])
    with pytest.raises(ScriptError, match="exists outside the workflow"):
        app.scripts.run(FLOW_CREATE.call(keys, [node]))
    assert data(redis_client) == before


# -- idempotent creation and bad input ---------------------------------------------------------


def test_creating_the_same_workflow_twice_writes_nothing_the_second_time(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    first = app.chain(add.s(1, 1), add.s(2, 2), flow_id="once")
    before = keys(redis_client)
    second = app.chain(add.s(1, 1), add.s(2, 2), flow_id="once")
    assert first.created and not second.created
    assert keys(redis_client) == before


def data(redis_client: Any) -> dict[str, Any]:
    """The keyspace but the workers' own wake lists (a worker run_due stopped may still be
    writing its own on the way out)."""
    return {k: v for k, v in keys(redis_client).items() if not k.startswith("jq:worker-wake:")}


def test_creating_a_finished_workflow_again_writes_nothing_not_even_an_expiry(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    first = app.chain(add.s(1, 1), add.s(2, 2), flow_id="ran")
    run_due(app)
    assert first.results(timeout=5) == [2, 4]
    before = data(redis_client)
    again = app.chain(add.s(1, 1), add.s(2, 2), flow_id="ran")
    assert not again.created
    assert data(redis_client) == before


def test_a_workflow_created_again_after_some_of_its_runs_expired_runs_nothing_again(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    app.chain(add.s(1, 1), add.s(2, 2), flow_id="half")
    run_due(app)
    redis_client.delete(app.keys_for("default", "half:0").run("half:0"))  # its retention ran out
    before = data(redis_client)
    again = app.chain(add.s(1, 1), add.s(2, 2), flow_id="half")
    assert [r.created for r in again.runs] == [False, False]
    assert data(redis_client) == before
    assert run_due(app).claimed == 0


@pytest.mark.parametrize("state", ["done", "pending"])
def test_a_step_that_waits_cannot_take_the_run_id_of_an_existing_run(
    app: JobQueue, redis_client: Any, state: str
) -> None:
    add, total = task(app, "add"), task(app, "total")
    add.with_options(run_id="P").enqueue(1, 1)
    if state == "done":
        run_due(app)
    before = data(redis_client)
    with pytest.raises(FlowConflict, match="'P' waits on other runs, but a run with that id"):
        app.workflow({"kid": add.s(2, 2), "P": total.receiving().with_options(run_id="P")
                      .after("kid")})
    assert data(redis_client) == before


def test_a_dependency_on_a_run_of_another_redis_is_refused(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    mine = add.with_options(run_id="P").enqueue(1, 1)
    other = JobQueue.from_url("redis://127.0.0.1:1/0")  # another store (never reached)
    theirs = RunHandle(other, "P", "default", True)  # the same run id, another run
    before = keys(redis_client)
    with pytest.raises(FlowConflict, match="of another Redis"):
        app.workflow({"a": add.s(1, 1).after(theirs)})
    assert keys(redis_client) == before
    flow = app.workflow({"a": add.s(1, 1).after(mine)})  # a handle of this store is fine
    assert flow.runs[0].created


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda jq, t: jq.workflow({"a": t.s(1, 1).after("b"), "b": t.s(1, 1).after("a")}),
         ConfigError, "cycle"),
        (lambda jq, t: jq.workflow({"a": t.s(1, 1).after("nope")}), ConfigError, "no such step"),
        (lambda jq, t: jq.workflow({"a": t.s(1, 1).after("a")}), ConfigError, "itself"),
        (lambda jq, t: jq.chain(t.receiving(1)), ConfigError, "first step"),
        (lambda jq, t: jq.chain(t.s(1, 1), t.s("too", "many", "args")), PayloadError,
         "too many positional arguments"),
        (lambda jq, t: jq.chord([t.s(1, 1)], t.s(1, 1), on_failure="shrug"), ConfigError,
         "on_failure"),
        (lambda jq, t: jq.group([]), ConfigError, "at least one step"),
        (lambda jq, t: jq.group([lambda: 1]), ConfigError, "signatures"),
        (lambda jq, t: jq.workflow({"a": t.receiving(1)}), ConfigError, "waits on nothing"),
        (lambda jq, t: jq.chain(t.s(1, 1), t.s(2, 2), flow_id='say "hi"'), ConfigError,
         "no quote"),
    ],
    ids=["cycle", "unknown-step", "self", "first-receiving", "bad-args", "policy", "empty",
         "not-a-signature", "receiving-alone", "quote"],
)
def test_a_bad_workflow_is_refused_and_nothing_is_written(
    app: JobQueue, redis_client: Any, build: Any, error: type[Exception], message: str
) -> None:
    before = keys(redis_client)
    with pytest.raises(error, match=message):
        build(app, task(app, "add"))
    assert keys(redis_client) == before


def test_a_step_waiting_on_a_run_that_does_not_exist_is_refused(
    app: JobQueue, redis_client: Any
) -> None:
    add = task(app, "add")
    ghost = add.enqueue(1, 1)
    redis_client.delete(app.keys_for("default", ghost.run_id).run(ghost.run_id))
    before = keys(redis_client)
    with pytest.raises(RunNotFound, match="does not exist"):
        app.workflow({"a": add.s(1, 1).after(ghost)})
    assert keys(redis_client) == before


@pytest.mark.parametrize("callback_queue", ["default", "side"], ids=["same-partition", "relayed"])
def test_results_past_the_bound_make_the_waiting_run_die_saying_so(
    redis_client: Any, callback_queue: str
) -> None:
    small = JobQueue(redis_client, settings=Settings(max_results_bytes=40))

    @small.task
    def add(x: int, y: int) -> int:
        return x + y

    @small.task(queue=callback_queue)
    def total(xs: list[int]) -> int:
        return sum(xs)

    flow = small.chord([add.s(i, 10**12) for i in range(5)], total.receiving())
    run_due(small, ["default", "side"])
    last = flow.last.refresh()
    assert last.state == "dead"
    assert "past the bound of 40" in (last.error or "")


def test_the_asyncio_client_creates_and_reads_a_chord(
    app: JobQueue, async_redis_client: Any
) -> None:
    """The same workflow through AsyncJobQueue, on the server the sync client's worker
    serves."""
    client = async_redis_client
    ajq = AsyncJobQueue(client, tasks=app)
    add, total = task(app, "add"), task(app, "total")

    async def chord() -> tuple[int, list[Any]]:
        try:
            flow: AsyncFlowHandle[int] = await ajq.chord(
                [add.s(i, 1) for i in range(3)], total.receiving()
            )
            await asyncio.to_thread(run_due, app)
            return await flow.result(timeout=5), await flow.last.children_results()
        finally:
            await client.aclose()

    assert asyncio.run(chord()) == (6, [1, 2, 3])


def test_the_render_then_mail_example_of_the_docs_runs_as_written(jq: JobQueue) -> None:
    """docs/workflows.md, "Shapes": 200 pages, a PDF of them in order, then the mail."""
    @jq.task
    def render(page: int) -> str:
        return f"page-{page}.png"

    @jq.task
    def build_pdf(pages: list[str], title: str) -> str:
        assert pages == [f"page-{p}.png" for p in range(200)]
        return f"{title}.pdf"

    @jq.task
    def mail(pdfs: list[str], to: str) -> str:
        return f"mailed {pdfs[0]} to {to}"

    pages = {f"page-{p}": render.s(p) for p in range(200)}
    flow = jq.workflow({
        **pages,
        "pdf": build_pdf.receiving(title="Report").after(*pages),
        "mail": mail.receiving(to="boss@example.com").after("pdf"),
    }, flow_id="report-2026-12")
    run_due(jq, concurrency=8)
    assert flow["mail"].result(timeout=5) == "mailed Report.pdf to boss@example.com"


# -- what a review found (each of these failed before its fix) ---------------------------------


def test_a_workflow_created_again_after_its_records_expired_runs_anew(
    app: JobQueue, redis_client: Any
) -> None:
    """Its dependency keys outlive its records (dead retention); a new run of the same id
    must not start with what the old one heard of."""
    add, double = task(app, "add"), task(app, "double")
    first = app.chain(add.s(1, 2), double.receiving(), flow_id="nightly")
    run_due(app)
    assert first.result(timeout=5) == 6
    for run in first.runs:  # their retention ran out
        redis_client.delete(app.keys_for("default", run.run_id).run(run.run_id))
    # ... and the record of its commit's, which outlives them (else it is created before)
    redis_client.delete(app.keys_for("default", first.runs[0].run_id).flowmark("nightly"))
    again = app.chain(add.s(1, 2), double.receiving(), flow_id="nightly")
    assert again.created
    run_due(app)
    assert again.result(timeout=5) == 6


def test_a_step_shared_by_run_id_with_an_earlier_workflow_tells_the_new_one_too(
    app: JobQueue,
) -> None:
    add, double = task(app, "add"), task(app, "double")
    fetch = add.s(1, 2).with_options(run_id="fetch-2026-12-03")
    app.chain(fetch, double.receiving(), flow_id="day1")
    run_due(app)
    again = app.chain(fetch, double.receiving(), flow_id="day1-again")
    assert not again.runs[0].created
    run_due(app)
    assert again.result(timeout=5) == 6


def test_foreign_data_in_one_waiting_runs_keys_holds_back_no_other_workflow(
    app: JobQueue, redis_client: Any
) -> None:
    add, double = task(app, "add"), task(app, "double")
    a = app.chain(add.s(1, 1), double.receiving(), flow_id="A")
    b = app.chain(add.s(2, 2), double.receiving(), flow_id="B")
    keys = app.keys_for("default", "A:1")
    redis_client.delete(keys.got("A:1"))
    redis_client.set(keys.got("A:1"), "not a hash")
    run_due(app)
    assert b.result(timeout=5) == 8
    assert a.last.state == "waiting"  # reported (logged), never repaired


def test_a_workers_fast_delivery_refused_by_one_runs_foreign_data_still_tells_the_others(
    app: JobQueue, redis_client: Any
) -> None:
    """Both completions go in one commit; the deliver call to their partition is refused
    whole (A:1's keys), and B:1 is told one delivery at a time, not at the next sweep."""
    add, double = task(app, "add"), task(app, "double")
    app.chain(add.s(1, 1), double.receiving(), flow_id="A")
    b = app.chain(add.s(2, 2), double.receiving(), flow_id="B")
    keys = app.keys_for("default", "A:1")
    redis_client.delete(keys.got("A:1"))
    redis_client.set(keys.got("A:1"), "not a hash")
    claimed = CLAIM.parse(app.scripts.run(CLAIM.call(keys, 10, "w", 30_000, 60_000))).runs
    results = {"A:0": "2", "B:0": "4"}
    outcomes = COMPLETE.parse(app.scripts.run(COMPLETE.call(
        keys, [(c.run_id, c.fence, results[c.run_id]) for c in claimed], 60_000)))
    carry = CommitRelay(app)
    carry.add([Committed(keys, c.run_id, results[c.run_id], o.parents or "",
                         o.outbox_version or 0) for c, o in zip(claimed, outcomes, strict=True)])
    carry.flush()
    assert b.last.refresh().state == "pending"
    assert app.find_run("A:1").state == "waiting"  # reported (logged), never repaired


def test_a_fail_cascade_leaves_a_dependency_another_waiting_run_still_needs(
    app: JobQueue,
) -> None:
    """A diamond: a waits on c and d, b on c only; d dies: a dies, c is not cancelled (b
    needs it), and b runs."""
    add, boom, note = task(app, "add"), task(app, "boom"), task(app, "note")
    held = add.with_options(queue="later")  # c: pending until its queue is served
    flow = app.workflow({
        "c": held.s(1, 1), "d": boom.s(),
        "a": note.s().after("c", "d"), "b": note.s().after("c"),
    }, flow_id="dia")
    run_due(app, queues=["default"])
    assert (flow["a"].state, flow["c"].state) == ("dead", "pending")
    run_due(app, queues=["later", "default"])
    assert flow["b"].result(timeout=5) == "noted"


def test_a_fail_cascade_never_cancels_a_run_created_before_the_workflow(app: JobQueue) -> None:
    add, boom, note = task(app, "add"), task(app, "boom"), task(app, "note")
    older = add.with_options(queue="later").enqueue(1, 1)
    flow = app.workflow({"d": boom.s(), "a": note.s().after("d", older)})
    run_due(app, queues=["default"])
    assert (flow["a"].state, older.state) == ("dead", "pending")


def test_a_waiting_run_or_a_step_that_waited_does_not_requeue(app: JobQueue) -> None:
    boom, note = task(app, "boom"), task(app, "note")
    flow = app.chain(boom.s(), note.receiving())
    with pytest.raises(OperationRefused, match="is waiting"):
        app.requeue(flow.last.run_id)
    run_due(app)
    assert flow.last.state == "dead"
    with pytest.raises(OperationRefused, match="workflow step"):
        app.requeue(flow.last.run_id)


def test_a_purge_delivers_a_dead_runs_outcome_before_deleting_it(
    app: JobQueue, redis_client: Any
) -> None:
    boom, note = task(app, "boom"), task(app, "note")
    flow = app.chain(boom.s(), note.s(), flow_id="P")
    first = flow.runs[0]
    keys = app.keys_for("default", first.run_id)
    # Dead, its outcome still in the outbox (a worker that died right after its commit).
    fence = claim_fence(app, keys)
    app.scripts.run(FAIL.call(keys, first.run_id, fence, "boom", None, 60_000))
    assert redis_client.zrange(keys.outbox, 0, -1) == [first.run_id]
    assert app.purge_dead([first.run_id]) == 1
    assert flow.last.state == "dead"  # it heard of the death before the record went


def test_the_purge_script_keeps_a_dead_run_whose_waiting_runs_have_not_heard_of_it(
    app: JobQueue, redis_client: Any
) -> None:
    """Even a purge that could not relay first (its relay failed, or the outbox was written
    again meanwhile) never deletes a record the relay still needs."""
    boom, note = task(app, "boom"), task(app, "note")
    flow = app.chain(boom.s(), note.s(), flow_id="Q")
    first = flow.runs[0]
    keys = app.keys_for("default", first.run_id)
    fence = claim_fence(app, keys)
    app.scripts.run(FAIL.call(keys, first.run_id, fence, "boom", None, 60_000))
    assert PURGE.parse(app.scripts.run(PURGE.call(keys, [first.run_id]))) == (0, 1)
    assert first.state == "dead"
    until_relayed_and_cleared = app.relay("default")
    assert until_relayed_and_cleared >= 1 and flow.last.state == "dead"
    assert PURGE.parse(app.scripts.run(PURGE.call(keys, [first.run_id]))) == (1, 0)


def test_a_garbage_dependency_count_is_worked_out_again_from_the_keys(
    app: JobQueue, redis_client: Any
) -> None:
    add, total = task(app, "add"), task(app, "total")
    flow = app.chord([add.s(1, 1), add.s(2, 2)], total.receiving())
    redis_client.hset(app.keys_for("default", flow.last.run_id).run(flow.last.run_id),
                      "left", "x")
    run_due(app)
    assert flow.result(timeout=5) == 6  # released once both were heard of, not at the first
