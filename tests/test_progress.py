"""ctx.progress(value, message): stored on the run record by progress.lua, only from the holder
of the run's current fence; shown by the run model, show, runs --json and the run page."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest
from click.testing import CliRunner
from helpers import claim_one, finished, make_worker, running, wait_for
from starlette.testclient import TestClient

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext
from jobqueue.dashboard.app import create_app
from jobqueue.errors import JobQueueError
from jobqueue.store.runs import PROGRESS, ClaimedRun, Outcome

NOW = 1_700_000_000_000


def claimed(jq: JobQueue, run_id: str = "r1") -> ClaimedRun:
    jq.declare_task("report")
    jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    keys = jq.keys_for("default", run_id)
    return claim_one(jq.scripts, keys, owner="w-1", retention_ms=60_000)


def report(jq: JobQueue, run: ClaimedRun, value: float, message: str = "", *,
           fence: int | None = None, now: int | None = NOW) -> Outcome:
    keys = jq.keys_for("default", run.run_id)
    call = PROGRESS.call(keys, run.run_id, run.fence if fence is None else fence, value,
                         message, now=now)
    return PROGRESS.parse(jq.scripts.run(call))


def test_the_holder_writes_progress_message_time_and_attempt(jq: JobQueue) -> None:
    run = claimed(jq)
    assert report(jq, run, 42.5, "parsing") == Outcome(True, "written")
    stored = jq.get_run("r1")
    assert (stored.progress, stored.progress_message, stored.progress_at_ms,
            stored.progress_attempt) == (42.5, "parsing", NOW, 1)


def test_a_requeued_run_shows_no_progress_of_its_ended_life(jq: JobQueue) -> None:
    run = claimed(jq)
    report(jq, run, 100, "all rows done")
    jq.cancel("r1")
    jq.requeue("r1")
    stored = jq.get_run("r1")
    assert (stored.progress, stored.progress_message, stored.progress_attempt) == (
        None, None, None
    )


def test_a_later_report_without_message_clears_the_message(jq: JobQueue) -> None:
    run = claimed(jq)
    report(jq, run, 10, "starting")
    report(jq, run, 20)
    stored = jq.get_run("r1")
    assert (stored.progress, stored.progress_message) == (20, None)


def test_a_stale_holder_cannot_write_progress(jq: JobQueue) -> None:
    run = claimed(jq)
    assert report(jq, run, 30, "old", fence=run.fence - 1) == Outcome(
        False, "fenced", current_fence=run.fence)
    assert jq.get_run("r1").progress is None


def test_a_cancelled_run_takes_no_more_progress(jq: JobQueue) -> None:
    run = claimed(jq)
    jq.cancel("r1")
    assert report(jq, run, 30).status == "cancelled"
    assert jq.get_run("r1").progress is None


def test_a_run_never_reported_has_no_progress(jq: JobQueue) -> None:
    claimed(jq)
    stored = jq.get_run("r1")
    assert (stored.progress, stored.progress_message, stored.to_dict()["progress"]) == (
        None, None, None)


def test_a_stored_progress_out_of_range_is_an_anomaly(jq: JobQueue) -> None:
    claimed(jq)
    jq.redis.hset(jq.keys_for("default", "r1").run("r1"), "progress", "250")
    stored = jq.get_run("r1")
    assert stored.progress is None
    assert any("'progress' is '250'" in a.problem for a in stored.anomalies)


# -- ctx.progress in a worker ----------------------------------------------------------------


def test_a_task_reports_progress_seen_while_it_runs(fast_jq: JobQueue) -> None:
    reported, release = threading.Event(), threading.Event()
    answers: list[bool] = []

    @fast_jq.task
    def long(ctx: RunContext) -> str:
        answers.append(ctx.progress(25, "a quarter"))
        reported.set()
        release.wait(5)
        answers.append(ctx.progress(100))
        return "ok"

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(long)
        assert reported.wait(5)
        during = handle.refresh()
        release.set()
        after = finished(fast_jq, handle.run_id)
    assert (during.state, during.progress, during.progress_message) == (
        "running", 25, "a quarter")
    assert (after.state, after.progress, after.progress_message, answers) == (
        "done", 100, None, [True, True])


def test_a_task_whose_lease_is_lost_is_told_its_progress_was_not_written(
    fast_jq: JobQueue,
) -> None:
    started, release = threading.Event(), threading.Event()
    answers: list[bool] = []

    @fast_jq.task
    def long(ctx: RunContext) -> None:
        started.set()
        release.wait(5)
        answers.append(ctx.progress(50))

    worker = make_worker(fast_jq)
    with running(worker):
        handle = fast_jq.enqueue(long)
        assert started.wait(5)
        fast_jq.cancel(handle.run_id)
        release.set()
        wait_for(lambda: answers, what="the progress answer")
    assert answers == [False]
    assert fast_jq.get_run(handle.run_id).progress is None


@pytest.mark.parametrize(
    ("value", "message", "error"),
    [(-1, None, ValueError), (100.5, None, ValueError), (math.nan, None, ValueError),
     (True, None, TypeError), ("50", None, TypeError), (50, "x" * 501, ValueError),
     (50, 7, TypeError), (50, "\ud800", ValueError)],
)
def test_progress_refuses_values_outside_0_to_100_and_bad_messages(
    value: Any, message: Any, error: type[Exception]
) -> None:
    ctx = RunContext("r", 1, 1, 1, "t", "q", "", None, _reporter=lambda *a: True)
    with pytest.raises(error):
        ctx.progress(value, message)


def test_progress_outside_a_worker_is_an_error() -> None:
    with pytest.raises(JobQueueError, match="inside a worker"):
        RunContext("r", 1, 1, 1, "t", "q", "", None).progress(1)


# -- what operators see --------------------------------------------------------------------


def test_show_runs_json_and_the_run_page_show_the_progress(
    jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = claimed(jq)
    report(jq, run, 42, "<b>parsing</b>", now=None)
    monkeypatch.setattr("jobqueue.cli.common.State.jq", lambda self: jq)
    shown = CliRunner().invoke(main, ["show", "r1"]).stdout
    assert "progress     42% (attempt 1, " in shown and "): <b>parsing</b>" in shown
    (listed,) = json.loads(CliRunner().invoke(main, ["runs", "--state", "running",
                                                     "--json"]).stdout)
    assert (listed["progress"], listed["progress_message"]) == (42, "<b>parsing</b>")
    page = TestClient(create_app(jq)).get("/run?id=r1").text
    assert '<progress max="100" value="42.0"></progress> 42%' in page
    assert "&lt;b&gt;parsing&lt;/b&gt;" in page
