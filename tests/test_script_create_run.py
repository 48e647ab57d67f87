"""create_run.lua through its contract: SET NX semantics, batches, due time, wake tokens, stats,
history. Plus the one-clock rule for every script: without ``now`` the scripts read Redis TIME."""

from __future__ import annotations

from typing import Any

from helpers import create
from redis.crc import key_slot

from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import (
    CANCEL,
    CLAIM,
    COMPLETE,
    CREATE_RUN,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    RELEASE,
    REQUEUE,
    RunSpec,
)
from jobqueue.store.scripts import ScriptRunner

# A payload with arguments: create_run keeps it verbatim.
ARGS_PAYLOAD = '{"args":[1,"a"],"kwargs":{"k":true}}'
NOW = 1_000_000


def spec(run_id: str, **kw: Any) -> RunSpec:
    """A run of task 't' with ARGS_PAYLOAD unless told."""
    task = kw.pop("task", "t")
    payload = kw.pop("payload", ARGS_PAYLOAD)
    return RunSpec(run_id, task, payload, **kw)


def server_ms(client: Any) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_create_run_creates_a_pending_record_with_every_field_given(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    s = spec(
        "r1", task="mail", max_attempts=5, lease_ms=7_000, timeout_ms=3_000, job_id="job-a",
        scheduled_for_ms=NOW - 5,
    )
    assert create(runner, pk, s, now=NOW) == [True]
    assert redis_client.hgetall(pk.run("r1")) == {
        "state": "pending",
        "task": "mail",
        "payload": ARGS_PAYLOAD,
        "due": str(NOW),
        "max_attempts": "5",
        "lease_ms": "7000",
        "timeout_ms": "3000",
        "job": "job-a",
        "scheduled_for": str(NOW - 5),
        "created": str(NOW),
    }


def test_create_run_stores_no_field_left_at_its_default(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """Attempt and fence are 0, lease and timeout 0 (the worker's), no job: none stored; the
    queue is in the key. Readers treat a missing field as its default."""
    assert create(runner, pk, spec("r1", max_attempts=3), now=NOW) == [True]
    assert redis_client.hgetall(pk.run("r1")) == {
        "state": "pending",
        "task": "t",
        "payload": ARGS_PAYLOAD,
        "due": str(NOW),
        "max_attempts": "3",
        "created": str(NOW),
    }


def test_create_run_returns_the_now_it_used(runner: ScriptRunner, pk: PartitionKeys) -> None:
    reply = runner.run(CREATE_RUN.call(pk, [spec("r1")], now=123_456))
    assert int(reply[0]) == 123_456


def test_create_run_batch_reports_created_and_existing_per_run(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    assert create(runner, pk, spec("a"), spec("c"), now=NOW) == [True, True]
    assert create(runner, pk, spec("a"), spec("b"), spec("c"), spec("d"), now=NOW) == [
        False,
        True,
        False,
        True,
    ]
    assert sorted(redis_client.zrange(pk.due, 0, -1)) == ["a", "b", "c", "d"]


def test_create_run_same_id_twice_in_one_batch_creates_it_once(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    created = create(runner, pk, spec("a", task="first"), spec("a", task="second"), now=NOW)
    assert created == [True, False]
    assert redis_client.hget(pk.run("a"), "task") == "first"
    assert redis_client.hget(pk.stats, "created") == "1"


def test_create_run_never_overwrites_an_existing_run(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a", task="first", due_at_ms=5_000), now=1_000)
    before = redis_client.hgetall(pk.run("a"))
    again = spec("a", task="second", payload="{}", due_at_ms=9_000)
    assert create(runner, pk, again, now=2_000) == [False]
    assert redis_client.hgetall(pk.run("a")) == before
    assert redis_client.zscore(pk.due, "a") == 5_000
    assert redis_client.llen(pk.history("a")) == 0


def test_create_run_refuses_to_recreate_a_run_in_any_state(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a"), now=1_000)
    claimed = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w", 30_000, 60_000, now=1_000)))
    c = claimed.runs[0]
    runner.run(COMPLETE.call(pk, [("a", c.fence, "1")], 60_000, now=2_000))
    assert create(runner, pk, spec("a"), now=3_000) == [False]
    assert redis_client.hget(pk.run("a"), "state") == "done"
    assert redis_client.zscore(pk.due, "a") is None


def test_create_run_due_defaults_to_now(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a"), now=42_000)
    assert redis_client.hget(pk.run("a"), "due") == "42000"
    assert redis_client.zscore(pk.due, "a") == 42_000


def test_create_run_due_is_now_plus_delay(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a", delay_ms=2_500), now=42_000)
    assert redis_client.hget(pk.run("a"), "due") == "44500"
    assert redis_client.zscore(pk.due, "a") == 44_500


def test_create_run_absolute_due_at_wins_over_delay(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a", due_at_ms=90_000, delay_ms=2_500), now=42_000)
    assert redis_client.zscore(pk.due, "a") == 90_000
    assert redis_client.hget(pk.run("a"), "due") == "90000"


def test_create_run_accepts_a_due_time_in_the_past(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a", due_at_ms=10), now=42_000)
    assert redis_client.zscore(pk.due, "a") == 10


def test_create_run_stores_scheduled_for_only_when_given(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    plain, scheduled = spec("plain"), spec("job@60", job_id="job", scheduled_for_ms=60_000)
    create(runner, pk, plain, scheduled, now=NOW)
    assert not redis_client.hexists(pk.run("plain"), "scheduled_for")
    assert redis_client.hget(pk.run("job@60"), "scheduled_for") == "60000"
    assert redis_client.hget(pk.run("job@60"), "job") == "job"


def test_create_run_pushes_a_wake_token_and_never_grows_the_wake_list_past_eight(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("first"), now=NOW)
    assert redis_client.llen(pk.wake) == 1
    for i in range(10):
        create(runner, pk, *(spec(f"r{i}-{j}") for j in range(3)), now=NOW)
    assert redis_client.llen(pk.wake) == 8


def test_create_run_pushes_one_token_per_created_run_up_to_eight(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, *(spec(f"a{j}") for j in range(3)), now=NOW)
    assert redis_client.llen(pk.wake) == 3
    redis_client.delete(pk.wake)
    create(runner, pk, *(spec(f"b{j}") for j in range(20)), now=NOW)
    assert redis_client.llen(pk.wake) == 8


def test_create_run_pushes_no_wake_token_when_nothing_was_created(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a"), now=NOW)
    redis_client.delete(pk.wake)
    assert create(runner, pk, spec("a"), now=NOW) == [False]
    assert redis_client.llen(pk.wake) == 0


def test_create_run_counts_created_runs_in_stats(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a"), spec("b"), now=NOW)
    create(runner, pk, spec("b"), spec("c"), now=NOW)
    assert redis_client.hget(pk.stats, "created") == "3"


def test_create_run_records_creation_in_the_record_not_in_the_history(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    create(runner, pk, spec("a", delay_ms=500), now=7_000)
    assert redis_client.hmget(pk.run("a"), "created", "due") == ["7000", "7500"]
    assert not redis_client.exists(pk.history("a"))


def test_create_run_keeps_a_run_id_with_braces_in_the_partition_slot(
    runner: ScriptRunner, redis_client: Any
) -> None:
    pk = PartitionKeys("default", 3)
    run_id = "{other}:x}{"
    assert create(runner, pk, spec(run_id), now=NOW) == [True]
    assert redis_client.hget(pk.run(run_id), "state") == "pending"
    assert key_slot(pk.run(run_id).encode()) == key_slot(pk.due.encode())
    assert key_slot(pk.history(run_id).encode()) == key_slot(pk.due.encode())
    assert key_slot(pk.due.encode()) != key_slot(b"other")


def test_create_run_writes_only_keys_of_its_partition(
    runner: ScriptRunner, redis_client: Any
) -> None:
    pk = PartitionKeys("default", 2)
    create(runner, pk, spec("a"), spec("b"), now=NOW)
    keys = set(redis_client.keys("*"))
    assert keys == {pk.run("a"), pk.run("b"), pk.due, pk.wake, pk.stats, pk.seq, pk.events}


def test_scripts_use_the_server_clock_when_no_now_is_given(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """Invariant 4 for every script: with now=None each one decides with Redis TIME."""
    lo = server_ms(redis_client)
    created = runner.run(CREATE_RUN.call(pk, [spec("a"), spec("b"), spec("c", delay_ms=60_000)]))
    claim = CLAIM.parse(runner.run(CLAIM.call(pk, 2, "w", 30_000, 60_000)))
    by_id = {r.run_id: r for r in claim.runs}
    beat = runner.run(HEARTBEAT.call(pk, [("a", by_id["a"].fence)], 40_000))
    runner.run(FENCED_WRITE.call(pk, "res", by_id["a"].fence, "v", "a"))  # while a runs
    runner.run(COMPLETE.call(pk, [("a", by_id["a"].fence, "1")], 60_000))
    retry = FAIL.parse(runner.run(FAIL.call(pk, "b", by_id["b"].fence, "x", 5_000, 1)))
    runner.run(CANCEL.call(pk, "c", 60_000, "stop"))
    runner.run(REQUEUE.call(pk, "c"))
    hi = server_ms(redis_client)

    def within(value: Any, offset: int = 0) -> None:
        assert lo + offset <= int(value) <= hi + offset, (lo, value, hi)

    within(created[0])
    for run_id in "abc":
        within(redis_client.hget(pk.run(run_id), "created"))
    # cancelled before its due time, requeued: due at that time again (server's now + 60 s)
    within(redis_client.zscore(pk.due, "c") or 0, 60_000)
    within(claim.now_ms)
    assert set(by_id) == {"a", "b"}
    for r in claim.runs:
        within(r.lease_until_ms, 30_000)
    within(beat[0])
    within(beat[1], 40_000)
    within(redis_client.hget(pk.run("a"), "finished"))
    assert retry.retry_at_ms is not None
    within(retry.retry_at_ms, 5_000)
    within(redis_client.hget(pk.run("c"), "due"), 60_000)
    within(redis_client.hget(pk.fence_resource("res"), "at"))
    # and the released run's due is the server's now too
    lo = server_ms(redis_client)
    runner.run(CREATE_RUN.call(pk, [spec("d")]))
    claim2 = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w", 30_000, 60_000)))
    (c,) = claim2.runs
    runner.run(RELEASE.call(pk, c.run_id, c.fence))
    hi = server_ms(redis_client)
    within(redis_client.zscore(pk.due, c.run_id) or 0)


def test_create_run_batch_mixing_tasks_and_options_keeps_each_runs_own_fields(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    """Consecutive runs with the same task and options share one group on the wire; a change
    starts a new group, and the flags still come back in the callers' order."""
    batch = [
        spec("a1", task="a"),
        spec("a2", task="a"),
        spec("b1", task="b", lease_ms=9_000),
        spec("a3", task="a", max_attempts=7),
        spec("a4", task="a", timeout_ms=1_000, job_id="j", scheduled_for_ms=NOW - 1),
    ]
    assert create(runner, pk, spec("a2", task="a"), now=NOW) == [True]
    assert create(runner, pk, *batch, now=NOW) == [True, False, True, True, True]
    got = {r: redis_client.hgetall(pk.run(r)) for r in ("a1", "b1", "a3", "a4")}
    assert (got["a1"]["task"], got["a1"]["max_attempts"], got["a1"].get("lease_ms")) == (
        "a", "3", None
    )
    assert (got["b1"]["task"], got["b1"]["lease_ms"]) == ("b", "9000")
    assert (got["a3"]["task"], got["a3"]["max_attempts"], got["a3"].get("lease_ms")) == (
        "a", "7", None
    )
    assert (got["a4"]["timeout_ms"], got["a4"]["job"], got["a4"]["scheduled_for"]) == (
        "1000", "j", str(NOW - 1)
    )
    assert len(CREATE_RUN.call(pk, batch).args) == 2 + 4 * 6 + 5 * 8  # 4 groups, 5 runs
