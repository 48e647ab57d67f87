"""The queues' event logs as users read them: ``jq.events`` (and ``async for`` over
``ajq.events``) in the order written over every partition, resuming right after an event
from its cursor; ``jq.recent_events``; ``jobqueue events``; the per-queue switch and the
trimming bounds. (That each transition writes exactly its event is the model-based test's:
tests/test_model_stateful.py.)"""

from __future__ import annotations

import asyncio
import json
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import server_time_past, wait_for, wait_for_async

from jobqueue.cli import main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.store.events import parse_entry
from jobqueue.testing import run_due


@pytest.fixture
def app(redis_client: Any) -> JobQueue:
    jq = JobQueue(redis_client, partitions={"default": 4})

    @jq.task
    def add(x: int, y: int) -> int:
        return x + y

    @jq.task(max_attempts=1)
    def boom() -> None:
        raise RuntimeError("boom")

    return jq


def kinds_of(events: Any) -> list[tuple[str, str]]:
    return [(ev.kind, ev.run_id) for ev in events]


def test_events_of_a_queue_span_its_partitions_in_the_order_written(app: JobQueue) -> None:
    ids = [f"r{i}" for i in range(12)]
    for rid in ids:
        app.enqueue(app.resolve_task("add").with_options(run_id=rid), 1, 1)
    got = list(app.events("default", since=0, follow=False))
    assert sorted(ev.run_id for ev in got) == sorted(ids)
    assert {ev.kind for ev in got} == {"created"}
    assert len({ev.partition for ev in got}) > 1  # (12 run ids over 4 partitions)
    assert [ev.at_ms for ev in got] == sorted(ev.at_ms for ev in got)


def test_a_cursor_resumes_right_after_its_event_in_every_partition(app: JobQueue) -> None:
    for i in range(8):
        app.enqueue(app.resolve_task("add").with_options(run_id=f"a{i}"), 1, 1)
    first = list(app.events("default", since=0, follow=False))
    middle = first[3]
    rest = list(app.events("default", since=middle.cursor, follow=False))
    assert kinds_of(rest) == kinds_of(first[4:])
    run_due(app)
    later = list(app.events("default", since=first[-1].cursor, follow=False))
    assert {ev.kind for ev in later} == {"claimed", "completed"} and len(later) == 16


def test_a_follower_gets_each_event_as_it_comes_and_stops_when_closed(app: JobQueue) -> None:
    stream = app.events("default", block=0.2)
    stream.start()
    got: list[Any] = []

    def follow() -> None:
        for ev in stream:
            got.append(ev)
            if len(got) == 3:
                stream.close()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    handle = app.enqueue("add", 2, 3)
    run_due(app)
    thread.join(10)
    assert not thread.is_alive()
    assert kinds_of(got) == [(k, handle.run_id) for k in ("created", "claimed", "completed")]


def test_the_asyncio_client_follows_the_same_events(
    app: JobQueue, async_redis_client: Any
) -> None:
    handle = app.enqueue("add", 2, 3)
    run_due(app)

    async def main_() -> list[Any]:
        ajq = AsyncJobQueue(async_redis_client, tasks=app, partitions={"default": 4})
        try:
            return [ev async for ev in ajq.events("default", since=0, follow=False)]
        finally:
            await ajq.close()

    assert kinds_of(asyncio.run(main_())) == [
        (k, handle.run_id) for k in ("created", "claimed", "completed")
    ]


def test_a_runs_events_tell_its_story(app: JobQueue) -> None:
    handle = app.enqueue("boom")
    app.enqueue("add", 1, 1)  # another run's events are not its
    run_due(app)
    story = list(app.events(since=0, run_id=handle.run_id, follow=False))
    assert [ev.kind for ev in story] == ["created", "claimed", "dead"]
    dead = story[-1]
    assert dead.attempt == 1 and "RuntimeError: boom" in (dead.text or "")
    assert app.recent_events(run_id=handle.run_id, limit=1)[0].kind == "dead"


@pytest.mark.parametrize(
    ("since", "expected"),
    [(timedelta(minutes=5), 1), (datetime(2000, 1, 1, tzinfo=UTC), 1), ("start", 1)],
    ids=["duration", "time", "start"],
)
def test_since_takes_a_duration_a_time_or_the_start(
    app: JobQueue, since: Any, expected: int
) -> None:
    app.enqueue("add", 1, 1)
    assert len(list(app.events(since=since, follow=False))) == expected


