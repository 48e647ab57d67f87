"""The worker when things go wrong: task code that misbehaves (SystemExit in a coroutine, a
result that cannot be encoded, code that never returns), a payload that cannot be decoded,
signals at awkward moments, and Redis refusing or hanging. The worker runs in-process
(tests/helpers.py); every test runs on both backends unless its docstring says why not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import (
    FAST,
    Exited,
    Send,
    advance_until,
    busy_slots,
    finished,
    held,
    intercept_worker_calls,
    make_worker,
    phase_of,
    running,
    wait_for,
)

from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConnectionFailed
from jobqueue.runtime.clock import FakeClock
from jobqueue.store.embedded import EmbeddedServer, find_server_binary
from jobqueue.store.scripts import Call, translate_error
from jobqueue.worker import (
    EXIT_UNHEALTHY,
    MAX_REJECTED_KEPT,
    RunPhase,
    WorkerStats,
    recycling,
    supervisor,
)
from jobqueue.worker.committing import Committer

# What this module checks does not depend on the backend: run on the real server only
# (real_only, tests/conftest.py); the scripts and the client API are tested on fakeredis too.
pytestmark = pytest.mark.real_only

# -- task code that misbehaves -------------------------------------------------------------


@pytest.mark.parametrize("exc_type", [SystemExit, KeyboardInterrupt])
def test_an_async_task_raising_systemexit_or_keyboardinterrupt_fails_only_its_own_run(
    fast_jq: JobQueue, exc_type: type[BaseException]
) -> None:
    @fast_jq.task(max_attempts=1)
    async def bails_out() -> None:
        raise exc_type(3)

    @fast_jq.task
    async def double(x: int) -> int:
        await asyncio.sleep(0)  # kept: a coroutine that suspends
        return x * 2

    worker = make_worker(fast_jq)
    with running(worker):
        bad = finished(fast_jq, fast_jq.enqueue(bails_out).run_id)
        good = finished(fast_jq, fast_jq.enqueue(double, 21).run_id)
        wait_for(lambda: busy_slots(worker) == 0, what="every slot to free")
    assert (bad.state, bad.attempt) == ("dead", 1)
    assert bad.error is not None and bad.error.startswith(exc_type.__name__)
    assert (good.state, good.result) == ("done", 42)


def test_a_worker_whose_event_loop_thread_died_stops_and_exits_non_zero(
    fast_jq: JobQueue,
) -> None:
    @fast_jq.task
    async def kill_the_loop() -> None:
        asyncio.get_running_loop().call_soon(sys.exit, 9)  # what kills a loop thread

    worker = make_worker(fast_jq, grace=0.5)
    exited = Exited(worker)
    try:
        fast_jq.enqueue(kill_the_loop)
        assert exited.join(10) == EXIT_UNHEALTHY
        assert worker.unhealthy == "the asyncio event loop thread died"
    finally:
        exited.close()


def test_a_worker_whose_committer_dies_stops_and_exits_non_zero(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug that ends the commit loop would leave every finished run heartbeated and never
    committed: the worker gives up instead, and its supervisor starts a clean process."""

    async def broken(self: Committer) -> None:
        raise RuntimeError("a bug in the commit loop")

    monkeypatch.setattr(Committer, "run", broken)
    worker = make_worker(fast_jq, grace=0.5)
    exited = Exited(worker)
    try:
        assert exited.join(10) == EXIT_UNHEALTHY
        assert worker.unhealthy is not None and "committer" in worker.unhealthy
    finally:
        exited.close()


