"""fenced_write.lua through its contract: a resource written only by the current holder of its run's
lease, and never over a write from a newer fence, so a stale attempt's side effect is refused."""

from __future__ import annotations

from typing import Any

from helpers import LEASE_MS, claim_one, create
from redis.crc import key_slot

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CANCEL, COMPLETE, FENCED_WRITE
from jobqueue.store.scripts import ScriptRunner


def holding(runner: ScriptRunner, pk: PartitionKeys, run_id: str, now: int = 0) -> int:
    """Create ``run_id`` and claim it; the fence of that claim."""
    create(runner, pk, run_id, now=now)
    run = claim_one(runner, pk, now, owner="w", retention_ms=1)
    assert run.run_id == run_id
    return run.fence


def write(runner: ScriptRunner, pk: PartitionKeys, run_id: str, fence: int, value: str,
          now: int = 1, resource: str = "res", ttl_ms: int = 0) -> tuple[bool, int]:
    call = FENCED_WRITE.call(pk, resource, fence, value, run_id, ttl_ms, now=now)
    return FENCED_WRITE.parse(runner.run(call))


def test_fenced_write_accepts_the_current_holder(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    fence = holding(runner, pk, "a")
    assert write(runner, pk, "a", fence, "v1") == (True, fence)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "v1"


def test_fenced_write_stores_value_writer_and_time(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    fence = holding(runner, pk, "job@60")
    write(runner, pk, "job@60", fence, '{"total":12}', now=9_000)
    assert redis_client.hgetall(pk.fence_resource("res")) == {
        "fence": str(fence),
        "value": '{"total":12}',
        "run": "job@60",
        "at": "9000",
    }


def test_fenced_write_refuses_the_side_effect_of_a_worker_whose_lease_was_reclaimed(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    w1 = holding(runner, pk, "a")
    w2 = claim_one(runner, pk, now=LEASE_MS, owner="w2", retention_ms=1)
    # The stale attempt is refused even before the new holder wrote anything.
    assert write(runner, pk, "a", w1, "from w1") == (False, w2.fence)
    assert not redis_client.exists(pk.fence_resource("res"))
    assert write(runner, pk, "a", w2.fence, "from w2") == (True, w2.fence)
    assert write(runner, pk, "a", w1, "from w1 again") == (False, w2.fence)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "from w2"


def test_fenced_write_refuses_a_run_that_finished_or_was_cancelled(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    done = holding(runner, pk, "done")
    runner.run(COMPLETE.call(pk, [("done", done, "1")], 60_000, now=1))
    cancelled = holding(runner, pk, "cancelled")
    runner.run(CANCEL.call(pk, "cancelled", 60_000, "stop", now=1))
    assert write(runner, pk, "done", done, "late")[0] is False
    assert write(runner, pk, "cancelled", cancelled, "late")[0] is False
    assert write(runner, pk, "never-created", 1, "v")[0] is False
    assert not redis_client.exists(pk.fence_resource("res"))


def test_fenced_write_keeps_the_write_of_the_later_claim_on_a_shared_resource(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    first = holding(runner, pk, "first")
    second = holding(runner, pk, "second")
    assert second > first  # one fence counter per partition orders every claim
    assert write(runner, pk, "second", second, "new") == (True, second)
    assert write(runner, pk, "first", first, "old") == (False, second)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "new"


def test_refused_fenced_write_changes_nothing(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    first = holding(runner, pk, "w1-run")
    second = holding(runner, pk, "w2-run")
    write(runner, pk, "w2-run", second, "new", now=100)
    before = redis_client.hgetall(pk.fence_resource("res"))
    write(runner, pk, "w1-run", first, "stale", now=200)
    assert redis_client.hgetall(pk.fence_resource("res")) == before


def test_fenced_write_accepts_the_same_attempt_again(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    fence = holding(runner, pk, "a")
    write(runner, pk, "a", fence, "first")
    assert write(runner, pk, "a", fence, "second") == (True, fence)
    assert redis_client.hget(pk.fence_resource("res"), "value") == "second"


def test_fenced_write_resources_are_independent(runner: ScriptRunner, pk: PartitionKeys) -> None:
    first = holding(runner, pk, "first")
    second = holding(runner, pk, "second")
    write(runner, pk, "second", second, "x", resource="one")
    assert write(runner, pk, "first", first, "y", resource="two") == (True, first)


def test_fenced_write_with_a_ttl_makes_the_resource_expire(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    fence = holding(runner, pk, "a")
    write(runner, pk, "a", fence, "kept")
    assert redis_client.pttl(pk.fence_resource("res")) == -1  # no ttl: kept until deleted
    write(runner, pk, "a", fence, "per run", resource="per-run", ttl_ms=60_000)
    assert 0 < redis_client.pttl(pk.fence_resource("per-run")) <= 60_000


def test_fenced_write_resource_key_is_in_the_partition_slot(
    runner: ScriptRunner, redis_client: Any
) -> None:
    pk = PartitionKeys("default", 5)
    name = "{evil}tag"
    fence = holding(runner, pk, "a")
    write(runner, pk, "a", fence, "v", resource=name)
    assert pk.fence_resource(name) in redis_client.keys("*fenced*")
    assert key_slot(pk.fence_resource(name).encode()) == key_slot(pk.due.encode())
