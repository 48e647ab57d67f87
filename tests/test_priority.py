"""Run priorities (issue 21) through the client API (sync and asyncio), the CLI and the
dashboard: a run's priority is one of its options, stored on its record and shown; the claim
order it gives is specified in test_script_priority.py (scripts) and test_model_stateful.py."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner, Result
from helpers import claim, make_worker, running, wait_for
from starlette.testclient import TestClient

from jobqueue import Request
from jobqueue.cli import State, main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError
from jobqueue.ops import queries
from jobqueue.store.scripts import ScriptRunner
from jobqueue.testing import run_due


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def claimed_order(jq: JobQueue) -> list[str]:
    pk = jq.keys_for("default", "any")  # one partition
    return [r.run_id for r in claim(ScriptRunner(jq.redis), pk).runs]


def test_with_options_priority_is_stored_on_the_run(jq: JobQueue) -> None:
    report = jq.declare_task("report")
    handle = report.with_options(priority=7).enqueue(1)
    assert jq.get_run(handle.run_id).priority == 7


def test_a_run_without_a_priority_has_the_default(jq: JobQueue) -> None:
    handle = jq.declare_task("report").enqueue(1)
    assert jq.get_run(handle.run_id).priority == 0


def test_enqueue_many_takes_a_priority_per_request(jq: JobQueue) -> None:
    jq.declare_task("report")
    handles = jq.enqueue_many(
        [Request("report", run_id="low"), Request("report", run_id="high", priority=9)]
    )
    assert [jq.get_run(h.run_id).priority for h in handles] == [0, 9]


def test_the_due_run_of_the_highest_priority_is_claimed_first(jq: JobQueue) -> None:
    report = jq.declare_task("report")
    report.with_options(run_id="low").enqueue()
    report.with_options(run_id="high", priority=9).enqueue()
    report.with_options(run_id="mid", priority=5).enqueue()
    assert claimed_order(jq) == ["high", "mid", "low"]


@pytest.mark.parametrize("priority", [0, 3])
def test_runs_of_one_priority_run_in_the_order_they_were_enqueued(
    jq: JobQueue, priority: int
) -> None:
    """Random run ids, enqueued in one call and one by one, most in the same millisecond: a
    worker with one slot runs them in that order (equal due times sorted by id before)."""
    ran: list[int] = []

    @jq.task
    def step(i: int) -> None:
        ran.append(i)

    urgent = step.with_options(priority=priority)
    jq.enqueue_many(Request(urgent, (i,)) for i in range(40))
    for i in range(40, 60):
        urgent.enqueue(i)
    run_due(jq, concurrency=1)
    assert ran == list(range(60))


@pytest.mark.parametrize("bad", [-1, 10, 2.0, True, "3"])
def test_a_priority_out_of_range_is_refused_and_nothing_is_written(
    jq: JobQueue, bad: object
) -> None:
    report = jq.declare_task("report")
    with pytest.raises(ConfigError, match="priority"):
        report.with_options(priority=bad).enqueue()  # type: ignore[arg-type]
    assert jq.queues() == {}


def test_async_enqueue_stores_the_priority() -> None:
    async def go() -> int:
        jq = AsyncJobQueue(fakeredis.aioredis.FakeRedis(decode_responses=True))
        report = jq.declare_task("report")
        handle = await jq.enqueue(report.with_options(priority=3), 1)
        return (await jq.get_run(handle.run_id)).priority

    assert asyncio.run(go()) == 3


def test_cli_enqueue_priority_and_show(jq: JobQueue) -> None:
    result = invoke(jq, "enqueue", "report", "--run-id", "r1", "--priority", "8")
    assert result.exit_code == 0, result.output
    shown = invoke(jq, "show", "r1").output
    assert any(line.split() == ["priority", "8"] for line in shown.splitlines()), shown


def test_cli_enqueue_refuses_a_priority_out_of_range(jq: JobQueue) -> None:
    result = invoke(jq, "enqueue", "report", "--priority", "10")
    assert result.exit_code == 2
    assert jq.queues() == {}


def test_cli_enqueue_from_file_gives_every_line_the_priority(
    jq: JobQueue, tmp_path: Any
) -> None:
    lines = tmp_path / "runs.jsonl"
    lines.write_text('{"run_id": "a"}\n{"run_id": "b"}\n')
    result = invoke(jq, "enqueue", "report", "--from-file", str(lines), "--priority", "4")
    assert result.exit_code == 0, result.output
    assert [jq.get_run(r).priority for r in ("a", "b")] == [4, 4]


def test_runs_json_has_the_priority(jq: JobQueue) -> None:
    jq.declare_task("report").with_options(run_id="r1", priority=2).enqueue()
    listed = json.loads(invoke(jq, "runs", "--json").output)
    assert [(r["run_id"], r["priority"]) for r in listed] == [("r1", 2)]


def test_the_dashboard_run_page_shows_the_priority(jq: JobQueue) -> None:
    jq.declare_task("report").with_options(run_id="r1", priority=6).enqueue()
    page = TestClient(create_app(jq)).get("/run?id=r1&queue=default").text
    assert "<tr><th>priority</th><td>6</td></tr>" in page


def test_a_priority_field_out_of_range_is_shown_as_the_default_with_an_anomaly(
    jq: JobQueue,
) -> None:
    jq.declare_task("report").with_options(run_id="r1").enqueue()
    jq.redis.hset(jq.keys_for("default", "r1").run("r1"), "priority", "42")
    run = jq.get_run("r1")
    assert run.priority == 0
    assert any("priority" in str(a) for a in run.anomalies)


def test_a_prio_key_of_another_type_is_an_anomaly_of_its_partition(jq: JobQueue) -> None:
    jq.declare_task("report").enqueue()
    jq.redis.set(jq.keys_for("default", "any").prio, "garbage")
    (part,) = queries.stats(jq, "default")
    assert any(":prio" in str(a) for a in part.anomalies)


def test_a_worker_of_one_slot_runs_due_runs_highest_priority_first(fast_jq: JobQueue) -> None:
    order: list[str] = []

    @fast_jq.task
    def step(name: str) -> None:
        order.append(name)

    for name, priority in (("low-1", 0), ("high-1", 9), ("mid-1", 4), ("low-2", 0), ("high-2", 9)):
        step.with_options(priority=priority).enqueue(name)
    with running(make_worker(fast_jq, concurrency=1)):
        wait_for(lambda: len(order) == 5, 30, "5 runs")
    # (runs enqueued in one millisecond are due together: in run id order within a level)
    assert [name.split("-")[0] for name in order] == ["high", "high", "mid", "low", "low"]
