"""The listings shown by a limit (leases with the least time left, the newest flows, some
recurring jobs) say when their limit left rows out: a top-N never passes for the whole."""

from __future__ import annotations

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient
from test_listing import enqueue

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.ops import flow_queries, queries
from jobqueue.store.runs import CLAIM

pytestmark = pytest.mark.real_only


@pytest.fixture
def jq(jq: JobQueue) -> JobQueue:
    jq.declare_task("report")
    return jq


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def running(jq: JobQueue, n: int) -> None:
    enqueue(jq, [f"r{i:03d}" for i in range(n)])
    jq.scripts.run(CLAIM.call(jq.keys_for("default", "r000"), n, "w-1", 60_000, 60_000))


def test_leases_say_when_their_limit_left_some_out(jq: JobQueue) -> None:
    running(jq, 3)
    assert queries.leases(jq, limit=2).truncated
    assert not queries.leases(jq, limit=3).truncated
    result = invoke(jq, "leases", "--limit", "2")
    assert result.exit_code == 0 and "only the first 2 are shown" in result.stderr
    assert "only the first" not in invoke(jq, "leases", "--limit", "3").stderr


def test_the_leases_page_says_when_more_are_running_than_it_shows(jq: JobQueue) -> None:
    running(jq, 501)
    page = TestClient(create_app(jq, sample_every_s=None)).get("/leases").text
    assert 'id="truncated"' in page and "than the 500 shown here" in page


def test_flows_say_when_older_ones_were_left_out(jq: JobQueue) -> None:
    ref = jq.resolve_task("report")
    for i in range(3):
        jq.group([ref.s(), ref.s()], flow_id=f"g{i}")
    assert flow_queries.flows(jq, limit=2).truncated
    assert not flow_queries.flows(jq, limit=3).truncated
    page = TestClient(create_app(jq, sample_every_s=None)).get("/flows?limit=2").text
    assert 'id="truncated"' in page and 'href="/flows?limit=10"' in page


def test_recurring_jobs_say_when_the_limit_left_some_out(jq: JobQueue) -> None:
    for i in range(3):
        jq.schedule(f"job-{i}", "report", every=60)
    assert queries.schedules(jq, limit=2).truncated
    assert not queries.schedules(jq, limit=3).truncated
    result = invoke(jq, "schedules", "list", "--limit", "2")
    assert result.exit_code == 0 and "only 2 of them are shown" in result.stderr
