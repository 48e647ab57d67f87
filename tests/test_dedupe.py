"""Deduplication keys (issue 21) through the client API (sync and asyncio) and the CLI: the
handle says what an enqueue under a key did and names the run holding the key; the key
decides the partition. The script-level rules are in test_script_dedupe.py."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import fakeredis
import pytest
from click.testing import CliRunner, Result
from helpers import claim
from starlette.testclient import TestClient

from jobqueue import Dedupe, Request
from jobqueue.cli import State, main
from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.dashboard.app import create_app
from jobqueue.errors import ConfigError, InvalidRunId
from jobqueue.store.keys import partition_of
from jobqueue.store.scripts import ScriptRunner


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def test_throttle_keeps_the_first_run_and_says_so(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("user:42"))
    first, second = report.enqueue(1), report.enqueue(2)
    assert (first.outcome, first.created) == ("created", True)
    assert (second.outcome, second.created, second.run_id) == (
        "deduplicated", False, first.run_id
    )
    assert jq.get_run(first.run_id).args == [1]


def test_debounce_replaces_the_pending_runs_arguments(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(
        dedupe=Dedupe("user:42", mode="debounce"), delay=60
    )
    first, second = report.enqueue(1), report.enqueue(2)
    assert (second.outcome, second.run_id) == ("replaced", first.run_id)
    run = jq.get_run(first.run_id)
    assert (run.args, run.dedupe_key) == ([2], "user:42")


def test_a_run_holds_its_key_until_its_first_claim(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("user:42"))
    first = report.enqueue(1)
    claim(ScriptRunner(jq.redis), jq.keys_for("default", first.run_id))
    assert report.enqueue(2).outcome == "created"


def test_with_a_ttl_the_key_holds_after_the_claim(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("user:42", ttl=60))
    first = report.enqueue(1)
    claim(ScriptRunner(jq.redis), jq.keys_for("default", first.run_id))
    assert report.enqueue(2).outcome == "deduplicated"


def test_runs_of_one_key_share_the_keys_partition(jq: JobQueue) -> None:
    jq = JobQueue(jq.redis, partitions={"default": 8})
    report = jq.declare_task("report")
    ids = [report.with_options(dedupe=Dedupe(f"user:{i}")).enqueue().run_id for i in range(8)]
    assert [partition_of(r, 8) for r in ids] == [partition_of(f"user:{i}", 8) for i in range(8)]


@pytest.mark.parametrize(
    "bad",
    [
        lambda: Dedupe(""),
        lambda: Dedupe("k", mode="drop"),
        lambda: Dedupe("k", ttl=0),
        lambda: Dedupe("k", ttl=float("nan")),
    ],
)
def test_a_bad_dedupe_option_is_refused(bad: Any) -> None:
    with pytest.raises(ConfigError):
        bad()


def test_dedupe_with_a_run_id_is_refused_and_nothing_is_written(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("k"), run_id="r1")
    with pytest.raises(ConfigError, match="dedupe"):
        report.enqueue()
    assert jq.queues() == {}


def test_a_dedupe_key_with_control_characters_is_refused(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("a\nb"))
    with pytest.raises(InvalidRunId, match="dedupe key"):
        report.enqueue()
    assert jq.queues() == {}


def test_enqueue_many_refuses_a_deduplicated_task(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("k"))
    with pytest.raises(ConfigError, match="enqueue_many"):
        jq.enqueue_many([Request(report)])
    assert jq.queues() == {}


def test_async_throttle_and_debounce() -> None:
    async def go() -> list[tuple[str, bool]]:
        jq = AsyncJobQueue(fakeredis.aioredis.FakeRedis(decode_responses=True))
        report = jq.declare_task("report")
        throttled = report.with_options(dedupe=Dedupe("a"))
        debounced = report.with_options(dedupe=Dedupe("b", mode="debounce"))
        handles = [
            await jq.enqueue(throttled, 1),
            await jq.enqueue(throttled, 2),
            await jq.enqueue(debounced, 1),
            await jq.enqueue(debounced, 2),
        ]
        return [(h.outcome, h.run_id == handles[i - i % 2].run_id) for i, h in enumerate(handles)]

    assert asyncio.run(go()) == [
        ("created", True), ("deduplicated", True), ("created", True), ("replaced", True)
    ]


def test_cli_enqueue_dedupe_key_and_mode(jq: JobQueue) -> None:
    args = ("enqueue", "report", "--dedupe-key", "user:42", "--json")
    first = json.loads(invoke(jq, *args, "--args", "[1]").stdout)
    second = json.loads(invoke(jq, *args, "--args", "[2]", "--dedupe-mode", "debounce").stdout)
    assert (first["outcome"], second["outcome"]) == ("created", "replaced")
    assert second["run_id"] == first["run_id"]
    assert jq.get_run(first["run_id"]).args == [2]
    shown = invoke(jq, "show", first["run_id"]).output
    assert any(line.split() == ["dedupe", "key", "user:42"] for line in shown.splitlines())


def test_cli_says_a_throttled_enqueue_wrote_nothing(jq: JobQueue) -> None:
    invoke(jq, "enqueue", "report", "--dedupe-key", "k")
    result = invoke(jq, "enqueue", "report", "--dedupe-key", "k")
    assert result.exit_code == 0
    assert result.stdout.startswith("deduplicated: ")


@pytest.mark.parametrize(
    "extra",
    [("--dedupe-mode", "debounce"), ("--dedupe-ttl", "5"), ("--dedupe-key", "k", "--run-id", "r")],
)
def test_cli_refuses_dedupe_options_that_do_not_go_together(
    jq: JobQueue, extra: tuple[str, ...]
) -> None:
    result = invoke(jq, "enqueue", "report", *extra)
    assert result.exit_code == 2
    assert jq.queues() == {}


def test_eight_threads_racing_on_one_key_create_one_run(jq: JobQueue) -> None:
    report = jq.declare_task("report").with_options(dedupe=Dedupe("user:42"))
    barrier = threading.Barrier(8)
    outcomes: list[tuple[str, str]] = []

    def producer() -> None:
        barrier.wait()
        handle = report.enqueue(1)
        outcomes.append((handle.outcome, handle.run_id))

    threads = [threading.Thread(target=producer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    created = [r for o, r in outcomes if o == "created"]
    assert len(created) == 1
    assert sorted(o for o, _ in outcomes) == ["created"] + ["deduplicated"] * 7
    assert {r for _, r in outcomes} == set(created)


def test_the_dashboard_run_page_and_runs_json_show_the_dedupe_key(jq: JobQueue) -> None:
    handle = jq.declare_task("report").with_options(dedupe=Dedupe("user:42")).enqueue()
    page = TestClient(create_app(jq)).get("/run", params={"id": handle.run_id}).text
    assert "<tr><th>dedupe key</th><td>user:42</td></tr>" in page
    (listed,) = json.loads(invoke(jq, "runs", "--json").stdout)
    assert listed["dedupe_key"] == "user:42"
