"""JobQueue, the app-facing client: enqueue (idempotent by run id), validation before any
write, look-ups, cancel/requeue, run ids, partitions, decoding, NOSCRIPT recovery."""

from __future__ import annotations

import hashlib
import math
import pickle
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis
from helpers import claim
from redis.crc import key_slot

from jobqueue import (
    ConfigError,
    JobQueue,
    OperationRefused,
    PayloadError,
    Request,
    RunNotFound,
    RunTimeout,
    Settings,
    UnknownTask,
)
from jobqueue.context import RunContext
from jobqueue.errors import InvalidRunId, ServerRefused
from jobqueue.payload import encode_payload
from jobqueue.store.keys import QUEUES_KEY, PartitionKeys
from jobqueue.store.runs import CLAIM, COMPLETE, CREATE_RUN, ClaimResult, RunSpec
from jobqueue.store.scripts import ScriptRunner, scripts


def register(jq: JobQueue) -> Any:
    @jq.task(max_attempts=4, lease=12, timeout=5)
    def add(x: int, y: int = 0) -> int:
        return x + y

    return add


def run_keys(client: Any) -> list[str]:
    """Every key but the queue registry."""
    return sorted(k for k in client.keys("*") if k != QUEUES_KEY)


# -- enqueue ---------------------------------------------------------------------------------


def test_enqueue_returns_a_handle_with_run_id_and_created_true(jq: JobQueue,
                                                               redis_client: Any) -> None:
    add = register(jq)
    handle = jq.enqueue(add.with_options(run_id="r1"), 1, y=2)
    assert (handle.run_id, handle.created, handle.queue) == ("r1", True, "default")
    assert redis_client.hget(PartitionKeys("default", 0).run("r1"), "state") == "pending"


def test_enqueue_without_run_id_generates_a_fresh_one_each_time(jq: JobQueue) -> None:
    add = register(jq)
    a, b = jq.enqueue(add, 1), jq.enqueue(add, 1)
    assert a.created and b.created
    assert a.run_id != b.run_id
    assert jq.get_run(a.run_id).state == jq.get_run(b.run_id).state == "pending"


def test_enqueue_same_run_id_twice_creates_one_run(jq: JobQueue, redis_client: Any) -> None:
    add = register(jq)
    first = jq.enqueue(add.with_options(run_id="once"), 1)
    second = jq.enqueue(add.with_options(run_id="once"), 99)
    assert (first.created, second.created) == (True, False)
    assert second.run_id == "once"
    assert jq.get_run("once").args == [1]
    assert redis_client.zcard(PartitionKeys("default", 0).due) == 1
    assert redis_client.hget(PartitionKeys("default", 0).stats, "created") == "1"


def test_enqueue_accepts_a_task_object_a_function_or_a_name(jq: JobQueue) -> None:
    add = register(jq)
    handles = [jq.enqueue(add, 1), jq.enqueue(add.func, 1), jq.enqueue("add", 1)]
    assert {jq.get_run(h.run_id).task for h in handles} == {"add"}


def test_task_enqueue_shorthand_enqueues_on_its_jobqueue(jq: JobQueue) -> None:
    add = register(jq)
    handle = add.with_options(run_id="short").enqueue(3, y=4)
    assert handle.created
    run = jq.get_run("short")
    assert (run.args, run.kwargs) == ([3], {"y": 4})


def test_enqueue_stores_the_task_options(jq: JobQueue) -> None:
    register(jq)
    run = jq.get_run(jq.enqueue(jq.resolve_task("add").with_options(run_id="opts"), 1).run_id)
    assert (run.max_attempts, run.queue, run.attempt, run.fence) == (4, "default", 0, 0)
    (claimed,) = claim_all(jq, "opts").runs
    assert claimed.timeout_ms == 5_000
    assert claimed.lease_until_ms - claimed_now(jq, "opts") == 12_000


