"""Deduplication keys in dedupe.lua and claim.lua, through their contracts: the first enqueue
under a key creates a run that holds it; while it holds, throttle drops a new enqueue and
debounce gives the pending holder the new payload, meta and due time; without a ttl the key
goes at the holder's first claim, with one it lasts ttl_ms. Explicit clock throughout."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import claim

from jobqueue.errors import ScriptError
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    DEDUPE,
    Deduped,
    RunSpec,
)
from jobqueue.store.scripts import ScriptRunner

RETENTION = 3_600_000


def enqueue(
    runner: ScriptRunner,
    pk: PartitionKeys,
    run_id: str,
    mode: str = "throttle",
    ttl: int | None = None,
    now: int = 1_000,
    payload: str = '{"args":[1],"kwargs":{}}',
    **fields: Any,
) -> Deduped:
    spec = RunSpec(run_id, "t", payload, **fields)
    return DEDUPE.parse(runner.run(DEDUPE.call(pk, spec, "k", mode, ttl, now=now)))


def test_the_first_enqueue_under_a_key_creates_a_run_that_holds_it(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    assert enqueue(runner, pk, "k@1") == Deduped("created", "k@1")
    assert redis_client.get(pk.dedupe("k")) == "k@1"
    assert redis_client.hget(pk.run("k@1"), "dedupe") == "k"


def test_throttle_drops_an_enqueue_while_the_holder_is_pending(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1")
    assert enqueue(runner, pk, "k@2", payload='{"args":[2],"kwargs":{}}') == Deduped(
        "deduplicated", "k@1"
    )
    assert not redis_client.exists(pk.run("k@2"))
    assert redis_client.hget(pk.run("k@1"), "payload") == '{"args":[1],"kwargs":{}}'


def test_debounce_gives_the_pending_holder_the_new_payload_meta_and_due_time(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1", "debounce", delay_ms=5_000)
    again = enqueue(
        runner, pk, "k@2", "debounce", now=2_000, payload='{"args":[2],"kwargs":{}}',
        delay_ms=5_000, meta='{"who":"b"}',
    )
    assert again == Deduped("replaced", "k@1")
    record = redis_client.hgetall(pk.run("k@1"))
    assert (record["payload"], record["due"], record["meta"]) == (
        '{"args":[2],"kwargs":{}}', "7000", '{"who":"b"}'
    )
    assert redis_client.zscore(pk.due, "k@1") == 7_000
    assert not redis_client.exists(pk.run("k@2"))


def test_a_debounced_run_keeps_its_priority_place_at_the_new_due_time(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1", "debounce", priority=4)
    enqueue(runner, pk, "k@2", "debounce", now=2_000, delay_ms=3_000, priority=9)
    assert redis_client.hget(pk.run("k@1"), "priority") == "4"  # the holder's stays
    assert redis_client.zscore(pk.prio, "k@1") == 5 * 2**43 + 5_000


def test_without_a_ttl_the_key_goes_at_the_holders_first_claim(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1")
    assert [r.run_id for r in claim(runner, pk, now=1_500).runs] == ["k@1"]
    assert not redis_client.exists(pk.dedupe("k"))
    assert enqueue(runner, pk, "k@2", now=1_600) == Deduped("created", "k@2")


def test_a_cancelled_holder_holds_nothing(runner: ScriptRunner, pk: PartitionKeys) -> None:
    enqueue(runner, pk, "k@1")
    runner.run(CANCEL.call(pk, "k@1", RETENTION, "no", now=1_100))
    assert enqueue(runner, pk, "k@2", now=1_200) == Deduped("created", "k@2")


def test_with_a_ttl_throttle_drops_enqueues_after_the_holder_ran(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1", ttl=60_000)
    claim(runner, pk, now=1_500)
    assert redis_client.get(pk.dedupe("k")) == "k@1"  # a claim leaves a ttl key alone
    assert enqueue(runner, pk, "k@2", ttl=60_000, now=2_000) == Deduped("deduplicated", "k@1")
    assert 0 < redis_client.pttl(pk.dedupe("k")) <= 60_000


def test_with_a_ttl_debounce_cannot_replace_a_claimed_run_and_creates_one(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1", "debounce", ttl=60_000)
    claim(runner, pk, now=1_500)
    assert enqueue(runner, pk, "k@2", "debounce", ttl=60_000, now=2_000) == Deduped(
        "created", "k@2"
    )
    assert redis_client.get(pk.dedupe("k")) == "k@2"


def test_a_key_naming_an_expired_record_holds_nothing(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    redis_client.set(pk.dedupe("k"), "gone@1", px=60_000)
    assert enqueue(runner, pk, "k@2", ttl=60_000) == Deduped("created", "k@2")


def test_an_existing_run_id_is_left_alone(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    enqueue(runner, pk, "k@1")
    redis_client.delete(pk.dedupe("k"))
    assert enqueue(runner, pk, "k@1", payload='{"args":[9],"kwargs":{}}') == Deduped(
        "existed", "k@1"
    )
    assert redis_client.hget(pk.run("k@1"), "payload") == '{"args":[1],"kwargs":{}}'


def test_a_dedupe_key_of_another_type_refuses_the_call_whole(
    runner: ScriptRunner, redis_client: Any, pk: PartitionKeys
) -> None:
    redis_client.rpush(pk.dedupe("k"), "x")
    with pytest.raises(ScriptError):
        enqueue(runner, pk, "k@1")
    assert not redis_client.exists(pk.run("k@1"))
