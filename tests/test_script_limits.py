"""Concurrency limits in claim.lua and set_limit.lua, through their contracts: a slot is held
by a claim (a live lease) and freed by the commit, the cancel, the fail or the lease's expiry;
a full partition changes nothing and says when to look again. Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import LEASE_MS, claim, create_new, ids

from jobqueue.errors import ScriptError
from jobqueue.store.admin import SET_LIMIT
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    CLAIM,
    COMPLETE,
    FAIL,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def cap(runner: ScriptRunner, pk: PartitionKeys, value: int | None) -> bool:
    return SET_LIMIT.parse(runner.run(SET_LIMIT.call(pk, "concurrency", value, now=0)))


def test_a_claim_takes_no_more_than_the_free_slots(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 2)
    create_new(runner, pk, "a", "b", "c", max_attempts=5)
    assert ids(claim(runner, pk, now=1_000)) == ["a", "b"]


def test_a_full_partition_hands_out_nothing_and_wakes_at_the_first_lease_expiry(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000, lease_ms=5_000)
    full = claim(runner, pk, now=2_000)
    assert (full.runs, full.next_wake_ms) == ([], 6_000)


def test_a_commit_frees_its_slot(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    (a,) = claim(runner, pk, now=1_000).runs
    runner.run(COMPLETE.call(pk, [("a", a.fence, "1")], RETENTION, now=2_000))
    assert ids(claim(runner, pk, now=3_000)) == ["b"]


def test_a_failure_frees_its_slot(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    (a,) = claim(runner, pk, now=1_000).runs
    runner.run(FAIL.call(pk, "a", a.fence, "boom", 60_000, RETENTION, now=2_000))
    assert ids(claim(runner, pk, now=3_000)) == ["b"]


def test_a_cancel_frees_its_slot(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000)
    runner.run(CANCEL.call(pk, "a", RETENTION, "stop", now=2_000))
    assert ids(claim(runner, pk, now=3_000)) == ["b"]


def test_an_expired_lease_frees_its_slot_and_is_taken_back_first(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    """A worker killed mid-run leaks no slot: its lease expires, and the run taken back holds
    the slot again (the dead worker no longer runs it)."""
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000, lease_ms=5_000)
    assert claim(runner, pk, now=5_999).runs == []
    (again,) = claim(runner, pk, now=6_000).runs
    assert (again.run_id, again.attempt) == ("a", 2)


def test_a_limit_of_zero_hands_out_nothing(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 0)
    create_new(runner, pk, "a", max_attempts=5)
    result = claim(runner, pk, now=1_000)
    assert (result.runs, result.next_wake_ms) == ([], None)


def test_a_full_partition_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000, lease_ms=5_000)
    before = {k: redis_client.dump(k) for k in redis_client.scan_iter("*")}
    claim(runner, pk, now=2_000)
    assert {k: redis_client.dump(k) for k in redis_client.scan_iter("*")} == before


def test_removing_the_limit_hands_out_everything(runner: ScriptRunner, pk: PartitionKeys) -> None:
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", "c", max_attempts=5)
    claim(runner, pk, now=1_000)
    cap(runner, pk, None)
    assert ids(claim(runner, pk, now=2_000)) == ["b", "c"]


@pytest.mark.parametrize("stored", ["lots", " 1", "1e0", "0x1", "1.0", "01", "-1"])
def test_a_limit_field_that_is_not_a_plain_count_is_no_limit(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, stored: str
) -> None:
    """Claims read a limit exactly as the Python side does (queues, show, repartition): plain
    decimal digits, or no limit at all."""
    redis_client.hset(pk.limits, "concurrency", stored)
    redis_client.hset(pk.limits, "rate", f"{stored} 60000")
    create_new(runner, pk, "a", "b", max_attempts=5)
    assert ids(claim(runner, pk, now=1_000)) == ["a", "b"]


def test_set_limit_says_whether_it_changed_the_limit(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    assert [cap(runner, pk, 3), cap(runner, pk, 3), cap(runner, pk, 4)] == [True, False, True]
    assert [cap(runner, pk, None), cap(runner, pk, None)] == [True, False]


@pytest.mark.parametrize(
    ("before", "after", "woken"), [(2, 3, True), (2, None, True), (3, 2, False), (None, 2, False)]
)
def test_raising_or_removing_a_limit_wakes_idle_workers(
    runner: ScriptRunner,
    pk: PartitionKeys,
    redis_client: Any,
    before: int | None,
    after: int | None,
    woken: bool,
) -> None:
    cap(runner, pk, before)
    redis_client.delete(pk.wake)
    cap(runner, pk, after)
    assert redis_client.llen(pk.wake) == (8 if woken else 0)


@pytest.mark.parametrize(
    ("name", "value"), [("speed", "3"), ("concurrency", "-1"), ("concurrency", "x")]
)
def test_set_limit_refuses_what_is_not_a_limit(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, name: str, value: str
) -> None:
    call = SET_LIMIT.call(pk, name, 3, now=0)
    call = call._replace(args=(*call.args[:-1], value))
    with pytest.raises(ScriptError, match="jobqueue"):
        runner.run(call)
    assert not redis_client.exists(pk.limits)


# -- rate limits ---------------------------------------------------------------------------


def rate(runner: ScriptRunner, pk: PartitionKeys, value: str | None) -> bool:
    return SET_LIMIT.parse(runner.run(SET_LIMIT.call(pk, "rate", value, now=0)))


def test_a_rate_limit_takes_at_most_n_claims_in_any_window(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    rate(runner, pk, "2 1000")
    create_new(runner, pk, "a", "b", "c", "d", "e", max_attempts=5)
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["a"]
    assert ids(claim(runner, pk, now=1_500)) == ["b"]
    assert ids(claim(runner, pk, now=1_999)) == []
    assert ids(claim(runner, pk, now=2_000)) == ["c"]  # a's claim left the window
    assert ids(claim(runner, pk, now=2_500)) == ["d"]


def test_a_rate_limited_partition_wakes_when_its_oldest_claim_leaves_the_window(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    rate(runner, pk, "1 1000")
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000)
    limited = claim(runner, pk, now=1_200)
    assert (limited.runs, limited.next_wake_ms) == ([], 2_000)


def test_a_rate_limited_claim_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    rate(runner, pk, "1 1000")
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000)
    before = {k: redis_client.dump(k) for k in redis_client.scan_iter("*")}
    claim(runner, pk, now=1_200)
    assert {k: redis_client.dump(k) for k in redis_client.scan_iter("*")} == before


def test_taking_back_an_expired_lease_counts_as_a_claim(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    rate(runner, pk, "2 10000")
    create_new(runner, pk, "a", "b", max_attempts=5)
    claim(runner, pk, now=1_000, lease_ms=1_000, limit=1)
    (again,) = claim(runner, pk, now=2_000).runs
    assert (again.run_id, again.attempt) == ("a", 2)
    assert claim(runner, pk, now=3_000).runs == []


def test_the_claim_log_keeps_only_the_window(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    rate(runner, pk, "5 1000")
    create_new(runner, pk, "a", "b", "c", max_attempts=5)
    claim(runner, pk, now=1_000, limit=2)
    claim(runner, pk, now=2_500)
    assert redis_client.zcard(pk.claims) == 1


def test_the_claim_log_on_the_servers_clock_expires_with_its_window(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    rate(runner, pk, "5 1000")
    create_new(runner, pk, "a", max_attempts=5)
    assert len(CLAIM.parse(runner.run(CLAIM.call(pk, 10, "w1", LEASE_MS, RETENTION))).runs) == 1
    assert 0 < redis_client.pttl(pk.claims) <= 1_000


def test_a_rate_and_a_concurrency_limit_both_hold(runner: ScriptRunner, pk: PartitionKeys) -> None:
    rate(runner, pk, "3 1000")
    cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", "c", max_attempts=5)
    assert ids(claim(runner, pk, now=1_000)) == ["a"]


def test_a_rate_is_stored_in_its_plain_form(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    assert [rate(runner, pk, "007 1000"), rate(runner, pk, "7 1000")] == [True, False]
    assert redis_client.hget(pk.limits, "rate") == "7 1000"


@pytest.mark.parametrize("value", ["5", "5 0", "-1 1000", "5 1000 2", "x y"])
def test_set_limit_refuses_what_is_not_a_rate(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, value: str
) -> None:
    with pytest.raises(ScriptError, match="a rate is"):
        rate(runner, pk, value)
    assert not redis_client.exists(pk.limits)


# -- commits wake the workers a limit made wait -----------------------------------------------


@pytest.mark.parametrize(("limited", "tokens"), [(True, 1), (False, 0)])
def test_a_completion_under_a_concurrency_limit_wakes_an_idle_worker(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, limited: bool, tokens: int
) -> None:
    if limited:
        cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    (a,) = claim(runner, pk, now=1_000, limit=1).runs
    redis_client.delete(pk.wake)
    runner.run(COMPLETE.call(pk, [("a", a.fence, "1")], RETENTION, now=2_000))
    assert redis_client.llen(pk.wake) == tokens


@pytest.mark.parametrize(("limited", "tokens"), [(True, 1), (False, 0)])
def test_a_burial_under_a_concurrency_limit_wakes_an_idle_worker(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any, limited: bool, tokens: int
) -> None:
    if limited:
        cap(runner, pk, 1)
    create_new(runner, pk, "a", "b", max_attempts=5)
    (a,) = claim(runner, pk, now=1_000, limit=1).runs
    redis_client.delete(pk.wake)
    runner.run(FAIL.call(pk, "a", a.fence, "boom", None, RETENTION, now=2_000))
    assert redis_client.llen(pk.wake) == tokens


def test_a_commit_is_never_refused_for_a_limits_key_of_another_type(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create_new(runner, pk, "a", max_attempts=5)
    (a,) = claim(runner, pk, now=1_000).runs
    redis_client.rpush(pk.limits, "x")
    runner.run(COMPLETE.call(pk, [("a", a.fence, "1")], RETENTION, now=2_000))
    assert redis_client.hget(pk.run("a"), "state") == "done"


def test_a_run_taken_with_a_stray_lease_entry_keeps_the_lease_it_was_just_granted(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """A pending, due run that also has a lease entry left behind (a stray): the claim takes
    it and must not then remove its new lease with the stray entry."""
    cap(runner, pk, 1)
    create_new(runner, pk, "p", "q", max_attempts=5)
    redis_client.zadd(pk.leases, {"p": 950})
    assert ids(claim(runner, pk, now=1_000, limit=1)) == ["p"]
    assert redis_client.zscore(pk.leases, "p") == 1_000 + LEASE_MS
    assert ids(claim(runner, pk, now=1_001)) == []  # p holds the one slot


def test_a_rate_window_on_the_callers_clock_outlives_the_real_time_it_spans(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """The window is judged on the script's clock (here the caller's): the log must not
    expire on the server's real clock meanwhile."""
    rate(runner, pk, "1 100")
    create_new(runner, pk, "a", "b", max_attempts=5)
    assert ids(claim(runner, pk, now=1_000)) == ["a"]
    assert redis_client.pttl(pk.claims) == -1  # no real-time expiry
    assert ids(claim(runner, pk, now=1_050)) == []
