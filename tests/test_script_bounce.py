"""bounce.lua through its contract: a worker without a run's task hands the run back without
counting an attempt, due again after a delay that doubles at each hand-back up to a cap; once
hand-backs have gone on for the whole window the run is buried, saying why."""

from __future__ import annotations

from typing import Any

import pytest
from fence_rule import fence_issued
from helpers import claim, claim_one, create

from jobqueue.errors import ScriptError
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import BOUNCE, COMPLETE, FAIL, RELEASE, REQUEUE, Bounced, RunSpec
from jobqueue.store.scripts import ScriptRunner

DELAY, CAP, WINDOW = 1_000, 8_000, 3_600_000
RETENTION = 7_200_000
WHY = "no worker has task 'sync'"


def bounce(
    runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, now: int,
    window_ms: int = WINDOW, owner: str = "w-old", min_hand_backs: int = 1,
) -> Bounced:
    call = BOUNCE.call(
        pk, run_id, fence, owner, WHY, delay_ms=DELAY, delay_cap_ms=CAP, window_ms=window_ms,
        dead_retention_ms=RETENTION, min_hand_backs=min_hand_backs, now=now,
    )
    return BOUNCE.parse(runner.run(call))


def bounced_at(runner: ScriptRunner, pk: PartitionKeys, times: list[int]) -> list[Bounced]:
    """Run 'a' claimed and handed back at each of ``times`` (each claim at the run's due)."""
    out = []
    for now in times:
        run = claim_one(runner, pk, now=now)
        out.append(bounce(runner, pk, "a", run.fence, now=now))
    return out