def test_an_async_timeout_keeps_the_slot_until_a_coroutine_that_ignores_cancel_ends(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    """The slot is the coroutine's: freed when it really ends, and the attempt is failed
    once (by the timeout), not again when the coroutine finally gives up."""
    release = threading.Event()
    started = threading.Event()

    @fast_jq.task(timeout=0.2, max_attempts=1)
    async def stubborn() -> str:
        started.set()
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: it keeps going
                await asyncio.sleep(0.02)  # kept: it runs on until released
        return "late"

    worker = make_worker(fast_jq, concurrency=1, clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(stubborn)
        assert started.wait(5)
        clock.advance(0.25)  # past its timeout
        run = finished(fast_jq, handle.run_id)
        assert busy_slots(worker) == 1  # the coroutine still runs: its slot is taken
        # (the worker's table hears of the fail's answer just after Redis has it)
        wait_for(lambda: phase_of(worker, handle.run_id) is RunPhase.OVERRUN,
                 what="the answered timeout to leave the run overrunning")
        assert busy_slots(worker) == 1
        release.set()
        wait_for(lambda: busy_slots(worker) == 0, what="the slot to free")
        assert worker.in_flight() == []
    assert (run.state, run.error) == ("dead", "timed out after 0.2s")
    assert worker.stats.fenced_out == 0 and worker.stats.rejected_commits == []


def test_a_result_arriving_after_its_timeout_does_not_win_over_the_timeouts_fail(
    fast_jq: JobQueue, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The timeout's fail and the late result reach the committer while it is busy with an
    earlier commit, so they would be committed in one batch: the run stays failed
    (completes are sent before fails, so a late result used to be committed as done)."""
    started, late, released = threading.Event(), threading.Event(), threading.Event()
    worker = make_worker(fast_jq, clock=clock)

    @fast_jq.task(timeout=0.2, max_attempts=1)
    def slow() -> str:
        started.set()
        late.wait(5)  # ignores ctx.cancelled
        return "late"

    @fast_jq.task
    def quick() -> str:
        return "first"

    def run_each(calls: list[Call], send: Send) -> list[Any]:
        if any(c.script == "complete" and "blocker" in c.args for c in calls):
            released.wait(5)  # the committer is busy meanwhile
        return send(calls)

    intercept_worker_calls(monkeypatch, run_each)
    with running(worker):
        handle = fast_jq.enqueue(slow)
        assert started.wait(5)
        fast_jq.enqueue(quick.with_options(run_id="blocker"))
        wait_for(lambda: phase_of(worker, "blocker") is RunPhase.COMMITTING, what="blocker")
        clock.advance(0.25)  # past slow's timeout: its fail is queued behind the blocker
        wait_for(lambda: phase_of(worker, handle.run_id) is RunPhase.TIMED_OUT, what="timeout")
        late.set()  # and its code returns with a result
        wait_for(lambda: busy_slots(worker) == 0, what="the late result")
        released.set()
        run = finished(fast_jq, handle.run_id)
        wait_for(lambda: worker.in_flight() == [], what="the runs to be forgotten")
    assert (run.state, run.result, run.error) == ("dead", None, "timed out after 0.2s")
    assert fast_jq.get_run("blocker").result == "first"


class _Rows(dict[str, Any]):
    """A dict whose items cannot be read (a lazy mapping over a closed cursor): json.dumps
    raises what reading them raises."""

    def __init__(self, error: type[Exception], **items: Any) -> None:
        super().__init__(**items)
        self.error = error

    def items(self) -> Any:
        raise self.error("backing cursor closed")


@pytest.mark.parametrize("error", [RuntimeError, MemoryError])
def test_a_result_whose_encoding_raises_fails_its_run_and_frees_its_slot(
    fast_jq: JobQueue, error: type[Exception]
) -> None:
    @fast_jq.task(max_attempts=3)
    def odd() -> Any:
        return _Rows(error, a=1)

    @fast_jq.task(max_attempts=3)
    def odd_mapping() -> Any:
        return _Rows(RuntimeError, a=1)

    worker = make_worker(fast_jq)
    with running(worker):
        runs = [finished(fast_jq, fast_jq.enqueue(t).run_id) for t in (odd, odd_mapping)]
        wait_for(lambda: worker.in_flight() == [], what="no leak")
    for run in runs:
        assert (run.state, run.attempt) == ("dead", 1)  # never retried: it would fail again
        assert run.error is not None and "could not be encoded" in run.error


def test_timed_out_code_holding_most_slots_makes_the_worker_stop_and_exit_non_zero(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    release = threading.Event()
    started = threading.Semaphore(0)

    @fast_jq.task(timeout=0.1, max_attempts=1)
    def stuck() -> None:
        started.release()
        release.wait(10)  # never checks ctx.cancelled

    worker = make_worker(fast_jq, concurrency=2, grace=0.2, stuck_limit=0.3, clock=clock)
    exited = Exited(worker)
    try:
        for _ in range(2):
            fast_jq.enqueue(stuck)
        # Both codes running (a run timed out before its thread took it never starts, and
        # then holds no slot: on a loaded machine a thread may take a while to start).
        for _ in range(2):
            assert started.acquire(timeout=10), "both codes to start"
        assert busy_slots(worker) == 2
        clock.advance(0.15)  # both time out: timed-out code holds every slot...
        wait_for(lambda: worker.stats.timeouts == 2, what="the timeouts")
        assert worker.unhealthy is None
        clock.advance(0.35)  # ...for longer than the stuck limit
        assert exited.join(10) == EXIT_UNHEALTHY
        assert worker.unhealthy is not None and "timed-out task code" in worker.unhealthy
    finally:
        release.set()
        exited.close()


# -- payloads ------------------------------------------------------------------------------


def test_a_payload_nested_too_deeply_fails_alone_and_the_rest_of_its_claim_batch_runs(
    fast_jq: JobQueue, redis_client: Any
) -> None:
    @fast_jq.task
    def echo(x: Any) -> Any:
        return x

    handles = [fast_jq.enqueue(echo, i) for i in range(4)]  # one claim batch
    poison = handles[0]
    keys = fast_jq.keys_for("default", poison.run_id)
    deep = '{"args": [' + "[" * 100_000 + "]" * 100_000 + '], "kwargs": {}}'
    redis_client.hset(keys.run(poison.run_id), "payload", deep)
    worker = make_worker(fast_jq)
    with running(worker):
        runs = [finished(fast_jq, h.run_id) for h in handles]
        wait_for(lambda: worker.in_flight() == [], what="no leak")
    assert (runs[0].state, runs[0].attempt) == ("dead", 1)
    assert runs[0].error is not None and "nested too deeply" in runs[0].error
    assert [(r.state, r.result) for r in runs[1:]] == [("done", i) for i in (1, 2, 3)]


# -- signals, startup and shutdown ---------------------------------------------------------


def test_a_stop_signal_landing_while_the_main_thread_holds_the_worker_lock_does_not_deadlock(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal handler runs in the main thread between two bytecodes, possibly while that
    thread holds one of the worker's (non-reentrant) locks: the handler must take none. Here
    it runs while every lock the worker made (its own, its events') is held."""
    locks: list[Any] = []
    real_lock = threading.Lock

    def recorded_lock() -> Any:
        lock = real_lock()
        locks.append(lock)
        return lock

    with monkeypatch.context() as m:
        m.setattr(threading, "Lock", recorded_lock)
        worker = make_worker(fast_jq)
    assert locks
    exited = Exited(worker)
    try:
        wait_for(lambda: worker.state == "running", what="the worker to start")

        def handler_under_the_locks() -> None:
            with contextlib.ExitStack() as stack:
                for lock in locks:
                    stack.enter_context(lock)
                worker.on_signal(signal.SIGTERM, None)

        t = threading.Thread(target=handler_under_the_locks, daemon=True)
        t.start()
        t.join(5)
        assert not t.is_alive(), "the signal handler deadlocked on the worker's lock"
        assert exited.join(10) == 0  # and the signal did stop the worker
    finally:
        exited.close()


def test_a_worker_that_cannot_register_its_queues_still_stops_when_told(
    fast_jq: JobQueue, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server refusing writes at startup (OOM, a replica): the retry loop gives up on stop."""
    tries: list[str] = []

    def refused(queue: str) -> None:
        tries.append(queue)
        raise ConnectionFailed("cannot register queue: OOM command not allowed")

    monkeypatch.setattr(fast_jq, "register_queue", refused)
    worker = make_worker(fast_jq, clock=clock)
    exited = Exited(worker)
    try:
        advance_until(clock, lambda: len(tries) >= 3, step=0.1, what="a few retries")
        assert worker.state == "starting"
        worker.stop()
        assert exited.join(5) == 0
    finally:
        exited.close()


class _PipelineOnAClosedConnection:
    """What a pipeline raised when the client's connection was closed under it (redis-py 6.1's
    hiredis reader, set to None by the close): not a RedisError."""

    def lpush(self, *args: Any) -> _PipelineOnAClosedConnection:
        return self

    def pexpire(self, *args: Any) -> _PipelineOnAClosedConnection:
        return self

    def execute(self) -> None:
        raise AttributeError("'NoneType' object has no attribute 'feed'")


def test_a_stop_whose_wake_meets_a_connection_closed_under_it_raises_nothing_on_its_thread(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() wakes the claim loop from a thread of its own; that thread races the close of
    the client, and a failed wake only means the loop notices at its idle wait. Nothing of it
    may reach threading.excepthook (a traceback on the daemon's stderr)."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda hook: raised.append(hook.exc_value))
    monkeypatch.setattr(fast_jq.redis, "pipeline", lambda **_: _PipelineOnAClosedConnection())
    worker = make_worker(fast_jq)
    worker.stop()
    wait_for(lambda: not [t for t in threading.enumerate() if t.name == "jq-stop"], 5,
             "the wake thread to end")
    assert raised == []


def test_the_first_heartbeat_comes_within_a_third_of_a_short_task_lease(
    fast_jq: JobQueue, clock: FakeClock
) -> None:
    """A run whose task lease is shorter than the worker's own: the heartbeat planned for
    the worker's lease would come after the short lease expired."""
    started = threading.Event()

    @fast_jq.task(lease=1.5, max_attempts=1)
    def a_while() -> str:
        begun = clock.monotonic()
        started.set()
        clock.sleep(begun + 2.5 - clock.monotonic())
        return "ok"

    worker = make_worker(fast_jq, lease=30.0, clock=clock)
    with running(worker):
        handle = fast_jq.enqueue(a_while)
        assert started.wait(5)
        for _ in range(5):
            # A third of the task's lease on, a heartbeat renews it (not 10 s on, a third
            # of the worker's).
            clock.advance(0.5)
            wait_for(
                lambda: (v := held(worker, handle.run_id)) is None
                or v.lease_expires >= clock.monotonic() + 1.0,
                what="a heartbeat",
            )
        run = finished(fast_jq, handle.run_id)
    assert (run.state, run.result, run.attempt) == ("done", "ok", 1)
    assert worker.stats.fenced_out == 0


def test_rejected_commits_keeps_only_the_most_recent_ones() -> None:
    stats = WorkerStats()
    total = 3 * MAX_REJECTED_KEPT
    for i in range(total):
        stats.rejected(f"r{i}", 1, "fenced")
    assert len(stats.rejected_commits) <= 2 * MAX_REJECTED_KEPT
    assert stats.rejected_commits[-1] == (f"r{total - 1}", 1, "fenced")


# -- Redis refusing commits ----------------------------------------------------------------


@pytest.mark.parametrize("refusal", [
    redis.exceptions.OutOfMemoryError("command not allowed when used memory"),
    # still after the reloads: a promoted master whose script cache was emptied again
    redis.exceptions.NoScriptError("No matching script. Please use EVAL."),
], ids=["OOM", "NOSCRIPT"])
def test_a_commit_refused_for_now_by_redis_is_retried_not_abandoned(
    fast_jq: JobQueue, monkeypatch: pytest.MonkeyPatch, refusal: Exception
) -> None:
    """OOM (and READONLY, BUSY, NOSCRIPT, ...) at commit time: the calls that were refused
    are sent again until Redis takes them; the others are not sent twice. The refusals are
    injected as error replies of the worker's pipeline (the real-server OOM case is in the
    next test)."""
    refusals = [2]

    def run_many_replies(calls: list[Call], send: Send) -> list[Any]:
        if refusals[0] <= 0 or not any(c.script == "complete" for c in calls):
            return send(calls)
        refusals[0] -= 1
        # The completes are refused (not run); the other calls of the pipeline run.
        others = [c for c in calls if c.script != "complete"]
        ran = iter(send(others) if others else [])
        return [
            translate_error(c, refusal) if c.script == "complete" else next(ran) for c in calls
        ]

    @fast_jq.task(max_attempts=1)
    def fine() -> str:
        return "ok"

    intercept_worker_calls(monkeypatch, run_many_replies)
    worker = make_worker(fast_jq)
    with running(worker):
        refusals[0] = 2
        handle = fast_jq.enqueue(fine)
        run = finished(fast_jq, handle.run_id)
    assert refusals[0] == 0
    assert (run.state, run.result, run.attempt) == ("done", "ok", 1)
    assert worker.stats.rejected_commits == []


def test_a_real_oom_blip_at_commit_time_does_not_lose_the_finished_result(
    real_server: Any,
) -> None:
    """Real server only: fakeredis has no maxmemory. The server refuses writes (maxmemory
    reached, noeviction) from the moment the task returns until 0.5 s later."""
    client = redis.Redis.from_url(real_server.url, decode_responses=True)
    client.flushall()
    jq = JobQueue(client, settings=FAST)
    admin = redis.Redis.from_url(real_server.url, decode_responses=True)

    @jq.task(max_attempts=1)
    def fills_memory() -> str:
        admin.config_set("maxmemory", 1)
        threading.Timer(0.5, admin.config_set, ("maxmemory", 0)).start()
        return "ok"

    try:
        worker = make_worker(jq)
        with running(worker):
            run = finished(jq, jq.enqueue(fills_memory).run_id)
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        client.close()
    assert (run.state, run.result, run.attempt) == ("done", "ok", 1)
    assert worker.stats.rejected_commits == []


# -- the --processes supervisor ------------------------------------------------------------

# A stand-in for a worker child: no handler for SIGTERM (a child still importing its app).
_NAPPING_CHILD = "import time; time.sleep(4)"
# A child that ignores SIGTERM (one that hangs in its drain).
_DEAF_CHILD = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ready', flush=True); time.sleep(6)"
)


@pytest.fixture
def restored_signals() -> Iterator[None]:
    """supervise() installs handlers in this (the main) thread: put pytest's back."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in saved.items():
        signal.signal(s, handler)


def _fake_spawn(
    code: str, spawned: list[subprocess.Popen[bytes]], signal_on: int, after_ready: bool = False
) -> Callable[[list[str], str], subprocess.Popen[bytes]]:
    """Spawns ``code``; sends the supervisor SIGTERM while spawning child ``signal_on`` (before
    its Popen, or once it printed a line when ``after_ready``)."""

    def spawn(argv: list[str], url: str) -> subprocess.Popen[bytes]:
        signal_now = len(spawned) + 1 == signal_on
        if signal_now and not after_ready:
            os.kill(os.getpid(), signal.SIGTERM)  # lands mid-spawn
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            preexec_fn=supervisor.child_setup,
            stdout=subprocess.PIPE if after_ready else None,
        )
        spawned.append(child)
        if signal_now and after_ready:
            assert child.stdout is not None
            child.stdout.readline()
            os.kill(os.getpid(), signal.SIGTERM)
        return child

    return spawn


def test_a_supervisor_signalled_while_spawning_a_child_drains_that_child_too_and_exits_0(
    restored_signals: None,
) -> None:
    """No Redis: the children stand in for workers. Each dies of the forwarded SIGTERM (it has
    no handler yet): a clean exit once the supervisor is stopping. Another thread is alive,
    as in most processes: the kernel may hand it the signal the main thread blocks, and Python
    then runs the handler in the main thread in the middle of the spawn."""
    spawned: list[subprocess.Popen[bytes]] = []
    spawn = _fake_spawn(_NAPPING_CHILD, spawned, 2)
    other = threading.Event()
    threading.Thread(target=other.wait, args=(30,), daemon=True).start()
    try:
        code = supervisor.supervise(2, ["jobqueue", "worker"], "", grace=1.0, spawn_child=spawn)
        assert code == 0
        assert [c.returncode for c in spawned] == [-signal.SIGTERM, -signal.SIGTERM]
    finally:
        other.set()
        for c in spawned:
            with contextlib.suppress(OSError):
                c.kill()
            c.wait()


def test_a_supervisor_kills_a_child_that_has_not_drained_by_its_deadline(
    restored_signals: None,
) -> None:
    """No Redis. The deadline is the children's grace plus a margin (shortened here)."""
    spawned: list[subprocess.Popen[bytes]] = []
    spawn = _fake_spawn(_DEAF_CHILD, spawned, 1, True)
    try:
        argv = ["jobqueue", "worker", "--grace", "0.5"]
        assert supervisor.supervise(1, argv, "", spawn_child=spawn, kill_margin=0.5) == 1
        assert [c.returncode for c in spawned] == [-signal.SIGKILL]
    finally:
        for c in spawned:
            with contextlib.suppress(OSError):
                c.kill()
            c.wait()


# -- a hung Redis at shutdown --------------------------------------------------------------


def test_a_stop_while_redis_hangs_ends_within_the_grace_and_a_small_margin() -> None:
    """Real server only, a private one: it is SIGSTOPped (connections accepted, nothing
    answered: a stalled VM, a partition that drops packets). Every shutdown call would wait
    its socket timeout, some several times (redis-py's retries): the shutdown has one deadline
    instead, grace + its shutdown margin (shortened here) from the stop."""
    server = EmbeddedServer(find_server_binary()).start()
    assert server.process is not None
    try:
        jq = JobQueue.from_url(server.url + "?socket_timeout=2", settings=FAST)
        started = threading.Event()

        @jq.task
        def nap() -> None:
            started.set()
            time.sleep(30)  # outlives the grace: to be released at the end of the drain

        worker = make_worker(jq, grace=0.5, shutdown_margin=1.0)
        exited = Exited(worker)
        jq.enqueue(nap)
        assert started.wait(10)
        server.process.send_signal(signal.SIGSTOP)
        stopped_at = time.monotonic()
        worker.stop()
        code = exited.join(15)
        took = time.monotonic() - stopped_at
        assert code == 0, f"still stopping {took:.1f}s after stop() (grace 0.5s)"
        # A wait already under way (the claim loop's) ends by the socket timeout (2 s): the
        # shutdown takes at most grace + margin + that, plus slack for a loaded machine.
        assert took < 0.5 + 1.0 + 2.0 + 1.5, f"took {took:.1f}s"
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.stop()


# A recycled child: reports why on the supervisor's pipe (as the CLI does), exits 5.
_RECYCLED_CHILD = (
    "import os, sys; from jobqueue.worker import recycling; "
    "recycling.report_to_supervisor('3 runs done (max 3 per child); RSS 1.0 MB'); "
    "sys.exit(recycling.EXIT_RECYCLED)"
)


def test_a_supervisor_replaces_recycled_children_at_once_with_no_crash_back_off(
    restored_signals: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """No Redis. Two children exit EXIT_RECYCLED one after the other; the crash back-off is
    made 60 s long: had a recycle taken that path, the third child would come a minute later.
    Each recycle is one INFO line with the child's reason; draining then is a clean exit."""
    monkeypatch.setattr(supervisor, "_RESTART_BACKOFF_S", 60.0)
    monkeypatch.setattr(supervisor, "_RESTART_BACKOFF_MAX_S", 60.0)
    spawned: list[subprocess.Popen[bytes]] = []

    def spawn(argv: list[str], url: str) -> subprocess.Popen[bytes]:
        report = int(os.environ[recycling.REPORT_FD_ENV])  # (what spawn_child passes on)
        code = _RECYCLED_CHILD if len(spawned) < 2 else _NAPPING_CHILD
        child = subprocess.Popen(
            [sys.executable, "-c", code], preexec_fn=supervisor.child_setup, pass_fds=(report,)
        )
        spawned.append(child)
        if len(spawned) == 3:
            threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGTERM)).start()
        return child

    started = time.monotonic()
    try:
        with caplog.at_level(logging.INFO, logger="jobqueue.supervisor"):
            code = supervisor.supervise(1, ["jobqueue", "worker"], "", grace=1.0, spawn_child=spawn)
        took = time.monotonic() - started
        assert code == 0
        assert len(spawned) == 3 and took < 20
        assert [c.returncode for c in spawned] == [5, 5, -signal.SIGTERM]
        lines = [r.getMessage() for r in caplog.records if "recycled" in r.getMessage()]
        assert lines == [
            f"recycled worker pid {spawned[0].pid} (3 runs done (max 3 per child); RSS 1.0 MB); "
            f"started worker pid {spawned[1].pid} (recycles: 1)",
            f"recycled worker pid {spawned[1].pid} (3 runs done (max 3 per child); RSS 1.0 MB); "
            f"started worker pid {spawned[2].pid} (recycles: 2)",
        ]
        assert not any("restarting" in r.getMessage() for r in caplog.records)
        assert recycling.REPORT_FD_ENV not in os.environ  # (put back as it was)
    finally:
        for c in spawned:
            with contextlib.suppress(OSError):
                c.kill()
            c.wait()
