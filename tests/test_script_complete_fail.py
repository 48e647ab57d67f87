"""complete.lua and fail.lua through their contracts: fenced commits, retry with delay,
dead-lettering, retention, the done index, stats and history."""

from __future__ import annotations

from typing import Any

import pytest
from fence_rule import fence_issued
from helpers import DEAD_RETENTION_MS, LEASE_MS, claim_one, create_new

from jobqueue.errors import ScriptError
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    CLAIM,
    COMPLETE,
    FAIL,
    Outcome,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def complete(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int,
             result: str = '"ok"', retention: int = RETENTION) -> Outcome:
    call = COMPLETE.call(pk, [(run_id, fence, result)], retention, now=now)
    (outcome,) = COMPLETE.parse(runner.run(call))
    return outcome


def fail(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int,
         delay: int | None = 1_000, error: str = "boom") -> Outcome:
    call = FAIL.call(pk, run_id, fence, error, delay, DEAD_RETENTION_MS, now=now)
    return FAIL.parse(runner.run(call))


# -- complete --------------------------------------------------------------------------------


def test_complete_with_current_fence_is_accepted_once(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert complete(runner, pk, "a", c.fence, now=10) == Outcome(True, "done")
    assert complete(runner, pk, "a", c.fence, now=20) == Outcome(
        False, "finished", current_fence=c.fence
    )


def test_complete_marks_done_with_result_and_finish_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    complete(runner, pk, "a", c.fence, now=1_234, result='{"n":[1,2]}')
    run = redis_client.hgetall(pk.run("a"))
    assert run["state"] == "done"
    assert run["result"] == '{"n":[1,2]}'
    assert run["finished"] == "1234"
    assert "lease_until" not in run


def test_complete_removes_the_lease_and_indexes_the_run_as_done(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    complete(runner, pk, "a", c.fence, now=500)
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.zscore(pk.done, "a") == 500
    # a completed run is not reclaimed when its old lease time passes
    result = CLAIM.parse(runner.run(CLAIM.call(pk, 5, "w2", LEASE_MS, 1, now=10 * LEASE_MS)))
    assert result.runs == []


def test_complete_with_stale_fence_is_refused_as_fenced_with_current_fence(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    new = claim_one(runner, pk, now=LEASE_MS, owner="w2")
    assert complete(runner, pk, "a", old.fence, now=LEASE_MS + 1) == Outcome(
        False, "fenced", current_fence=new.fence
    )


def test_refused_complete_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    claim_one(runner, pk, now=LEASE_MS, owner="w2")
    record = redis_client.hgetall(pk.run("a"))
    history = redis_client.lrange(pk.history("a"), 0, -1)
    leases = redis_client.zrange(pk.leases, 0, -1, withscores=True)
    complete(runner, pk, "a", old.fence, now=LEASE_MS + 1)
    assert redis_client.hgetall(pk.run("a")) == record
    assert redis_client.lrange(pk.history("a"), 0, -1) == history
    assert redis_client.zrange(pk.leases, 0, -1, withscores=True) == leases
    assert redis_client.zcard(pk.done) == 0
    assert redis_client.pttl(pk.run("a")) == -1


def test_complete_of_unknown_run_is_refused_as_unknown(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    outcome = complete(runner, pk, "ghost", 1, now=10)
    assert outcome == Outcome(False, "unknown", current_fence=0)
    assert not redis_client.exists(pk.run("ghost"))
    assert not redis_client.exists(pk.history("ghost"))
    assert redis_client.zcard(pk.done) == 0


def test_complete_of_a_pending_run_is_refused_as_not_running(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    outcome = complete(runner, pk, "a", 0, now=10)
    assert outcome == Outcome(False, "not-running", current_fence=0)
    assert redis_client.hget(pk.run("a"), "state") == "pending"


def test_complete_of_cancelled_run_is_refused_as_cancelled(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(CANCEL.call(pk, "a", RETENTION, "stop", now=5))
    assert complete(runner, pk, "a", c.fence, now=10) == Outcome(
        False, "cancelled", current_fence=fence_issued(5, after=c.fence)
    )


def test_complete_of_dead_run_is_refused_as_finished(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    fail(runner, pk, "a", c.fence, now=5, delay=None)
    assert complete(runner, pk, "a", c.fence, now=10).status == "finished"


def test_finished_record_expires_after_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert redis_client.pttl(pk.run("a")) == -1
    fail(runner, pk, "a", c.fence, now=5, delay=0)  # a history entry: a history key exists
    c = claim_one(runner, pk, now=6)
    complete(runner, pk, "a", c.fence, now=10, retention=50_000)
    for key in (pk.run("a"), pk.history("a")):
        assert 40_000 < redis_client.pttl(key) <= 50_000


def test_complete_trims_done_index_entries_older_than_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "old", "new")
    fences = {r.run_id: r.fence for r in CLAIM.parse(
        runner.run(CLAIM.call(pk, 2, "w", 10**9, 1, now=0))).runs}
    complete(runner, pk, "old", fences["old"], now=1_000, retention=10_000)
    complete(runner, pk, "new", fences["new"], now=20_000, retention=10_000)
    assert redis_client.zrange(pk.done, 0, -1) == ["new"]


def test_complete_keeps_done_index_entries_within_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "old", "new")
    fences = {r.run_id: r.fence for r in CLAIM.parse(
        runner.run(CLAIM.call(pk, 2, "w", 10**9, 1, now=0))).runs}
    complete(runner, pk, "old", fences["old"], now=1_000, retention=10_000)
    complete(runner, pk, "new", fences["new"], now=10_999, retention=10_000)
    assert redis_client.zrange(pk.done, 0, -1) == ["old", "new"]


def test_complete_counts_completed_and_rejected_in_stats(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    complete(runner, pk, "a", c.fence, now=10)
    complete(runner, pk, "a", c.fence, now=11)
    complete(runner, pk, "ghost", 1, now=12)
    assert redis_client.hget(pk.stats, "completed") == "1"
    assert redis_client.hget(pk.stats, "rejected") == "2"


def test_a_first_attempt_that_completes_writes_no_history(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """The record tells it all (owner, fence, attempt, started, finished): no list key."""
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    complete(runner, pk, "a", c.fence, now=77)
    assert not redis_client.exists(pk.history("a"))
    assert redis_client.hmget(pk.run("a"), "state", "owner", "fence", "started", "finished") == [
        "done", "w1", "1", "0", "77"
    ]


def test_complete_many_accepts_each_current_fence_and_refuses_each_stale_one(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", "b", "c")
    claimed = {r.run_id: r for r in CLAIM.parse(runner.run(
        CLAIM.call(pk, 3, "w1", 30_000, DEAD_RETENTION_MS, now=0))).runs}
    call = COMPLETE.call(
        pk,
        [("a", claimed["a"].fence, '"A"'), ("b", claimed["b"].fence + 7, '"B"'),
         ("c", claimed["c"].fence, '"C"'), ("ghost", 1, "null")],
        RETENTION,
        now=50,
    )
    outcomes = COMPLETE.parse(runner.run(call))
    assert [(o.accepted, o.status) for o in outcomes] == [
        (True, "done"), (False, "fenced"), (True, "done"), (False, "unknown")
    ]
    assert outcomes[1].current_fence == claimed["b"].fence
    assert redis_client.hmget(pk.run("a"), "state", "result") == ["done", '"A"']
    assert redis_client.hget(pk.run("b"), "state") == "running"
    assert redis_client.zrange(pk.leases, 0, -1) == ["b"]
    assert sorted(redis_client.zrange(pk.done, 0, -1)) == ["a", "c"]
    stats = redis_client.hgetall(pk.stats)
    assert (stats["completed"], stats["rejected"]) == ("2", "2")


# -- fail ------------------------------------------------------------------------------------


def test_fail_retries_at_now_plus_delay_until_max_attempts(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=3)
    now = 0
    outcomes = []
    for _ in range(3):
        c = claim_one(runner, pk, now=now)
        outcome = fail(runner, pk, "a", c.fence, now=now + 100, delay=2_000)
        outcomes.append(outcome)
        if outcome.retry_at_ms is not None:
            now = outcome.retry_at_ms
    assert outcomes == [
        Outcome(True, "retry", retry_at_ms=2_100),
        Outcome(True, "retry", retry_at_ms=4_200),
        Outcome(True, "dead"),
    ]
    assert redis_client.hget(pk.run("a"), "attempt") == "3"


def test_fail_retry_puts_the_run_back_to_pending_with_the_error(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    fail(runner, pk, "a", c.fence, now=100, delay=5_000, error="ValueError: nope")
    run = redis_client.hgetall(pk.run("a"))
    assert run["state"] == "pending"
    assert run["error"] == "ValueError: nope"
    assert run["due"] == "5100"
    assert run["attempt"] == "1"
    assert "lease_until" not in run
    assert redis_client.zscore(pk.due, "a") == 5_100
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.pttl(pk.run("a")) == -1


def test_fail_retry_is_claimable_at_its_due_time_not_before(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    fail(runner, pk, "a", c.fence, now=100, delay=5_000)
    early = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w", LEASE_MS, 1, now=5_099)))
    assert early.runs == []
    assert early.next_wake_ms == 5_100
    again = claim_one(runner, pk, now=5_100)
    assert (again.fence, again.attempt) == (fence_issued(5_100, after=c.fence), 2)


def test_fail_without_retry_delay_buries_at_once(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=10)
    c = claim_one(runner, pk, now=0)
    assert fail(runner, pk, "a", c.fence, now=100, delay=None) == Outcome(True, "dead")
    assert redis_client.hget(pk.run("a"), "state") == "dead"
    assert redis_client.zscore(pk.due, "a") is None


def test_fail_on_last_attempt_buries_in_dead_set_with_dead_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=1)
    c = claim_one(runner, pk, now=0)
    assert fail(runner, pk, "a", c.fence, now=300, delay=1_000, error="final") == Outcome(
        True, "dead"
    )
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["error"], run["finished"]) == ("dead", "final", "300")
    assert "lease_until" not in run
    assert redis_client.zscore(pk.dead, "a") == 300
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.zscore(pk.due, "a") is None
    for key in (pk.run("a"), pk.history("a")):
        assert DEAD_RETENTION_MS - 60_000 < redis_client.pttl(key) <= DEAD_RETENTION_MS


def test_fail_with_stale_fence_is_refused_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    new = claim_one(runner, pk, now=LEASE_MS, owner="w2")
    record = redis_client.hgetall(pk.run("a"))
    outcome = fail(runner, pk, "a", old.fence, now=LEASE_MS + 1, delay=None)
    assert outcome == Outcome(False, "fenced", current_fence=new.fence)
    assert redis_client.hgetall(pk.run("a")) == record
    assert redis_client.zscore(pk.leases, "a") == 2 * LEASE_MS
    assert redis_client.zcard(pk.dead) == 0


@pytest.mark.parametrize(
    ("setup", "reason"),
    [("none", "unknown"), ("pending", "not-running"), ("cancelled", "cancelled"),
     ("done", "finished")],
)
def test_fail_is_refused_unless_the_run_is_running(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, setup: str, reason: str
) -> None:
    fence = 0
    if setup != "none":
        create_new(runner, pk, "a")
    if setup in ("cancelled", "done"):
        fence = claim_one(runner, pk, now=0).fence
    if setup == "cancelled":
        runner.run(CANCEL.call(pk, "a", RETENTION, "stop", now=1))
        fence += 1  # even the new fence is refused: the run is cancelled
    if setup == "done":
        complete(runner, pk, "a", fence, now=1)
    before = redis_client.hgetall(pk.run("a"))
    outcome = fail(runner, pk, "a", fence, now=10)
    assert (outcome.accepted, outcome.status) == (False, reason)
    assert redis_client.hgetall(pk.run("a")) == before
    assert redis_client.hget(pk.stats, "failed") is None


def test_fail_counts_failed_retried_dead_and_rejected(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=2)
    c = claim_one(runner, pk, now=0)
    fail(runner, pk, "a", c.fence, now=1, delay=0)
    c = claim_one(runner, pk, now=2)
    fail(runner, pk, "a", c.fence, now=3, delay=0)
    fail(runner, pk, "a", c.fence, now=4, delay=0)  # refused: already dead
    stats = redis_client.hgetall(pk.stats)
    assert (stats["failed"], stats["retried"], stats["dead"], stats["rejected"]) == (
        "2", "1", "1", "1"
    )


def test_fail_writes_retry_and_dead_history_entries(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=2)
    first = claim_one(runner, pk, now=0)
    fail(runner, pk, "a", first.fence, now=10, delay=90, error="E1")
    second = claim_one(runner, pk, now=100)
    fail(runner, pk, "a", second.fence, now=110, delay=90, error="E2 " + "x" * 500)
    history = redis_client.lrange(pk.history("a"), 0, -1)
    assert history == [
        f"10 failed fence={first.fence} attempt=1 owner=w1 retry at 100: E1",
        f"110 dead fence={second.fence} attempt=2 owner=w1: E2 " + "x" * 197,
    ]
    # the record keeps the whole error, only history is abridged
    assert redis_client.hget(pk.run("a"), "error") == "E2 " + "x" * 500


def test_fail_with_zero_delay_is_due_at_once(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert fail(runner, pk, "a", c.fence, now=50, delay=0).retry_at_ms == 50
    assert claim_one(runner, pk, now=50).attempt == 2


def test_a_key_of_another_type_in_a_batched_complete_refuses_that_run_alone(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", "b", "c")
    got = CLAIM.parse(runner.run(CLAIM.call(pk, 3, "w", LEASE_MS, DEAD_RETENTION_MS, now=0)))
    fences = {r.run_id: r.fence for r in got.runs}
    redis_client.delete(pk.run("b"))
    redis_client.set(pk.run("b"), "not a hash")
    batch = [(r, fences[r], '"ok"') for r in "abc"]
    outcomes = COMPLETE.parse(runner.run(COMPLETE.call(pk, batch, RETENTION, now=1)))
    assert [(o.accepted, o.status) for o in outcomes] == [
        (True, "done"), (False, "unknown"), (True, "done")
    ]
    for run_id in "ac":  # fully committed: state, index, lease gone
        assert redis_client.hget(pk.run(run_id), "state") == "done"
        assert redis_client.zscore(pk.done, run_id) is not None
        assert redis_client.zscore(pk.leases, run_id) is None
    assert redis_client.hget(pk.stats, "completed") == "2"


def test_fail_to_dead_trims_dead_index_entries_older_than_the_dead_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    now = DEAD_RETENTION_MS + 10_000
    redis_client.zadd(pk.dead, {"expired-long-ago": 1_000})
    create_new(runner, pk, "a", max_attempts=1, now=now)
    c = claim_one(runner, pk, now=now)
    assert fail(runner, pk, "a", c.fence, now=now, delay=None).status == "dead"
    assert redis_client.zrange(pk.dead, 0, -1) == ["a"]


# -- numbers and text from a foreign caller -----------------------------------------------


@pytest.mark.parametrize(("index", "bad"), [(5, "nan"), (5, "inf"), (5, "1.5"), (6, "x")])
def test_fail_with_a_number_that_is_not_whole_is_refused_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, index: int, bad: str
) -> None:
    """ARGV[6] retry delay, ARGV[7] dead retention: a bad one failed ZADD or PEXPIRE after the
    record was written (pending, out of due, still leased)."""
    create_new(runner, pk, "r")
    run = claim_one(runner, pk, now=1_000)
    call = FAIL.call(pk, "r", run.fence, "boom", 1_000, DEAD_RETENTION_MS, now=2_000)
    args = list(call.args)
    args[index] = bad
    before = redis_client.hgetall(pk.run("r"))
    with pytest.raises(ScriptError, match="whole number"):
        runner.run(call._replace(args=tuple(args)))
    assert redis_client.hgetall(pk.run("r")) == before
    assert redis_client.zscore(pk.leases, "r") is not None


def test_complete_with_a_retention_that_is_not_whole_is_refused_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "r")
    run = claim_one(runner, pk, now=1_000)
    call = COMPLETE.call(pk, [("r", run.fence, '"ok"')], RETENTION, now=2_000)
    args = list(call.args)
    args[2] = "1.5"
    with pytest.raises(ScriptError, match="whole number"):
        runner.run(call._replace(args=tuple(args)))
    assert redis_client.hget(pk.run("r"), "state") == "running"


def test_a_failure_message_is_cut_at_a_character_boundary(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """The history keeps the first 200 bytes of the error: never half a character."""
    create_new(runner, pk, "r")
    run = claim_one(runner, pk, now=1_000)
    fail(runner, pk, "r", run.fence, now=2_000, error="a" * 199 + "é" * 5)
    (entry,) = [e for e in redis_client.lrange(pk.history("r"), 0, -1) if "failed" in e]
    assert "\ufffd" not in entry  # the client decodes with 'replace'
    assert entry.endswith(": " + "a" * 199)
