"""Shared test helpers.

Scripts: what many tests do first, create runs and claim them, through the real scripts and
with an explicit clock (``now`` in ms; None: the server's). ``runner`` is a ScriptRunner (a
test's ``runner`` fixture, or ``jq.scripts``).

Workers: for the tests that run a Worker in-process: ``Worker.run()`` in a thread (no signal
handlers), stopped with ``worker.stop()``, watched only through its public surface (``stats``,
``in_flight()``, ``state``, ``unhealthy``). Tests about time (leases, heartbeats, timeouts,
self-fencing) give the worker a FakeClock (the ``clock`` fixture) and move it themselves. Tests
of faults put ``intercept_worker_calls`` between the worker's event loop and Redis."""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any, TypeVar

import redis

from jobqueue.client.aio import AsyncJobQueue
from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.models import Run
from jobqueue.runtime.clock import FakeClock
from jobqueue.settings import Settings
from jobqueue.store.io import Request, Scripts, Steps
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, CREATE_RUN, ClaimedRun, ClaimResult, RunSpec
from jobqueue.store.scripts import Call, ScriptRunner
from jobqueue.worker import RunPhase, RunView, Worker
from jobqueue.worker.redis_io import RedisIO

# -- scripts ----------------------------------------------------------------------------------

PAYLOAD = '{"args":[],"kwargs":{}}'
LEASE_MS = 30_000
# How long a run that claim dead-letters (lease expired on its last attempt) is kept.
DEAD_RETENTION_MS = 7_200_000


def spec(run_id: str, task: str = "t", payload: str = PAYLOAD, **fields: Any) -> RunSpec:
    """A run to create: task 't' with no arguments unless told; ``fields`` are RunSpec's
    (max_attempts, lease_ms, delay_ms, job_id, ...)."""
    return RunSpec(run_id, task, payload, **fields)


def create(
    runner: ScriptRunner,
    pk: PartitionKeys,
    *runs: str | RunSpec,
    now: int | None = 0,
    **fields: Any,
) -> list[bool]:
    """Create runs (run ids become ``spec(run_id, **fields)``) in one call; whether each was
    created (False: the run id existed)."""
    specs = [r if isinstance(r, RunSpec) else spec(r, **fields) for r in runs]
    return CREATE_RUN.parse(runner.run(CREATE_RUN.call(pk, specs, now=now)))


def create_new(
    runner: ScriptRunner,
    pk: PartitionKeys,
    *runs: str | RunSpec,
    now: int | None = 0,
    **fields: Any,
) -> None:
    """:func:`create`, for runs that must not exist yet."""
    assert all(create(runner, pk, *runs, now=now, **fields))


def claim(
    runner: ScriptRunner,
    pk: PartitionKeys,
    now: int | None = None,
    limit: int = 10,
    owner: str = "w1",
    lease_ms: int = LEASE_MS,
    retention_ms: int = DEAD_RETENTION_MS,
) -> ClaimResult:
    """Claim up to ``limit`` runs of one partition for ``owner``."""
    call = CLAIM.call(pk, limit, owner, lease_ms, retention_ms, now=now)
    return CLAIM.parse(runner.run(call))


def ids(result: ClaimResult) -> list[str]:
    """The run ids a claim took, in the order it took them."""
    return [r.run_id for r in result.runs]


def claim_one(
    runner: ScriptRunner,
    pk: PartitionKeys,
    now: int | None = None,
    owner: str = "w1",
    lease_ms: int = LEASE_MS,
    retention_ms: int = DEAD_RETENTION_MS,
) -> ClaimedRun:
    """Claim the one run due (the test keeps exactly one due)."""
    (run,) = claim(runner, pk, now, 1, owner, lease_ms, retention_ms).runs
    return run


T = TypeVar("T")


def drive_async(async_redis_client: Any, steps: Callable[[AsyncJobQueue], Steps[T]]) -> T:
    """``steps(ajq)`` driven by an AsyncJobQueue on the test's server (the
    ``async_redis_client`` fixture), which is closed afterwards."""

    async def go() -> T:
        ajq = AsyncJobQueue(async_redis_client)
        try:
            return await ajq.run_steps(steps(ajq))
        finally:
            await async_redis_client.aclose()

    return asyncio.run(go())


# -- workers ----------------------------------------------------------------------------------

# Short retry back-off, so that retried runs come back at once; and a short hand-back window
# for runs of tasks no worker has (Settings.unknown_task_*), so that they go dead soon.
FAST = Settings(
    backoff_base_s=0.05,
    backoff_cap_s=0.2,
    unknown_task_window_s=0.5,
    unknown_task_delay_s=0.02,
    unknown_task_delay_cap_s=0.1,
)
# A fake clock starts this far ahead of the server's: every run enqueued meanwhile is due.
FAKE_CLOCK_AHEAD_MS = 86_400_000


