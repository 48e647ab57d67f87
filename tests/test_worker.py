"""The worker in-process: ``Worker.run()`` in a thread (no signal handlers), stopped with
``worker.stop()`` (tests/helpers.py). Every test runs on both backends (fakeredis blocks and
wakes on BLPOP with a timeout, checked when this file was written), unless its docstring says
why not. Tests about leases, heartbeats and timeouts run the worker on a fake clock (the
``clock`` fixture), which the server judges leases and due times by too."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import pytest
from helpers import (
    FAST,
    Send,
    busy_slots,
    fake_clock,
    finished,
    held,
    intercept_worker_calls,
    make_worker,
    phase_of,
    running,
    state_is,
    wait_for,
    watch_idle_waits,
)

from jobqueue import Request
from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext
from jobqueue.errors import ConnectionFailed, Fatal
from jobqueue.runtime.clock import REAL_CLOCK, FakeClock
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.store.keys import WORKERS_KEY, partition_of
from jobqueue.store.runs import CLAIM, FENCED_WRITE, ClaimedRun
from jobqueue.store.scripts import Call
from jobqueue.worker import RunPhase
from jobqueue.worker.claiming import Claimer
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.redis_io import RedisIO
from jobqueue.worker.registry import WorkerTasks
from jobqueue.worker.runs import RunTable, WorkerStats
from jobqueue.worker.shared import Shared

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only


def test_the_worker_is_imported_from_the_package_or_its_own_module() -> None:
    import jobqueue
    import jobqueue.worker

    assert jobqueue.Worker is jobqueue.worker.Worker
    assert jobqueue.WorkerStats is jobqueue.worker.WorkerStats
    assert (jobqueue.worker.EXIT_UNHEALTHY, jobqueue.worker.MAX_REJECTED_KEPT) == (4, 1000)


# -- results -------------------------------------------------------------------------------


def test_sync_task_completes_with_its_result(fast_jq: JobQueue) -> None:
    @fast_jq.task
    def add(a: int, b: int) -> int:
        return a + b

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(add, 2, 3)
        run = finished(fast_jq, handle.run_id)
    assert (run.state, run.result, run.attempt) == ("done", 5, 1)


def test_async_task_completes_with_its_result(fast_jq: JobQueue) -> None:
    @fast_jq.task
    async def shout(word: str) -> dict[str, Any]:
        import asyncio

        await asyncio.sleep(0.01)  # kept: a coroutine that suspends a while
        return {"word": word.upper(), "thread": threading.current_thread().name}

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(shout, "hi")
        run = finished(fast_jq, handle.run_id)
    assert run.state == "done"
    assert run.result == {"word": "HI", "thread": "jq-async"}


def test_task_gets_a_context_describing_its_run(fast_jq: JobQueue) -> None:
    seen: dict[str, Any] = {}

    @fast_jq.task
    def inspect_ctx(ctx: RunContext) -> str:
        seen.update(run_id=ctx.run_id, fence=ctx.fence, attempt=ctx.attempt, queue=ctx.queue)
        return "ok"

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(inspect_ctx.with_options(run_id="ctx-run-1"))
        run = finished(fast_jq, handle.run_id)
    assert seen == {"run_id": "ctx-run-1", "fence": run.fence, "attempt": 1, "queue": "default"}


def test_a_worker_shows_its_state_and_the_runs_it_holds_with_their_phases(
    fast_jq: JobQueue,
) -> None:
    started, release = threading.Event(), threading.Event()

    @fast_jq.task
    def held_up() -> str:
        started.set()
        release.wait(5)
        return "ok"

    worker = make_worker(fast_jq)
    assert (worker.state, worker.in_flight(), worker.unhealthy) == ("new", [], None)
    with running(worker):
        wait_for(lambda: worker.state == "running", what="the worker to start")
        handle = fast_jq.enqueue(held_up)
        assert started.wait(5)
        (view,) = worker.in_flight()
        run = fast_jq.get_run(handle.run_id)
        assert (view.run_id, view.fence, view.attempt) == (handle.run_id, run.fence, 1)
        assert view.phase is RunPhase.RUNNING and view.phase.holds_slot
        release.set()
        finished(fast_jq, handle.run_id)
        wait_for(lambda: worker.in_flight() == [], what="the run to be forgotten")
    assert (worker.state, worker.unhealthy) == ("stopped", None)


# -- failures ------------------------------------------------------------------------------


def test_raising_task_retries_with_backoff_then_goes_dead_with_its_error(
    fast_jq: JobQueue,
) -> None:
    calls: list[float] = []

    @fast_jq.task(max_attempts=3, backoff=0.1, backoff_cap=1.0)
    def flaky() -> None:
        calls.append(time.monotonic())
        raise ValueError(f"boom {len(calls)}")

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(flaky)
        run = finished(fast_jq, handle.run_id)
    assert (run.state, run.attempt, len(calls)) == ("dead", 3, 3)
    assert run.error is not None and "ValueError: boom 3" in run.error
    retries = [h for h in run.history if " failed " in h and " retry at " in h]
    assert len(retries) == 2
    # Backoff: equal jitter in [d/2, d] with d = 100 ms, then 200 ms.
    for line, (low, high) in zip(retries, [(50, 100), (100, 200)], strict=True):
        failed_at = int(line.split()[0])
        due = int(line.split(" retry at ")[1].split(":")[0])
        assert low <= due - failed_at <= high, line
    # Each retry waited for its due time before running again.
    assert calls[1] - calls[0] >= 0.045 and calls[2] - calls[1] >= 0.095


def test_fatal_error_goes_dead_at_once(fast_jq: JobQueue) -> None:
    @fast_jq.task(max_attempts=5)
    def doomed() -> None:
        raise Fatal("bad input, do not retry")

    with running(make_worker(fast_jq)):
        handle = fast_jq.enqueue(doomed)
        run = finished(fast_jq, handle.run_id)
    assert (run.state, run.attempt) == ("dead", 1)
    assert run.error == "Fatal: bad input, do not retry"


def test_unknown_task_name_is_handed_back_then_dead_with_a_clear_error_and_imports_nothing(
    redis_client: Any,
) -> None:
    """FAST's hand-back window is 0.5 s: the run is handed back (attempts not counted) until
    it is over, then buried saying why."""
    module = "jq_test_never_imported_module"
    client = JobQueue(redis_client, settings=FAST)
    client.declare_task(f"{module}.run", max_attempts=3)
    worker_jq = JobQueue(redis_client, settings=FAST)

    @worker_jq.task
    def known() -> str:
        return "still working"

    with running(make_worker(worker_jq)):
        handle = client.enqueue(f"{module}.run", 1)
        run = finished(client, handle.run_id)
        after = finished(client, worker_jq.enqueue(known).run_id)
    assert (run.state, run.attempt) == ("dead", 0)
    assert run.error is not None
    assert run.error.startswith(f"no code for task '{module}.run' in this worker")
    assert "handed back" in run.error and "the window is 0.5 s" in run.error
    assert module not in sys.modules
    assert after.result == "still working"


def test_malformed_payload_goes_dead_with_the_reason_and_the_worker_keeps_running(
    fast_jq: JobQueue, redis_client: Any
) -> None:
    @fast_jq.task
    def echo(x: Any) -> Any:
        return x

    handle = fast_jq.enqueue(echo, 1)  # before the worker starts: nothing claims it yet
    keys = fast_jq.keys_for("default", handle.run_id)
    redis_client.hset(keys.run(handle.run_id), "payload", "{not json")
    with running(make_worker(fast_jq)):
        run = finished(fast_jq, handle.run_id)
        after = finished(fast_jq, fast_jq.enqueue(echo, "next").run_id)
    assert (run.state, run.attempt) == ("dead", 1)
    assert run.error is not None and "not valid JSON" in run.error
    assert (after.state, after.result) == ("done", "next")


def test_result_that_is_not_json_goes_dead_with_the_reason(fast_jq: JobQueue) -> None:
    @fast_jq.task(max_attempts=3)
    def returns_a_set() -> Any:
        return {1, 2}

    with running(make_worker(fast_jq)):
        run = finished(fast_jq, fast_jq.enqueue(returns_a_set).run_id)
    assert (run.state, run.attempt) == ("dead", 1)
    assert run.error is not None and "not JSON-serialisable" in run.error


# -- timeouts, cancellation, fences --------------------------------------------------------


def test_timeout_fails_and_retries_the_run_and_discards_the_stuck_threads_late_result(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    release_stuck = threading.Event()

    fences: list[int] = []

    @fast_jq.task(timeout=0.2, max_attempts=2, backoff=0.05)
    def slow(ctx: RunContext) -> str:
        fences.append(ctx.fence)
        if ctx.attempt == 1:
            release_stuck.wait(5)  # ignores ctx.cancelled: a stuck thread
            return "late"
        return "second"

    worker = make_worker(fast_jq, clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(slow)
        wait_for(lambda: fences, what="the first attempt")
        clock.advance(0.1)
        assert phase_of(worker, handle.run_id) is RunPhase.RUNNING  # within its timeout
        clock.advance(0.15)  # past the timeout: failed, to be retried 25-50 ms later
        state_is(fast_jq, handle.run_id, "pending")
        clock.advance(0.05)  # due again; the clock then stands still while attempt 2 runs
        run = finished(fast_jq, handle.run_id)
        assert (run.state, run.result, run.attempt) == ("done", "second", 2)
        assert busy_slots(worker) == 1  # the stuck code still holds its slot
        wait_for(
            lambda: (
                [(r.fence, r.phase) for r in worker.in_flight()] == [(fences[0], RunPhase.OVERRUN)]
            ),
            what="only the stuck attempt to be held",
        )
        release_stuck.set()
        wait_for(lambda: busy_slots(worker) == 0, what="the stuck code's slot to free")
        assert worker.in_flight() == []
    # The late result was never sent: the timeout's fail stands for attempt 1.
    assert worker.stats.rejected_commits == []
    assert worker.stats.timeouts == 1
    first = f"failed fence={fences[0]} attempt=1"
    assert any(first in h and "timed out after 0.2s" in h for h in run.history)
    final = fast_jq.get_run(handle.run_id)
    assert (final.result, final.fence) == ("second", fences[1])
    stats = fast_jq.redis.hgetall(fast_jq.keys_for("default", handle.run_id).stats)
    assert (stats.get("completed"), stats.get("rejected")) == ("1", None)  # one commit only


def test_refused_heartbeat_sets_ctx_cancelled_and_the_late_commit_is_refused(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    started = threading.Event()
    observed: dict[str, Any] = {}

    @fast_jq.task
    def long_running(ctx: RunContext) -> str:
        observed["fence"] = ctx.fence
        started.set()
        observed["cancelled"] = ctx.cancelled.wait(5)
        observed["reason"] = ctx.cancel_reason
        return "should be discarded"

    worker = make_worker(fast_jq, lease=0.3, clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(long_running)
        assert started.wait(5)
        fast_jq.cancel(handle.run_id, reason="operator said stop")
        clock.advance(0.1)  # the next heartbeat, a third of the lease on, is refused
        wait_for(lambda: worker.stats.rejected_commits, what="the refused commit")
    assert observed["cancelled"] is True
    assert "cancelled" in observed["reason"]
    assert worker.stats.rejected_commits == [(handle.run_id, observed["fence"], "cancelled")]
    run = fast_jq.get_run(handle.run_id)
    assert (run.state, run.result_json, run.error) == ("cancelled", None, "operator said stop")


def test_fenced_write_refuses_a_write_older_than_the_resources_last(fast_jq: JobQueue) -> None:
    release = threading.Event()

    @fast_jq.task
    def write(resource: str, ctx: RunContext) -> bool:
        release.wait(10)
        return ctx.fenced_write(resource, f"from fence {ctx.fence}")

    keys = fast_jq.keys_for("default", "older")
    with running(make_worker(fast_jq, concurrency=1)):
        older = fast_jq.enqueue(write.with_options(run_id="older"), "contested")
        held = state_is(fast_jq, "older", "running")
        # A run claimed later in the same partition (a greater fence) writes first; the busy
        # worker (one slot) leaves it to this claim.
        fast_jq.enqueue(fast_jq.resolve_task("write").with_options(run_id="newer"), "x")
        claim = CLAIM.call(keys, 1, "other", 30_000, 60_000)
        (newer,) = CLAIM.parse(fast_jq.scripts.run(claim)).runs
        assert newer.run_id == "newer" and newer.fence > held.fence
        first = FENCED_WRITE.call(keys, "contested", newer.fence, "newer", "newer")
        assert FENCED_WRITE.parse(fast_jq.scripts.run(first)) == (True, newer.fence)
        release.set()
        stale = finished(fast_jq, older.run_id)
        fresh = finished(fast_jq, fast_jq.enqueue(
            write.with_options(run_id="fresh"), "fresh"
        ).run_id)
    assert (stale.result, fresh.result) == (False, True)
    redis = fast_jq.redis
    assert redis.hget(keys.fence_resource("contested"), "value") == "newer"
    fresh_keys = fast_jq.keys_for("default", "fresh")
    assert redis.hget(fresh_keys.fence_resource("fresh"), "value") == f"from fence {fresh.fence}"


def test_heartbeats_keep_a_run_alive_past_its_lease(fast_jq: JobQueue, clock: FakeClock) -> None:
    fences: list[int] = []

    @fast_jq.task
    def sleeper(ctx: RunContext) -> str:
        begun = clock.monotonic()
        fences.append(ctx.fence)
        clock.sleep(begun + 2.5 - clock.monotonic())
        return "slept"

    lease = 1.0
    worker = make_worker(fast_jq, lease=lease, clock=clock)
    keys = fast_jq.keys_for("default", "sleeper")
    with running(worker):
        handle = fast_jq.enqueue(sleeper.with_options(run_id="sleeper"))
        wait_for(lambda: fences, what="the run to start")
        while fences and not fast_jq.get_run(handle.run_id).finished:
            # A third of the lease on, a heartbeat renews it without the clock moving further.
            clock.advance(lease / 3)
            renewed = wait_for(
                lambda: (
                    (v := held(worker, "sleeper")) is None
                    or v.lease_expires >= clock.monotonic() + lease - 0.01
                ),
                what="a heartbeat",
            )
            assert renewed
            # Another worker claiming now finds the run still leased.
            claim = CLAIM.call(keys, 1, "other", 30_000, 60_000, now=clock.now_ms())
            assert CLAIM.parse(fast_jq.scripts.run(claim)).runs == []
        run = finished(fast_jq, handle.run_id)
    # Claimed once (no second claim ever happened) and its lease never expired.
    assert (run.state, run.result, run.attempt, run.fence) == ("done", "slept", 1, fences[0])
    assert len(fences) == 1
    assert not any("lease expired" in h for h in run.history)


# -- idling and the registry ---------------------------------------------------------------


def test_run_enqueued_while_idle_is_started_by_its_wake_token_not_the_idle_timeout(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    @fast_jq.task
    def noop() -> None:
        return None

    waits = watch_idle_waits(monkeypatch)
    # An idle wait (8 s: below the client's 10 s socket timeout, whose expiry would also end
    # the wait) twice the test's patience: only the enqueue's wake token can start these runs.
    with running(make_worker(fast_jq, idle_wait=8.0)):
        seen = 0
        for _ in range(5):
            # Asleep on the wake list: a wait begun since the last enqueue.
            wait_for(lambda seen=seen: waits.asleep(since=seen), what="the worker asleep")
            seen = waits.begun
            assert finished(fast_jq, fast_jq.enqueue(noop).run_id, timeout=4).state == "done"


def test_an_idle_worker_stops_at_once_not_at_the_end_of_its_idle_wait(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Asleep on the wake list for up to 8 s, the worker is told to stop: it wakes and is
    gone well within that (by construction: waiting the sleep out would take 8 s)."""
    waits = watch_idle_waits(monkeypatch)
    worker = make_worker(fast_jq, idle_wait=8.0)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: worker.state == "running", what="the worker to start")
    wait_for(waits.asleep, what="the worker asleep on the wake list")
    worker.stop()
    thread.join(6.0)
    assert not thread.is_alive(), "the stop waited for the idle wait to end"


