"""Middleware (jobqueue.hooks): enqueue hooks and their meta, run hooks around sync and async
tasks, event hooks, and hooks that raise (logged; no run lost, no worker stopped)."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner
from helpers import finished, make_worker, running, wait_for
from starlette.testclient import TestClient

from jobqueue.cli import main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.base import Request
from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext, current_run
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError, Fatal
from jobqueue.hooks import (
    META_MAX_BYTES,
    META_MAX_ITEMS,
    EnqueueRequest,
    MetaError,
    Middleware,
    RunEvent,
)
from jobqueue.models import Run
from jobqueue.runtime.clock import FakeClock


class Tagging(Middleware):
    def __init__(self, **tags: str) -> None:
        self.tags = tags
        self.seen: list[EnqueueRequest] = []

    def before_enqueue(self, request: EnqueueRequest) -> None:
        self.seen.append(request)
        request.meta.update(self.tags)


class Broken(Middleware):
    def before_enqueue(self, request: EnqueueRequest) -> None:
        request.meta["half"] = "written"
        raise RuntimeError("enqueue hook bug")

    def before_run(self, ctx: RunContext) -> None:
        raise RuntimeError("before_run bug")

    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        raise RuntimeError("after_run bug")

    def on_dead(self, event: RunEvent) -> None:
        raise RuntimeError("on_dead bug")


class Recorder(Middleware):
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.events: list[RunEvent] = []

    def before_run(self, ctx: RunContext) -> None:
        self.calls.append(("before", (ctx.run_id, current_run() is ctx)))

    def after_run(self, ctx: RunContext, error: BaseException | None) -> None:
        self.calls.append(("after", (ctx.run_id, repr(error))))

    def on_retry_scheduled(self, event: RunEvent) -> None:
        self.events.append(event)

    def on_dead(self, event: RunEvent) -> None:
        self.events.append(event)

    def on_cancelled(self, event: RunEvent) -> None:
        self.events.append(event)

    def on_lease_lost(self, event: RunEvent) -> None:
        self.events.append(event)


# -- enqueue hooks and meta ------------------------------------------------------------------


def test_before_enqueue_sees_the_run_and_its_meta_is_stored(jq: JobQueue) -> None:
    jq.declare_task("report", queue="reports")
    tagging = Tagging(tenant="acme")
    jq.use(tagging)
    handle = jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"), 7, region="eu")
    (seen,) = tagging.seen
    assert (seen.task, seen.queue, seen.run_id, list(seen.args), dict(seen.kwargs)) == (
        "report", "reports", "r1", [7], {"region": "eu"})
    assert handle.refresh().meta == {"tenant": "acme"}


def test_enqueue_many_keeps_each_requests_meta_and_the_hooks(jq: JobQueue) -> None:
    jq.declare_task("report")
    jq.use(Tagging(source="api"))
    jq.enqueue_many([Request("report", run_id="a", meta={"user": "u1"}), Request("report",
                                                                                run_id="b")])
    assert jq.get_run("a").meta == {"user": "u1", "source": "api"}
    assert jq.get_run("b").meta == {"source": "api"}


def test_meta_without_hooks_is_stored_too(jq: JobQueue) -> None:
    jq.declare_task("report")
    jq.enqueue_many([Request("report", run_id="a", meta={"k": "v"})])
    assert jq.get_run("a").meta == {"k": "v"}


def test_a_run_without_meta_reads_an_empty_map(jq: JobQueue) -> None:
    jq.declare_task("report")
    assert jq.enqueue(jq.resolve_task("report").with_options(run_id="a")).refresh().meta == {}


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ({f"k{i}": "v" for i in range(META_MAX_ITEMS + 1)}, "entries"),
        ({"k": "v" * META_MAX_BYTES}, "bytes"),
        ({"k": 1}, "str to str"),
        ({"": "v"}, "characters"),
        ({"k" * 65: "v"}, "characters"),
    ],
)
def test_meta_beyond_its_limits_is_refused_and_nothing_is_written(
    jq: JobQueue, meta: dict[str, Any], message: str
) -> None:
    jq.declare_task("report")
    jq.use(Tagging(**meta))
    with pytest.raises(MetaError, match=message):
        jq.enqueue(jq.resolve_task("report").with_options(run_id="a"))
    assert jq.find_run("a") is None


@pytest.mark.parametrize("meta", [["a"], "k=v", 7])
def test_meta_that_is_not_a_mapping_is_refused_and_nothing_is_written(
    jq: JobQueue, meta: Any
) -> None:
    jq.declare_task("report")
    with pytest.raises(MetaError, match="mapping"):
        jq.enqueue_many([Request("report", run_id="a", meta=meta)])
    assert jq.find_run("a") is None


@pytest.mark.parametrize("stray", ["not middleware", Tagging, None])
def test_registering_what_is_not_middleware_is_refused(jq: JobQueue, stray: Any) -> None:
    with pytest.raises(ConfigError, match="Middleware"):
        jq.use(stray)
    with pytest.raises(ConfigError, match="Middleware"):
        make_worker(jq, middleware=[stray])


def test_a_raising_enqueue_hook_is_logged_and_the_run_is_still_created(
    jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    jq.declare_task("report")
    jq.use(Tagging(first="1"))
    jq.use(Broken())
    jq.use(Tagging(last="3"))
    with caplog.at_level(logging.ERROR, logger="jobqueue.hooks"):
        handle = jq.enqueue(jq.resolve_task("report").with_options(run_id="a"))
    assert handle.created
    assert handle.refresh().meta == {"first": "1", "last": "3"}  # not the broken hook's
    assert "Broken.before_enqueue raised" in caplog.text and "enqueue hook bug" in caplog.text


def test_the_async_client_runs_the_same_enqueue_hooks() -> None:
    async def go() -> Run:
        jq = AsyncJobQueue(fakeredis.FakeAsyncRedis(decode_responses=True))
        jq.declare_task("report")
        jq.use(Tagging(tenant="acme"))
        await jq.enqueue(jq.resolve_task("report").with_options(run_id="a"))
        return await jq.get_run("a")

    assert asyncio.run(go()).meta == {"tenant": "acme"}


def test_a_stored_meta_that_is_not_a_map_is_an_anomaly() -> None:
    run = Run.from_hash("a", 0, {"state": "pending", "meta": "[1]"}, [], key="k")
    assert run.meta == {}
    assert [a.problem for a in run.anomalies] == ["field 'meta' is '[1]', not a map"]


def test_show_prints_the_meta(redis_client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    jq = JobQueue(redis_client)
    jq.declare_task("report")
    jq.enqueue_many([Request("report", run_id="a", meta={"tenant": "acme"})])
    monkeypatch.setattr("jobqueue.cli.common.State.jq", lambda self: jq)
    out = CliRunner().invoke(main, ["show", "a"]).stdout
    assert "meta tenant  acme" in out


# -- run hooks -------------------------------------------------------------------------------


def test_run_hooks_wrap_a_sync_task_in_its_thread_with_its_meta(fast_jq: JobQueue) -> None:
    recorder = Recorder()
    fast_jq.use(Tagging(tenant="acme"))
    seen: list[Any] = []

    @fast_jq.task
    def job(ctx: RunContext) -> int:
        seen.append(dict(ctx.meta))
        return 1

    with running(make_worker(fast_jq, middleware=[recorder])):
        run = finished(fast_jq, fast_jq.enqueue(job.with_options(run_id="r1")).run_id)
    assert run.state == "done" and seen == [{"tenant": "acme"}]
    assert recorder.calls == [("before", ("r1", True)), ("after", ("r1", "None"))]


def test_run_hooks_wrap_an_async_task_and_see_its_error(fast_jq: JobQueue) -> None:
    recorder = Recorder()
    fast_jq.use(recorder)

    @fast_jq.task(max_attempts=1)
    async def job() -> None:
        await asyncio.sleep(0)  # kept: a coroutine that suspends before it fails
        raise ValueError("async boom")

    with running(make_worker(fast_jq)):
        finished(fast_jq, fast_jq.enqueue(job.with_options(run_id="r1")).run_id)
    assert recorder.calls == [
        ("before", ("r1", True)),
        ("after", ("r1", "ValueError('async boom')")),
    ]


def test_raising_run_and_event_hooks_are_logged_and_the_run_stands(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    @fast_jq.task(max_attempts=1)
    def ok() -> str:
        return "fine"

    @fast_jq.task(max_attempts=1)
    def bad() -> None:
        raise Fatal("no")

    worker = make_worker(fast_jq, middleware=[Broken()])
    with caplog.at_level(logging.ERROR, logger="jobqueue.hooks"), running(worker):
        done = finished(fast_jq, fast_jq.enqueue(ok).run_id)
        dead = finished(fast_jq, fast_jq.enqueue(bad).run_id)
        again = finished(fast_jq, fast_jq.enqueue(ok).run_id)  # the worker goes on
    assert (done.state, done.result, dead.state, again.state) == ("done", "fine", "dead", "done")
    for name in ("before_run", "after_run", "on_dead"):
        assert f"Broken.{name} raised" in caplog.text


# -- event hooks -----------------------------------------------------------------------------


def test_retry_and_dead_events_carry_the_attempt_error_and_traceback(fast_jq: JobQueue) -> None:
    recorder = Recorder()
    fast_jq.use(Tagging(tenant="acme"))

    @fast_jq.task(max_attempts=2, backoff=0.01, backoff_cap=0.01)
    def flaky() -> None:
        raise ValueError("boom")

    with running(make_worker(fast_jq, middleware=[recorder])):
        finished(fast_jq, fast_jq.enqueue(flaky.with_options(run_id="r1")).run_id)
    retry, dead = recorder.events
    assert (retry.outcome, retry.attempt, retry.run_id, retry.task) == ("retry", 1, "r1", "flaky")
    assert retry.retry_at_ms is not None and retry.meta == {"tenant": "acme"}
    assert (dead.outcome, dead.attempt, dead.error, dead.retry_at_ms) == (
        "dead", 2, "ValueError: boom", None)
    assert dead.traceback.endswith("ValueError: boom") and "in flaky" in dead.traceback


def test_cancelling_a_running_run_is_one_cancelled_event(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    recorder = Recorder()
    started = threading.Event()

    @fast_jq.task
    def long(ctx: RunContext) -> None:
        started.set()
        ctx.cancelled.wait(5)

    # On a fake clock: the heartbeat comes when the test moves the clock a beat on, and the
    # lease cannot run out meanwhile (on a 0.3 s real lease, a busy machine let it expire
    # before the heartbeat: one 'expired' event instead).
    worker = make_worker(fast_jq, lease=3.0, middleware=[recorder], clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(long)
        assert started.wait(5)
        fast_jq.cancel(handle.run_id, reason="stop")
        clock.advance(1.0)  # a third of the lease: the next heartbeat is due
        wait_for(lambda: worker.stats.rejected_commits, what="the refused commit")
    assert [(e.outcome, e.reason) for e in recorder.events] == [("cancelled", "cancelled")]


def test_a_run_gone_from_redis_is_one_lease_lost_event(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    recorder = Recorder()
    started = threading.Event()

    @fast_jq.task
    def long(ctx: RunContext) -> None:
        started.set()
        ctx.cancelled.wait(5)

    # On a fake clock: the heartbeat comes when the test moves the clock a beat on, and the
    # lease cannot run out meanwhile (on a 0.3 s real lease, a busy machine let it expire
    # before the heartbeat: one 'expired' event instead).
    worker = make_worker(fast_jq, lease=3.0, middleware=[recorder], clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(long)
        assert started.wait(5)
        fast_jq.redis.delete(fast_jq.keys_for("default", handle.run_id).run(handle.run_id))
        clock.advance(1.0)  # a third of the lease: the next heartbeat is due
        wait_for(lambda: worker.stats.rejected_commits, what="the refused commit")
    assert [(e.outcome, e.reason) for e in recorder.events] == [("lease-lost", "unknown")]


def test_events_reach_the_hooks_whatever_the_log_level(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = Recorder()
    caplog.set_level(logging.WARNING, logger="jobqueue.worker")  # no INFO line per run

    @fast_jq.task(max_attempts=1)
    def bad() -> None:
        raise ValueError("boom")

    with running(make_worker(fast_jq, middleware=[recorder])):
        finished(fast_jq, fast_jq.enqueue(bad).run_id)
    assert [e.outcome for e in recorder.events] == ["dead"]


def test_meta_with_text_that_is_not_unicode_is_refused(jq: JobQueue) -> None:
    jq.declare_task("report")
    with pytest.raises(MetaError, match="lone surrogate"):
        jq.enqueue_many([Request("report", run_id="a", meta={"k": "\udcff"})])
    assert jq.find_run("a") is None


def test_the_run_page_shows_the_meta_escaped(jq: JobQueue) -> None:
    jq.declare_task("report")
    jq.enqueue_many([Request("report", run_id="a", meta={"tenant": "<i>acme</i>"})])
    page = TestClient(create_app(jq)).get("/run?id=a").text
    assert "<tr><th>meta tenant</th><td>&lt;i&gt;acme&lt;/i&gt;</td></tr>" in page