def fake_clock(jq: JobQueue) -> FakeClock:
    return FakeClock(now_ms=jq.server_time_ms() + FAKE_CLOCK_AHEAD_MS)


def make_worker(jq: JobQueue, **kw: Any) -> Worker:
    kw.setdefault("concurrency", 4)
    kw.setdefault("lease", 5.0)
    kw.setdefault("grace", 5.0)
    return Worker(jq, install_signal_handlers=False, **kw)


def _join(worker: Worker, thread: threading.Thread, timeout: float) -> None:
    """Join the worker's thread; on a fake clock, move it on meanwhile (the drain waits out
    its grace period on the worker's clock)."""
    clock = worker.clock
    deadline = time.monotonic() + timeout
    while thread.is_alive() and time.monotonic() < deadline:
        thread.join(0.02)
        if isinstance(clock, FakeClock):
            clock.advance(0.1)


@contextmanager
def running(worker: Worker, join_timeout: float = 10.0) -> Iterator[Worker]:
    thread = threading.Thread(target=worker.run, name="test-worker", daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        _join(worker, thread, join_timeout)
        assert not thread.is_alive(), "worker did not stop"


class Exited:
    """Worker.run() in a thread, its return value kept: for the tests where the worker must
    stop by itself."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.code: int | None = None
        self.thread = threading.Thread(target=self._run, name="test-worker", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        self.code = self.worker.run()

    def join(self, timeout: float) -> int | None:
        _join(self.worker, self.thread, timeout)
        return None if self.thread.is_alive() else self.code

    def close(self) -> None:
        # stop() from a thread of its own: a test that failed may have left the worker
        # blocked for ever, and the test must still end.
        threading.Thread(target=self.worker.stop, daemon=True).start()
        _join(self.worker, self.thread, 10)


# What a call on a cluster meets while a master fails over: tried again, as the daemons do
# (jobqueue's clients never re-send a command).
FAILING_OVER = (JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def poll(
    predicate: Callable[[], Any],
    timeout: float,
    interval: float = 0.01,
    retrying: tuple[type[BaseException], ...] = (),
) -> Any:
    """Ask ``predicate()`` every ``interval`` seconds until it holds (its value), for at most
    ``timeout`` seconds of real time; None when it never did (a try the caller may repeat;
    :func:`wait_for` where that is a failure). An error of a type in ``retrying`` counts as
    "not yet" (a call tried again while a cluster fails over, as the daemons do)."""
    deadline = time.monotonic() + timeout
    while True:
        value = None
        with suppress(retrying):
            value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            return None
        time.sleep(interval)


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str | Callable[[], str] = "",
    interval: float = 0.01,
    retrying: tuple[type[BaseException], ...] = (),
) -> Any:
    """Ask ``predicate()`` every ``interval`` seconds until it holds (its value), for at most
    ``timeout`` seconds of real time. ``what`` names what is awaited in the failure (a
    callable: read at the timeout, to say how far it got); ``retrying`` as :func:`poll`'s."""
    value = poll(predicate, timeout, interval, retrying)
    if not value:
        said = what() if callable(what) else what
        raise AssertionError(f"timed out waiting for {said or predicate}")
    return value


async def wait_for_async(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "",
    interval: float = 0.01,
) -> Any:
    """:func:`wait_for` inside an event loop: the loop runs on between the looks. The
    predicate may be a coroutine function (its result is awaited)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what or predicate}")
        await asyncio.sleep(interval)


async def settle(turns: int = 20) -> None:
    """Let the event loop run what is ready, ``turns`` rounds: a task started just now runs
    until it blocks (on an event, a lock, I/O). No time passes on any clock."""
    for _ in range(turns):
        await asyncio.sleep(0)


def advance_until(
    clock: FakeClock,
    predicate: Callable[[], Any],
    step: float = 0.05,
    timeout: float = 10.0,
    what: str = "",
) -> Any:
    """Move the fake clock on by ``step`` at a time until ``predicate()`` holds."""

    def moved() -> Any:
        value = predicate()
        if not value:
            clock.advance(step)
        return value

    return wait_for(moved, timeout, what)


def server_time_past(jq: JobQueue, ms: int, timeout: float = 10.0) -> int:
    """Wait until the server's clock (the one that judges leases, due times and ages when no
    ``now`` is given) reads past ``ms``; that reading."""
    reading: int = wait_for(
        lambda: (t := jq.server_time_ms()) > ms and t, timeout, f"the server's clock past {ms}"
    )
    return reading


def listener_blocked(client: Any) -> int:
    """The id of the connection blocked in a run waiter's listener's XREAD, on the server
    ``client`` talks to (waits until there is one)."""

    def find() -> int | None:
        for c in client.client_list():
            if c.get("cmd") == "xread" and "b" in c.get("flags", ""):
                return int(c["id"])
        return None

    found: int = wait_for(find, what="the listener's blocking read")
    return found


def finished(jq: JobQueue, run_id: str, timeout: float = 10.0) -> Run:
    def check() -> Run | None:
        run = jq.get_run(run_id)
        return run if run.finished else None

    run: Run = wait_for(check, timeout, f"run {run_id} to finish")
    return run


def state_is(jq: JobQueue, run_id: str, state: str, timeout: float = 10.0) -> Run:
    run: Run = wait_for(
        lambda: (r := jq.get_run(run_id)).state == state and r, timeout, f"{run_id} {state}"
    )
    return run


def busy_slots(worker: Worker) -> int:
    """Slots taken: runs whose code has not returned yet."""
    return sum(r.phase.holds_slot for r in worker.in_flight())


def held(worker: Worker, run_id: str) -> RunView | None:
    """The worker's view of its (newest) attempt of ``run_id``, if it holds one."""
    views = [r for r in worker.in_flight() if r.run_id == run_id]
    return max(views, key=lambda r: r.fence) if views else None


