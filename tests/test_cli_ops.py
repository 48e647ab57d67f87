"""The operator's commands against a real server: what they print matches the state created."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from helpers import claim, server_time_past

from jobqueue.cli import main
from jobqueue.client.sync import JobQueue
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.store.runs import CLAIM, FAIL


@pytest.fixture
def url(real_server: EmbeddedServer) -> str:
    redis.Redis.from_url(real_server.url).flushall()
    return real_server.url


@pytest.fixture
def jq(url: str) -> JobQueue:
    q = JobQueue.from_url(url)
    q.declare_task("report")
    return q


def cli(url: str, *args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--redis-url", url, *args], input=input)
    return result.exit_code, result.stdout, result.stderr


def cli_json(url: str, *args: str) -> Any:
    code, out, err = cli(url, *args, "--json")
    assert code == 0, err
    return json.loads(out)


def claim_as(jq: JobQueue, owner: str, lease_ms: int = 30_000, now: int | None = None) -> Any:
    """Claim the due runs of queue default for ``owner``."""
    keys = jq.keys_for("default", "x")
    return claim(jq.scripts, keys, now, owner=owner, lease_ms=lease_ms, retention_ms=60_000)


def test_leases_lists_owner_fence_attempt_and_time_left(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    (claimed,) = claim_as(jq, "host-a:123:abc").runs
    (lease,) = cli_json(url, "leases")
    assert (lease["run_id"], lease["owner"], lease["fence"], lease["attempt"]) == (
        "r1", "host-a:123:abc", claimed.fence, 1)
    assert 25_000 < lease["remaining_ms"] <= 30_000
    assert lease["expired"] is False


def test_leases_flags_expired_leases(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r2"))
    claim_as(jq, "w-new")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    # A 1 ms lease that nobody reclaims (no claim runs after it): expired, not yet taken over.
    now = jq.server_time_ms()
    claim_as(jq, "w-old", lease_ms=1, now=now)
    server_time_past(jq, now + 1)
    expired = cli_json(url, "leases", "--expired")
    assert [lease["run_id"] for lease in expired] == ["r1"]
    assert expired[0]["remaining_ms"] < 0
    code, out, _ = cli(url, "leases")
    assert code == 0 and "EXPIRED" in out and "w-new" in out


def test_leases_filters_by_worker(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r1"))
    claim_as(jq, "w-1")
    jq.enqueue(jq.resolve_task("report").with_options(run_id="r2"))
    claim_as(jq, "w-2")
    assert [lease["run_id"] for lease in cli_json(url, "leases", "--worker", "w-2")] == ["r2"]


def test_runs_filters_by_state(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="pending-1"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="cancelled-1", delay=60))
    jq.cancel("cancelled-1")
    assert [r["run_id"] for r in cli_json(url, "runs", "--state", "pending")] == ["pending-1"]
    assert [r["run_id"] for r in cli_json(url, "runs", "--state", "cancelled")] == ["cancelled-1"]
    assert {r["run_id"] for r in cli_json(url, "runs")} == {"pending-1", "cancelled-1"}


def test_runs_filters_by_job(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="nightly@2026-11-29T00:00:00Z"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="hourly@2026-11-29T10:00:00Z"))
    found = cli_json(url, "runs", "--job", "nightly")
    assert [r["run_id"] for r in found] == ["nightly@2026-11-29T00:00:00Z"]


def test_stats_counts_due_later_running_and_dead(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="now-1"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="now-2"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="later", delay=600))
    claim_keys = jq.keys_for("default", "x")
    CLAIM.parse(jq.scripts.run(CLAIM.call(claim_keys, 1, "w", 30_000, 60_000)))
    (row,) = cli_json(url, "stats")
    assert (row["due_now"], row["scheduled_later"], row["running"], row["dead"]) == (1, 1, 1, 0)
    assert row["counters"]["created"] == 3


def test_dead_list_retry_and_purge(jq: JobQueue, url: str) -> None:
    keys = jq.keys_for("default", "x")
    for run_id in ("d1", "d2"):
        jq.enqueue(jq.resolve_task("report").with_options(run_id=run_id))
    for r in claim_as(jq, "w").runs:
        jq.scripts.run(FAIL.call(keys, r.run_id, r.fence, "boom", None, 60_000))
    assert {r["run_id"] for r in cli_json(url, "dead", "list")} == {"d1", "d2"}
    code, out, _ = cli(url, "dead", "retry", "d1")
    assert code == 0 and "retried 1 of 1" in out
    assert jq.get_run("d1").state == "pending"
    code, out, _ = cli(url, "dead", "purge", "--all", "--yes")
    assert code == 0 and "purged 1" in out
    assert jq.find_run("d2") is None
    assert jq.get_run("d1").state == "pending", "purge touches only dead runs"


def test_purge_asks_before_deleting(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="d1"))
    keys = jq.keys_for("default", "x")
    (r,) = claim_as(jq, "w").runs
    jq.scripts.run(FAIL.call(keys, r.run_id, r.fence, "boom", None, 60_000))
    code, _, _ = cli(url, "dead", "purge", "d1", input="n\n")
    assert code == 1  # aborted
    assert jq.get_run("d1").state == "dead"


def test_capacity_prints_the_arithmetic_for_5_million_hourly_jobs() -> None:
    result = CliRunner().invoke(main, ["capacity", "--jobs", "5000000", "--every", "3600",
                                       "--row-bytes", "300"])
    assert result.exit_code == 0, result.output
    assert "runs/day 120,000,000; average 1,389 runs/s" in result.stdout
    assert "if every job fires at minute 0: 5,000,000 runs in one second" in result.stdout
    assert "run rows/day at 300 bytes each: 36 GB" in result.stdout
    assert "bytes per finished run (measured)" in result.stdout


def test_workers_lists_the_registry_with_stale_flag(jq: JobQueue, url: str) -> None:
    now = jq.server_time_ms()
    jq.redis.hset("jq:workers", mapping={
        "w-live": json.dumps({"id": "w-live", "host": "h", "pid": 1, "last_seen_ms": now,
                              "lease_ms": 30000}),
        "w-gone": json.dumps({"id": "w-gone", "host": "h", "pid": 2,
                              "last_seen_ms": now - 600_000, "lease_ms": 30000}),
    })
    found = {w["id"]: w["stale"] for w in cli_json(url, "workers")}
    assert found == {"w-live": False, "w-gone": True}


def test_check_warns_about_an_evicting_memory_policy(jq: JobQueue, url: str) -> None:
    jq.redis.config_set("maxmemory-policy", "allkeys-lru")
    try:
        code, out, _ = cli(url, "check")
    finally:
        jq.redis.config_set("maxmemory-policy", "noeviction")
    assert code == 1
    assert "WARN  maxmemory-policy allkeys-lru" in out


def test_leases_json_in_a_real_subprocess(jq: JobQueue, url: str) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="sub-1"))
    claim_as(jq, "w-sub")
    out = subprocess.run([sys.executable, "-m", "jobqueue.cli", "--redis-url", url, "leases",
                          "--json"], capture_output=True, text=True, check=True).stdout
    assert [(x["run_id"], x["owner"]) for x in json.loads(out)] == [("sub-1", "w-sub")]


def test_a_run_id_in_two_queues_is_refused_without_a_queue_and_found_with_one(
    url: str, jq: JobQueue
) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="twin"))
    jq.enqueue(jq.resolve_task("report").with_options(run_id="twin", queue="emails"))
    for args in (["show", "twin"], ["cancel", "twin"]):
        code, _, err = cli(url, *args)
        assert code == 1, err
        assert "exists in several queues (default, emails): name the queue" in err
    assert jq.get_run("twin", queue="emails").state == "pending"  # nothing was cancelled
    code, out, _ = cli(url, "show", "twin", "--queue", "emails")
    assert code == 0 and "emails" in out


def test_show_of_a_key_that_is_not_a_run_record_says_so(url: str, jq: JobQueue) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="victim"))
    key = jq.keys_for("default", "victim").run("victim")
    jq.redis.delete(key)
    jq.redis.set(key, "not a hash")
    code, out, err = cli(url, "show", "victim")
    assert code == 0, err
    assert "not a run record" in out


def test_show_of_a_workflow_step_lists_what_it_waits_on_and_runs_lists_it_waiting(
    url: str, jq: JobQueue
) -> None:
    report = jq.resolve_task("report")
    jq.chord([report.s(), report.s()], report.s(), on_failure="ignore", flow_id="wf")
    code, out, err = cli(url, "show", "wf:2")
    assert code == 0, err
    assert "workflow wf: waits on 2 runs, 0 heard of" in out
    assert "  wf:0 (default, on failure ignore) not finished" in out
    rows = cli_json(url, "runs", "--state", "waiting")
    assert [r["run_id"] for r in rows] == ["wf:2"]


def test_show_of_a_workflow_step_prints_the_tree_below_it_with_each_runs_state(
    url: str, jq: JobQueue
) -> None:
    report = jq.resolve_task("report")
    jq.chain(report.s(), report.s(), report.s(), flow_id="tree")
    code, out, err = cli(url, "show", "tree:2")
    assert code == 0, err
    assert "workflow tree: waits on 1 runs, 0 heard of" in out
    assert "\n  tree:1 (default, on failure fail) not finished; now waiting\n" in out
    assert "\n    tree:0 (default, on failure fail) not finished; now pending\n" in out


def test_show_of_a_workflow_step_prints_the_runs_waiting_on_it_with_their_state(
    url: str, jq: JobQueue
) -> None:
    report = jq.resolve_task("report")
    jq.chord([report.s(), report.s()], report.s(), flow_id="up")
    code, out, err = cli(url, "show", "up:0")
    assert code == 0, err
    assert "workflow up: waits on 0 runs, 0 heard of, 1 wait on it" in out
    assert out.endswith("waited on by:\n  up:2 (default): now waiting, on 2 more runs\n")
    jq.cancel("up:2")
    assert cli(url, "show", "up:0")[1].endswith("  up:2 (default): now cancelled\n")


def test_show_marks_a_waited_on_by_list_jobqueue_did_not_write(url: str, jq: JobQueue) -> None:
    jq.enqueue(jq.resolve_task("report").with_options(run_id="odd"))
    redis.Redis.from_url(url).hset(jq.keys_for("default", "odd").run("odd"), "parents", "{x")
    code, out, err = cli(url, "show", "odd")
    assert code == 0
    assert "field 'parents' is '{x', not a list of [queue, run_id]" in err + out


def test_show_cuts_a_wide_tree_at_60_runs_saying_how_many_were_left_out(
    url: str, jq: JobQueue
) -> None:
    report = jq.resolve_task("report")
    steps = {f"leaf-{i}-{j}": report.s() for i in range(3) for j in range(30)}
    steps |= {f"mid-{i}": report.s().after(*[f"leaf-{i}-{j}" for j in range(30)])
              for i in range(3)}
    steps["top"] = report.s().after("mid-0", "mid-1", "mid-2")
    jq.workflow(steps, flow_id="wide")
    code, out, err = cli(url, "show", "wide:top")
    assert code == 0, err
    tree = [line for line in out.splitlines() if "; now " in line]
    assert len(tree) == 3 + 20 + 20 + 17  # the mids, then leaves until 60 lines in all
    assert out.count("    ... and 10 more") == 2  # 20 of 30 leaves under each of two mids
    assert "    ... and 13 more" in out  # the third mid: the 60 lines were spent
