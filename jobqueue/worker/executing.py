"""Running claimed runs: sync tasks on a pool of daemon threads (short ones on the claim
loop's own thread: jobqueue.worker.inline), ``async def`` tasks on one event loop thread;
turning what the code returned or raised into the outcome to commit; and the task timeouts
(a sync task cannot be killed: timed-out code keeps its slot until it returns, and a worker
whose slots it mostly holds gives up)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import queue as queue_mod
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from jobqueue.client.flows import add_to_flow_steps
from jobqueue.client.sync import JobQueue
from jobqueue.context import NO_META, Reporter, RunContext, Writer, bind, unbind
from jobqueue.errors import Fatal, FlowAddFailed, PayloadError, UnknownTask
from jobqueue.hooks import Hooks
from jobqueue.models import decode_meta
from jobqueue.payload import decode_payload, encode_result
from jobqueue.runtime.clock import Clock
from jobqueue.runtime.logs import run_fields
from jobqueue.runtime.tracebacks import format_traceback
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import FENCED_WRITE, PROGRESS, ClaimedRun
from jobqueue.tasks import Task
from jobqueue.worker.inline import TAKE_OVER_S, InlineLane, TaskSpeeds
from jobqueue.worker.registry import WorkerTasks
from jobqueue.worker.runs import LEASE_LOST, Finished, InFlight, RunTable, WorkerStats

log = logging.getLogger("jobqueue.worker")


class _StartFailed(Exception):
    """A run that could not be started (a payload its task cannot take, a closed loop): failed,
    never retried."""


class _NoCode(Exception):
    """A run of a task this worker has no code for: handed back for a worker that has it."""


class _TaskExit(Exception):
    """An async task's SystemExit/KeyboardInterrupt, carried out of the event loop as an
    ordinary failure (raised inside the loop it would stop the loop thread itself)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


# The sync pool runs jobs on at least this many threads (fewer if --concurrency is lower;
# measured: 8 drained one-Redis-call tasks faster than 4, and 1 ms CPU tasks as fast) ...
MIN_THREADS = 8
# ... and on one per job waiting when no job was taken for this long while some waited.
STARVED_S = 0.1
# Weight of the newest task in the running average of task CPU time, and in the low quantile
# of their waits when below it / above it.
_EWMA = 0.05
_DOWN = 0.5
_UP = 0.01
# The process's CPU per job is sampled over at least this many jobs.
_SAMPLE_RUNS = 20


# A pool thread with more jobs waiting holds the outcomes of the jobs it ran, up to this many
# or this long, and hands them on together: each hand-off wakes the committer and the claim
# loop (a GIL transfer and context switches), once per batch instead of once per run.
OUTCOME_BATCH = 64
OUTCOME_LINGER_S = 0.003
_EMPTY: Any = object()  # no job taken yet


class _Held:
    """One pool thread's outcomes not handed on yet (see OUTCOME_BATCH): its own, and the
    keeper's ``tick`` hands them on if the thread's next job runs long."""

    __slots__ = ("items", "lock", "since")

    def __init__(self) -> None:
        self.items: list[tuple[Any, Any, BaseException | None]] = []
        self.lock = threading.Lock()
        self.since = 0  # time.perf_counter_ns() when the first of them was held