def phase_of(worker: Worker, run_id: str) -> RunPhase | None:
    view = held(worker, run_id)
    return None if view is None else view.phase


def pid_alive(pid: int) -> bool:
    """The process exists and is not a zombie (a zombie child of ours still answers kill(0)).
    A process reaped between the two looks is gone: /proc/<pid>/stat then fails with ENOENT at
    the open or ESRCH at the read (ProcessLookupError; seen in a fresh-clone bin/test)."""
    try:
        os.kill(pid, 0)
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except (ProcessLookupError, FileNotFoundError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


# -- a relay pass held half way (tests of what a slow relay meets) --------------------------


def until_relayed(steps: Steps[Any]) -> Steps[Request | None]:
    """A relay pass up to (not including) its ``relayed`` call, which clears the outbox
    entries it read: that request (the pass is left suspended there), or None when the pass
    ended before it (an empty outbox)."""
    try:
        request: Request = next(steps)
        while True:
            if isinstance(request, Scripts) and any(c.script == "relayed" for c in request.calls):
                return request
            try:
                reply = yield request
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration:
        return None


def until_call(steps: Steps[Any], script: str, nth: int = 1) -> Steps[Request | None]:
    """Steps driven up to (not including) the ``nth`` request that calls ``script``: that
    request (the steps are left suspended there: a process killed just before it), or None
    when they ended first."""
    try:
        request: Request = next(steps)
        while True:
            if isinstance(request, Scripts) and any(c.script == script for c in request.calls):
                nth -= 1
                if nth == 0:
                    return request
            try:
                reply = yield request
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration:
        return None


def resume(steps: Steps[Any], request: Request) -> Steps[Any]:
    """The rest of a pass ``until_relayed`` stopped, from the request it stopped at."""
    try:
        while True:
            try:
                reply = yield request
            except Exception as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration as done:
        return done.value


Send = Callable[[list[Call]], list[Any]]


def intercept_worker_calls(
    monkeypatch: Any, intercept: Callable[[list[Call], Send], list[Any]]
) -> None:
    """Every batch of script calls a worker's event loop sends (claims, heartbeats, commits,
    releases) goes through ``intercept(calls, send)`` instead, on a thread of its own: it may
    block (a stall of that call only, the loop goes on), change the replies ``send(calls)``
    gives (errors are values, as RedisIO.run_each returns them) or raise."""
    real = RedisIO.run_each

    async def run_each(self: RedisIO, calls: Any) -> list[Any]:
        loop = asyncio.get_running_loop()

        def send(some: list[Call]) -> list[Any]:
            return asyncio.run_coroutine_threadsafe(real(self, list(some)), loop).result()

        return await asyncio.to_thread(intercept, list(calls), send)

    monkeypatch.setattr(RedisIO, "run_each", run_each)


class IdleWaits:
    """The worker's waits on its wake lists (RedisIO.wait_on_lists), begun and ended."""

    def __init__(self) -> None:
        self.begun = 0
        self.ended = 0

    def asleep(self, since: int = 0) -> bool:
        """A wait is under way, and it is one begun after the first ``since`` waits."""
        return self.begun > max(self.ended, since)


def watch_idle_waits(monkeypatch: Any) -> IdleWaits:
    """Count a worker's waits on its wake lists: where a test must know the worker is asleep
    (its claim loop found nothing and waits for a token) instead of hoping it is by now."""
    real = RedisIO.wait_on_lists
    waits = IdleWaits()

    async def wait_on_lists(self: RedisIO, keys: list[str], timeout: float) -> str | None:
        waits.begun += 1
        try:
            return await real(self, keys, timeout)
        finally:
            waits.ended += 1

    monkeypatch.setattr(RedisIO, "wait_on_lists", wait_on_lists)
    return waits