def test_enqueue_many_pipelines_and_reports_per_run(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    jq = JobQueue(redis_client, partitions={"default": 4})
    add = register(jq)
    jq.enqueue(add.with_options(run_id="job-2@1"), 0)
    ids = [f"job-{i}@1" for i in range(8)]
    assert len({jq.keys_for("default", r) for r in ids}) > 1  # several partitions

    def no_single_calls(call: Any) -> Any:
        raise AssertionError("enqueue_many must pipeline its script calls")

    monkeypatch.setattr(jq.scripts, "run", no_single_calls)
    handles = jq.enqueue_many(Request(add, (i,), run_id=r) for i, r in enumerate(ids))
    assert [h.run_id for h in handles] == ids
    assert [h.created for h in handles] == [r != "job-2@1" for r in ids]
    monkeypatch.undo()
    for i, r in enumerate(ids):
        assert jq.get_run(r).args == ([0] if r == "job-2@1" else [i])


def test_enqueue_many_with_a_repeated_run_id_creates_it_once(jq: JobQueue) -> None:
    add = register(jq)
    handles = jq.enqueue_many(
        [Request(add, (1,), run_id="dup"), Request(add, (2,), run_id="other"),
         Request(add, (3,), run_id="dup")]
    )
    assert [h.created for h in handles] == [True, True, False]
    assert jq.get_run("dup").args == [1]


def test_enqueue_many_of_nothing_returns_no_handles(jq: JobQueue, redis_client: Any) -> None:
    register(jq)
    assert jq.enqueue_many([]) == []
    assert run_keys(redis_client) == []


def test_enqueue_many_validates_every_request_before_writing_any(
    jq: JobQueue, redis_client: Any
) -> None:
    add = register(jq)
    with pytest.raises(PayloadError):
        jq.enqueue_many([Request(add, (1,), run_id="good"), Request(add, (object(),))])
    assert run_keys(redis_client) == []


def test_enqueue_to_an_explicit_queue_uses_that_queues_keys(jq: JobQueue,
                                                             redis_client: Any) -> None:
    add = register(jq)
    handle = jq.enqueue(add.with_options(run_id="q", queue="other"), 1)
    assert handle.queue == "other"
    assert redis_client.exists(PartitionKeys("other", 0).run("q"))
    assert not redis_client.exists(PartitionKeys("default", 0).run("q"))
    assert jq.get_run("q").queue == "other"
    assert jq.queues() == {"other": 1}


# -- time ------------------------------------------------------------------------------------


def test_enqueue_with_delay_is_due_delay_after_creation(jq: JobQueue) -> None:
    add = register(jq)
    run = jq.get_run(jq.enqueue(add.with_options(delay=5, run_id="d"), 1).run_id)
    assert run.due_ms is not None and run.created_ms is not None
    assert run.due_ms - run.created_ms == 5_000


def test_enqueue_with_timedelta_delay(jq: JobQueue) -> None:
    add = register(jq)
    run = jq.get_run(jq.enqueue(
        add.with_options(delay=timedelta(minutes=2, milliseconds=7), run_id="d"), 1
    ).run_id)
    assert run.due_ms is not None and run.created_ms is not None
    assert run.due_ms - run.created_ms == 120_007


def test_enqueue_without_delay_is_due_at_creation(jq: JobQueue) -> None:
    add = register(jq)
    run = jq.get_run(jq.enqueue(add.with_options(run_id="d"), 1).run_id)
    assert run.due_ms == run.created_ms


def test_enqueue_at_an_aware_datetime_is_due_then(jq: JobQueue, redis_client: Any) -> None:
    add = register(jq)
    at = datetime(2031, 3, 4, 5, 6, 7, 890_000, tzinfo=timezone(timedelta(hours=2)))
    jq.enqueue(add.with_options(at=at, run_id="at"), 1)
    expected = int(datetime(2031, 3, 4, 3, 6, 7, 890_000, tzinfo=UTC).timestamp() * 1000)
    assert jq.get_run("at").due_ms == expected
    assert redis_client.zscore(PartitionKeys("default", 0).due, "at") == expected


def test_enqueue_at_a_naive_datetime_is_refused(jq: JobQueue, redis_client: Any) -> None:
    add = register(jq)
    with pytest.raises(ConfigError):
        jq.enqueue(add.with_options(at=datetime(2031, 1, 1), run_id="naive"), 1)
    assert run_keys(redis_client) == []


def test_enqueue_with_delay_and_at_together_is_refused(jq: JobQueue, redis_client: Any) -> None:
    add = register(jq)
    with pytest.raises(ConfigError):
        jq.enqueue(add.with_options(delay=1, at=datetime(2031, 1, 1, tzinfo=UTC), run_id="both"), 1)
    assert run_keys(redis_client) == []


@pytest.mark.parametrize("delay", [-1, math.nan, math.inf, "5", True])
def test_enqueue_with_a_bad_delay_is_refused(jq: JobQueue, redis_client: Any, delay: Any) -> None:
    add = register(jq)
    with pytest.raises(ConfigError):
        jq.enqueue(add.with_options(delay=delay, run_id="bad"), 1)
    assert run_keys(redis_client) == []


# -- refusals --------------------------------------------------------------------------------


def test_enqueue_of_an_unknown_task_name_raises_unknown_task(jq: JobQueue,
                                                            redis_client: Any) -> None:
    register(jq)
    with pytest.raises(UnknownTask):
        jq.enqueue("nope", 1)
    assert run_keys(redis_client) == []


def test_enqueue_of_an_unregistered_function_raises_unknown_task(jq: JobQueue) -> None:
    register(jq)

    def add(x: int) -> int:  # same name as the registered task, different function
        return x

    with pytest.raises(UnknownTask):
        jq.enqueue(add, 1)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((object(),), {}), ((float("nan"),), {}), ((), {"x": float("inf")}), (({1, 2},), {}),
     ((bytearray(b"bytes"),), {})],
    ids=["object", "nan", "inf-kwarg", "set", "bytearray"],
)
def test_unserialisable_argument_raises_payload_error_and_writes_no_run(
    jq: JobQueue, redis_client: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    add = register(jq)
    with pytest.raises(PayloadError):
        jq.enqueue(add.with_options(run_id="bad"), *args, **kwargs)
    assert run_keys(redis_client) == []
    with pytest.raises(RunNotFound):
        jq.get_run("bad")


def test_refused_enqueue_writes_nothing_at_all(jq: JobQueue, redis_client: Any) -> None:
    """Validation comes before any write: not even the queue registry is touched."""
    add = register(jq)
    with pytest.raises(PayloadError):
        jq.enqueue(add.with_options(run_id="bad"), object())
    assert redis_client.keys("*") == []


def test_payload_over_the_limit_raises_payload_error_and_writes_nothing(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client, settings=Settings(max_payload_bytes=100))
    add = register(jq)
    with pytest.raises(PayloadError):
        jq.enqueue(add.with_options(run_id="big"), "x" * 100)
    assert run_keys(redis_client) == []


def test_payload_exactly_at_the_limit_is_accepted(redis_client: Any) -> None:
    text = "é" * 10
    size = len(encode_payload([text], {}).encode())
    jq = JobQueue(redis_client, settings=Settings(max_payload_bytes=size))
    add = register(jq)
    assert jq.enqueue(add.with_options(run_id="fits"), text).created
    assert jq.get_run("fits").args == [text]
    jq_small = JobQueue(redis_client, settings=Settings(max_payload_bytes=size - 1))
    add_small = register(jq_small)
    with pytest.raises(PayloadError):
        jq_small.enqueue(add_small.with_options(run_id="too-big"), text)


# -- look-ups, cancel, requeue ---------------------------------------------------------------


def test_get_run_of_unknown_id_raises_run_not_found(jq: JobQueue) -> None:
    register(jq)
    jq.enqueue(jq.resolve_task("add").with_options(run_id="exists"), 1)
    with pytest.raises(RunNotFound):
        jq.get_run("missing")
    with pytest.raises(RunNotFound):
        jq.get_run("exists", queue="other")


def test_get_run_on_an_empty_server_raises_run_not_found(jq: JobQueue) -> None:
    with pytest.raises(RunNotFound):
        jq.get_run("missing")
    assert jq.find_run("missing") is None


def test_get_run_returns_the_stored_run(jq: JobQueue, redis_client: Any) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="r"), 1)
    run = jq.get_run("r")
    assert (run.run_id, run.state, run.task, run.queue, run.partition) == (
        "r", "pending", "add", "default", 0
    )
    assert run.owner is None and run.lease_until_ms is None and run.finished_ms is None
    assert not run.finished
    assert run.created_ms is not None and run.due_ms == run.created_ms
    assert (run.attempt, run.fence, run.job_id) == (0, 0, "")
    assert run.history == []  # the history starts at the first claim


