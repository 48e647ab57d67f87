"""Priorities in create_run.lua and claim.lua, through their contracts: among the runs due in a
partition the highest level is claimed first, FIFO by due time within a level; a delayed run
waits for its due time whatever its level; a retry, a release and a requeue keep the level;
the prio zset is a hint the due set overrules. Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import claim, create_new, ids, spec

from jobqueue.errors import ScriptError
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    CREATE_RUN,
    FAIL,
    RELEASE,
    REQUEUE,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def create_prioritized(
    runner: ScriptRunner, pk: PartitionKeys, *runs: tuple[str, int], now: int = 0, delay: int = 0
) -> None:
    """Runs given as (run id, priority), five attempts each."""
    specs = [spec(r, delay_ms=delay, max_attempts=5, priority=p) for r, p in runs]
    create_new(runner, pk, *specs, now=now)


def test_the_highest_priority_among_due_runs_is_claimed_first(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("low", 0), ("mid", 4), ("top", 9), ("mid2", 4), now=1_000)
    assert ids(claim(runner, pk, now=2_000)) == ["top", "mid", "mid2", "low"]


@pytest.mark.parametrize("level", [0, 5])
def test_runs_of_one_priority_created_in_one_millisecond_are_claimed_in_creation_order(
    runner: ScriptRunner, pk: PartitionKeys, level: int
) -> None:
    """Ids whose sort order is not their creation order, in one call and over several calls
    of the same millisecond: equal due times would sort by id."""
    names = [f"r{n:02d}-{'zyxwvutsrq'[n % 10]}" for n in range(30)]
    order = sorted(names, key=lambda n: n[::-1])  # neither by id nor reversed
    create_prioritized(runner, pk, *((n, level) for n in order[:20]), now=1_000)
    for n in order[20:]:
        create_prioritized(runner, pk, (n, level), now=1_000)
    assert ids(claim(runner, pk, now=1_000, limit=30)) == order


def test_a_run_created_later_in_a_millisecond_is_due_within_that_millisecond(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("a", 0), ("b", 0), now=1_000)
    assert ids(claim(runner, pk, now=1_000)) == ["a", "b"]


def test_runs_of_one_priority_are_claimed_in_due_order(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("second", 3), now=2_000)
    create_prioritized(runner, pk, ("first", 3), now=1_000)
    create_prioritized(runner, pk, ("third", 3), now=3_000)
    assert ids(claim(runner, pk, now=5_000)) == ["first", "second", "third"]


def test_a_claim_limit_takes_the_highest_priorities(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("a", 0), ("b", 0), ("c", 2), ("d", 7), now=1_000)
    assert ids(claim(runner, pk, now=2_000, limit=2)) == ["d", "c"]
    assert ids(claim(runner, pk, now=2_000, limit=2)) == ["a", "b"]


def test_a_delayed_high_priority_run_waits_for_its_due_time(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("later", 9), now=1_000, delay=10_000)
    create_prioritized(runner, pk, ("now", 0), now=1_000)
    first = claim(runner, pk, now=2_000)
    assert (ids(first), first.next_wake_ms) == (["now"], 11_000)
    assert ids(claim(runner, pk, now=11_000)) == ["later"]


def test_a_retried_run_keeps_its_priority(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_prioritized(runner, pk, ("vip", 5), now=1_000)
    (vip,) = claim(runner, pk, now=1_000).runs
    runner.run(FAIL.call(pk, "vip", vip.fence, "boom", 1_000, RETENTION, now=2_000))
    create_prioritized(runner, pk, ("plain", 0), now=2_000)
    assert ids(claim(runner, pk, now=2_500)) == ["plain"]  # the retry waits for its backoff
    create_prioritized(runner, pk, ("plain2", 0), now=2_600)
    assert ids(claim(runner, pk, now=3_000)) == ["vip", "plain2"]


def test_a_released_run_keeps_its_priority(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_prioritized(runner, pk, ("vip", 5), now=1_000)
    (vip,) = claim(runner, pk, now=1_000).runs
    create_prioritized(runner, pk, ("plain", 0), now=1_500)
    runner.run(RELEASE.call(pk, "vip", vip.fence, now=2_000))
    assert ids(claim(runner, pk, now=3_000)) == ["vip", "plain"]


def test_a_requeued_run_keeps_its_priority(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_prioritized(runner, pk, ("vip", 5), now=1_000, delay=60_000)
    runner.run(CANCEL.call(pk, "vip", RETENTION, "no", now=1_000))
    create_prioritized(runner, pk, ("plain", 0), now=1_500)
    runner.run(REQUEUE.call(pk, "vip", now=2_000))  # due at its own time again: 61_000
    assert ids(claim(runner, pk, now=61_000)) == ["vip", "plain"]


def test_a_cancelled_runs_hint_is_dropped_and_lower_runs_are_claimed(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("gone", 9), ("plain", 0), now=1_000)
    runner.run(CANCEL.call(pk, "gone", RETENTION, "no", now=1_500))
    assert ids(claim(runner, pk, now=2_000)) == ["plain"]
    assert redis_client.zcard(pk.prio) == 0


def test_a_run_claimed_in_due_order_leaves_the_prio_zset(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("vip", 3), now=1_000)
    redis_client.zrem(pk.prio, "vip")  # a hint lost: the due set still has the run
    assert ids(claim(runner, pk, now=2_000)) == ["vip"]
    assert redis_client.zcard(pk.prio) == 0


def test_a_hint_ahead_of_its_runs_due_time_moves_with_it(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("vip", 3), now=1_000)
    redis_client.zadd(pk.due, {"vip": 50_000})  # the due set says later: it wins
    result = claim(runner, pk, now=2_000)
    assert (ids(result), result.next_wake_ms) == ([], 50_000)
    assert ids(claim(runner, pk, now=50_000)) == ["vip"]


def test_create_stores_a_priority_above_the_default_only(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("plain", 0), ("vip", 7), now=1_000)
    assert redis_client.hget(pk.run("plain"), "priority") is None
    assert redis_client.hget(pk.run("vip"), "priority") == "7"
    assert redis_client.zrange(pk.prio, 0, -1) == ["vip"]


@pytest.mark.parametrize("garbage", ["12", "-1", "x", "2.5"])
def test_a_priority_argument_out_of_range_counts_as_the_default(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys, garbage: str
) -> None:
    call = CREATE_RUN.call(pk, [spec("r", priority=1)], now=1_000)
    args = list(call.args)
    args[2 + 5] = garbage  # the group header's priority
    runner.run(call._replace(args=tuple(args)))
    assert redis_client.hget(pk.run("r"), "priority") is None
    assert redis_client.zcard(pk.prio) == 0


def test_a_hint_left_by_an_older_record_of_the_id_does_not_raise_a_new_one(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("first", 0), now=1_000)
    create_prioritized(runner, pk, ("renewed", 0), now=1_500)
    redis_client.zadd(pk.prio, {"renewed": 1_500})  # a level-9 entry of an expired record
    assert ids(claim(runner, pk, now=2_000)) == ["first", "renewed"]
    assert redis_client.zcard(pk.prio) == 0


def test_a_prio_key_of_another_type_refuses_the_claim_whole(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    create_prioritized(runner, pk, ("plain", 0), now=1_000)
    redis_client.set(pk.prio, "garbage")
    with pytest.raises(ScriptError):
        claim(runner, pk, now=2_000)
    assert redis_client.zcard(pk.due) == 1
