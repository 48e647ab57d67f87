"""fenced_write.lua through ops: a resource that refuses writes from a fence older than the
last one it accepted, so a stale attempt's side effect is refused."""

from __future__ import annotations

from typing import Any

from redis.crc import key_slot

from jobqueue import ops
from jobqueue.keys import PartitionKeys
from jobqueue.scripts import ScriptRunner

LEASE = 30_000


def write(runner: ScriptRunner, pk: PartitionKeys, fence: int, value: str, now: int = 1,
          resource: str = "res", run_id: str = "r") -> tuple[bool, int]:
    call = ops.fenced_write_call(pk, resource, fence, value, run_id, now=now)
    return ops.parse_fenced_write(runner.run(call))


def test_fenced_write_accepts_the_first_write(runner: ScriptRunner, pk: PartitionKeys,
                                              redis_client: Any) -> None:
    assert write(runner, pk, 1, "v1") == (True, 1)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "v1"


def test_fenced_write_accepts_fence_zero_on_a_fresh_resource(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    assert write(runner, pk, 0, "v0") == (True, 0)


def test_fenced_write_stores_value_writer_and_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    write(runner, pk, 3, '{"total":12}', now=9_000, run_id="job@60")
    assert redis_client.hgetall(pk.fence_resource("res")) == {
        "fence": "3",
        "value": '{"total":12}',
        "run": "job@60",
        "at": "9000",
    }


def test_fenced_write_refuses_an_older_fence_and_reports_the_last(
    runner: ScriptRunner, pk: PartitionKeys
) -> None:
    write(runner, pk, 5, "new")
    assert write(runner, pk, 4, "stale") == (False, 5)


def test_refused_fenced_write_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    write(runner, pk, 5, "new", now=100, run_id="w2-run")
    before = redis_client.hgetall(pk.fence_resource("res"))
    write(runner, pk, 2, "stale", now=200, run_id="w1-run")
    assert redis_client.hgetall(pk.fence_resource("res")) == before


def test_fenced_write_accepts_the_same_fence_again(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    write(runner, pk, 2, "first")
    assert write(runner, pk, 2, "second") == (True, 2)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "second"


def test_fenced_write_accepts_a_newer_fence(runner: ScriptRunner, pk: PartitionKeys,
                                            redis_client: Any) -> None:
    write(runner, pk, 2, "old")
    assert write(runner, pk, 7, "newer") == (True, 7)
    assert redis_client.hget(pk.fence_resource("res"), "fence") == "7"
    assert write(runner, pk, 6, "stale") == (False, 7)


def test_fenced_write_resources_are_independent(runner: ScriptRunner, pk: PartitionKeys) -> None:
    write(runner, pk, 9, "x", resource="one")
    assert write(runner, pk, 1, "y", resource="two") == (True, 1)


def test_fenced_write_resource_key_is_in_the_partition_slot(
    runner: ScriptRunner, redis_client: Any
) -> None:
    pk = PartitionKeys("default", 5)
    name = "{evil}tag"
    write(runner, pk, 1, "v", resource=name)
    assert redis_client.keys("*") == [pk.fence_resource(name)]
    assert key_slot(pk.fence_resource(name).encode()) == key_slot(pk.due.encode())


def test_fenced_write_refuses_the_side_effect_of_a_worker_whose_lease_was_reclaimed(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    spec = ops.RunSpec("a", "t", '{"args":[],"kwargs":{}}')
    runner.run(ops.create_call(pk, [spec], now=0))
    (w1,) = ops.parse_claim(runner.run(ops.claim_call(pk, 1, "w1", LEASE, 1, now=0))).runs
    (w2,) = ops.parse_claim(runner.run(ops.claim_call(pk, 1, "w2", LEASE, 1, now=LEASE))).runs
    assert write(runner, pk, w2.fence, "from w2", run_id="a") == (True, w2.fence)
    assert write(runner, pk, w1.fence, "from w1", run_id="a") == (False, w2.fence)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "from w2"
