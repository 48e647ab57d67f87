"""pause.lua and a paused partition's claim, through their contracts: a paused partition hands
out nothing (not even expired leases), enqueues and commits go on, resume fills the wake list.
Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import LEASE_MS, claim, create_new

from jobqueue.errors import ScriptError
from jobqueue.store.admin import PAUSE
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import COMPLETE, HEARTBEAT
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def pause(runner: ScriptRunner, pk: PartitionKeys, paused: bool, now: int = 1_000) -> bool:
    return PAUSE.parse(runner.run(PAUSE.call(pk, paused, now=now)))


def test_a_paused_partition_hands_out_no_due_run(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, "a", now=0)
    pause(runner, pk, True)
    result = claim(runner, pk, now=2_000)
    assert (result.runs, result.next_wake_ms) == ([], None)


def test_a_paused_partition_keeps_an_expired_lease_until_resumed(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", now=0)
    assert [r.run_id for r in claim(runner, pk, now=0).runs] == ["a"]
    pause(runner, pk, True)
    assert claim(runner, pk, now=LEASE_MS + 1).runs == []
    assert redis_client.hget(pk.run("a"), "owner") == "w1"
    pause(runner, pk, False)
    assert [r.attempt for r in claim(runner, pk, now=LEASE_MS + 2).runs] == [2]


def test_enqueues_heartbeats_and_commits_go_on_while_paused(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", now=0)
    (run,) = claim(runner, pk, now=0).runs
    pause(runner, pk, True)
    create_new(runner, pk, "b", now=1_000)
    beats = HEARTBEAT.parse(runner.run(HEARTBEAT.call(pk, [("a", run.fence)], LEASE_MS, now=2_000)))
    assert beats.answers == [2_000 + LEASE_MS]
    call = COMPLETE.call(pk, [("a", run.fence, "1")], RETENTION, now=3_000)
    runner.run(call)
    assert redis_client.hget(pk.run("a"), "state") == "done"
    assert redis_client.hget(pk.run("b"), "state") == "pending"


def test_resume_lets_claims_take_the_due_runs(runner: ScriptRunner, pk: PartitionKeys) -> None:
    create_new(runner, pk, "a", "b", now=0)
    pause(runner, pk, True)
    pause(runner, pk, False)
    assert [r.run_id for r in claim(runner, pk, now=2_000).runs] == ["a", "b"]


def test_resume_fills_the_wake_list(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    pause(runner, pk, True)
    redis_client.delete(pk.wake)
    pause(runner, pk, False)
    assert redis_client.llen(pk.wake) == 8


def test_pause_says_whether_it_changed_the_partition(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    assert [pause(runner, pk, True), pause(runner, pk, True)] == [True, False]
    assert [pause(runner, pk, False), pause(runner, pk, False)] == [True, False]


def test_pause_records_when_it_paused(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    pause(runner, pk, True, now=5_000)
    pause(runner, pk, True, now=9_000)
    assert redis_client.get(pk.paused) == "5000"


def test_a_paused_key_of_another_type_refuses_the_claim(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", now=0)
    redis_client.rpush(pk.paused, "x")
    with pytest.raises(ScriptError, match="paused"):
        claim(runner, pk, now=2_000)
    assert redis_client.hget(pk.run("a"), "state") == "pending"
