"""Orphans and `jobqueue repair`: an index entry whose record is not there is kept aside, not
dropped, and comes back when its record does; repair puts every run of a queue back in the
index its state belongs to. Both backends."""

from __future__ import annotations

import json
from typing import Any

from click.testing import CliRunner
from helpers import claim, create, ids

from jobqueue import JobQueue
from jobqueue.cli import State, main
from jobqueue.ops.repair import repair_queue
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import COMPLETE, FAIL, RELEASE
from jobqueue.store.scripts import ScriptRunner


def one_run(jq: JobQueue, run_id: str) -> PartitionKeys:
    """One pending run ``run_id`` of a task "t" in the default queue; its partition's keys."""
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id=run_id), 1)
    return jq.keys_for("default", run_id)


def snapshot(client: Any) -> dict[str, Any]:
    return {k: client.dump(k) for k in sorted(client.keys("*"))}


def test_a_due_entry_whose_record_is_missing_is_kept_as_an_orphan_not_dropped(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """On a cluster node importing a slot, an index entry may arrive before its record."""
    create(runner, pk, "a", "b")
    redis_client.delete(pk.run("a"))  # not here (yet)
    assert ids(claim(runner, pk, now=10)) == ["b"]
    assert redis_client.zscore(pk.orphans, "a") == 10
    assert redis_client.zscore(pk.due, "a") is None


def test_an_orphan_whose_record_appears_goes_back_to_its_index_at_the_next_claim(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    record = redis_client.dump(pk.run("a"))
    redis_client.delete(pk.run("a"))
    assert ids(claim(runner, pk, now=10)) == []
    redis_client.restore(pk.run("a"), 0, record)  # the record arrives
    assert ids(claim(runner, pk, now=20)) == []  # this claim puts it back...
    assert redis_client.zscore(pk.orphans, "a") is None
    assert ids(claim(runner, pk, now=30)) == ["a"]  # ...and the next one takes it


def test_repair_puts_a_pending_record_without_a_due_entry_back_at_its_due_time(
    jq: JobQueue, redis_client: Any
) -> None:
    pk = one_run(jq, "lost")
    due = redis_client.zscore(pk.due, "lost")
    redis_client.zrem(pk.due, "lost")  # a pending run no claim can see
    report = repair_queue(jq, "default")
    assert (report.totals.indexed, report.totals.orphaned) == (1, 0)
    assert redis_client.zscore(pk.due, "lost") == due


def test_repair_gives_every_state_its_index(
    jq: JobQueue, redis_client: Any
) -> None:
    runner, pk = jq.scripts, jq.partition_keys("default", 0)
    jq.register_queue("default")
    create(runner, pk, "p", "r", "d", "x")
    assert sorted(ids(claim(runner, pk, now=1))) == ["d", "p", "r", "x"]
    fences = {k: int(redis_client.hget(pk.run(k), "fence")) for k in ("d", "p", "r", "x")}
    runner.run(COMPLETE.call(pk, [("d", fences["d"], "1")], 60_000, now=2))
    runner.run(FAIL.call(pk, "x", fences["x"], "boom", None, 60_000, now=2))
    runner.run(RELEASE.call(pk, "p", fences["p"], now=2))
    for index in (pk.due, pk.leases, pk.dead, pk.done):
        redis_client.delete(index)
    report = repair_queue(jq, "default")
    assert report.totals.indexed == 4
    assert redis_client.zrange(pk.due, 0, -1) == ["p"]
    assert redis_client.zrange(pk.leases, 0, -1) == ["r"]
    assert redis_client.zrange(pk.dead, 0, -1) == ["x"]
    assert redis_client.zrange(pk.done, 0, -1) == ["d"]


def test_repair_sets_an_index_entry_without_a_record_aside_as_an_orphan(
    jq: JobQueue, redis_client: Any
) -> None:
    pk = one_run(jq, "gone")
    redis_client.delete(pk.run("gone"))
    report = repair_queue(jq, "default")
    assert report.totals.orphaned == 1
    assert redis_client.zscore(pk.due, "gone") is None
    assert redis_client.zscore(pk.orphans, "gone") is not None


def test_a_dry_run_reports_and_changes_nothing(jq: JobQueue, redis_client: Any) -> None:
    redis_client.zrem(one_run(jq, "lost").due, "lost")
    before = snapshot(redis_client)
    assert repair_queue(jq, "default", dry_run=True).totals.indexed == 1
    assert snapshot(redis_client) == before


def test_repair_run_twice_changes_nothing_the_second_time(
    jq: JobQueue, redis_client: Any
) -> None:
    jq.declare_task("t")
    for i in range(30):
        jq.enqueue("t", i)
    redis_client.delete(jq.partition_keys("default", 0).due)
    assert repair_queue(jq, "default").totals.indexed == 30
    again = repair_queue(jq, "default").totals
    assert (again.indexed, again.orphaned, again.unorphaned, again.unchanged) == (0, 0, 0, 30)


def test_the_repair_command_reports_per_queue_in_json(jq: JobQueue, redis_client: Any) -> None:
    redis_client.zrem(one_run(jq, "lost").due, "lost")
    result = CliRunner().invoke(main, ["repair", "--json"], obj=State(None, jq))
    assert result.exit_code == 0, result.output
    (report,) = json.loads(result.stdout)
    assert (report["queue"], report["totals"]["indexed"]) == ("default", 1)


def test_repairing_an_unknown_queue_is_refused(jq: JobQueue) -> None:
    result = CliRunner().invoke(main, ["repair", "--queue", "nope"], obj=State(None, jq))
    assert result.exit_code == 1
    assert "no queue 'nope'" in result.output


def test_repair_sets_aside_every_entry_of_an_index_longer_than_one_page(
    jq: JobQueue, redis_client: Any
) -> None:
    """Repairs move entries out of the index being paged through; none may be skipped."""
    pk = one_run(jq, "kept")
    redis_client.zadd(pk.due, {f"gone-{i}": i for i in range(1500)})  # > one 1,000-entry page
    assert repair_queue(jq, "default").totals.orphaned == 1500
    assert redis_client.zrange(pk.due, 0, -1) == ["kept"]
    assert redis_client.zcard(pk.orphans) == 1500
