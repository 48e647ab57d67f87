"""heartbeat.lua through its contract: extend a lease only with the current fence of a running run,
else say why, so the worker stops."""

from __future__ import annotations

from typing import Any

from fence_rule import fence_issued
from helpers import LEASE_MS, claim_one, create_new

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    CLAIM,
    COMPLETE,
    FAIL,
    HEARTBEAT,
    RELEASE,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def beat(runner: ScriptRunner, pk: PartitionKeys, leases: list[tuple[str, int]], now: int,
         lease_ms: int = LEASE_MS) -> list[int | str]:
    return HEARTBEAT.parse(runner.run(HEARTBEAT.call(pk, leases, lease_ms, now=now))).answers


def test_heartbeat_extends_the_lease_from_now(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert beat(runner, pk, [("a", c.fence)], now=10_000) == [10_000 + LEASE_MS]
    assert redis_client.hget(pk.run("a"), "lease_until") == str(10_000 + LEASE_MS)
    assert redis_client.zscore(pk.leases, "a") == 10_000 + LEASE_MS


def test_heartbeat_returns_the_now_it_used(runner: ScriptRunner, pk: PartitionKeys) -> None:
    reply = runner.run(HEARTBEAT.call(pk, [], LEASE_MS, now=4_321))
    assert [int(x) for x in reply] == [4_321]


def test_heartbeat_uses_the_callers_lease_length_when_the_run_has_none(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert beat(runner, pk, [("a", c.fence)], now=1_000, lease_ms=5_000) == [6_000]


def test_heartbeat_uses_the_runs_own_lease_over_the_default(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a", lease_ms=90_000)
    c = claim_one(runner, pk, now=0)
    assert c.lease_until_ms == 90_000
    assert beat(runner, pk, [("a", c.fence)], now=1_000, lease_ms=5_000) == [91_000]


def test_heartbeat_keeps_an_extended_lease_from_being_reclaimed(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    beat(runner, pk, [("a", c.fence)], now=20_000)
    result = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w2", LEASE_MS, RETENTION, now=LEASE_MS)))
    assert result.runs == []
    assert result.next_wake_ms == 20_000 + LEASE_MS


def test_heartbeat_refuses_a_stale_fence_as_fenced(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    new = claim_one(runner, pk, now=LEASE_MS, owner="w2")
    assert new.fence == fence_issued(LEASE_MS, after=old.fence)
    assert beat(runner, pk, [("a", old.fence)], now=LEASE_MS + 1) == ["fenced"]
    # the refusal changed nothing: w2's lease stands
    assert redis_client.zscore(pk.leases, "a") == 2 * LEASE_MS
    assert redis_client.hget(pk.run("a"), "lease_until") == str(2 * LEASE_MS)


def test_heartbeat_refuses_a_fence_from_the_future_as_fenced(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert beat(runner, pk, [("a", c.fence + 1)], now=1) == ["fenced"]


def test_heartbeat_refuses_a_cancelled_run(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(CANCEL.call(pk, "a", RETENTION, "stop", now=5))
    assert beat(runner, pk, [("a", c.fence)], now=10) == ["cancelled"]


def test_heartbeat_refuses_a_completed_run_as_finished(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(COMPLETE.call(pk, [("a", c.fence, "null")], RETENTION, now=5))
    assert beat(runner, pk, [("a", c.fence)], now=10) == ["finished"]
    assert redis_client.zscore(pk.leases, "a") is None
    assert not redis_client.hexists(pk.run("a"), "lease_until")


def test_heartbeat_refuses_a_dead_run_as_finished(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(FAIL.call(pk, "a", c.fence, "boom", None, RETENTION, now=5))
    assert beat(runner, pk, [("a", c.fence)], now=10) == ["finished"]


def test_heartbeat_refuses_a_released_run_as_not_running(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(RELEASE.call(pk, "a", c.fence, now=5))
    assert beat(runner, pk, [("a", c.fence)], now=10) == ["not-running"]
    assert redis_client.zscore(pk.leases, "a") is None


def test_heartbeat_refuses_a_run_failed_back_to_pending_as_not_running(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    runner.run(FAIL.call(pk, "a", c.fence, "boom", 1_000, RETENTION, now=5))
    assert beat(runner, pk, [("a", c.fence)], now=10) == ["not-running"]


def test_heartbeat_refuses_an_unknown_run(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    assert beat(runner, pk, [("nope", 1)], now=10) == ["unknown"]
    assert redis_client.zcard(pk.leases) == 0
    assert not redis_client.exists(pk.run("nope"))


def test_heartbeat_answers_each_lease_of_a_batch_in_order(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_new(runner, pk, "a", "b", "c")
    got = CLAIM.parse(runner.run(CLAIM.call(pk, 3, "w1", LEASE_MS, RETENTION, now=0)))
    fences = {r.run_id: r.fence for r in got.runs}
    runner.run(COMPLETE.call(pk, [("b", fences["b"], "null")], RETENTION, now=1))
    answer = beat(
        runner,
        pk,
        [("a", fences["a"]), ("b", fences["b"]), ("ghost", 1), ("c", fences["c"] - 1),
         ("c", fences["c"])],
        now=2_000,
    )
    assert answer == [2_000 + LEASE_MS, "finished", "unknown", "fenced", 2_000 + LEASE_MS]


def test_heartbeat_does_not_change_the_fence_attempt_or_owner(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    before = redis_client.hgetall(pk.run("a"))
    beat(runner, pk, [("a", c.fence)], now=10_000)
    after = redis_client.hgetall(pk.run("a"))
    before.pop("lease_until")
    after.pop("lease_until")
    assert after == before


def test_heartbeat_after_lease_expiry_but_before_reclaim_is_still_accepted(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    """Nobody took the run yet, so the fence is still current: the worker keeps it."""
    create_new(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert beat(runner, pk, [("a", c.fence)], now=LEASE_MS + 5) == [2 * LEASE_MS + 5]
    result = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w2", LEASE_MS, RETENTION,
                                                       now=LEASE_MS + 6)))
    assert result.runs == []


def test_a_key_of_another_type_in_a_batched_heartbeat_refuses_that_run_alone(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", "b", "c")
    got = CLAIM.parse(runner.run(CLAIM.call(pk, 3, "w", LEASE_MS, RETENTION, now=0)))
    fences = {r.run_id: r.fence for r in got.runs}
    redis_client.delete(pk.run("b"))
    redis_client.set(pk.run("b"), "not a hash")
    answers = beat(runner, pk, [(r, fences[r]) for r in "abc"], now=10_000)
    assert answers == [10_000 + LEASE_MS, "unknown", 10_000 + LEASE_MS]
    assert redis_client.zscore(pk.leases, "c") == 10_000 + LEASE_MS