class DaemonPool:
    """A pool of daemon threads running sync tasks: ``size`` at most, and as few as keep the
    interpreter busy.

    Threads that run Python at once only hand the GIL back and forth: while tasks are short
    or mostly CPU (one Redis call is both), another thread taking the next job gains nothing
    and costs context switches. So the pool measures each task's CPU time
    (``time.thread_time_ns``) and wait (wall less CPU; a low quantile, as the GIL waits
    inflate the rest), and the process's CPU per job (its own claims and commits hold the
    GIL too). One task's wait is covered by ``wait / CPU per job`` other jobs, so it runs on
    ``(wait + task CPU) / CPU per job`` threads, at least MIN_THREADS: a task that waits 9 ms
    for 1 ms of CPU grows it to 10 threads, a task that computes keeps it at MIN_THREADS. A
    thread starts only when a job waits and no thread is idle; one leaves when there are more
    than twice as many as wanted. ``tick`` (the keeper's) starts a thread for each job
    waiting when none was taken for STARVED_S: long or stuck code holds every thread, and
    tasks that long lose nothing to hand-offs.

    A thread that ends a job while others wait holds its outcome and takes the next job,
    handing the outcomes on together (OUTCOME_BATCH, OUTCOME_LINGER_S): one wake-up of the
    committer and the claim loop per batch, not per run. It hands them on before it waits for
    a job, and the keeper's ``tick`` does when the thread's next job runs long, so a finished
    run waits at most about OUTCOME_LINGER_S plus a tick for its commit.

    Not ``ThreadPoolExecutor``: the interpreter joins its threads at exit, so one task stuck
    past the grace period would keep a drained worker process from exiting (its run already
    released). A stuck daemon thread dies with the process. And no Future per job: a job
    carries a token and the pool calls ``done(token, value, error)`` when it ends (a Future,
    with its Condition and callback list, was a third of a no-op run's cost).
    """

    def __init__(
        self,
        size: int,
        name: str,
        done: Callable[[Any, Any, BaseException | None], None],
        timed: Callable[[Any, float], None] = lambda token, wall_s: None,
    ) -> None:
        """``done(token, value, error)`` gets each outcome; ``timed(token, wall_s)`` each
        job's wall time, as the pool measures it anyway."""
        self._done = done
        self._timed = timed
        self._name = name
        self._size = size
        self._jobs: queue_mod.SimpleQueue[tuple[Any, Callable[..., Any], tuple[Any, ...]] | None]
        self._jobs = queue_mod.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0  # threads waiting for a job
        self._queued = 0  # jobs not taken yet
        # when a thread last took a job; real time, not the worker's clock: real threads wait
        self._taken_at = time.monotonic()
        self._closed = False
        # the tasks' CPU time (a running average) and wait (a low quantile), in ns; none
        # measured yet
        self._cpu = 0.0
        self._wait = -1.0
        # the process's CPU per job taken, all threads (the worker's own claims and commits
        # take the GIL too), sampled by tick()
        self._run_cpu = 0.0
        self._taken = 0
        self._sampled: tuple[int, int] = (time.process_time_ns(), 0)
        # each thread's outcomes not handed on yet
        self._held: list[_Held] = []
        with self._lock:
            self._grow(min(size, MIN_THREADS))

    @property
    def threads(self) -> int:
        """Threads started so far."""
        return self._threads

    def width(self) -> int:
        """How many threads the tasks measured so far ask for (MIN_THREADS before any is)."""
        if self._run_cpu <= 0.0:  # not sampled yet
            return min(self._size, MIN_THREADS)
        per_run = max(self._cpu, self._run_cpu)
        wanted = int((self._wait + self._cpu) / per_run + 0.999)
        return max(min(self._size, MIN_THREADS), min(wanted, self._size))

    def submit(self, token: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        with self._lock:
            self._queued += 1
            waiting = self._queued - self._idle
            if waiting > 0 and self._threads < self._size:
                self._grow(min(waiting, self.width() - self._threads))
        self._jobs.put((token, fn, args))

    def ran_elsewhere(self, n: int) -> None:
        """``n`` jobs ran on another thread (inline): the process's CPU per job counts them."""
        with self._lock:
            self._taken += n

    def tick(self) -> None:
        """Called now and then (the keeper's tick): samples the process's CPU per job; a
        thread for each job waiting when none was taken for STARVED_S."""
        cpu_ns, taken = time.process_time_ns(), self._taken
        cpu0, taken0 = self._sampled
        if taken - taken0 >= _SAMPLE_RUNS:
            self._sampled = (cpu_ns, taken)
            sample = (cpu_ns - cpu0) / (taken - taken0)
            self._run_cpu = sample if self._run_cpu <= 0.0 else self._run_cpu * 0.7 + sample * 0.3
        # A thread holding outcomes while its next job runs long: they go on from here.
        old = time.perf_counter_ns() - int(OUTCOME_LINGER_S * 1e9)
        with self._lock:
            holders = list(self._held)
        for held in holders:
            if held.items and held.since <= old:
                self._hand_on(held)
        with self._lock:
            if (
                self._queued > self._idle
                and self._threads < self._size
                and time.monotonic() - self._taken_at >= STARVED_S
            ):
                self._taken_at = time.monotonic()
                self._grow(min(self._queued - self._idle, self._size - self._threads))

    def _grow(self, n: int) -> None:
        # under self._lock
        if self._closed:
            return
        for _ in range(max(n, 0)):
            t = threading.Thread(
                target=self._work, name=f"{self._name}-{self._threads}", daemon=True
            )
            self._threads += 1
            t.start()

    def _work(self) -> None:
        get, get_nowait, lock = self._jobs.get, self._jobs.get_nowait, self._lock
        wall_ns, cpu_ns, keep = time.perf_counter_ns, time.thread_time_ns, 1.0 - _EWMA
        monotonic = time.monotonic
        held = _Held()
        with lock:
            self._held.append(held)
        try:
            self._serve(held, get, get_nowait, wall_ns, cpu_ns, keep, monotonic)
        finally:
            with lock:
                self._held.remove(held)
            self._hand_on(held)

    def _serve(
        self,
        held: _Held,
        get: Callable[[], Any],
        get_nowait: Callable[[], Any],
        wall_ns: Callable[[], int],
        cpu_ns: Callable[[], int],
        keep: float,
        monotonic: Callable[[], float],
    ) -> None:
        lock, linger_ns = self._lock, int(OUTCOME_LINGER_S * 1e9)
        while True:
            with lock:
                if self._threads > self.width() * 2 and not held.items:
                    # the tasks now ask for far fewer threads
                    self._threads -= 1
                    return
                self._idle += 1
            job: Any = _EMPTY
            if held.items:
                # Outcomes held: take the next job only if one is waiting; before blocking
                # for one, hand them on.
                with contextlib.suppress(queue_mod.Empty):
                    job = get_nowait()
                if job is _EMPTY:
                    self._hand_on(held)
            if job is _EMPTY:
                job = get()
            with lock:
                self._idle -= 1
                if job is None:
                    return
                self._queued -= 1
                self._taken += 1
                self._taken_at = monotonic()
            token, fn, args = job
            wall0, cpu0 = wall_ns(), cpu_ns()
            try:
                value = fn(*args)
            except BaseException as exc:
                error: BaseException | None = exc
                value = None
            else:
                error = None
            wall1 = wall_ns()
            cpu = max(cpu_ns() - cpu0, 1)
            waited = max(wall1 - wall0 - cpu, 0)
            self._timed(token, (wall1 - wall0) / 1e9)
            # Unlocked: a lost update among racing threads only skips one sample.
            self._cpu = self._cpu * keep + cpu * _EWMA
            # The time a task waits is its wall time less its CPU, but that includes its
            # waits for the GIL, longer the more threads there are: counted, they would grow
            # the pool without end. A low quantile is the wait of a task that found the GIL
            # free: followed at once downwards, slowly upwards.
            w = self._wait
            if w < 0.0:  # the first task measured
                self._wait = float(waited)
            else:
                self._wait = w + (waited - w) * (_DOWN if waited < w else _UP)
            with held.lock:
                if not held.items:
                    held.since = wall1
                held.items.append((token, value, error))
                full = len(held.items) >= OUTCOME_BATCH or wall1 - held.since >= linger_ns
            if full:
                self._hand_on(held)

    def _hand_on(self, held: _Held) -> None:
        """Hand the held outcomes to ``done``, in the order their jobs ended."""
        with held.lock:
            items, held.items = held.items, []
        for token, value, error in items:
            try:
                self._done(token, value, error)
            except BaseException:  # the pool thread must survive a failing callback
                log.exception("finishing a run failed")

    def shutdown(self) -> None:
        """Idle threads exit; busy ones finish their task (or die with the process)."""
        with self._lock:
            self._closed = True
            threads = self._threads
        for _ in range(threads):
            self._jobs.put(None)


class Executor:
    """Starts claimed runs and hands each outcome to ``commit`` (the committer's queue)."""

    def __init__(
        self,
        jq: JobQueue,
        tasks: WorkerTasks,
        table: RunTable,
        stats: WorkerStats,
        clock: Clock,
        commit: Callable[[Finished], None],
        die: Callable[[str], None],
        stopping: threading.Event,
        *,
        concurrency: int,
        stuck_limit: float,
        hooks: Hooks | None = None,
    ) -> None:
        self._jq = jq
        # None without middleware: one identity test per run on the hot path
        self._hooks = hooks if hooks else None
        self._tasks = tasks
        self._table = table
        self._stats = stats
        self._clock = clock
        self._commit = commit
        self._die = die
        self._stopping = stopping
        self._concurrency = concurrency
        self._stuck_limit = stuck_limit
        self._stuck_since: float | None = None
        self._pool = DaemonPool(concurrency, "jq-task", self._on_outcome, self._timed)
        # Short sync tasks run on the claim loop's thread (jobqueue.worker.inline).
        self._speeds = TaskSpeeds()
        self._lane = InlineLane(
            self._on_outcome, self._pool.submit, self._speeds, self._pool.ran_elsewhere
        )
        self._take_over: Callable[[], None] = lambda: None
        self._loop: asyncio.AbstractEventLoop | None = None
        # per partition: ctx.fenced_write's and ctx.progress's calls
        self._writers: dict[PartitionKeys, tuple[Writer, Reporter]] = {}
        # Async runs started since the last launch_started(): handed to the loop together.
        self._to_spawn: list[tuple[InFlight, Task[Any, Any], list[Any], dict[str, Any]]] = []

    # -- the event loop ------------------------------------------------------------------

    def start_loop(self, stopped: threading.Event) -> None:
        """Start the event loop thread if any task is ``async def``."""
        if not self._tasks.any_async:
            return
        self._loop = asyncio.new_event_loop()
        threading.Thread(
            target=self._run_loop, args=(self._loop, stopped), name="jq-async", daemon=True
        ).start()

    def _run_loop(self, loop: asyncio.AbstractEventLoop, stopped: threading.Event) -> None:
        try:
            loop.run_forever()
        except BaseException as exc:
            log.critical("the asyncio event loop thread died: %r", exc, exc_info=True)
        if not stopped.is_set():
            # Every async run would hang: not a worker that should look alive.
            self._die("the asyncio event loop thread died")

    def shutdown(self) -> None:
        self._pool.shutdown()
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # a loop already closed
                self._loop.call_soon_threadsafe(self._loop.stop)

    # -- starting ------------------------------------------------------------------------

    def start(self, run: ClaimedRun, keys: PartitionKeys, now_ms: int, sent: float) -> None:
        """``sent``: when the claim was sent (clock.monotonic()), from which its lease counts."""
        writers = self._writers.get(keys) or self._writers.setdefault(
            keys, (self._writer_for(keys), self._reporter_for(keys))
        )
        ctx = RunContext(
            run_id=run.run_id,
            fence=run.fence,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            task=run.task,
            queue=keys.queue,
            job_id=run.job_id,
            scheduled_for_ms=run.scheduled_for_ms,
            meta=(decode_meta(run.meta) or NO_META) if run.meta else NO_META,
            _writer=writers[0],
            _reporter=writers[1],
            _adder=self._add_to_flow,
        )
        timeout_s = run.timeout_ms / 1000 if run.timeout_ms > 0 else None
        lease_ms = max(run.lease_until_ms - now_ms, 1)
        entry = InFlight(
            run,
            keys,
            ctx,
            self._clock.monotonic(),
            timeout_s,
            lease_ms,
            granted=sent,
            lease_deadline=sent + lease_ms / 1000,
        )
        self._table.add(entry)
        self._stats.claimed += 1
        if log.isEnabledFor(logging.DEBUG):  # run_fields costs a dict per run: only if shown
            log.debug(
                "claimed run_id=%s fence=%d attempt=%d",
                run.run_id,
                run.fence,
                run.attempt,
                extra=run_fields(run),
            )

        try:
            self._launch(entry)
        except UnknownTask as exc:
            # Another worker may have the task (a rolling deploy, two apps on one queue).
            self._on_outcome(entry, None, _NoCode(str(exc)))
        except Exception as exc:
            # Never retried: another attempt would meet the same bytes.
            if isinstance(exc, PayloadError):
                error = str(exc)
            elif isinstance(exc, RecursionError):
                error = "stored arguments are nested too deeply to decode"
            else:
                log.exception("starting run_id=%s failed", run.run_id)
                error = f"Fatal: could not start the run: {type(exc).__name__}: {exc}"
            self._on_outcome(entry, None, _StartFailed(error))

    def _launch(self, entry: InFlight) -> None:
        run, ctx = entry.run, entry.ctx
        task = self._tasks.code_for(run.task)
        args, kwargs = decode_payload(run.payload)
        entry.is_async = task.is_async
        if task.is_async:
            assert self._loop is not None
            self._to_spawn.append((entry, task, args, kwargs))
        elif self._speeds.inline(run.task):
            self._lane.add(run.task, (entry, _run_sync, (task, ctx, args, kwargs, self._hooks)))
        else:
            self._pool.submit(entry, _run_sync, (task, ctx, args, kwargs, self._hooks))

    def _timed(self, entry: InFlight, wall_s: float) -> None:
        """A sync run's wall time in the pool: short tasks go inline."""
        self._speeds.record(entry.run.task, wall_s)

    def run_inline(self) -> bool:
        """On the claim loop's thread: run the short sync runs it just started (see
        jobqueue.worker.inline). False when the keeper gave this thread up meanwhile (a run
        was stuck): another thread runs the claim loop now, and this one must leave it."""
        return self._lane.run()

    def watch_inline(self, take_over: Callable[[], None]) -> None:
        """``take_over()`` starts a new claim loop thread: called from the keeper's tick when
        an inline run is stuck."""
        self._take_over = take_over

    def launch_started(self) -> None:
        """Hand the async runs started since the last call to the event loop, in one wake-up
        of its thread (one per claim, not one per run: each is a write to the loop's
        self-pipe and a thread hand-off)."""
        batch, self._to_spawn = self._to_spawn, []
        if not batch or self._loop is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._spawn_many, batch)
        except RuntimeError as exc:  # the loop is closed: these runs can never start
            for entry, _, _, _ in batch:
                error = f"Fatal: could not start the run: {type(exc).__name__}: {exc}"
                self._on_outcome(entry, None, _StartFailed(error))

    def _spawn_many(
        self, batch: list[tuple[InFlight, Task[Any, Any], list[Any], dict[str, Any]]]
    ) -> None:
        for entry, task, args, kwargs in batch:
            self._spawn_async(entry, task, args, kwargs)

    def _spawn_async(
        self, entry: InFlight, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """On the loop: start the run's asyncio Task. Its own done-callback reports the
        outcome, so the slot frees only when the coroutine has really ended (a coroutine
        that swallows CancelledError still holds it)."""
        try:
            coro = _run_async(task, entry.ctx, args, kwargs, self._hooks)
            t = asyncio.get_running_loop().create_task(coro)
        except Exception as exc:
            self._on_outcome(entry, None, exc)
            return
        entry.task = t
        t.add_done_callback(functools.partial(self._on_task_done, entry))
        if entry.cancel_requested:
            t.cancel()

    def _on_task_done(self, entry: InFlight, t: asyncio.Task[Any]) -> None:
        if t.cancelled():
            self._on_outcome(entry, None, asyncio.CancelledError())
            return
        error = t.exception()
        self._on_outcome(entry, None if error is not None else t.result(), error)

    # -- outcomes ------------------------------------------------------------------------

    def _on_outcome(self, entry: InFlight, value: Any, error: BaseException | None) -> None:
        """The run's code has returned (or could not start): free its slot and hand its
        outcome to the committer, unless the run timed out (the timeout's fail stands: a
        late success must not win over it) or was handed back at shutdown."""
        try:
            item = self._outcome(entry, value, error)
        except BaseException as exc:
            # The run must not stay in flight (heartbeated for ever, its slot taken).
            log.exception("finishing run_id=%s failed; failing it", entry.run.run_id)
            text = f"Fatal: finishing the run failed: {type(exc).__name__}: {exc}"
            item = Finished(entry, ok=False, error=text[:8000], retry=False)
        item.duration_s = self._clock.monotonic() - entry.started
        if not item.ok:
            # An exception's text may hold lone surrogates (undecodable bytes): not UTF-8,
            # so neither Redis nor a log line's consumer could take it.
            item.error = _utf8(item.error)
            item.traceback = _utf8(item.traceback)
        if self._table.returned(entry):
            self._commit(item)

    def _outcome(self, entry: InFlight, value: Any, error: BaseException | None) -> Finished:
        if isinstance(error, _TaskExit):
            error = error.original
        if isinstance(error, _StartFailed):
            return Finished(entry, ok=False, error=str(error), retry=False)
        if isinstance(error, _NoCode):
            return Finished(entry, ok=False, error=str(error), retry=False, bounce=True)
        if isinstance(error, concurrent.futures.CancelledError | asyncio.CancelledError):
            reason = entry.ctx.cancel_reason or "cancelled"
            return Finished(entry, ok=False, error=reason, retry=entry.phase is not LEASE_LOST)
        if isinstance(error, Fatal):
            tb = self._traceback(error)
            return Finished(entry, ok=False, error=f"Fatal: {error}", retry=False, traceback=tb)
        if error is not None:
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            tb = self._traceback(error)
            return Finished(entry, ok=False, error=text[:8000], retry=True, traceback=tb)
        try:
            result = encode_result(value, self._jq.settings.max_payload_bytes)
        except PayloadError as exc:
            return Finished(entry, ok=False, error=str(exc), retry=False)
        except Exception as exc:  # MemoryError, a custom Mapping's RuntimeError, ...
            text = f"the task result could not be encoded: {type(exc).__name__}: {exc}"
            return Finished(entry, ok=False, error=text[:8000], retry=False)
        return Finished(entry, ok=True, result_json=result)

    def _traceback(self, error: BaseException) -> str:
        settings = self._jq.settings
        return format_traceback(
            error, settings.traceback_max_frames, settings.traceback_max_bytes
        )

    # -- stopping runs -------------------------------------------------------------------

    def cancel_async(self, entry: InFlight) -> None:
        """Cancel an async run's task (a sync run only sees ctx.cancelled)."""
        if entry.is_async and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(_cancel_task, entry)

    def enforce_timeouts(self, now: float) -> None:
        """Fail the runs whose code ran over its timeout (a retry per policy); their slots
        stay taken until the code returns."""
        self._pool.tick()
        if self._lane.stuck():
            log.warning(
                "a sync task run inline has run for over %gs: the claim loop goes on in a new "
                "thread, and the task runs in the pool (it tries the lane again much later)",
                TAKE_OVER_S,
            )
            self._take_over()
        expired, stuck = self._table.timed_out(now)
        self._check_stuck(now, stuck)
        for e in expired:
            self._stats.timeouts += 1
            e.ctx.cancel(f"timed out after {e.timeout_s:g}s")
            log.warning(
                "timeout: run_id=%s fence=%d attempt=%d ran over %gs; failing it",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                e.timeout_s,
                extra=run_fields(e.run),
            )
            timed_out = Finished(e, ok=False, error=f"timed out after {e.timeout_s:g}s")
            timed_out.duration_s = now - e.started
            self._commit(timed_out)
            self.cancel_async(e)

    def _check_stuck(self, now: float, stuck: int) -> None:
        """Timed-out code that never returns keeps its slot (a thread cannot be killed). When
        such code holds most slots for stuck_limit, this worker is of no use: it gives up so
        that a clean process replaces it."""
        if stuck * 2 <= self._concurrency:
            self._stuck_since = None
            return
        if self._stuck_since is None:
            self._stuck_since = now
        elif now - self._stuck_since >= self._stuck_limit and not self._stopping.is_set():
            self._die(
                f"{stuck} of {self._concurrency} slots held by timed-out task code that never "
                f"returned, for over {self._stuck_limit:g}s"
            )

    # -- fenced writes -------------------------------------------------------------------

    def _writer_for(self, keys: PartitionKeys) -> Writer:
        jq, clock = self._jq, self._clock

        def write(resource: str, value: str, fence: int, run_id: str, ttl: float | None) -> bool:
            ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
            call = FENCED_WRITE.call(
                keys, resource, fence, value, run_id, ttl_ms, now=clock.now_ms()
            )
            ok, _ = FENCED_WRITE.parse(jq.scripts.run(call))
            return ok

        return write

    def _add_to_flow(
        self, run_id: str, queue: str, fence: int, steps: list[tuple[str, Any]]
    ) -> list[str]:
        made = self._jq.run_steps(add_to_flow_steps(self._jq, run_id, queue, steps, fence))
        return [rid for rid, _, _ in made]

    def _reporter_for(self, keys: PartitionKeys) -> Reporter:
        jq, clock = self._jq, self._clock

        def report(run_id: str, fence: int, progress: float, message: str) -> bool:
            # lone surrogates (undecodable bytes) are not UTF-8: the call could not be sent
            message = message.encode("utf-8", "replace").decode("utf-8")
            call = PROGRESS.call(keys, run_id, fence, progress, message, now=clock.now_ms())
            return PROGRESS.parse(jq.scripts.run(call)).accepted

        return report


def _utf8(text: str) -> str:
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


def _cancel_task(entry: InFlight) -> None:
    # On the loop. Its task may not exist yet: _spawn_async then cancels it at birth.
    entry.cancel_requested = True
    if entry.task is not None:
        entry.task.cancel()


def _run_sync(
    task: Task[Any, Any],
    ctx: RunContext,
    args: list[Any],
    kwargs: dict[str, Any],
    hooks: Hooks | None,
) -> Any:
    token = bind(ctx)
    try:
        if hooks is None:
            return _checked(ctx, task.call_with(ctx, args, kwargs))
        hooks.before_run(ctx)
        try:
            value = _checked(ctx, task.call_with(ctx, args, kwargs))
        except BaseException as exc:
            hooks.after_run(ctx, exc)
            raise
        hooks.after_run(ctx, None)
        return value
    finally:
        unbind(token)


def _checked(ctx: RunContext, value: Any) -> Any:
    """The task's value, unless an add_to_flow of the attempt raised (see RunContext)."""
    if ctx.add_error is not None:
        raise FlowAddFailed(
            f"ctx.add_to_flow raised during this attempt ({ctx.add_error!r}): the runs "
            "waiting on this one may wait on runs that were never created, so it is not "
            "committed done"
        ) from ctx.add_error
    return value


async def _run_async(
    task: Task[Any, Any],
    ctx: RunContext,
    args: list[Any],
    kwargs: dict[str, Any],
    hooks: Hooks | None,
) -> Any:
    token = bind(ctx)
    try:
        if hooks is not None:
            hooks.before_run(ctx)
        try:
            value = _checked(ctx, await task.call_with(ctx, args, kwargs))
        except BaseException as exc:
            if hooks is not None:
                hooks.after_run(ctx, exc)
            raise
        if hooks is not None:
            hooks.after_run(ctx, None)
        return value
    except (SystemExit, KeyboardInterrupt) as exc:
        # Raised out of a Task these stop the event loop itself (its thread dies, and with
        # it every async run): here they fail this run, like any other exception.
        raise _TaskExit(exc) from exc
    finally:
        unbind(token)