def test_cancel_pending_returns_pending_and_a_second_cancel_is_refused(jq: JobQueue) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="c"), 1)
    assert jq.cancel("c", reason="not needed") == "pending"
    run = jq.get_run("c")
    assert (run.state, run.error, run.finished) == ("cancelled", "not needed", True)
    with pytest.raises(OperationRefused):
        jq.cancel("c")


def test_cancel_of_an_unknown_run_raises_run_not_found(jq: JobQueue) -> None:
    register(jq)
    jq.enqueue("add", 1)
    with pytest.raises(RunNotFound):
        jq.cancel("missing")


def test_cancelled_record_keeps_its_run_id_for_the_done_retention(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client, settings=Settings(done_retention_s=90))
    add = register(jq)
    jq.enqueue(add.with_options(run_id="c"), 1)
    jq.cancel("c")
    assert 80_000 < redis_client.pttl(PartitionKeys("default", 0).run("c")) <= 90_000
    assert not jq.enqueue(add.with_options(run_id="c"), 1).created


def test_requeue_a_cancelled_run(jq: JobQueue) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="c"), 1)
    jq.cancel("c")
    assert jq.requeue("c") == "cancelled"
    run = jq.get_run("c")
    assert (run.state, run.attempt, run.finished_ms) == ("pending", 0, None)
    assert [r.run_id for r in claim_all(jq, "c").runs] == ["c"]


