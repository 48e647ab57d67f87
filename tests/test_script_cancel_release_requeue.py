"""cancel.lua, release.lua and requeue.lua through their contracts, plus the history cap."""

from __future__ import annotations

from typing import Any

import pytest
from fence_rule import fence_issued
from helpers import DEAD_RETENTION_MS, LEASE_MS, PAYLOAD, claim, claim_one, create_new

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    COMPLETE,
    CREATE_RUN,
    FAIL,
    HEARTBEAT,
    RELEASE,
    REQUEUE,
    Outcome,
    RunSpec,
)
from jobqueue.store.schedules import HOLD_MS
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def cancel(runner: ScriptRunner, pk: PartitionKeys, run_id: str, now: int,
           reason: str = "stop", retention: int = RETENTION) -> tuple[bool, str]:
    return CANCEL.parse(runner.run(CANCEL.call(pk, run_id, retention, reason, now=now)))


def release(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int
            ) -> Outcome:
    return RELEASE.parse(runner.run(RELEASE.call(pk, run_id, fence, now=now)))


def requeue(
    runner: ScriptRunner, pk: PartitionKeys, run_id: str, now: int, force: bool = True
) -> tuple[bool, str]:
    return REQUEUE.parse(runner.run(REQUEUE.call(pk, run_id, force, now=now)))


def complete(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int
             ) -> Outcome:
    call = COMPLETE.call(pk, [(run_id, fence, '"ok"')], RETENTION, now=now)
    (outcome,) = COMPLETE.parse(runner.run(call))
    return outcome


def make_state(runner: ScriptRunner, pk: PartitionKeys, state: str) -> None:
    """Run 'a' in the given state."""
    create_new(runner, pk, "a", max_attempts=1)
    if state == "pending":
        return
    c = claim_one(runner, pk, now=0)
    if state == "done":
        complete(runner, pk, "a", c.fence, now=10)
    elif state == "dead":
        runner.run(FAIL.call(pk, "a", c.fence, "boom", None, DEAD_RETENTION_MS, now=10))
    elif state == "cancelled":
        cancel(runner, pk, "a", now=10)
    else:
        assert state == "running"


# -- cancel ----------------------------------------------------------------------------------


def test_cancel_pending_run_removes_it_from_the_due_queue(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", delay_ms=1_000)
    assert cancel(runner, pk, "a", now=500) == (True, "pending")
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["fence"], run["finished"]) == (
        "cancelled", str(fence_issued(500)), "500"
    )
    assert redis_client.zscore(pk.due, "a") is None
    assert redis_client.zscore(pk.done, "a") == 500
    assert claim(runner, pk, now=10**9, limit=1).runs == []


