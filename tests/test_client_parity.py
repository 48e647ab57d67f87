"""The sync and the asyncio client are one client: every public method of JobQueue has an
async twin with the same parameters (or is listed below as sync-only, with the reason), and the
same inputs, foreign or corrupt data planted in Redis included, give both the same answer or
the same error."""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import fakeredis
import pytest
import redis.asyncio

from jobqueue.anomalies import Listing
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.handles import AsyncFlowHandle, AsyncRunHandle, FlowHandle, RunHandle
from jobqueue.models import Run
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.store.embedded import EmbeddedServer

SYNC_ONLY = {
    "connect": "the async client opens its connection at its first await (redis.asyncio)",
    "use_url": "the CLI's --redis-url for an app's JobQueue; an AsyncJobQueue is made for one URL",
}

# Methods whose async twin is a plain method giving an async iterator (``async for``).
ITERATORS = {"events": "async for ev in ajq.events(queue): the stream, not a coroutine"}

T0 = 1_800_000_000_000  # a fixed 'now' (ms) for the recurring-job methods that take one


def public_methods(cls: type) -> dict[str, Any]:
    return {
        name: getattr(cls, name)
        for name in dir(cls)
        if not name.startswith("_") and callable(getattr(cls, name))
    }


def parameters(method: Any) -> list[tuple[str, Any, Any, Any]]:
    return [
        (p.name, p.kind, p.default, p.annotation)
        for p in inspect.signature(method).parameters.values()
    ]


def test_every_public_method_of_jobqueue_has_an_async_twin_with_the_same_parameters() -> None:
    sync, aio = public_methods(JobQueue), public_methods(AsyncJobQueue)
    missing = sorted(set(sync) - set(aio) - set(SYNC_ONLY))
    differ = sorted(
        name
        for name in set(sync) & set(aio)
        if parameters(sync[name]) != parameters(aio[name])
    )
    assert (missing, differ) == ([], [])


def test_async_twins_of_the_clients_own_methods_are_coroutines() -> None:
    # The sync client's own: defined by JobQueue or a base the async client does not share
    # (its methods come by concern from bases: QueueMethods, RunMethods, ...).
    sync_only_bases = [c for c in JobQueue.__mro__ if c not in AsyncJobQueue.__mro__]
    own = [
        name
        for name in dict.fromkeys(n for c in sync_only_bases for n in vars(c))
        if name in public_methods(JobQueue)
    ]
    assert "enqueue" in own and "chain" in own and "schedule" in own
    not_awaitable = [
        name
        for name in own
        if name not in SYNC_ONLY
        and name not in ITERATORS
        and name != "from_url"
        and not inspect.iscoroutinefunction(getattr(AsyncJobQueue, name))
    ]
    assert not_awaitable == []


def test_sync_only_methods_exist_only_on_the_sync_client() -> None:
    assert [name for name in SYNC_ONLY if hasattr(AsyncJobQueue, name)] == []
    assert [name for name in SYNC_ONLY if not hasattr(JobQueue, name)] == []


# -- the same inputs, the same answers ----------------------------------------------------


@dataclass
class Case:
    """A method called with arguments on a store where ``plant`` wrote raw data first."""

    name: str
    method: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    plant: list[tuple[str, ...]] = field(default_factory=list)  # raw commands
    # run options: the first argument, a task name, becomes that task with these options
    options: dict[str, Any] | None = None
    # a workflow's arguments and keyword steps, made of the client's own task 'report'
    steps: Callable[[Any], tuple[Any, ...]] | None = None
    callbacks: Callable[[Any], dict[str, Any]] | None = None


