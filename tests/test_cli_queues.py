"""`jobqueue queues` (alias `stats`): every column checked against state the test builds, on
fakeredis and a real server; reading commands never use KEYS."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result
from helpers import claim

from jobqueue.cli import State, main
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import COMPLETE, FAIL, ClaimedRun

JOBQUEUE = str(Path(sys.executable).parent / "jobqueue")
MINUTE = 60_000


def invoke(jq: JobQueue, *args: str) -> Result:
    return CliRunner().invoke(main, list(args), obj=State(None, jq))


def as_json(jq: JobQueue, *args: str) -> Any:
    result = invoke(jq, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def claim_runs(jq: JobQueue, n: int, now: int, lease_ms: int = 60_000) -> list[ClaimedRun]:
    """Claim up to ``n`` runs of queue default, for 'w-1'."""
    keys = jq.keys_for("default", "x")
    return claim(jq.scripts, keys, now, n, "w-1", lease_ms, 3_600_000).runs


def finish(jq: JobQueue, runs: list[ClaimedRun], now: int, dead: bool = False) -> None:
    keys = jq.keys_for("default", "x")
    for r in runs:
        if dead:
            jq.scripts.run(FAIL.call(keys, r.run_id, r.fence, "boom", None, 3_600_000, now))
        else:
            jq.scripts.run(COMPLETE.call(keys, [(r.run_id, r.fence, "null")], 3_600_000, now))


def build_state(jq: JobQueue) -> int:
    """One run in each situation a column counts; returns the oldest due time (ms).

    Claims run at past instants (the scripts take `now`), so which run each claim takes is
    decided by the order of creation, and nothing depends on the test's speed."""
    jq.declare_task("report")
    t = jq.server_time_ms()
    s = t // 1000  # whole seconds: `at` below converts exactly
    jq.enqueue(jq.resolve_task("report").with_options(run_id="done-30m-ago", at=s - 2400))
    finish(jq, claim_runs(jq, 1, now=t - 30 * MINUTE), now=t - 30 * MINUTE + 5)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="done-recent-1", at=s - 20))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="done-recent-2", at=s - 20))
    finish(jq, claim_runs(jq, 2, now=t - 10_000), now=t - 9_000)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="lease-expired", at=s - 20))
    claim_runs(jq, 1, now=t - 10_000, lease_ms=1_000)  # lease ended at t - 9 s: expired, unclaimed
    jq.enqueue(jq.resolve_task("report").with_options(run_id="running", at=s - 20))
    claim_runs(jq, 1, now=t - 10_000)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="died", at=s - 20))
    finish(jq, claim_runs(jq, 1, now=t - 10_000), now=t - 9_000, dead=True)
    jq.enqueue(jq.resolve_task("report").with_options(run_id="due-2-min-ago", at=s - 120))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="due-now"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="due-later", delay=600))
    return (s - 120) * 1000


def test_queues_reports_every_column_against_the_state_created(jq: JobQueue) -> None:
    oldest_due = build_state(jq)
    (row,) = as_json(jq, "queues")
    assert (row["queue"], row["partition"]) == ("default", 0)
    assert row["due_now"] == 2
    assert row["scheduled_later"] == 1
    assert row["running"] == 2  # the live lease and the expired one not yet reclaimed
    assert row["expired_leases"] == 1
    assert row["dead"] == 1
    assert row["done_last_minute"] == 2
    assert row["done_last_hour"] == 3
    assert row["oldest_due_ms"] == oldest_due
    assert row["oldest_due_age_ms"] >= 120_000
    assert row["counters"]["created"] == 9


def test_queues_human_table_shows_each_column_with_oldest_due_relative_and_absolute(
    jq: JobQueue,
) -> None:
    build_state(jq)
    result = invoke(jq, "queues")
    assert result.exit_code == 0, result.output
    header, row = result.stdout.splitlines()
    for column in ("DUE NOW", "LATER", "RUNNING", "EXPIRED", "DEAD", "DONE/1M", "DONE/1H"):
        assert column in header
    assert header.index("DUE NOW") < header.index("OLDEST DUE (UTC)")
    cells = row.split()
    assert cells[:9] == ["default", "0", "2", "1", "2", "1", "1", "2", "3"]
    assert cells[9].startswith("2m0") and cells[10] == "(due"  # 2 minutes late, then when


def test_stats_is_the_same_command_as_queues(jq: JobQueue) -> None:
    build_state(jq)
    by_name = {name: as_json(jq, name) for name in ("queues", "stats")}
    for rows in by_name.values():
        for row in rows:
            row.pop("oldest_due_age_ms")  # measured at each call's own server time
    assert by_name["queues"] == by_name["stats"]


def test_queues_lists_each_partition_of_a_partitioned_queue(redis_client: Any) -> None:
    jq = JobQueue(redis_client, partitions={"mail": 4})
    jq.declare_task("send", queue="mail")
    for i in range(40):
        jq.enqueue(jq.resolve_task("send").with_options(run_id=f"m-{i}"))
    rows = as_json(jq, "queues", "--queue", "mail")
    assert [r["partition"] for r in rows] == [0, 1, 2, 3]
    assert sum(r["due_now"] for r in rows) == 40
    assert all(r["due_now"] > 0 for r in rows)  # 40 ids spread over all 4 partitions


def test_queues_with_no_queue_yet_says_so(jq: JobQueue) -> None:
    result = invoke(jq, "queues")
    assert (result.exit_code, result.stdout.strip()) == (0, "no queues yet")


def test_queues_json_from_a_real_subprocess(real_server: EmbeddedServer) -> None:
    redis.Redis.from_url(real_server.url).flushall()
    jq = JobQueue.from_url(real_server.url)
    build_state(jq)
    out = subprocess.run(
        [JOBQUEUE, "--redis-url", real_server.url, "queues", "--json"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout
    (row,) = json.loads(out)
    assert (row["due_now"], row["running"], row["expired_leases"], row["dead"]) == (2, 2, 1, 1)


def test_reading_commands_never_use_keys(real_server: EmbeddedServer) -> None:
    r = redis.Redis.from_url(real_server.url, decode_responses=True)
    r.flushall()
    jq = JobQueue.from_url(real_server.url)
    build_state(jq)
    jq.schedule("nightly", "report", cron="0 3 * * *")
    r.config_resetstat()
    reads = [
        ["queues"], ["stats"], ["leases"], ["runs"], ["workers"], ["dead", "list"],
        ["schedules", "list"], ["schedules", "show", "nightly"], ["show", "running"],
        ["top", "--once"],
    ]
    for args in reads:
        result = CliRunner().invoke(main, ["--redis-url", real_server.url, *args])
        assert result.exit_code == 0, (args, result.output)
    used = {name.removeprefix("cmdstat_") for name in r.info("commandstats")}
    assert "keys" not in used
    assert {"zcount", "zrange"} <= used  # the stats really were read from this server


@pytest.mark.parametrize(
    "args",
    [["queues"], ["runs"], ["leases"], ["dead", "list"], ["top", "--once"]],
    ids=lambda a: " ".join(a),
)
def test_a_queue_name_no_one_used_is_refused_not_shown_empty(jq: JobQueue, args: list[str]) -> None:
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="r"))  # records 'default'
    result = invoke(jq, *args, "--queue", "defualt")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip() == "error: no queue 'defualt' in Redis (known: default)"
