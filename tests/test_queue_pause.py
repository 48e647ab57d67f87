"""Pausing a queue (issue 21): the client API (the asyncio one in test_aio.py), a worker that
takes nothing from a paused queue while it serves the others, `jobqueue queue pause|resume`,
and the pause as `queues`, `show`, `top`, the dashboard and the metrics show it. Both
backends."""

from __future__ import annotations

import json
import re
import urllib.request

import pytest
from click.testing import CliRunner, Result
from helpers import finished, make_worker, running
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from jobqueue.cli import State, main
from jobqueue.cli.top_view import render
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.ops import queries
from jobqueue.runtime.metrics import serve


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


# -- the client ----------------------------------------------------------------------------


def test_pause_queue_pauses_every_partition(jq: JobQueue) -> None:
    jq = JobQueue(jq.redis, partitions={"mail": 4})
    assert jq.pause_queue("mail") is True
    rows = queries.stats(jq, "mail")
    assert [r.paused for r in rows] == [True] * 4


def test_pause_and_resume_say_whether_they_changed_the_queue(jq: JobQueue) -> None:
    assert [jq.pause_queue("mail"), jq.pause_queue("mail")] == [True, False]
    assert jq.queue_paused("mail")
    assert [jq.resume_queue("mail"), jq.resume_queue("mail")] == [True, False]
    assert not jq.queue_paused("mail")


def test_a_queue_unknown_to_redis_is_not_paused(jq: JobQueue) -> None:
    assert not jq.queue_paused("never-used")


# -- the worker ----------------------------------------------------------------------------


def test_a_worker_claims_nothing_from_a_paused_queue_and_everything_once_resumed(
    fast_jq: JobQueue,
) -> None:
    @fast_jq.task(queue="held")
    def t() -> int:
        return 1

    @fast_jq.task(queue="open")
    def u() -> int:
        return 2

    fast_jq.pause_queue("held")
    waiting = fast_jq.enqueue(t.with_options(run_id="waiting"))
    with running(make_worker(fast_jq, queues=["held", "open"])):
        # Each claim pass asks "held" first: once "open"'s run is done, "held" was asked.
        finished(fast_jq, fast_jq.enqueue(u.with_options(run_id="passing")).run_id)
        assert fast_jq.get_run(waiting.run_id).state == "pending"
        fast_jq.resume_queue("held")
        assert finished(fast_jq, waiting.run_id).state == "done"


# -- the CLI -------------------------------------------------------------------------------


def test_cli_queue_pause_and_resume(jq: JobQueue) -> None:
    first, again = invoke(jq, "queue", "pause", "mail"), invoke(jq, "queue", "pause", "mail")
    assert (first.exit_code, again.exit_code) == (0, 0)
    assert "paused queue mail" in first.output and "already paused" in again.output
    assert jq.queue_paused("mail")
    resumed, again = invoke(jq, "queue", "resume", "mail"), invoke(jq, "queue", "resume", "mail")
    assert "resumed queue mail" in resumed.output and "not paused" in again.output
    assert not jq.queue_paused("mail")


def test_cli_queues_shows_when_a_queue_was_paused(jq: JobQueue) -> None:
    jq.declare_task("t", queue="mail")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    jq.pause_queue("mail")
    table = invoke(jq, "queues").output
    assert "PAUSED" in table and re.search(r"mail .* since \d{4}-\d\d-\d\d", table)
    (row,) = json.loads(invoke(jq, "queues", "--json").stdout)
    assert row["paused"] is True and row["paused_since_ms"] > 0


def test_cli_show_says_a_run_waits_for_its_paused_queue(jq: JobQueue) -> None:
    jq.declare_task("t", queue="mail")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    jq.pause_queue("mail")
    assert "paused: not claimed until resumed" in invoke(jq, "show", "a").output
    jq.resume_queue("mail")
    assert "paused" not in invoke(jq, "show", "a").output


def test_top_marks_a_paused_queue(jq: JobQueue) -> None:
    jq.declare_task("t", queue="mail")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    jq.pause_queue("mail")
    assert any(line.startswith("mail (paused)") for line in render(queries.top_snapshot(jq)))


# -- the dashboard and the metrics ---------------------------------------------------------


def test_dashboard_queue_buttons_pause_and_resume(jq: JobQueue) -> None:
    jq.declare_task("t", queue="mail")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="a"))
    client = TestClient(create_app(jq), follow_redirects=False)

    def post(action: str) -> None:
        page = client.get("/queues").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', page)
        assert token
        data = {"csrf_token": token.group(1), "queue": "mail", "next": "/queues"}
        assert client.post(f"/actions/{action}", data=data).status_code == 303

    post("pause-queue")
    assert jq.queue_paused("mail")
    assert "<strong>paused</strong>" in client.get("/queues").text
    post("resume-queue")
    assert not jq.queue_paused("mail")
    assert "<strong>paused</strong>" not in client.get("/queues").text


def test_metrics_count_the_paused_partitions(jq: JobQueue) -> None:
    jq = JobQueue(jq.redis, partitions={"mail": 2})
    jq.pause_queue("mail")
    metrics = serve("worker", 0, "127.0.0.1")
    try:
        metrics.refresh_depth(jq, ["mail"])
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as reply:
            text = reply.read().decode()
    finally:
        metrics.close()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert samples[("jobqueue_queue_paused", (("queue", "mail"),))] == 2



@pytest.mark.parametrize(
    "args",
    [["pause", "defualt"], ["concurrency", "defualt", "3"], ["rate", "defualt", "5"]],
    ids=["pause", "concurrency", "rate"],
)
def test_configuring_a_queue_never_seen_says_so_on_stderr(jq: JobQueue, args: list[str]) -> None:
    first = CliRunner().invoke(main, ["queue", *args], obj=State(None, jq))
    assert first.exit_code == 0, first.output
    assert "queue defualt had no runs nor configuration" in first.stderr
    again = CliRunner().invoke(main, ["queue", *args], obj=State(None, jq))
    assert again.exit_code == 0 and "had no runs" not in again.stderr