RUN = "jq:{default#0}:run:r1"
ONE_PARTITION = ("HSET", "jq:queues", "default", "1")
CASES = [
    Case("enqueue", "enqueue", ("report", 1), options={"run_id": "r1"}),
    Case("enqueue again", "enqueue", ("report", 1),
         plant=[("HSET", "jq:queues", "default", "1"),
                ("HSET", RUN, "state", "pending", "task", "report", "payload", '{"args":[1]}')],
         options={"run_id": "r1"}),
    Case("enqueue, bad run id", "enqueue", ("report",), options={"run_id": "a b"}),
    Case("enqueue, a run option among the arguments", "enqueue", ("report",), {"run_id": "r1"}),
    Case("enqueue, args as a string", "enqueue_many", ([Request("report", "abc")],)),  # type: ignore[arg-type]
    Case("enqueue, unknown task", "enqueue", ("nope",)),
    Case("enqueue, delay and at", "enqueue", ("report",), options={"delay": 1, "at": 2}),
    Case("enqueue, jq:queues a string", "enqueue", ("report",), {},
         [("SET", "jq:queues", "x")]),
    Case("enqueue, garbage count", "enqueue", ("report",), {},
         [("HSET", "jq:queues", "default", "99999999")]),
    Case("find_run, none", "find_run", ("r1",)),
    Case("find_run, jq:queues a string", "find_run", ("r1",), {}, [("SET", "jq:queues", "x")]),
    Case("find_run, a string under the run's name", "find_run", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"), ("SET", RUN, "x")]),
    Case("find_run, garbage fields", "find_run", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"),
          ("HSET", RUN, "state", "pending", "task", "report", "attempt", "many")]),
    Case("find_run, history of another type", "find_run", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"),
          ("HSET", RUN, "state", "pending", "task", "report", "hist", "1"),
          ("SET", "jq:{default#0}:hist:r1", "x")]),
    Case("find_run, garbage queue count", "find_run", ("r1",), {},
         [("HSET", "jq:queues", "default", "1", "evil", "0")]),
    Case("find_run, named queue unusable", "find_run", ("r1",), {"queue": "evil"},
         [("HSET", "jq:queues", "evil", "x")]),
    Case("find_run, bad run id", "find_run", ("",)),
    Case("get_run, not found", "get_run", ("r1",), {}, [("HSET", "jq:queues", "evil", "0")]),
    Case("get_run, a string under the run's name", "get_run", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"), ("SET", RUN, "x")]),
    Case("cancel, a string under the run's name", "cancel", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"), ("SET", RUN, "x")]),
    Case("cancel, done", "cancel", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"), ("HSET", RUN, "state", "done", "task", "t")]),
    Case("requeue, pending", "requeue", ("r1",), {},
         [("HSET", "jq:queues", "default", "1"),
          ("HSET", RUN, "state", "pending", "task", "report")]),
    Case("purge_dead, none dead", "purge_dead", (["r1", "r2"],)),
    Case("queue_table, garbage", "queue_table", (), {},
         [("HSET", "jq:queues", "a", "1", "b", "x", "c d", "1")]),
    Case("queues, a string", "queues", (), {}, [("SET", "jq:queues", "x")]),
    Case("run_states", "run_states", (["r1", "r2"],), {},
         [("HSET", "jq:queues", "default", "1"), ("SET", RUN, "x")]),
    Case("schedule", "schedule", ("j", "report"), {"every": 60, "now": T0}),
    Case("schedule, bad cron", "schedule", ("j", "report"), {"cron": "61 * * * *", "now": T0}),
    Case("schedule, garbage K", "schedule", ("j", "report"), {"every": 60, "now": T0},
         [("HSET", "jq:sched:config", "partitions", "0")]),
    Case("list_schedules, garbage definition", "list_schedules", (), {},
         [("HSET", "jq:{sched#0}:def", "bad", "not json",
           "good", '{"task":"report","queue":"default","every_ms":60000}'),
          ("HSET", "jq:{sched#0}:state", "good", "many")]),
    Case("list_schedules, definitions of another type", "list_schedules", (), {},
         [("SET", "jq:{sched#0}:def", "x")]),
    Case("list_schedules, garbage K", "list_schedules", (), {},
         [("SET", "jq:sched:config", "x")]),
    Case("get_schedule, garbage definition", "get_schedule", ("bad",), {},
         [("HSET", "jq:{sched#0}:def", "bad", "not json")]),
    Case("unschedule, garbage definition", "unschedule", ("bad",), {},
         [("HSET", "jq:{sched#0}:def", "bad", "not json")]),
    Case("pause_schedule, none", "pause_schedule", ("nope",), {"now": T0}),
    Case("trigger, none", "trigger", ("nope",), {"now": T0}),
    Case("backfill, end in the future", "backfill",
         ("j", (T0 - 60_000) / 1000, (T0 + 60_000) / 1000), {"now": T0},
         [("HSET", "jq:{sched#0}:def", "j",
           '{"task":"report","queue":"default","every_ms":60000}')]),
    Case("backfill", "backfill", ("j", (T0 - 180_000) / 1000, T0 / 1000), {"now": T0},
         [("HSET", "jq:{sched#0}:def", "j",
           '{"task":"report","queue":"default","every_ms":60000}')]),
    Case("chain", "chain", (), {"flow_id": "f"}, steps=lambda t: (t.s(1), t.receiving())),
    Case("chain, a waiting step's run id taken outside it", "chain", (), {"flow_id": "f"},
         [ONE_PARTITION, ("HSET", "jq:{default#0}:run:f:1", "state", "done", "task", "report")],
         steps=lambda t: (t.s(1), t.receiving())),
    Case("chain, a flow id with a control character", "chain", (), {"flow_id": "a\tb"},
         steps=lambda t: (t.s(1), t.receiving())),
    Case("chain, jq:queues a string", "chain", (), {"flow_id": "f"},
         [("SET", "jq:queues", "x")], steps=lambda t: (t.s(1), t.receiving())),
    Case("chain, bad failure policy", "chain", (), {"on_failure": "shrug"},
         steps=lambda t: (t.s(1), t.receiving())),
    Case("group, no step", "group", (), steps=lambda t: ([],)),
    Case("chord", "chord", (), {"flow_id": "c"},
         steps=lambda t: ([t.s(1), t.s(2)], t.receiving())),
    Case("workflow, after an unknown step", "workflow", (), {"flow_id": "w"},
         steps=lambda t: ({"a": t.s(), "b": t.s().after("zz")},)),
    Case("workflow, a cycle", "workflow", (), {"flow_id": "w"},
         steps=lambda t: ({"a": t.s().after("b"), "b": t.s().after("a")},)),
    Case("batch, no callback", "batch", (), {"batch_id": "b"},
         steps=lambda t: ([t.s(1), t.s(2)],)),
    Case("batch", "batch", (), {"batch_id": "b"}, steps=lambda t: ([t.s(1), t.s(2)],),
         callbacks=lambda t: {"on_complete": t.receiving()}),
]


def shape(value: Any) -> Any:
    """What an answer says, without the server clock's times (the two calls run apart)."""
    if isinstance(value, FlowHandle | AsyncFlowHandle):
        return ("flow", value.flow_id, [shape(r) for r in value.runs], value.created)
    if isinstance(value, RunHandle | AsyncRunHandle):
        return ("handle", value.run_id, value.queue, value.created)
    if isinstance(value, Run):
        return ("run", value.run_id, value.queue, value.state, value.task, value.attempt,
                value.history, value.anomalies)
    if isinstance(value, ScheduleInfo):
        return ("schedule", value.definition, value.next_fire_ms, value.state, value.anomalies)
    if isinstance(value, Listing):
        return ("listing", [shape(v) for v in value], value.anomalies)
    if isinstance(value, list | tuple):
        return [shape(v) for v in value]
    return value


def outcome(call: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", shape(call()))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


async def async_outcome(call: Callable[[], Awaitable[Any]]) -> tuple[Any, ...]:
    try:
        return ("ok", shape(await call()))
    except Exception as exc:
        return ("error", type(exc).__name__, str(exc))


def ready(jq: JobQueue | AsyncJobQueue) -> Any:
    jq.declare_task("report")
    return jq


def arguments(case: Case, jq: JobQueue | AsyncJobQueue) -> tuple[Any, ...]:
    """The case's arguments, its task given ``with_options`` when it has run options, or its
    workflow's steps."""
    if case.steps is not None:
        return case.steps(jq.resolve_task("report"))
    if case.options is None:
        return case.args
    return (jq.resolve_task(case.args[0]).with_options(**case.options), *case.args[1:])


def keywords(case: Case, jq: JobQueue | AsyncJobQueue) -> dict[str, Any]:
    """The case's keyword arguments, with its workflow's callbacks."""
    if case.callbacks is None:
        return case.kwargs
    return {**case.kwargs, **case.callbacks(jq.resolve_task("report"))}


@pytest.fixture
def async_factory(
    redis_client: Any, backend: str, request: pytest.FixtureRequest
) -> Callable[[], Any]:
    """A new redis.asyncio client on the same data as ``redis_client`` (one per event loop)."""
    if backend == "fake":
        server = redis_client.connection_pool.connection_kwargs["server"]
        return lambda: fakeredis.FakeAsyncRedis(server=server, decode_responses=True)
    url = request.getfixturevalue("real_server").url
    return lambda: redis.asyncio.Redis.from_url(url, decode_responses=True)


def plant(redis_client: Any, commands: list[tuple[str, ...]]) -> None:
    redis_client.flushall()
    for command in commands:
        redis_client.execute_command(*command)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_both_clients_give_the_same_answer_or_error(
    case: Case, redis_client: Any, async_factory: Callable[[], Any]
) -> None:
    plant(redis_client, case.plant)
    sync = ready(JobQueue(redis_client))
    args = arguments(case, sync)
    kwargs = keywords(case, sync)
    by_sync = outcome(lambda: getattr(sync, case.method)(*args, **kwargs))
    sync_keys = sorted(redis_client.keys("*"))

    plant(redis_client, case.plant)

    async def go() -> tuple[Any, ...]:
        aio = ready(AsyncJobQueue(async_factory()))
        aio_args, aio_kwargs = arguments(case, aio), keywords(case, aio)
        try:
            return await async_outcome(
                lambda: getattr(aio, case.method)(*aio_args, **aio_kwargs)
            )
        finally:
            await aio.close()

    by_async = asyncio.run(go())
    assert by_async == by_sync
    assert sorted(redis_client.keys("*")) == sync_keys


def test_list_schedules_skips_a_corrupt_definition_and_logs_it(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    jq = ready(JobQueue(redis_client))
    jq.schedule("good", "report", every=60, now=T0)
    redis_client.hset("jq:{sched#0}:def", "bad", "not json")
    with caplog.at_level(logging.WARNING, logger="jobqueue.client"):
        listing = jq.list_schedules()
    assert [i.job_id for i in listing] == ["good"]
    assert [a.key for a in listing.anomalies] == ["jq:{sched#0}:def"]
    assert "field 'bad'" in caplog.text and "not valid JSON" in caplog.text


def test_list_schedules_reads_page_by_page_up_to_a_limit(redis_client: Any) -> None:
    jq = ready(JobQueue(redis_client))
    for i in range(5):
        jq.schedule(f"job-{i}", "report", every=60, now=T0)
    assert len(jq.list_schedules(limit=3)) == 3
    assert len(jq.list_schedules()) == 5


def test_async_list_schedules_matches_the_clis_listing(
    redis_client: Any, async_factory: Callable[[], Any]
) -> None:
    from jobqueue.ops.queries import schedules

    jq = ready(JobQueue(redis_client))
    jq.schedule("good", "report", every=60, now=T0)
    redis_client.hset("jq:{sched#0}:def", "bad", "not json")

    async def go() -> Any:
        aio = ready(AsyncJobQueue(async_factory()))
        try:
            return await aio.list_schedules()
        finally:
            await aio.close()

    assert shape(asyncio.run(go())) == shape(schedules(jq))


def test_async_enqueue_is_durable_when_settings_ask(
    real_server: EmbeddedServer,
) -> None:
    # A server without replicas: WAIT answers 0 replicas, so an enqueue that asks for one is
    # refused as not durable by both clients (the async one used to skip the WAIT).
    from jobqueue.errors import NotDurable
    from jobqueue.settings import Settings

    settings = Settings(durable_replicas=1, durable_timeout_s=0.05)
    sync = ready(JobQueue.from_url(real_server.url, settings=settings))
    with pytest.raises(NotDurable) as by_sync:
        sync.enqueue(sync.resolve_task("report").with_options(run_id="d1"))

    async def go() -> None:
        aio = ready(AsyncJobQueue.from_url(real_server.url, settings=settings))
        try:
            await aio.enqueue(aio.resolve_task("report").with_options(run_id="d1"))
        finally:
            await aio.close()

    with pytest.raises(NotDurable) as by_async:
        asyncio.run(go())
    assert str(by_async.value) == str(by_sync.value)