def test_requeue_of_a_done_run_is_refused_without_force(jq: JobQueue) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="d"), 1)
    complete_now(jq, "d")
    with pytest.raises(OperationRefused, match="force=True"):
        jq.requeue("d")
    assert jq.get_run("d").state == "done"


def test_requeue_of_a_done_run_with_force_shows_only_the_new_life(jq: JobQueue) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="d"), 1)
    complete_now(jq, "d")
    assert jq.requeue("d", force=True) == "done"
    run = jq.get_run("d")
    assert (run.state, run.result, run.error, run.owner, run.started_ms) == (
        "pending", None, None, None, None
    )
    events = [text for _, text in run.timeline()]
    assert any(e.startswith("done fence=") for e in events)
    assert events[-1] == "requeued (was done)"


def test_requeue_of_a_pending_run_is_refused(jq: JobQueue) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id="p"), 1)
    with pytest.raises(OperationRefused):
        jq.requeue("p")


# -- run ids ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "run_id", ["", "x" * 600, "x" * 513, "line\nbreak", "nul\x00", "tab\tbed", "del\x7f", "\x1b[0m"]
)
def test_invalid_run_ids_are_refused(jq: JobQueue, redis_client: Any, run_id: str) -> None:
    add = register(jq)
    with pytest.raises(InvalidRunId):
        jq.enqueue(add.with_options(run_id=run_id), 1)
    with pytest.raises(InvalidRunId):
        jq.get_run(run_id)
    assert run_keys(redis_client) == []


def test_a_run_id_of_the_maximum_length_is_accepted(jq: JobQueue) -> None:
    add = register(jq)
    run_id = "y" * 512
    assert jq.enqueue(add.with_options(run_id=run_id), 1).created
    assert jq.get_run(run_id).run_id == run_id


ODD_IDS = [
    "with spaces  inside ",
    "ünïcødé ✓ 日本語",
    "emoji 🎉 and 𝄞",
    "user@example.com",
    "a@b@c",
    "@",
    "trailing@",
    "colons:in:it:",
    "{default#1}",
    "{other}",
    "}{",
    "{",
    "}",
    "{}",
    "*?[glob]\\",
    "'\"quotes\"'",
]


@pytest.mark.parametrize("partitions", [1, 4])
@pytest.mark.parametrize("run_id", ODD_IDS)
def test_odd_but_legal_run_ids_round_trip(
    redis_client: Any, run_id: str, partitions: int
) -> None:
    jq = JobQueue(redis_client, partitions={"default": partitions})
    add = register(jq)
    assert jq.enqueue(add.with_options(run_id=run_id), run_id).created
    assert not jq.enqueue(add.with_options(run_id=run_id), run_id).created
    run = jq.get_run(run_id)
    assert (run.run_id, run.state, run.args) == (run_id, "pending", [run_id])
    pk = jq.keys_for("default", run_id)
    assert run.partition == pk.partition
    assert redis_client.hget(pk.run(run_id), "state") == "pending"
    assert redis_client.zscore(pk.due, run_id) is not None
    (claimed,) = claim_all(jq, run_id).runs
    assert claimed.run_id == run_id
    assert jq.cancel(run_id) == "running"


