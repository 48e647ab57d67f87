"""Run.timeline(): a run's story from its record and its (lean) history, oldest first, as
`jobqueue show` prints it. Explicit clock throughout."""

from __future__ import annotations

from typing import Any

from helpers import LEASE_MS, claim_one, create

from jobqueue import JobQueue
from jobqueue.ops import queries as inspect
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CANCEL, COMPLETE, FAIL
from jobqueue.store.scripts import ScriptRunner


def events(jq: JobQueue, run_id: str) -> list[tuple[int | None, str]]:
    return jq.get_run(run_id, queue="default").timeline()


def test_a_first_attempt_success_reads_created_claimed_done(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=100)
    c = claim_one(runner, pk, owner="w1", now=150)
    runner.run(COMPLETE.call(pk, [("a", c.fence, "1")], 60_000, now=180))
    assert events(jq, "a") == [
        (100, "created"),
        (150, f"claimed fence={c.fence} attempt=1 owner=w1"),
        (180, f"done fence={c.fence}"),
    ]


def test_a_retried_run_shows_how_the_first_attempt_ended_and_who_held_each(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=0)
    c1 = claim_one(runner, pk, owner="w1", now=10)
    runner.run(FAIL.call(pk, "a", c1.fence, "boom", 90, 1, now=20))
    c2 = claim_one(runner, pk, owner="w2", now=110)
    runner.run(COMPLETE.call(pk, [("a", c2.fence, "1")], 60_000, now=130))
    assert events(jq, "a") == [
        (0, "created"),
        (20, f"failed fence={c1.fence} attempt=1 owner=w1 retry at 110: boom"),
        (110, f"claimed fence={c2.fence} attempt=2 owner=w2"),
        (130, f"done fence={c2.fence}"),
    ]


def test_a_lease_expiry_names_the_owner_that_lost_the_run(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=0)
    c1 = claim_one(runner, pk, owner="w1", now=0)
    c2 = claim_one(runner, pk, owner="w2", now=LEASE_MS + 1)
    assert events(jq, "a") == [
        (0, "created"),
        (LEASE_MS + 1, f"lease expired fence={c1.fence} attempt=1 owner=w1"),
        (LEASE_MS + 1, f"claimed fence={c2.fence} attempt=2 owner=w2"),
    ]


def test_a_cancelled_running_run_shows_the_fence_its_claim_had(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=0)
    c = claim_one(runner, pk, owner="w1", now=5)
    runner.run(CANCEL.call(pk, "a", 60_000, "stop", now=9))
    assert events(jq, "a") == [
        (0, "created"),
        (5, f"claimed fence={c.fence} attempt=1 owner=w1"),
        (9, f"cancelled (was running, fence={c.fence}): stop"),
    ]


def test_a_pending_run_has_only_its_creation(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", now=7)
    assert events(jq, "a") == [(7, "created")]


def test_show_json_carries_the_timeline(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a", now=100)
    c = claim_one(runner, pk, owner="w1", now=150)
    runner.run(COMPLETE.call(pk, [("a", c.fence, "1")], 60_000, now=180))
    assert jq.get_run("a", queue="default").to_dict()["timeline"] == [
        {"at_ms": 100, "event": "created"},
        {"at_ms": 150, "event": f"claimed fence={c.fence} attempt=1 owner=w1"},
        {"at_ms": 180, "event": f"done fence={c.fence}"},
    ]


def test_show_prints_the_instants_inside_history_entries_as_times(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    from click.testing import CliRunner

    from jobqueue.cli import State, main

    create(runner, pk, "a", now=1_700_000_000_000)
    c = claim_one(runner, pk, owner="w1", now=1_700_000_000_100)
    runner.run(FAIL.call(pk, "a", c.fence, "boom", 60_000, 1, now=1_700_000_000_200))
    out = CliRunner().invoke(main, ["show", "a", "--queue", "default"], obj=State(None, jq))
    assert out.exit_code == 0, out.output
    assert "retry at 2023-11-14" in out.output and "1700000060200" not in out.output


def test_a_listing_shows_each_run_with_the_same_history_and_timeline_as_show(
    jq: JobQueue, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    jq.register_queue("default")  # as every enqueue does; these runs come from the scripts
    create(runner, pk, "a", now=100)
    c = claim_one(runner, pk, owner="w1", now=150)
    runner.run(FAIL.call(pk, "a", c.fence, "boom", None, 60_000, now=170))  # dead
    create(runner, pk, "b", now=200)
    listed = {r.run_id: r for r in inspect.runs(jq, queue="default")}
    for run_id in ("a", "b"):
        shown = jq.get_run(run_id, queue="default")
        assert listed[run_id].history == shown.history
        assert listed[run_id].timeline() == shown.timeline()
    assert any("dead" in text for _, text in listed["a"].timeline())