def test_a_bounced_run_is_pending_again_after_the_delay_without_counting_an_attempt(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a", max_attempts=1)
    c = claim_one(runner, pk, now=0)
    assert bounce(runner, pk, "a", c.fence, now=10) == Bounced(True, "bounced", 1, 1_010)
    run = redis_client.hgetall(pk.run("a"))
    assert (run["state"], run["attempt"], run["due"]) == ("pending", "0", "1010")
    assert "owner" not in run and "lease_until" not in run
    assert redis_client.zscore(pk.leases, "a") is None
    assert claim(runner, pk, now=1_009).runs == []
    again = claim_one(runner, pk, now=1_010)
    assert (again.attempt, again.fence) == (1, fence_issued(1_010, after=c.fence))


def test_the_delay_doubles_at_each_hand_back_up_to_the_cap(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a")
    got = bounced_at(runner, pk, [0, 1_000, 3_000, 7_000, 15_000, 23_000])
    assert [(b.hand_backs, b.due_ms) for b in got] == [
        (1, 1_000), (2, 3_000), (3, 7_000), (4, 15_000), (5, 23_000), (6, 31_000)
    ]


def test_a_hand_back_is_in_the_history_with_the_worker_and_the_reason(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    bounce(runner, pk, "a", c.fence, now=5)
    assert redis_client.lrange(pk.history("a"), -1, -1) == [
        f"5 handed back fence={c.fence} owner=w-old: {WHY} (attempt not counted; due at 1005)"
    ]


def test_the_run_is_buried_once_hand_backs_have_gone_on_for_the_window(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    bounced_at(runner, pk, [0, 1_000, 3_000])
    c = claim_one(runner, pk, now=WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=WINDOW) == Bounced(True, "dead", 4)
    run = redis_client.hgetall(pk.run("a"))
    assert run["state"] == "dead"
    assert run["error"] == f"{WHY} (handed back 4 times over 3600 s, the window is 3600 s)"
    assert redis_client.zscore(pk.dead, "a") == WINDOW
    assert redis_client.hget(pk.stats, "dead") == "1"
    assert redis_client.hget(pk.stats, "bounced") == "4"
    assert redis_client.ttl(pk.run("a")) > 0  # a dead record expires, as any


def test_the_window_counts_from_the_first_hand_back_not_from_the_runs_creation(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a", delay_ms=10 * WINDOW)  # due long after its creation
    c = claim_one(runner, pk, now=10 * WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=10 * WINDOW).status == "bounced"


def test_a_worker_that_has_the_task_and_fails_it_starts_a_new_window(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a", max_attempts=5)
    bounced_at(runner, pk, [0])
    mine = claim_one(runner, pk, now=WINDOW - 1, owner="w-new")
    runner.run(FAIL.call(pk, "a", mine.fence, "boom", 0, RETENTION, now=WINDOW - 1))
    assert "unknown_since" not in redis_client.hgetall(pk.run("a"))
    c = claim_one(runner, pk, now=WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=WINDOW) == Bounced(
        True, "bounced", 1, WINDOW + DELAY
    )


def test_past_the_window_a_run_is_buried_only_after_its_minimum_of_hand_backs(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    assert bounce(runner, pk, "a", c.fence, now=0, min_hand_backs=3).status == "bounced"
    c = claim_one(runner, pk, now=2 * WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=2 * WINDOW, min_hand_backs=3).status == (
        "bounced"
    )
    c = claim_one(runner, pk, now=3 * WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=3 * WINDOW, min_hand_backs=3) == Bounced(
        True, "dead", 3
    )


def test_a_release_by_a_worker_that_had_the_task_starts_a_new_window(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a")
    bounced_at(runner, pk, [0])
    mine = claim_one(runner, pk, now=1_000, owner="w-new")
    runner.run(RELEASE.call(pk, "a", mine.fence, now=WINDOW + 1))  # its graceful shutdown
    c = claim_one(runner, pk, now=WINDOW + 2)
    assert bounce(runner, pk, "a", c.fence, now=WINDOW + 2).status == "bounced"


def test_a_take_back_of_an_expired_lease_starts_a_new_window(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    create(runner, pk, "a")
    bounced_at(runner, pk, [0])
    claim_one(runner, pk, now=1_000, owner="w-new", lease_ms=1_000)  # then it crashed
    c = claim_one(runner, pk, now=WINDOW + 2)  # its lease taken back
    assert bounce(runner, pk, "a", c.fence, now=WINDOW + 2).status == "bounced"


def test_a_bounce_missing_its_last_arguments_is_refused_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    c = claim_one(runner, pk, now=0)
    call = BOUNCE.call(
        pk, "a", c.fence, "w", WHY, delay_ms=DELAY, delay_cap_ms=CAP, window_ms=WINDOW,
        dead_retention_ms=RETENTION, now=10,
    )
    before = (redis_client.hgetall(pk.run("a")), redis_client.zscore(pk.leases, "a"))
    with pytest.raises(ScriptError, match="jobqueue: "):
        runner.run(call._replace(args=call.args[:9]))
    assert (redis_client.hgetall(pk.run("a")), redis_client.zscore(pk.leases, "a")) == before


def test_a_requeue_starts_a_new_window(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    bounced_at(runner, pk, [0])
    mine = claim_one(runner, pk, now=1_000, owner="w-new")
    runner.run(COMPLETE.call(pk, [("a", mine.fence, "1")], RETENTION, now=1_001))
    REQUEUE.parse(runner.run(REQUEUE.call(pk, "a", True, now=WINDOW)))
    c = claim_one(runner, pk, now=WINDOW)
    assert bounce(runner, pk, "a", c.fence, now=WINDOW).status == "bounced"


def test_a_bounce_with_a_stale_fence_is_refused_and_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, "a")
    old = claim_one(runner, pk, now=0, owner="w1")
    new = claim_one(runner, pk, now=30_000, owner="w2")
    before = redis_client.hgetall(pk.run("a"))
    assert bounce(runner, pk, "a", old.fence, now=30_001) == Bounced(
        False, "fenced", current_fence=new.fence
    )
    assert redis_client.hgetall(pk.run("a")) == before
    assert redis_client.zscore(pk.leases, "a") is not None


def test_a_bounced_run_keeps_its_priority(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, RunSpec("hi", "t", '{"args":[],"kwargs":{}}', priority=7))
    create(runner, pk, "lo", now=1)
    c = claim_one(runner, pk, now=2)
    assert c.run_id == "hi"
    bounce(runner, pk, "hi", c.fence, now=3)
    assert [r.run_id for r in claim(runner, pk, now=2_000, limit=2).runs] == ["hi", "lo"]