@pytest.mark.parametrize("run_id", ["{x}", "{other}:a", "}{evil}", "{default#3}"])
def test_braces_in_a_run_id_do_not_change_the_hash_slot(
    jq: JobQueue, redis_client: Any, run_id: str
) -> None:
    add = register(jq)
    jq.enqueue(add.with_options(run_id=run_id), 1)
    pk = PartitionKeys("default", 0)
    slot = key_slot(pk.due.encode())
    assert redis_client.exists(pk.run(run_id))
    assert key_slot(pk.run(run_id).encode()) == slot
    assert key_slot(pk.history(run_id).encode()) == slot


def test_runs_of_one_job_share_a_partition(redis_client: Any) -> None:
    jq = JobQueue(redis_client, partitions={"default": 8})
    parts = {jq.keys_for("default", f"nightly@{t}").partition for t in range(20)}
    assert len(parts) == 1
    spread = {jq.keys_for("default", f"job-{i}@1").partition for i in range(40)}
    assert len(spread) > 1


# -- partitions ------------------------------------------------------------------------------


def test_queue_partition_count_mismatch_raises_config_error(redis_client: Any) -> None:
    first = JobQueue(redis_client, partitions={"default": 4})
    first.enqueue(register(first), 1)
    other = JobQueue(redis_client, partitions={"default": 2})
    add = register(other)
    with pytest.raises(ConfigError):
        other.enqueue(add.with_options(run_id="mismatch"), 1)
    assert not redis_client.keys("*mismatch*")
    assert first.queues() == {"default": 4}


def test_a_client_without_partition_config_adopts_the_recorded_count_on_enqueue(
    redis_client: Any,
) -> None:
    first = JobQueue(redis_client, partitions={"default": 4})
    first.enqueue(register(first), 1)
    plain = JobQueue(redis_client)
    plain.enqueue(register(plain).with_options(run_id="adopt"), 1)
    assert plain.partitions_of("default") == 4
    assert first.get_run("adopt").partition == first.keys_for("default", "adopt").partition


def test_a_client_without_partition_config_finds_runs_of_a_partitioned_queue(
    redis_client: Any,
) -> None:
    writer = JobQueue(redis_client, partitions={"default": 4})
    add = register(writer)
    ids = [f"job-{i}@1" for i in range(12)]
    writer.enqueue_many(Request(add, (1,), run_id=r) for r in ids)
    assert {writer.keys_for("default", r).partition for r in ids} != {0}
    reader = JobQueue(redis_client)  # e.g. the ops CLI: it only knows the URL
    for r in ids:
        assert reader.get_run(r).run_id == r


def test_partition_count_must_be_a_positive_integer(redis_client: Any) -> None:
    for bad in (0, -1, 2.0, "4"):
        with pytest.raises(ConfigError):
            JobQueue(redis_client, partitions={"default": bad})  # type: ignore[dict-item]


# -- decoding --------------------------------------------------------------------------------


def claim_all(jq: JobQueue, run_id: str) -> ClaimResult:
    pk = jq.keys_for("default", run_id)
    return claim(jq.scripts, pk, limit=100, owner="test-worker", retention_ms=60_000)


def complete_now(jq: JobQueue, run_id: str) -> None:
    (c,) = claim_all(jq, run_id).runs
    pk = jq.keys_for("default", run_id)
    jq.scripts.run(COMPLETE.call(pk, [(run_id, c.fence, "3")], 60_000))


def claimed_now(jq: JobQueue, run_id: str) -> int:
    started = jq.get_run(run_id).started_ms
    assert started is not None
    return started


@pytest.mark.parametrize(
    ("args", "kwargs", "why"),
    [((), {}, "missing a required argument: 'x'"), ((1, 2, 3), {}, "too many positional"),
     ((1,), {"bogus": 1}, "unexpected keyword argument 'bogus'")],
)
def test_arguments_that_do_not_fit_the_tasks_signature_are_refused_and_nothing_is_written(
    jq: JobQueue, args: tuple[Any, ...], kwargs: dict[str, Any], why: str
) -> None:
    add = register(jq)
    with pytest.raises(PayloadError, match=why):
        add.with_options(run_id="r").enqueue(*args, **kwargs)
    assert jq.find_run("r") is None


