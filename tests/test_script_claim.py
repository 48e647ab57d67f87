"""claim.lua through its contract: due runs, expired leases first, dead-lettering, corrupt records,
stray index entries, next_wake, stats and history. Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from fence_rule import fence_issued
from helpers import DEAD_RETENTION_MS, LEASE_MS, PAYLOAD, claim, create_new, ids, spec

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import COMPLETE, FAIL, ClaimedRun
from jobqueue.store.scripts import ScriptRunner


def test_claim_takes_a_due_run_and_returns_its_fields(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(
        runner,
        pk,
        spec("job@60", task="report", payload='{"args":[1],"kwargs":{}}', due_at_ms=60_000,
             max_attempts=4, timeout_ms=9_000, job_id="job", scheduled_for_ms=59_000),
    )
    result = claim(runner, pk, now=61_000)
    assert result.now_ms == 61_000
    assert result.runs == [
        ClaimedRun(
            run_id="job@60",
            fence=fence_issued(61_000),
            attempt=1,
            max_attempts=4,
            task="report",
            payload='{"args":[1],"kwargs":{}}',
            lease_until_ms=61_000 + LEASE_MS,
            timeout_ms=9_000,
            job_id="job",
            scheduled_for_ms=59_000,
            due_ms=60_000,
        )
    ]


def test_claim_reports_no_job_and_no_scheduled_for_for_a_plain_run(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("a"))
    (r,) = claim(runner, pk, now=0).runs
    assert r.job_id == ""
    assert r.scheduled_for_ms is None


def test_claim_marks_the_record_running_with_owner_and_lease(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a"), now=1_000)
    claim(runner, pk, now=2_000, owner="worker-7")
    run = redis_client.hgetall(pk.run("a"))
    assert run["state"] == "running"
    assert run["owner"] == "worker-7"
    assert run["fence"] == str(fence_issued(2_000))
    assert run["attempt"] == "1"
    assert run["lease_until"] == str(2_000 + LEASE_MS)
    assert run["started"] == "2000"
    assert redis_client.zscore(pk.due, "a") is None
    assert redis_client.zscore(pk.leases, "a") == 2_000 + LEASE_MS


def test_claim_skips_runs_not_yet_due(runner: ScriptRunner, pk: PartitionKeys,
                                      redis_client: Any) -> None:
    create_new(runner, pk, spec("later", due_at_ms=5_000), spec("now", due_at_ms=1_000))
    assert ids(claim(runner, pk, now=4_999)) == ["now"]
    assert redis_client.hget(pk.run("later"), "state") == "pending"
    assert redis_client.zscore(pk.due, "later") == 5_000


def test_claim_takes_a_run_due_exactly_now(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, spec("a", due_at_ms=5_000))
    assert ids(claim(runner, pk, now=4_999)) == []
    assert ids(claim(runner, pk, now=5_000)) == ["a"]


def test_claim_takes_due_runs_in_due_order(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(
        runner, pk, spec("c", due_at_ms=300), spec("a", due_at_ms=100), spec("b", due_at_ms=200)
    )
    assert ids(claim(runner, pk, now=1_000, limit=2)) == ["a", "b"]
    assert ids(claim(runner, pk, now=1_000, limit=2)) == ["c"]


def test_claim_takes_at_most_limit_runs(runner: ScriptRunner, pk: PartitionKeys,
                                        redis_client: Any) -> None:
    create_new(runner, pk, *(spec(f"r{i}", due_at_ms=i) for i in range(5)))
    assert len(claim(runner, pk, now=100, limit=3).runs) == 3
    assert redis_client.zcard(pk.due) == 2
    assert redis_client.zcard(pk.leases) == 3


def test_claim_never_hands_one_run_to_two_claims(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, spec("a"))
    assert ids(claim(runner, pk, now=0, owner="w1")) == ["a"]
    assert ids(claim(runner, pk, now=1, owner="w2")) == []


def test_claim_uses_the_runs_own_lease_over_the_default(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("own", lease_ms=5_000), spec("default"))
    runs = {r.run_id: r for r in claim(runner, pk, now=1_000).runs}
    assert runs["own"].lease_until_ms == 6_000
    assert runs["default"].lease_until_ms == 1_000 + LEASE_MS


def test_claim_returns_nothing_and_no_next_wake_on_an_empty_partition(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    result = claim(runner, pk, now=1_000)
    assert result.runs == []
    assert result.next_wake_ms is None


def test_claim_returns_next_wake_as_earliest_due_or_lease(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("now"), spec("later", due_at_ms=50_000))
    # "now" leased until 30_000, "later" due at 50_000: the lease comes first
    assert claim(runner, pk, now=0, limit=1).next_wake_ms == LEASE_MS
    create_new(runner, pk, spec("soon", due_at_ms=10_000), now=1)
    # now the due run at 10_000 is the earliest
    assert claim(runner, pk, now=2, limit=1).next_wake_ms == 10_000


def test_claim_next_wake_is_the_lease_when_nothing_is_due(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("a"))
    assert claim(runner, pk, now=100).next_wake_ms == 100 + LEASE_MS


def test_claim_next_wake_ignores_claimed_runs(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, spec("a", due_at_ms=10), spec("b", due_at_ms=70_000))
    result = claim(runner, pk, now=20, lease_ms=100_000)
    assert ids(result) == ["a"]
    assert result.next_wake_ms == 70_000


def test_claim_takes_expired_leases_before_due_runs(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("stalled"), now=0)
    claim(runner, pk, now=0, owner="w1")
    create_new(runner, pk, spec("fresh", due_at_ms=1_000), now=1)
    result = claim(runner, pk, now=LEASE_MS + 1, limit=1, owner="w2")
    assert ids(result) == ["stalled"]
    assert redis_client.zscore(pk.due, "fresh") == 1_000


def test_claim_fills_the_remaining_limit_with_due_runs_after_expired_leases(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("stalled"), now=0)
    claim(runner, pk, now=0)
    create_new(runner, pk, spec("d1", due_at_ms=1), spec("d2", due_at_ms=2), now=1)
    assert ids(claim(runner, pk, now=LEASE_MS, limit=2, owner="w2")) == ["stalled", "d1"]


def test_claim_does_not_take_a_lease_that_has_not_expired(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("a"))
    claim(runner, pk, now=0)
    assert ids(claim(runner, pk, now=LEASE_MS - 1, owner="w2")) == []
    assert ids(claim(runner, pk, now=LEASE_MS, owner="w2")) == ["a"]


def test_claim_of_an_expired_lease_counts_an_attempt_and_bumps_the_fence(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a", max_attempts=3))
    (first,) = claim(runner, pk, now=0, owner="w1").runs
    (r,) = claim(runner, pk, now=LEASE_MS + 5, owner="w2").runs
    fence = fence_issued(LEASE_MS + 5, after=first.fence)
    assert (r.fence, r.attempt, r.lease_until_ms) == (fence, 2, 2 * LEASE_MS + 5)
    run = redis_client.hgetall(pk.run("a"))
    assert (run["owner"], run["fence"], run["attempt"]) == ("w2", str(fence), "2")
    assert redis_client.zscore(pk.leases, "a") == 2 * LEASE_MS + 5


def test_expired_lease_past_max_attempts_goes_dead_with_reason(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a", max_attempts=2))
    claim(runner, pk, now=0)
    claim(runner, pk, now=LEASE_MS)  # attempt 2 of 2
    result = claim(runner, pk, now=2 * LEASE_MS + 1)
    assert result.runs == []
    run = redis_client.hgetall(pk.run("a"))
    assert run["state"] == "dead"
    assert run["error"] == "lease expired on attempt 2 of 2 (worker died or stalled)"
    assert run["finished"] == str(2 * LEASE_MS + 1)
    assert "lease_until" not in run
    assert redis_client.zscore(pk.dead, "a") == 2 * LEASE_MS + 1
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.zscore(pk.due, "a") is None


def test_dead_lettering_expired_leases_does_not_count_against_the_limit(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a", max_attempts=1), spec("b", max_attempts=1))
    claim(runner, pk, now=0)
    result = claim(runner, pk, now=LEASE_MS + 1, limit=1)  # reads limit + 1 lease entries
    assert result.runs == []
    assert redis_client.zrange(pk.dead, 0, -1) == ["a", "b"]
    assert result.next_wake_ms == LEASE_MS + 1  # every entry read was handled: more may follow


def test_dead_lettered_record_expires_after_dead_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a", max_attempts=1))
    claim(runner, pk, now=0)
    claim(runner, pk, now=LEASE_MS)
    assert redis_client.hget(pk.run("a"), "state") == "dead"
    for key in (pk.run("a"), pk.history("a")):
        assert DEAD_RETENTION_MS - 60_000 < redis_client.pttl(key) <= DEAD_RETENTION_MS


def test_a_dead_run_is_never_claimed_again(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, spec("a", max_attempts=1))
    claim(runner, pk, now=0)
    claim(runner, pk, now=LEASE_MS)
    assert ids(claim(runner, pk, now=10 * LEASE_MS)) == []


def corrupt(redis_client: Any, pk: PartitionKeys, run_id: str, **fields: Any) -> None:
    record = {"state": "pending", "task": "t", "payload": PAYLOAD, "attempt": 0,
              "max_attempts": 3, "fence": 0, "due": 0}
    record.update(fields)
    redis_client.hset(pk.run(run_id), mapping={k: v for k, v in record.items() if v is not None})
    if record["state"] == "pending":
        redis_client.zadd(pk.due, {run_id: 0})


def test_claim_dead_letters_a_corrupt_record_with_a_reason(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    corrupt(redis_client, pk, "no-task", task=None)
    corrupt(redis_client, pk, "bad-max", max_attempts="lots")
    create_new(runner, pk, spec("good"))
    result = claim(runner, pk, now=5_000)
    assert ids(result) == ["good"]
    assert redis_client.hget(pk.run("no-task"), "state") == "dead"
    assert redis_client.hget(pk.run("no-task"), "error") == "corrupt record: no task"
    assert redis_client.hget(pk.run("bad-max"), "state") == "dead"
    assert redis_client.hget(pk.run("bad-max"), "error") == "corrupt record: bad max_attempts"
    assert redis_client.zscore(pk.dead, "no-task") == 5_000
    assert redis_client.zscore(pk.dead, "bad-max") == 5_000
    assert redis_client.zcard(pk.leases) == 1
    assert redis_client.hget(pk.stats, "dead") == "2"


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"task": ""}, "corrupt record: no task"),
        ({"task": None}, "corrupt record: no task"),
        ({"payload": None}, "corrupt record: no payload"),
        ({"max_attempts": None}, "corrupt record: bad max_attempts"),
        ({"max_attempts": "3x"}, "corrupt record: bad max_attempts"),
    ],
)
def test_claim_dead_letters_each_kind_of_corrupt_pending_record(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, fields: dict[str, Any],
    reason: str
) -> None:
    corrupt(redis_client, pk, "x", **fields)
    assert claim(runner, pk, now=1_000).runs == []
    run = redis_client.hgetall(pk.run("x"))
    assert (run["state"], run["error"]) == ("dead", reason)
    assert redis_client.zscore(pk.due, "x") is None
    assert redis_client.zscore(pk.dead, "x") == 1_000
    assert redis_client.lrange(pk.history("x"), -1, -1) == [f"1000 dead {reason}"]
    assert 0 < redis_client.pttl(pk.run("x")) <= DEAD_RETENTION_MS


def test_claim_dead_letters_a_corrupt_running_record_whose_lease_expired(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a", max_attempts=5))
    claim(runner, pk, now=0)
    redis_client.hdel(pk.run("a"), "task")
    assert claim(runner, pk, now=LEASE_MS, owner="w2").runs == []
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["error"]) == ("dead", "corrupt record: no task")
    assert redis_client.zscore(pk.leases, "a") is None
    assert redis_client.zscore(pk.dead, "a") == LEASE_MS


def test_claim_drops_a_stray_due_entry_of_a_run_in_another_state(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a"))
    (r,) = claim(runner, pk, now=0).runs
    runner.run(COMPLETE.call(pk, [("a", r.fence, '"ok"')], 60_000, now=10))
    redis_client.zadd(pk.due, {"a": 5})
    before = redis_client.hgetall(pk.run("a"))
    assert claim(runner, pk, now=20).runs == []
    assert redis_client.zscore(pk.due, "a") is None
    assert redis_client.hgetall(pk.run("a")) == {**before, "hist": "1"}  # now has a history
    assert redis_client.lrange(pk.history("a"), -1, -1) == [
        "20 stray due entry dropped (state done)"
    ]
    # The new history expires with the finished record instead of outliving it. The record
    # is read first: a later read of the history can only find less time left.
    record_ttl = redis_client.pttl(pk.run("a"))
    assert 0 < redis_client.pttl(pk.history("a")) <= record_ttl + 5


def test_claim_drops_a_due_entry_whose_record_is_gone(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    redis_client.zadd(pk.due, {"ghost": 1})
    assert claim(runner, pk, now=20).runs == []
    assert redis_client.zcard(pk.due) == 0
    assert not redis_client.exists(pk.run("ghost"))
    assert not redis_client.exists(pk.history("ghost"))


def test_claim_drops_a_lease_entry_whose_record_is_not_running(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("pending-one", due_at_ms=10**9))
    redis_client.zadd(pk.leases, {"pending-one": 1, "ghost": 2})
    result = claim(runner, pk, now=100)
    assert result.runs == []
    assert redis_client.zcard(pk.leases) == 0
    assert redis_client.hget(pk.run("pending-one"), "state") == "pending"
    assert redis_client.hget(pk.run("pending-one"), "attempt") is None  # never claimed: 0
    assert redis_client.hget(pk.stats, "lease_expired") is None


def test_claim_counts_claimed_expired_and_dead_in_stats(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("retry", max_attempts=2), spec("die", max_attempts=1))
    claim(runner, pk, now=0)
    create_new(runner, pk, spec("fresh"), now=1)
    claim(runner, pk, now=LEASE_MS + 1)  # retry reclaimed, die buried, fresh claimed
    stats = redis_client.hgetall(pk.stats)
    assert stats["claimed"] == "4"
    assert stats["lease_expired"] == "2"
    assert stats["dead"] == "1"


def test_claim_writes_a_lease_expired_history_entry_with_the_owner_that_lost_it(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a"), now=0)
    (first,) = claim(runner, pk, now=10, owner="w1").runs
    (second,) = claim(runner, pk, now=10 + LEASE_MS, owner="w2").runs
    # The claims themselves are in the record (owner w2, its fence now); the history keeps
    # how the first attempt ended and whose it was.
    assert redis_client.lrange(pk.history("a"), 0, -1) == [
        f"{10 + LEASE_MS} lease expired fence={first.fence} attempt=1 owner=w1",
    ]
    assert redis_client.hmget(pk.run("a"), "owner", "fence", "attempt") == [
        "w2", str(second.fence), "2"
    ]


def test_claim_of_a_retried_run_continues_the_attempt_count(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, spec("a", max_attempts=3))
    (r,) = claim(runner, pk, now=0).runs
    runner.run(FAIL.call(pk, "a", r.fence, "boom", 100, DEAD_RETENTION_MS, now=10))
    (r2,) = claim(runner, pk, now=110).runs
    assert (r2.fence, r2.attempt) == (fence_issued(110, after=r.fence), 2)


# -- fences: one counter per partition ---------------------------------------------------------


def test_each_claim_in_a_partition_issues_a_greater_fence_than_any_before(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a"), spec("b"), spec("c"))
    fences = [r.fence for r in claim(runner, pk, now=0, limit=2).runs]
    fences += [r.fence for r in claim(runner, pk, now=0).runs]
    assert fences == [1, 2, 3]  # at the clock's origin, the counter alone decides
    assert redis_client.get(pk.fences) == "3"


def test_a_fence_is_at_least_the_clock_in_microseconds(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("a"), spec("b"))
    (a,) = claim(runner, pk, now=5_000, limit=1).runs
    (b,) = claim(runner, pk, now=5_000, limit=1).runs
    assert (a.fence, b.fence) == (5_000_000, 5_000_001)  # same instant: the counter goes on
    assert redis_client.get(pk.fences) == "5000001"


def test_a_node_that_lost_its_fence_history_still_issues_greater_fences(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """A replica promoted while it lagged, or a restart from an older snapshot: the counter
    and the record are back where they were before fences were issued. The clock has moved on
    since, and the next fence is above every one lost."""
    create_new(runner, pk, spec("a"))
    snapshot = {k: redis_client.dump(k) for k in redis_client.keys("*")}
    (lost,) = claim(runner, pk, now=1_000, owner="w1").runs  # then the node loses it
    for key in redis_client.keys("*"):
        redis_client.delete(key)
    for key, value in snapshot.items():
        redis_client.restore(key, 0, value)
    (new,) = claim(runner, pk, now=1_001, owner="w2").runs
    assert new.fence > lost.fence
    stale = COMPLETE.call(pk, [("a", lost.fence, '"w1"')], 60_000, now=1_002)
    assert COMPLETE.parse(runner.run(stale))[0].status == "fenced"


def test_a_run_id_created_again_after_its_record_expired_never_reuses_a_fence(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, spec("order-42"))
    (old,) = claim(runner, pk, now=0, owner="w1").runs  # w1 then stalls past everything below
    (taken,) = claim(runner, pk, now=LEASE_MS, owner="w2").runs
    runner.run(COMPLETE.call(pk, [("order-42", taken.fence, '"w2"')], 60_000, now=LEASE_MS))
    redis_client.delete(pk.run("order-42"))  # its retention ran out
    create_new(runner, pk, spec("order-42"), now=LEASE_MS + 1)
    (new,) = claim(runner, pk, now=LEASE_MS + 1, owner="w3").runs
    assert new.fence > taken.fence > old.fence
    stale = COMPLETE.call(pk, [("order-42", old.fence, '"w1"')], 60_000, now=LEASE_MS + 2)
    assert COMPLETE.parse(runner.run(stale))[0].status == "fenced"
    fresh = COMPLETE.call(pk, [("order-42", new.fence, '"w3"')], 60_000, now=LEASE_MS + 3)
    assert COMPLETE.parse(runner.run(fresh))[0].accepted
    assert redis_client.hget(pk.run("order-42"), "result") == '"w3"'


def test_a_fence_counter_behind_a_records_fence_is_overtaken(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """Records written before the counter existed (or moved in by repartition) keep growing."""
    create_new(runner, pk, spec("a"))
    redis_client.hset(pk.run("a"), "fence", 41)
    (run,) = claim(runner, pk, now=0).runs
    assert run.fence == 42 and redis_client.get(pk.fences) == "42"


def test_claim_trims_dead_index_entries_older_than_the_dead_retention(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    redis_client.zadd(pk.dead, {"expired-long-ago": 1_000, "recent": 5_000_000})
    claim(runner, pk, now=DEAD_RETENTION_MS + 2_000)
    assert redis_client.zrange(pk.dead, 0, -1) == ["recent"]