@pytest.mark.parametrize("since", ["garbage", "q#x=1-0", datetime(2026, 1, 1), True])
def test_a_bad_since_is_refused(app: JobQueue, since: Any) -> None:
    with pytest.raises(ConfigError):
        app.events(since=since).start()


def test_an_unknown_kind_is_refused(app: JobQueue) -> None:
    with pytest.raises(ConfigError, match="unknown event kinds"):
        app.events(kinds=["finished"])


def test_foreign_entries_are_passed_over_and_counted(app: JobQueue, redis_client: Any) -> None:
    handle = app.enqueue(app.resolve_task("add").with_options(run_id="r"), 1, 1)
    keys = app.keys_for("default", handle.run_id)
    redis_client.xadd(keys.events, {"garbage": "x"})
    stream = app.events("default", since=0, follow=False)
    assert kinds_of(stream) == [("created", "r")]
    assert stream.reader is not None and stream.reader.skipped == 1


def test_a_foreign_key_in_place_of_a_log_is_reported_not_raised(
    app: JobQueue, redis_client: Any
) -> None:
    app.register_queue("default")
    keys = app.keys_for("default", "r")
    redis_client.set(keys.events, "not a stream")
    found = app.recent_events("default")
    assert [a.key for a in found.anomalies] == [keys.events]


def test_a_log_that_refuses_entries_costs_the_event_never_the_transition(
    app: JobQueue, redis_client: Any
) -> None:
    """A foreign stream whose last id is the largest there is: XADD '*' fails there, after
    the transition's own writes; the transition stands whole and the next ones go on."""
    handle = app.enqueue(app.resolve_task("add").with_options(run_id="r"), 1, 2)
    keys = app.keys_for("default", handle.run_id)
    redis_client.xadd(keys.events, {"x": "y"}, id="18446744073709551615-18446744073709551615")
    run_due(app)
    run = app.get_run("r")
    assert (run.state, run.result) == ("done", 3)
    assert redis_client.zscore(keys.done, "r") is not None and redis_client.zcard(keys.leases) == 0
    assert redis_client.xlen(keys.events) == 2  # created, and the foreign entry: no more


def test_switched_off_a_queue_writes_no_event_and_on_again_it_does(
    app: JobQueue, redis_client: Any
) -> None:
    settings = app.set_queue_events("default", enabled=False)
    assert not settings.enabled
    app.enqueue("add", 1, 1)
    assert app.recent_events("default") == []
    app.set_queue_events("default", enabled=True)
    app.enqueue("add", 1, 1)
    assert [ev.kind for ev in app.recent_events("default")] == ["created"]


@pytest.mark.real_only  # (fakeredis keeps every entry under MAXLEN ~)
def test_a_queues_maxlen_bounds_its_log_whole_nodes_at_a_time(
    app: JobQueue, redis_client: Any
) -> None:
    """MAXLEN ~ trims whole nodes of 100 entries: at most one node more than asked."""
    app.set_queue_events("single", maxlen=100)
    for i in range(600):
        app.enqueue(app.resolve_task("add").with_options(run_id=f"y{i}", queue="single"), 1, 1)
    keys = app.keys_for("single", "y0")
    assert 100 <= redis_client.xlen(keys.events) <= 200


@pytest.mark.real_only
def test_a_queues_max_age_drops_older_entries_a_node_at_a_time(
    app: JobQueue, redis_client: Any
) -> None:
    app.set_queue_events("single", max_age=1)
    for i in range(250):
        app.enqueue(app.resolve_task("add").with_options(run_id=f"o{i}", queue="single"), 1, 1)
    # The log's own clock (the server's) decides; more time only trims more.
    server_time_past(app, app.server_time_ms() + 1_000)
    app.enqueue(app.resolve_task("add").with_options(run_id="new", queue="single"), 1, 1)
    keys = app.keys_for("single", "new")
    left = [parse_entry("single", 0, i, f) for i, f in redis_client.xrange(keys.events)]
    old = [ev for ev in left if ev and ev.run_id != "new"]
    assert len(old) <= 100  # only the node holding the new entry may keep older ones