def test_a_tasks_ctx_parameter_is_not_an_argument_to_enqueue(jq: JobQueue) -> None:
    @jq.task
    def report(ctx: RunContext, day: str) -> None:
        return None

    report.with_options(run_id="r").enqueue(day="monday")
    assert jq.get_run("r").kwargs == {"day": "monday"}
    with pytest.raises(PayloadError):
        report.enqueue()


def test_run_args_kwargs_and_result_decode(jq: JobQueue) -> None:
    @jq.task
    def keep(*args: Any, **kwargs: Any) -> None:
        return None

    keep.with_options(run_id="r").enqueue(1, [2, "three"], None, y={"nested": [True, 1.5]}, z="ü")
    run = jq.get_run("r")
    assert run.args == [1, [2, "three"], None]
    assert run.kwargs == {"y": {"nested": [True, 1.5]}, "z": "ü"}
    assert run.result is None
    (c,) = claim_all(jq, "r").runs
    result_json = '{"sum":3,"items":["a",null]}'
    pk = jq.keys_for("default", "r")
    call = COMPLETE.call(pk, [("r", c.fence, result_json)], 60_000)
    (outcome,) = COMPLETE.parse(jq.scripts.run(call))
    assert outcome.accepted
    done = jq.get_run("r")
    assert done.result == {"sum": 3, "items": ["a", None]}
    assert done.result_json == result_json
    assert done.to_dict()["args"] == [1, [2, "three"], None]


def test_handle_refresh_state_and_result_follow_the_run(jq: JobQueue) -> None:
    add = register(jq)
    handle = jq.enqueue(add.with_options(run_id="h"), 1)
    assert handle.state == "pending"
    (c,) = claim_all(jq, "h").runs
    assert handle.state == "running"
    pk = jq.keys_for("default", "h")
    jq.scripts.run(COMPLETE.call(pk, [("h", c.fence, "42")], 60_000))
    assert handle.result(timeout=1) == 42
    assert handle.wait(timeout=1).state == "done"


def test_handle_wait_gives_up_with_run_timeout(jq: JobQueue) -> None:
    add = register(jq)
    handle = jq.enqueue(add.with_options(run_id="slow"), 1)
    with pytest.raises(RunTimeout):
        handle.wait(timeout=0.05, poll=0.01)


# -- NOSCRIPT --------------------------------------------------------------------------------


def test_runner_run_recovers_after_script_flush(runner: ScriptRunner, pk: PartitionKeys,
                                                redis_client: Any) -> None:
    spec = RunSpec("a", "t", "{}")
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [spec], now=1))) == [True]
    redis_client.script_flush()
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [spec], now=2))) == [False]
    redis_client.script_flush()
    claimed = CLAIM.parse(runner.run(CLAIM.call(pk, 1, "w", 1_000, 1, now=3)))
    assert [r.run_id for r in claimed.runs] == ["a"]


def test_runner_run_many_recovers_after_script_flush(
    runner: ScriptRunner, pk: PartitionKeys, redis_client: Any
) -> None:
    runner.load()
    redis_client.script_flush()
    other = PartitionKeys("default", 1)
    calls = [
        CREATE_RUN.call(pk, [RunSpec("a", "t", "{}")], now=1),
        CREATE_RUN.call(other, [RunSpec("b", "t", "{}")], now=1),
        CLAIM.call(pk, 5, "w", 1_000, 1, now=2),
        CREATE_RUN.call(pk, [RunSpec("a", "t", "{}")], now=3),
    ]
    replies = runner.run_many(calls)
    assert CREATE_RUN.parse(replies[0]) == [True]
    assert CREATE_RUN.parse(replies[1]) == [True]
    assert [r.run_id for r in CLAIM.parse(replies[2]).runs] == ["a"]
    # each call ran exactly once: the claim saw one run and the last create found it
    assert CREATE_RUN.parse(replies[3]) == [False]
    assert redis_client.hget(pk.stats, "claimed") == "1"
    assert redis_client.hget(pk.run("a"), "fence") == str(CLAIM.parse(replies[2]).runs[0].fence)


