"""Per-key and per-task concurrency caps and per-key rates in claim.lua (and the scripts that
free a slot), through their contracts: a slot is held by a claim and freed by the commit, the
fail, the cancel, the release or the burial of an expired lease; a run of a full group is
parked and unparked in FIFO order by a freed slot, without stalling the rest of the queue.
Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import claim, create_new, ids

from jobqueue.errors import ScriptError
from jobqueue.store.admin import SET_LIMIT
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    BOUNCE,
    CANCEL,
    COMPLETE,
    FAIL,
    RELEASE,
    ClaimResult,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def create_keyed(
    runner: ScriptRunner,
    pk: PartitionKeys,
    *run_ids: str,
    key: str = "",
    attempts: int = 5,
    **fields: Any,
) -> None:
    """Runs under the limit key ``key`` ('': none), five attempts each unless told."""
    create_new(runner, pk, *run_ids, limit_key=key, max_attempts=attempts, **fields)


def limit(runner: ScriptRunner, pk: PartitionKeys, name: str, value: int | str | None) -> bool:
    return SET_LIMIT.parse(runner.run(SET_LIMIT.call(pk, name, value, now=0)))


def fences(result: ClaimResult) -> dict[str, int]:
    return {r.run_id: r.fence for r in result.runs}


def complete(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int) -> None:
    runner.run(COMPLETE.call(pk, [(run_id, fence, "1")], RETENTION, now=now))


# -- per-key caps ------------------------------------------------------------------------------


def test_a_key_cap_holds_the_runs_of_one_key(runner: ScriptRunner, pk: PartitionKeys) -> None:
    limit(runner, pk, "key_concurrency", 2)
    create_keyed(runner, pk, "a1", "a2", "a3", key="a")
    assert ids(claim(runner, pk, now=1_000)) == ["a1", "a2"]
    assert ids(claim(runner, pk, now=2_000)) == []


def test_runs_of_a_full_key_do_not_stall_the_other_keys(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", "a3", "a4", key="a", now=0)
    create_keyed(runner, pk, "b1", key="b", now=1)
    create_keyed(runner, pk, "n1", now=2)  # no key: no per-key cap
    assert ids(claim(runner, pk, now=1_000, limit=3)) == ["a1", "b1", "n1"]


def test_a_parked_run_does_not_use_up_the_limit(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", "a3", key="a", now=0)
    create_keyed(runner, pk, "b1", key="b", now=1)
    assert ids(claim(runner, pk, now=1_000, limit=2)) == ["a1", "b1"]


def test_a_parked_run_is_shown_in_its_record_and_the_parked_index(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000)
    assert redis_client.hget(pk.run("a2"), "parked") == "key:a"
    assert redis_client.zrange(pk.parked, 0, -1, withscores=True) == [("a2", 0.0)]


def test_a_parked_run_waits_for_its_fallback_recheck(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    result = claim(runner, pk, now=1_000, lease_ms=5_000)
    assert redis_client.zscore(pk.due, "a2") == 6_000
    assert result.next_wake_ms == 6_000


@pytest.mark.parametrize(
    "how", ["complete", "fail-retry", "fail-dead", "cancel", "release", "bounce", "bounce-dead"]
)
def test_a_slot_is_freed_when_its_holder_leaves(
    runner: ScriptRunner, pk: PartitionKeys, how: str
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a", attempts=1 if how == "fail-dead" else 5)
    (a1,) = claim(runner, pk, now=1_000).runs
    assert ids(claim(runner, pk, now=1_500)) == []
    if how == "complete":
        complete(runner, pk, "a1", a1.fence, now=2_000)
    elif how in ("fail-retry", "fail-dead"):
        runner.run(FAIL.call(pk, "a1", a1.fence, "boom", 60_000, RETENTION, now=2_000))
    elif how == "cancel":
        runner.run(CANCEL.call(pk, "a1", RETENTION, "stop", now=2_000))
    elif how in ("bounce", "bounce-dead"):
        window = 0 if how == "bounce-dead" else 3_600_000
        runner.run(BOUNCE.call(
            pk, "a1", a1.fence, "w1", "no task", delay_ms=60_000, delay_cap_ms=60_000,
            window_ms=window, dead_retention_ms=RETENTION, now=2_000,
        ))
    else:
        runner.run(RELEASE.call(pk, "a1", a1.fence, now=2_000))
    # The parked run is back at its own due time, long before its fallback recheck.
    assert ids(claim(runner, pk, now=2_001, limit=1)) == ["a2"]


def test_an_expired_lease_keeps_its_slot_when_taken_back(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000, lease_ms=1_000)
    assert ids(claim(runner, pk, now=3_000)) == ["a1"]  # taken back, a2 still waits


def test_an_expired_lease_buried_frees_its_slot(runner: ScriptRunner, pk: PartitionKeys) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", attempts=1, key="a", now=0)
    create_keyed(runner, pk, "a2", key="a", now=1)
    claim(runner, pk, now=1_000, lease_ms=1_000)
    assert ids(claim(runner, pk, now=1_500)) == []  # a2 parked
    buried = claim(runner, pk, now=3_000)
    assert (ids(buried), buried.next_wake_ms) == ([], 3_000)  # a2 unparked: claim again now
    assert ids(claim(runner, pk, now=3_000)) == ["a2"]


def test_parked_runs_are_unparked_in_fifo_order(runner: ScriptRunner, pk: PartitionKeys) -> None:
    limit(runner, pk, "key_concurrency", 1)
    for i, run_id in enumerate(["a1", "a2", "a3", "a4"]):
        create_keyed(runner, pk, run_id, key="a", now=i)
    order = []
    now = 1_000
    running = fences(claim(runner, pk, now=now))
    for _ in range(4):
        (run_id, fence), = running.items()
        order.append(run_id)
        now += 10
        complete(runner, pk, run_id, fence, now=now)
        running = fences(claim(runner, pk, now=now))
    assert order == ["a1", "a2", "a3", "a4"]


def test_a_cancelled_parked_run_leaves_the_parked_index(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000)
    runner.run(CANCEL.call(pk, "a2", RETENTION, "stop", now=2_000))
    assert redis_client.zcard(pk.parked) == 0
    assert redis_client.exists(pk.prefix + "parked:key:a") == 0


def test_a_parked_entry_of_a_missing_run_is_dropped_when_a_slot_frees(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    (a1,) = claim(runner, pk, now=1_000).runs
    redis_client.zadd(pk.prefix + "parked:key:a", {"ghost": -1})  # older than a2
    redis_client.zadd(pk.parked, {"ghost": -1})
    complete(runner, pk, "a1", a1.fence, now=2_000)
    assert ids(claim(runner, pk, now=2_001)) == ["a2"]
    assert redis_client.zcard(pk.parked) == 0


def test_a_stale_held_member_is_pruned(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    redis_client.sadd(pk.prefix + "held:key:a", "gone")  # a slot no path freed
    create_keyed(runner, pk, "a1", key="a")
    assert ids(claim(runner, pk, now=1_000)) == ["a1"]
    assert redis_client.smembers(pk.prefix + "held:key:a") == {"a1"}


def test_removing_the_key_cap_puts_parked_runs_back_at_their_due_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000, lease_ms=100_000, limit=1)
    claim(runner, pk, now=2_000, lease_ms=10_000)  # a2 parked, its recheck at 12_000
    limit(runner, pk, "key_concurrency", None)
    assert ids(claim(runner, pk, now=2_001)) == ["a2"]
    assert redis_client.zcard(pk.parked) == 0


def test_raising_a_task_cap_puts_its_parked_runs_back_and_no_others(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "task:export", 1)
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "e1", "e2", task="export", now=0)
    create_keyed(runner, pk, "a1", "a2", key="a", now=1)
    claim(runner, pk, now=1_000, lease_ms=10_000)  # e1, a1 run; e2, a2 parked
    limit(runner, pk, "task:export", 2)
    assert redis_client.zscore(pk.due, "e2") == 0
    assert redis_client.zscore(pk.due, "a2") == 11_000
    assert ids(claim(runner, pk, now=1_001)) == ["e2"]


def test_raising_a_task_cap_looks_at_its_own_parked_runs_only(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "task:export", 1)
    create_keyed(runner, pk, "e1", "e2", task="export", now=10)
    claim(runner, pk, now=1_000, lease_ms=10_000)  # e2 parked
    # 1,000 older runs parked by other caps (entries only: they are not looked at)
    redis_client.zadd(pk.parked, {f"other{i}": 0 for i in range(1_000)})
    limit(runner, pk, "task:export", 2)
    assert redis_client.zscore(pk.due, "e2") == 10


def test_a_parked_run_above_the_default_priority_is_rehinted(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a", priority=5)
    claim(runner, pk, now=1_000, lease_ms=5_000)
    assert redis_client.zscore(pk.prio, "a2") == 4 * 2**43 + 6_000


def test_an_unparked_priority_run_keeps_its_priority(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a", priority=9, now=10)
    (a1,) = claim(runner, pk, now=1_000).runs  # a2 parked, its recheck at 31_000
    create_keyed(runner, pk, "n1", now=5)  # the default priority, due earlier
    complete(runner, pk, "a1", a1.fence, now=2_000)  # a2 back at its due time
    assert ids(claim(runner, pk, now=2_001, limit=1)) == ["a2"]


def test_a_priority_run_put_back_by_a_raised_cap_keeps_its_priority(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a", priority=9, now=10)
    claim(runner, pk, now=1_000)  # a2 parked
    create_keyed(runner, pk, "n1", now=5)
    limit(runner, pk, "key_concurrency", 2)
    assert ids(claim(runner, pk, now=2_001, limit=1)) == ["a2"]


def test_parked_runs_do_not_hide_the_rest_of_their_priority_level(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a0", key="a", priority=9, now=0)
    assert ids(claim(runner, pk, now=1)) == ["a0"]
    create_keyed(runner, pk, *[f"a{i}" for i in range(1, 11)], key="a", priority=9, now=10)
    create_keyed(runner, pk, "b1", key="b", priority=9, now=100)
    create_keyed(runner, pk, "n1", now=2)
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["b1"]


def test_a_parked_run_buried_as_corrupt_leaves_no_parked_trace(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000, lease_ms=5_000)  # a1 runs, a2 parked (recheck 6_000)
    redis_client.hdel(pk.run("a2"), "payload")  # a2's record goes bad
    claim(runner, pk, now=6_001, lease_ms=50_000)  # a2 dead-lettered at its recheck
    assert redis_client.hget(pk.run("a2"), "state") == "dead"
    assert redis_client.zscore(pk.parked, "a2") is None
    assert redis_client.zscore(pk.prefix + "parked:key:a", "a2") is None
    assert redis_client.hget(pk.run("a2"), "parked") is None


# -- per-task caps -----------------------------------------------------------------------------


def test_a_task_cap_holds_the_runs_of_one_task(runner: ScriptRunner, pk: PartitionKeys) -> None:
    limit(runner, pk, "task:export", 1)
    create_keyed(runner, pk, "e1", "e2", task="export", now=0)
    create_keyed(runner, pk, "m1", task="mail", now=1)
    assert ids(claim(runner, pk, now=1_000)) == ["e1", "m1"]


def test_a_task_cap_slot_is_freed_by_the_commit(runner: ScriptRunner, pk: PartitionKeys) -> None:
    limit(runner, pk, "task:export", 1)
    create_keyed(runner, pk, "e1", "e2", task="export")
    (e1,) = claim(runner, pk, now=1_000).runs
    complete(runner, pk, "e1", e1.fence, now=2_000)
    assert ids(claim(runner, pk, now=2_001)) == ["e2"]


def test_a_run_under_a_task_and_a_key_cap_holds_both(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "task:export", 2)
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", task="export", key="a", now=0)
    create_keyed(runner, pk, "b1", "b2", task="export", key="b", now=1)
    assert ids(claim(runner, pk, now=1_000)) == ["a1", "b1"]


def test_set_limit_counts_the_task_caps(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "task:a", 1)
    limit(runner, pk, "task:b", 1)
    assert redis_client.hget(pk.limits, "task_caps") == "2"
    limit(runner, pk, "task:a", None)
    limit(runner, pk, "task:b", None)
    assert redis_client.hget(pk.limits, "task_caps") is None


@pytest.mark.parametrize(
    ("name", "value"),
    [("key_concurrency", 10_001), ("task:x", "x"), ("task:", 1), ("key_rate", "1")],
)
def test_set_limit_refuses_what_is_not_a_cap(
    runner: ScriptRunner, pk: PartitionKeys, name: str, value: Any
) -> None:
    with pytest.raises(ScriptError):
        limit(runner, pk, name, value)


# -- per-key rate ------------------------------------------------------------------------------


def test_a_key_rate_takes_at_most_n_claims_of_a_key_in_any_window(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_rate", "2 10000")
    create_keyed(runner, pk, "a1", "a2", "a3", key="a", now=0)
    create_keyed(runner, pk, "b1", key="b", now=1)
    result = claim(runner, pk, now=1_000)
    assert ids(result) == ["a1", "a2", "b1"]
    assert result.next_wake_ms == 11_000  # a3's key has room again


def test_a_run_held_by_its_key_rate_is_due_when_the_window_has_room(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_rate", "1 10000")
    create_keyed(runner, pk, "a1", "a2", "a3", key="a")
    claim(runner, pk, now=1_000)
    assert ids(claim(runner, pk, now=10_999)) == []
    assert ids(claim(runner, pk, now=11_000)) == ["a2"]
    assert ids(claim(runner, pk, now=21_001)) == ["a3"]


@pytest.mark.parametrize("backlog", [20, 200, 2000])
def test_a_key_rate_backlog_is_rechecked_once_per_window_not_every_ms(
    backlog: int, runner: ScriptRunner, pk: PartitionKeys
) -> None:
    limit(runner, pk, "key_rate", "1 1000")
    create_keyed(runner, pk, *[f"a{i:04}" for i in range(backlog)], key="a", now=0)
    now, claims, taken = 1, 0, 0
    while now < 10_000:  # 10 windows: 10 runs can go
        result = claim(runner, pk, now=now)
        claims, taken = claims + 1, taken + len(result.runs)
        now = max(now + 1, result.next_wake_ms)
    assert taken == 10
    # Ideally the backlog is read once (up to 74 due entries a call), then one claim per
    # window takes its run: at most 3 times that.
    ideal = backlog // 74 + 1 + taken
    assert claims <= 3 * ideal


def test_a_key_cap_of_another_type_refuses_the_claim_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", key="a")
    redis_client.set(pk.prefix + "held:key:a", "garbage")
    with pytest.raises(ScriptError):
        claim(runner, pk, now=1_000)
    assert redis_client.zscore(pk.due, "a1") == 0
    assert redis_client.hget(pk.run("a1"), "state") == "pending"


def test_a_parked_key_of_another_type_refuses_the_claim_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    redis_client.set(pk.prefix + "parked:key:a", "garbage")
    before = redis_client.zscore(pk.due, "a2")
    with pytest.raises(ScriptError):
        claim(runner, pk, now=1_000)
    assert redis_client.hget(pk.run("a1"), "state") == "pending"
    assert redis_client.zscore(pk.due, "a2") == before


def test_a_held_key_of_another_type_refuses_the_commit_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", key="a")
    (a1,) = claim(runner, pk, now=1_000).runs
    redis_client.delete(pk.prefix + "held:key:a")
    redis_client.set(pk.prefix + "held:key:a", "garbage")
    with pytest.raises(ScriptError):
        complete(runner, pk, "a1", a1.fence, now=2_000)
    assert redis_client.hget(pk.run("a1"), "state") == "running"


def test_a_krate_key_of_another_type_refuses_the_claim_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_rate", "1 10000")
    create_keyed(runner, pk, "a1", key="a")
    redis_client.set(pk.prefix + "krate:a", "garbage")
    with pytest.raises(ScriptError):
        claim(runner, pk, now=1_000)
    assert redis_client.hget(pk.run("a1"), "state") == "pending"


def test_a_queue_without_key_limits_ignores_the_limit_key(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_keyed(runner, pk, "a1", "a2", key="a")
    assert ids(claim(runner, pk, now=1_000)) == ["a1", "a2"]
    assert redis_client.exists(pk.prefix + "held:key:a") == 0


def test_a_parked_run_taken_after_its_cap_went_leaves_the_parked_index(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000, lease_ms=5_000)  # a2 parked, its recheck at 6_000
    redis_client.hdel(pk.limits, "key_concurrency")  # gone without set_limit's unparking
    assert ids(claim(runner, pk, now=6_000, lease_ms=50_000)) == ["a1", "a2"]
    assert redis_client.zcard(pk.parked) == 0
    assert redis_client.hget(pk.run("a2"), "parked") is None


def test_a_parked_index_of_another_type_refuses_the_claim_of_a_parked_run_whole(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    limit(runner, pk, "key_concurrency", 1)
    create_keyed(runner, pk, "a1", "a2", key="a")
    claim(runner, pk, now=1_000, lease_ms=5_000)
    redis_client.hdel(pk.limits, "key_concurrency")
    redis_client.delete(pk.parked)
    redis_client.set(pk.parked, "garbage")
    with pytest.raises(ScriptError):
        claim(runner, pk, now=6_000)
    assert redis_client.hget(pk.run("a2"), "state") == "pending"
    assert redis_client.hget(pk.run("a1"), "state") == "running"