def test_cancel_running_run_bumps_fence_so_the_worker_is_refused(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert cancel(runner, pk, "a", now=100) == (True, "running")
    cancelled_at = fence_issued(100, after=c.fence)
    assert redis_client.hget(pk.run("a"), "fence") == str(cancelled_at)
    beat = runner.run(HEARTBEAT.call(pk, [("a", c.fence)], LEASE_MS, now=200))
    assert HEARTBEAT.parse(beat).answers == ["cancelled"]
    assert complete(runner, pk, "a", c.fence, now=300) == Outcome(
        False, "cancelled", current_fence=cancelled_at
    )
    failed = runner.run(FAIL.call(pk, "a", c.fence, "x", 0, DEAD_RETENTION_MS, now=300))
    assert FAIL.parse(failed).status == "cancelled"
    assert release(runner, pk, "a", c.fence, now=300).status == "cancelled"
    assert redis_client.hget(pk.run("a"), "state") == "cancelled"


def test_cancel_running_run_removes_its_lease(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    claim_one(runner, pk, now=0)
    cancel(runner, pk, "a", now=100)
    assert redis_client.zscore(pk.leases, "a") is None
    assert not redis_client.hexists(pk.run("a"), "lease_until")
    # its old lease time passing does not bring it back
    assert claim(runner, pk, now=10 * LEASE_MS, limit=1).runs == []
    assert redis_client.hget(pk.run("a"), "state") == "cancelled"


def test_cancel_of_unknown_run_reports_unknown(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    assert cancel(runner, pk, "ghost", now=1) == (False, "unknown")
    assert redis_client.keys("*") == []


@pytest.mark.parametrize("state", ["done", "dead", "cancelled"])
def test_cancel_of_finished_run_reports_its_state_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, state: str
) -> None:
    make_state(runner, pk, state)
    before = redis_client.hgetall(pk.run("a"))
    assert cancel(runner, pk, "a", now=1_000) == (False, state)
    assert redis_client.hgetall(pk.run("a")) == before


def test_cancelled_record_expires_after_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    cancel(runner, pk, "a", now=1, retention=40_000)
    for key in (pk.run("a"), pk.history("a")):
        assert 30_000 < redis_client.pttl(key) <= 40_000


def test_cancel_stores_the_reason_and_counts_in_stats(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", "b")
    long_reason = "operator said so " + "!" * 300
    cancel(runner, pk, "a", now=1, reason=long_reason)
    cancel(runner, pk, "b", now=2)
    cancel(runner, pk, "b", now=3)  # refused, not counted
    assert redis_client.hget(pk.run("a"), "error") == long_reason
    assert redis_client.hget(pk.stats, "cancelled") == "2"
    assert redis_client.lrange(pk.history("a"), -1, -1) == [
        "1 cancelled (was pending): " + long_reason[:200]
    ]


# -- release ---------------------------------------------------------------------------------


def test_release_does_not_count_an_attempt(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=1)
    c = claim_one(runner, pk, now=0)
    assert c.attempt == 1
    assert release(runner, pk, "a", c.fence, now=10) == Outcome(True, "released")
    assert redis_client.hget(pk.run("a"), "attempt") == "0"
    again = claim_one(runner, pk, now=20, owner="w2")
    assert (again.attempt, again.fence) == (1, fence_issued(20, after=c.fence))


def test_release_puts_run_back_due_now_without_owner_or_lease(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    release(runner, pk, "a", c.fence, now=1_500)
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["due"]) == ("pending", "1500")
    assert "owner" not in run
    assert "lease_until" not in run
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.zscore(pk.due, "a") == 1_500


def test_release_keeps_the_fence_until_the_next_claim_bumps_it(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    release(runner, pk, "a", c.fence, now=10)
    assert redis_client.hget(pk.run("a"), "fence") == str(c.fence)
    # the releasing worker can no longer commit: the run is not running
    assert complete(runner, pk, "a", c.fence, now=11).status == "not-running"


def test_release_pushes_a_wake_token(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    redis_client.delete(pk.wake)
    release(runner, pk, "a", c.fence, now=10)
    assert redis_client.lrange(pk.wake, 0, -1) == ["1"]


def test_release_cuts_an_overfull_wake_list_back_to_its_cap(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    redis_client.rpush(pk.wake, *["1"] * 30)
    c = claim_one(runner, pk, now=0)
    release(runner, pk, "a", c.fence, now=10)
    assert redis_client.llen(pk.wake) == 8


def test_release_with_stale_fence_is_refused(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    new = claim_one(runner, pk, now=LEASE_MS, owner="w2")
    before = redis_client.hgetall(pk.run("a"))
    assert release(runner, pk, "a", old.fence, now=LEASE_MS + 1) == Outcome(
        False, "fenced", current_fence=new.fence
    )
    assert redis_client.hgetall(pk.run("a")) == before
    assert redis_client.zscore(pk.due, "a") is None


@pytest.mark.parametrize(
    ("state", "reason"),
    [("pending", "not-running"), ("done", "finished"), ("dead", "finished"),
     ("cancelled", "cancelled")],
)
def test_release_is_refused_unless_the_run_is_running(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, state: str, reason: str
) -> None:
    make_state(runner, pk, state)
    fence = int(redis_client.hget(pk.run("a"), "fence") or 0)  # not stored until a claim
    before = redis_client.hgetall(pk.run("a"))
    assert release(runner, pk, "a", fence, now=1_000).status == reason
    assert redis_client.hgetall(pk.run("a")) == before


def test_release_of_unknown_run_is_refused(runner: ScriptRunner, pk: PartitionKeys,
                                           redis_client: Any) -> None:
    assert release(runner, pk, "ghost", 1, now=1) == Outcome(False, "unknown", current_fence=0)
    assert redis_client.keys("*") == []


def test_release_writes_a_history_entry(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    release(runner, pk, "a", c.fence, now=42)
    assert redis_client.lrange(pk.history("a"), -1, -1) == [
        f"42 released fence={c.fence} owner=w1 (attempt not counted)"
    ]


def test_history_keeps_only_the_last_32_entries(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    fences = []
    for i in range(40):
        c = claim_one(runner, pk, now=i * 10)
        fences.append(c.fence)
        release(runner, pk, "a", c.fence, now=i * 10 + 5)
    history = redis_client.lrange(pk.history("a"), 0, -1)
    assert len(history) == 32
    assert history[-1] == f"395 released fence={fences[39]} owner=w1 (attempt not counted)"
    assert history[0] == f"85 released fence={fences[8]} owner=w1 (attempt not counted)"


# -- requeue ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["dead", "cancelled", "done"])
def test_requeue_finished_run_resets_attempts_and_makes_it_due_now(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, state: str
) -> None:
    make_state(runner, pk, state)
    assert requeue(runner, pk, "a", now=5_000) == (True, state)
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["attempt"], run["due"]) == ("pending", "0", "5000")
    for gone in ("finished", "result", "error", "owner", "started", "lease_until"):
        assert gone not in run
    assert redis_client.zscore(pk.due, "a") == 5_000
    again = claim_one(runner, pk, now=5_000)
    assert again.attempt == 1


def test_requeue_of_a_delayed_run_cancelled_before_its_time_keeps_it_due_at_that_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", delay_ms=60_000)
    cancel(runner, pk, "a", now=1_000)
    assert requeue(runner, pk, "a", now=2_000) == (True, "cancelled")
    assert redis_client.hget(pk.run("a"), "due") == "60000"
    assert redis_client.zscore(pk.due, "a") == 60_000
    assert claim(runner, pk, now=59_999, limit=1).runs == []
    assert claim_one(runner, pk, now=60_000).run_id == "a"


def test_requeue_of_a_cancelled_held_buffer_one_run_is_due_now_not_at_the_hold_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    spec = RunSpec("held", "t", PAYLOAD, due_at_ms=HOLD_MS)  # waiting for its predecessor
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [spec], now=0))) == [True]
    cancel(runner, pk, "held", now=1_000)
    requeue(runner, pk, "held", now=2_000)
    assert redis_client.zscore(pk.due, "held") == 2_000


def test_requeue_of_a_delayed_run_cancelled_and_requeued_after_its_time_is_due_now(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", delay_ms=60_000)
    cancel(runner, pk, "a", now=1_000)
    requeue(runner, pk, "a", now=70_000)
    assert redis_client.zscore(pk.due, "a") == 70_000


@pytest.mark.parametrize("state", ["dead", "cancelled", "done"])
def test_requeue_removes_the_expiry_of_a_finished_record(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, state: str
) -> None:
    make_state(runner, pk, state)
    assert redis_client.pttl(pk.run("a")) > 0
    requeue(runner, pk, "a", now=5_000)
    assert redis_client.pttl(pk.run("a")) == -1
    assert redis_client.pttl(pk.history("a")) == -1


def test_requeue_removes_run_from_dead_and_done_indexes(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    make_state(runner, pk, "dead")
    assert redis_client.zscore(pk.dead, "a") is not None
    requeue(runner, pk, "a", now=100)
    assert redis_client.zscore(pk.dead, "a") is None
    c = claim_one(runner, pk, now=100)
    complete(runner, pk, "a", c.fence, now=200)
    assert redis_client.zscore(pk.done, "a") == 200
    requeue(runner, pk, "a", now=300)
    assert redis_client.zscore(pk.done, "a") is None


def test_requeue_keeps_the_fence_so_an_old_worker_stays_refused(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    complete(runner, pk, "a", c.fence, now=10)
    requeue(runner, pk, "a", now=20)
    assert redis_client.hget(pk.run("a"), "fence") == str(c.fence)
    assert complete(runner, pk, "a", c.fence, now=21).status == "not-running"
    new = claim_one(runner, pk, now=30, owner="w2")
    assert new.fence == fence_issued(30, after=c.fence)
    assert complete(runner, pk, "a", c.fence, now=31).status == "fenced"
    assert complete(runner, pk, "a", new.fence, now=32).accepted


@pytest.mark.parametrize("state", ["pending", "running"])
def test_requeue_of_a_live_run_is_refused_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, state: str
) -> None:
    make_state(runner, pk, state)
    before = redis_client.hgetall(pk.run("a"))
    assert requeue(runner, pk, "a", now=1_000) == (False, state)
    assert redis_client.hgetall(pk.run("a")) == before


def test_requeue_of_unknown_run_reports_unknown(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    assert requeue(runner, pk, "ghost", now=1) == (False, "unknown")
    assert redis_client.keys("*") == []


def test_requeue_pushes_a_wake_token_and_writes_history(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    make_state(runner, pk, "cancelled")
    redis_client.delete(pk.wake)
    requeue(runner, pk, "a", now=77)
    assert redis_client.lrange(pk.wake, 0, -1) == ["1"]
    assert redis_client.lrange(pk.history("a"), -1, -1) == ["77 requeued (was cancelled)"]


def test_requeue_of_a_done_run_without_force_is_refused_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    make_state(runner, pk, "done")
    before = redis_client.hgetall(pk.run("a"))
    assert requeue(runner, pk, "a", now=1_000, force=False) == (False, "done")
    assert redis_client.hgetall(pk.run("a")) == before
    assert redis_client.zscore(pk.done, "a") is not None


@pytest.mark.parametrize("state", ["dead", "cancelled"])
def test_requeue_of_a_dead_or_cancelled_run_needs_no_force(
    runner: ScriptRunner, pk: PartitionKeys, state: str
) -> None:
    make_state(runner, pk, state)
    assert requeue(runner, pk, "a", now=1_000, force=False) == (True, state)


def test_requeue_of_a_done_run_keeps_its_claim_and_success_in_the_history(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=10, owner="w1")
    complete(runner, pk, "a", c.fence, now=20)
    requeue(runner, pk, "a", now=30)
    assert redis_client.lrange(pk.history("a"), 0, -1) == [
        f"10 claimed fence={c.fence} attempt=1 owner=w1",
        f"20 done fence={c.fence}: \"ok\"",
        "30 requeued (was done)",
    ]


def test_a_requeued_dead_run_shows_the_new_attempt_only_and_keeps_the_old_in_history(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=1)
    c = claim_one(runner, pk, now=10, owner="w1")
    runner.run(FAIL.call(pk, "a", c.fence, "boom", None, DEAD_RETENTION_MS, now=20))
    requeue(runner, pk, "a", now=30)
    again = claim_one(runner, pk, now=40, owner="w2")
    complete(runner, pk, "a", again.fence, now=50)
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["owner"], run["started"]) == ("done", "w2", "40")
    assert "error" not in run
    history = redis_client.lrange(pk.history("a"), 0, -1)
    assert f"10 claimed fence={c.fence} attempt=1 owner=w1" in history
    assert any(line.startswith("20 dead") and "boom" in line for line in history)


def test_cancel_issues_a_fence_from_the_partitions_counter(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", "b")
    held = claim(runner, pk, now=0, limit=2).runs
    assert cancel(runner, pk, "a", now=1) == (True, "running")
    fence_a = int(redis_client.hget(pk.run("a"), "fence"))
    assert fence_a > max(r.fence for r in held)
    assert redis_client.get(pk.fences) == str(fence_a)


def test_cancel_trims_done_index_entries_older_than_the_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    now = RETENTION + 10_000
    redis_client.zadd(pk.done, {"expired-long-ago": 1_000})
    create_new(runner, pk, "a", now=now)
    assert cancel(runner, pk, "a", now=now) == (True, "pending")
    assert redis_client.zrange(pk.done, 0, -1) == ["a"]