class ForgetfulServer:
    """A client of a server whose script cache is emptied again right after every load (as
    by a SCRIPT FLUSH from elsewhere, each time): every EVALSHA is answered NOSCRIPT."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def script_load(self, source: str) -> Any:
        return hashlib.sha1(source.encode()).hexdigest()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_script_the_server_never_keeps_is_refused_for_now_and_nothing_runs(
    pk: PartitionKeys, redis_client: Any
) -> None:
    """NOSCRIPT after every reload: the call did not run, so it is a refusal the daemons
    send again (ServerRefused), never a script error whose outcome is unknown."""
    redis_client.script_flush()
    runner = ScriptRunner(ForgetfulServer(redis_client))
    call = CREATE_RUN.call(pk, [RunSpec("a", "t", "{}")], now=1)
    with pytest.raises(ServerRefused):
        runner.run(call)
    with pytest.raises(ServerRefused):
        runner.run_many([call, call])
    assert [type(reply) for reply in runner.run_each([call])] == [ServerRefused]
    assert redis_client.exists(pk.run("a")) == 0


class ServerWithoutShebang:
    """A client of a server that cannot parse a '#!lua' line (Redis 6 does this), which lets
    ``meanwhile`` run just before it refuses the first call (another thread of the same
    process learning the plain form in between)."""

    REFUSAL = "Error compiling script (new function): user_script:1: unexpected symbol near '#'"

    def __init__(self, client: Any) -> None:
        self.client = client
        self.meanwhile: Any = None
        self.shebang_shas = {s.sha for s in scripts().values()}

    def evalsha(self, sha: str, *args: Any) -> Any:
        if sha in self.shebang_shas:
            if self.meanwhile is not None:
                meanwhile, self.meanwhile = self.meanwhile, None
                meanwhile()
            raise redis.exceptions.ResponseError(self.REFUSAL)
        return self.client.evalsha(sha, *args)

    def script_load(self, source: str) -> Any:
        if source.startswith("#!"):
            raise redis.exceptions.ResponseError(self.REFUSAL)
        return self.client.script_load(source)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_a_call_refused_for_its_lua_line_after_another_learnt_the_plain_form_is_sent_again(
    redis_client: Any, pk: PartitionKeys
) -> None:
    server = ServerWithoutShebang(redis_client)
    runner = ScriptRunner(server)
    other = PartitionKeys("default", 1)
    server.meanwhile = lambda: runner.run(CREATE_RUN.call(other, [RunSpec("b", "t", "{}")]))
    assert CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, [RunSpec("a", "t", "{}")]))) == [True]
    assert redis_client.exists(pk.run("a"), other.run("b")) == 2


def test_enqueue_and_enqueue_many_recover_after_script_flush(redis_client: Any) -> None:
    jq = JobQueue(redis_client, partitions={"default": 4})
    add = register(jq)
    jq.enqueue(add.with_options(run_id="warm"), 1)
    redis_client.script_flush()
    assert jq.enqueue(add.with_options(run_id="after-flush"), 1).created
    redis_client.script_flush()
    handles = jq.enqueue_many(Request(add, (i,), run_id=f"job-{i}@1") for i in range(6))
    assert all(h.created for h in handles)
    redis_client.script_flush()
    assert jq.cancel("after-flush") == "pending"


def test_get_run_of_a_record_with_a_binary_payload_raises_payload_error(
    jq: JobQueue, redis_client: Any
) -> None:
    """A record written by something else (here a pickle, protocol 4) is reported as a
    PayloadError, the typed error for stored arguments that are not JSON."""
    jq.declare_task("t")
    jq.enqueue(jq.resolve_task("t").with_options(run_id="binary"), 1)
    redis_client.hset(PartitionKeys("default", 0).run("binary"), "payload",
                      pickle.dumps({"args": [1]}, protocol=4))
    try:
        run = jq.get_run("binary")
    except PayloadError:
        return
    with pytest.raises(PayloadError):
        _ = run.args


def test_repr_names_a_client_given_directly_and_never_a_password(redis_client: Any) -> None:
    assert repr(JobQueue(redis_client)) == f"JobQueue(a {type(redis_client).__name__} client)"
    assert repr(JobQueue.from_url("redis://u:secret@localhost:1/0")) == (
        "JobQueue(redis://u:***@localhost:1/0)"
    )