@pytest.mark.parametrize(
    ("maxlen", "max_age", "message"),
    [(50, None, "maxlen"), (None, 0.1, "max_age"), (True, None, "maxlen")],
)
def test_settings_out_of_bounds_are_refused(
    app: JobQueue, maxlen: Any, max_age: Any, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        app.set_queue_events("default", maxlen=maxlen, max_age=max_age)


# -- the CLI -------------------------------------------------------------------------------------


@pytest.mark.real_only
def test_jobqueue_events_prints_the_newest_then_json_with_cursors(
    app: JobQueue, real_server: Any
) -> None:
    handle = app.enqueue("add", 1, 1)
    run_due(app)
    url = real_server.url
    out = CliRunner().invoke(main, ["--redis-url", url, "events", "--limit", "2"])
    assert out.exit_code == 0, out.output
    assert "claimed" in out.output and "completed" in out.output and handle.run_id in out.output
    got = CliRunner().invoke(main, ["--redis-url", url, "events", "--since", "0", "--json"])
    lines = [json.loads(line) for line in got.stdout.splitlines()]
    assert [d["kind"] for d in lines] == ["created", "claimed", "completed"]
    after = CliRunner().invoke(
        main, ["--redis-url", url, "events", "--since", lines[0]["cursor"], "--json"]
    )
    assert [json.loads(x)["kind"] for x in after.stdout.splitlines()] == ["claimed", "completed"]
    one = CliRunner().invoke(main, ["--redis-url", url, "events", "--run", handle.run_id,
                                    "--kind", "completed"])
    assert one.output.count("completed") == 1


@pytest.mark.real_only
@pytest.mark.parametrize("since", ["garbage", "2026-13-45", "q#x=1"])
def test_jobqueue_events_refuses_a_bad_since_in_one_line(real_server: Any, since: str) -> None:
    out = CliRunner().invoke(main, ["--redis-url", real_server.url, "events", "--since", since])
    assert out.exit_code == 2 and "Traceback" not in out.output
    assert len(out.output.strip().splitlines()) == 1


@pytest.mark.real_only
def test_jobqueue_queue_events_shows_and_changes_the_settings(real_server: Any) -> None:
    url = real_server.url
    off = CliRunner().invoke(main, ["--redis-url", url, "queue", "events", "q", "--off",
                                    "--maxlen", "500", "--json"])
    assert off.exit_code == 0, off.output
    assert json.loads(off.stdout) | {"entries": 0} == {
        "queue": "q", "enabled": False, "maxlen": 500, "max_age_s": 86400.0, "entries": 0,
        "mixed": False,
    }
    back = CliRunner().invoke(main, ["--redis-url", url, "queue", "events", "q", "--default"])
    assert "events on, about 10000 per partition" in back.output


def test_a_follower_of_every_queue_made_before_any_queue_hears_the_first_ones(
    jq: JobQueue,
) -> None:
    stream = jq.events(block=0.05)
    assert stream.read_batch() == []  # no queue yet: a wait, then a look for queues
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="first"))
    got: list[Any] = []
    for _ in range(40):
        got += stream.read_batch()
        if got:
            break
    assert [(e.kind, e.run_id) for e in got[:1]] == [("created", "first")]


def test_iterating_every_queue_before_any_queue_hears_the_first_ones(jq: JobQueue) -> None:
    stream = jq.events(block=0.05)
    jq.declare_task("t")
    got: list[Any] = []
    reader = threading.Thread(target=lambda: got.append(next(stream, None)))
    reader.start()
    # The reader has taken its starting positions (no queue's stream yet) before the enqueue.
    wait_for(lambda: stream.reader is not None, what="the reader to start")
    assert not stream.reader.streams
    jq.enqueue(jq.resolve_task("t").with_options(run_id="first"))
    reader.join(10)
    stream.close()  # a reader still looking stops at its next turn
    reader.join(10)
    assert got and got[0] is not None and (got[0].kind, got[0].run_id) == ("created", "first")


def test_the_asyncio_follower_of_every_queue_hears_the_first_ones(
    jq: JobQueue, async_redis_client: Any
) -> None:
    jq.declare_task("t")

    async def main_() -> Any:
        ajq = AsyncJobQueue(async_redis_client, tasks=jq)
        try:
            stream = ajq.events(block=0.05)

            async def later() -> None:
                # The follower has taken its starting positions (no queue's stream yet).
                await wait_for_async(lambda: stream.reader is not None, what="the follower")
                assert not stream.reader.streams
                jq.enqueue(jq.resolve_task("t").with_options(run_id="first"))

            task = asyncio.create_task(later())
            first = await asyncio.wait_for(stream.__anext__(), 10)
            await task
            return first
        finally:
            await ajq.close()

    first = asyncio.run(main_())
    assert (first.kind, first.run_id) == ("created", "first")