class _ClaimCalls(Metrics):
    """Counts the claim calls Redis answered (the claim loop calls ``claimed`` once each)."""

    def __init__(self) -> None:
        self.calls = 0

    def claimed(self, queue: str, runs: Iterable[ClaimedRun], now_ms: int) -> None:
        self.calls += 1


def _in_other_partitions(jq: JobQueue, prefix: str, count: int) -> list[str]:
    """``count`` run ids, each in a partition of "default" none of the others is in."""
    ids: list[str] = []
    seen: set[int] = set()
    for i in itertools.count():
        p = partition_of(f"{prefix}{i}", jq.partitions_of("default"))
        if p not in seen:
            seen.add(p)
            ids.append(f"{prefix}{i}")
            if len(ids) == count:
                return ids
    raise AssertionError("unreachable")


def test_an_idle_worker_woken_by_an_enqueue_claims_from_that_partition_alone(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    jq = JobQueue(redis_client, settings=FAST, partitions={"default": 16})

    @jq.task
    def noop() -> None:
        return None

    calls = _ClaimCalls()
    waits = watch_idle_waits(monkeypatch)
    # The idle wait (8 s) is longer than the test: only wake tokens end a wait.
    with running(make_worker(jq, idle_wait=8.0, metrics=calls)):
        wait_for(lambda: calls.calls >= 16, what="the first claim of every partition")
        seen = 0
        for run_id in _in_other_partitions(jq, "woken-", 3):
            # Asleep on the wake lists: a wait begun since the last enqueue.
            wait_for(lambda seen=seen: waits.asleep(since=seen), what="the worker asleep")
            seen = waits.begun
            before = calls.calls
            assert finished(jq, jq.enqueue(
                noop.with_options(run_id=run_id)
            ).run_id, timeout=4).state == "done"
            # Kept: a window (asleep again, or sweeping every partition: counted here).
            time.sleep(0.3)
            assert calls.calls - before <= 2  # its partition, not all 16


def test_a_worker_woken_again_and_again_by_one_partition_still_asks_every_partition(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose lease another worker let expire brings no token: only asking every
    partition finds it, at least once per idle wait however often one partition wakes it.
    The idle wait (8 s) is measured on the worker's clock, a fake one moved here: on real
    time no wait runs to its end during the test, only tokens end them."""
    jq = JobQueue(redis_client, settings=FAST, partitions={"default": 16})
    clock = fake_clock(jq)

    @jq.task
    def noop() -> None:
        return None

    calls = _ClaimCalls()
    waits = watch_idle_waits(monkeypatch)
    with running(make_worker(jq, idle_wait=8.0, metrics=calls, clock=clock)):
        wait_for(lambda: calls.calls >= 16 and waits.asleep(), what="the first sweep, asleep")
        before = calls.calls
        for i in range(12):  # a token every 3.2 s of its clock: no wait runs to its end
            seen = waits.begun
            finished(jq, jq.enqueue(noop.with_options(run_id=f"trickle-{i}")).run_id)
            wait_for(lambda seen=seen: waits.asleep(since=seen), what="the worker asleep again")
            clock.advance(3.2)
        # 12 woken claims or so, and a sweep of the 16 partitions every 8 s at least
        assert calls.calls - before >= 12 + 2 * 16


def test_a_run_due_in_another_partition_starts_on_time_while_the_worker_claims_woken_ones(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    jq = JobQueue(redis_client, settings=FAST, partitions={"default": 16})

    @jq.task
    def noop() -> None:
        return None

    later_id, now_id = _in_other_partitions(jq, "due-", 2)
    waits = watch_idle_waits(monkeypatch)
    with running(make_worker(jq, idle_wait=8.0)):
        wait_for(waits.asleep, what="the worker asleep after its first sweep")
        seen = waits.begun
        later = jq.enqueue(noop.with_options(run_id=later_id, delay=1.5))
        # Woken by its token, told its due time by its partition's claim, asleep again.
        wait_for(lambda: waits.asleep(since=seen), what="the worker asleep again")
        jq.enqueue(
            noop.with_options(run_id=now_id)
        )  # woken by this one's partition, then waits again
        # Before the 8 s idle wait ends: the wait after the woken partition's claim still
        # runs to the due time the other partition reported.
        assert finished(jq, later.run_id, timeout=5).state == "done"


def test_a_worker_asks_its_partitions_in_one_pipelined_round_not_one_claim_each(
    redis_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    jq = JobQueue(redis_client, settings=FAST, partitions={"default": 16})

    @jq.task
    def noop() -> None:
        return None

    rounds: list[int] = []

    def run_each(calls: list[Call], send: Send) -> list[Any]:
        rounds.append(sum(c.script == "claim" for c in calls))
        return send(calls)

    intercept_worker_calls(monkeypatch, run_each)
    with running(make_worker(jq, concurrency=32, idle_wait=8.0)):
        wait_for(lambda: 16 in rounds, what="one round trip with a claim of every partition")


def test_a_partition_with_a_backlog_gets_the_room_the_others_one_run_claims_leave(
    redis_client: Any,
) -> None:
    jq = JobQueue(redis_client, settings=FAST, partitions={"default": 16})

    @jq.task
    def noop() -> None:
        return None

    backlog = [r for r in (f"b-{i}" for i in range(4000)) if partition_of(r, 16) == 5][:120]
    jq.enqueue_many(Request(noop, run_id=r) for r in backlog)
    started: list[str] = []
    executor = SimpleNamespace(start=lambda run, keys, now_ms, sent: started.append(run.run_id))

    async def two_claims() -> tuple[int, int]:
        shared = Shared(
            jq=jq, io=RedisIO(jq.redis), config=WorkerConfig(concurrency=64),
            worker_id="w-backlog", queues=["default"], lease_ms=60_000, tasks=WorkerTasks(jq),
            table=RunTable(64), stats=WorkerStats(), metrics=NO_METRICS, clock=REAL_CLOCK,
            hooks=None,
        )
        claimer = Claimer(shared, executor)  # type: ignore[arg-type]
        claimer.set_partitions(jq.all_partition_keys("default"))
        try:
            return (await claimer.claim(64))[0], (await claimer.claim(64))[0]
        finally:
            await shared.io.aclose()

    first, second = asyncio.run(two_claims())
    # Nothing known yet: the 64 slots are shared by the 16 partitions, 4 each.
    assert first == 4
    # It gave all it was asked for: the others before it in the rotation are asked for one
    # run each, and it for the rest of the room.
    assert second >= 64 - 15
    assert set(started) <= set(backlog)


def test_worker_registers_itself_and_removes_itself_on_stop(fast_jq: JobQueue) -> None:
    worker = make_worker(fast_jq, worker_id="w-registry-test")
    with running(worker):
        raw = wait_for(lambda: fast_jq.redis.hget(WORKERS_KEY, worker.id), what="registry")
        info = json.loads(raw)
        server_now = fast_jq.server_time_ms()
    assert info["id"] == "w-registry-test"
    assert info["host"] == socket.gethostname()
    assert info["pid"] == os.getpid()
    assert abs(server_now - info["last_seen_ms"]) < 5_000
    assert fast_jq.redis.hget(WORKERS_KEY, worker.id) is None


def test_graceful_stop_releases_runs_past_the_grace_without_counting_an_attempt(
    fast_jq: JobQueue,
) -> None:
    started = threading.Semaphore(0)

    @fast_jq.task
    def stubborn(ctx: RunContext) -> str:
        started.release()
        ctx.cancelled.wait(5)
        return "too late"

    worker = make_worker(fast_jq, grace=0.2)
    handles = []
    with running(worker):
        handles = [fast_jq.enqueue(stubborn) for _ in range(2)]
        for _ in handles:
            assert started.acquire(timeout=5)
    assert worker.stats.released == 2
    released_fences = {}
    for h in handles:
        run = fast_jq.get_run(h.run_id)
        assert (run.state, run.attempt) == ("pending", 0)
        assert any(
            f"released fence={run.fence} owner=" in line and "(attempt not counted)" in line
            for line in run.history
        )
        released_fences[h.run_id] = run.fence

    # The next worker gets them as first attempts.
    fast_jq.registry = type(fast_jq.registry)()

    @fast_jq.task(name="stubborn")
    def quick() -> str:
        return "done now"

    with running(make_worker(fast_jq)):
        runs = [finished(fast_jq, h.run_id) for h in handles]
    assert [(r.state, r.attempt, r.result) for r in runs] == [("done", 1, "done now")] * 2
    assert all(r.fence > released_fences[r.run_id] for r in runs)  # a new claim, a new fence


def test_stale_attempt_is_told_it_was_fenced_out_when_its_own_worker_reclaimed_the_run(
    fast_jq: JobQueue, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stall (heartbeats not reaching Redis past the lease) lets this very worker reclaim the
    run; the stale attempt must still be told, so it is cancelled, not orphaned: its own lease
    ran out with no heartbeat reaching Redis (self-fencing, before any refusal could arrive)."""
    first_ctx: list[RunContext] = []
    second_started = threading.Event()

    @fast_jq.task
    def patient(ctx: RunContext) -> str:
        if ctx.attempt == 1:
            first_ctx.append(ctx)
            ctx.cancelled.wait(5)  # told its lease is gone: it may still take a while...
            second_started.wait(5)  # ...so long that the run is claimed again meanwhile
            return "stale"
        second_started.set()
        return "second"

    paused = threading.Event()

    def run_each(calls: list[Call], send: Send) -> list[Any]:
        if not paused.is_set():
            return send(calls)
        replies = iter(send([c for c in calls if c.script != "heartbeat"]))
        stalled = ConnectionFailed("stalled")
        return [stalled if c.script == "heartbeat" else next(replies) for c in calls]

    intercept_worker_calls(monkeypatch, run_each)
    worker = make_worker(fast_jq, lease=0.3, clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(patient)
        wait_for(lambda: first_ctx, what="the first attempt")
        paused.set()  # a stall: the lease runs out and the claim loop takes the run again
        clock.advance(0.35)
        assert first_ctx[0].cancelled.wait(5), "the stale attempt was never told"
        run = finished(fast_jq, handle.run_id)
        paused.clear()
        wait_for(lambda: worker.stats.rejected_commits, what="the stale commit")
    assert (run.state, run.result, run.attempt) == ("done", "second", 2)
    assert run.fence > first_ctx[0].fence
    assert first_ctx[0].cancel_reason == "lease expired: no heartbeat reached Redis"
    assert worker.stats.rejected_commits == [(handle.run_id, first_ctx[0].fence, "fenced")]


def test_an_unexpected_error_in_a_claim_does_not_end_the_claim_loop(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    @fast_jq.task
    def echo(x: int) -> int:
        return x

    failures: list[str] = []

    def flaky(calls: list[Call], send: Send) -> list[Any]:
        if any(c.script == "claim" for c in calls) and not failures:
            failures.append("claim")
            raise RuntimeError("a bug, not a Redis error")
        return send(calls)

    intercept_worker_calls(monkeypatch, flaky)
    with running(make_worker(fast_jq)):
        run = finished(fast_jq, fast_jq.enqueue(echo, 7).run_id)
    assert failures and (run.state, run.result) == ("done", 7)


def test_a_finished_run_whose_commit_is_still_in_flight_at_stop_is_committed_not_released(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slots free when the code returns, before the commit lands: a stop in between must
    wait for the commit, never hand the finished run back (it would run again)."""

    @fast_jq.task
    def quick() -> str:
        return "ran"

    in_commit, told_to_stop = threading.Event(), threading.Event()

    def slow_commits(calls: list[Call], send: Send) -> list[Any]:
        if any(c.script == "complete" for c in calls):
            in_commit.set()
            # The commit is on its way while the worker is told to stop...
            told_to_stop.wait(10)
            time.sleep(0.5)  # kept: ...and lands only after the grace (0.1 s) has run out
        return send(calls)

    intercept_worker_calls(monkeypatch, slow_commits)
    worker = make_worker(fast_jq, grace=0.1)
    handle = fast_jq.enqueue(quick)
    with running(worker):
        assert in_commit.wait(10)
        worker.stop()
        told_to_stop.set()
    run = fast_jq.get_run(handle.run_id)
    assert (run.state, run.result, run.attempt) == ("done", "ran", 1)
    assert worker.stats.released == 0


def test_an_error_text_that_is_not_utf8_fails_its_run_and_spoils_no_other_commit(
    fast_jq: JobQueue,
) -> None:
    @fast_jq.task(max_attempts=1)
    def undecodable() -> None:
        raise ValueError("bad bytes: \udcff")

    @fast_jq.task
    def fine() -> str:
        return "ok"

    with running(make_worker(fast_jq)):
        bad = fast_jq.enqueue(undecodable)
        good = [fast_jq.enqueue(fine) for _ in range(5)]
        run = finished(fast_jq, bad.run_id)
        assert (run.state, run.error) == ("dead", "ValueError: bad bytes: ?")
        assert all(finished(fast_jq, h.run_id).result == "ok" for h in good)


def test_a_released_run_is_logged_as_not_counted(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    started = threading.Event()

    fences: list[int] = []

    @fast_jq.task
    def stubborn(ctx: RunContext) -> None:
        fences.append(ctx.fence)
        started.set()
        ctx.cancelled.wait(5)

    caplog.set_level("INFO", logger="jobqueue.worker")
    with running(make_worker(fast_jq, grace=0.1)):
        handle = fast_jq.enqueue(stubborn)
        assert started.wait(5)
    released = f"released run_id={handle.run_id} fence={fences[0]} attempt=1: not counted"
    assert released in caplog.text
    assert fast_jq.get_run(handle.run_id).attempt == 0
