"""Running claimed runs: ``async def`` tasks as asyncio tasks on the worker's event loop,
sync tasks on a pool of at most ``concurrency`` threads that hand their outcomes back to the
loop in batches; turning what the code returned or raised into the outcome to commit; and the
task timeouts (a sync task cannot be killed: timed-out code keeps its slot until it returns,
and a worker whose slots it mostly holds gives up). Claiming and committing never run task
code."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import functools
import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from jobqueue.client.flows import add_to_flow_steps
from jobqueue.context import NO_META, Reporter, RunContext, Writer, bind, unbind
from jobqueue.errors import Fatal, FlowAddFailed, PayloadError, UnknownTask
from jobqueue.hooks import Hooks
from jobqueue.models import decode_meta
from jobqueue.payload import decode_payload, encode_result
from jobqueue.runtime.logs import run_fields
from jobqueue.runtime.tracebacks import format_traceback
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import FENCED_WRITE, PROGRESS, ClaimedRun
from jobqueue.tasks import Task
from jobqueue.worker.runs import Finished, InFlight
from jobqueue.worker.shared import Shared

log = logging.getLogger("jobqueue.worker")


class _StartFailed(Exception):
    """A run that could not be started (a payload its task cannot take): failed, never
    retried."""


class _NoCode(Exception):
    """A run of a task this worker has no code for: handed back for a worker that has it."""


class _TaskExit(Exception):
    """An async task's SystemExit/KeyboardInterrupt, carried out as an ordinary failure
    (raised inside the loop it would stop the worker's loop itself)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class TaskThreads:
    """The threads sync tasks run on: at most ``size``, started as runs find none idle, kept
    until shutdown. A thread that ends a job takes the next one queued without sleeping, and
    an idle thread is woken for a queued job only by the thread that took the job before it
    (a chain): short jobs are run by the few threads already awake, each wake-up a context
    switch saved; long ones wake a thread each, one after the other. Daemon threads, not
    ThreadPoolExecutor: the interpreter joins its threads at exit, so one task stuck past the
    grace period would keep a drained worker process from exiting; a stuck daemon thread
    dies with the process."""

    def __init__(self, size: int, name: str) -> None:
        self._size = size
        self._name = name
        self._jobs: collections.deque[Callable[[], None]] = collections.deque()
        self._ready = threading.Condition(threading.Lock())
        self._threads = 0
        self._idle = 0  # threads waiting for a job
        self._waking = False  # an idle thread was woken and has not taken a job yet
        self._closed = False

    @property
    def threads(self) -> int:
        return self._threads

    def submit(self, job: Callable[[], None]) -> None:
        """Queue ``job``; RuntimeError when no thread at all could be started for it."""
        with self._ready:
            self._jobs.append(job)
            if self._idle > 0:
                if not self._waking:  # (else the woken thread wakes the next: the chain)
                    self._waking = True
                    self._ready.notify()
            elif self._threads < self._size:
                try:
                    self._start()
                except RuntimeError:
                    if self._threads == 0:  # nothing will ever take it
                        self._jobs.remove(job)
                        raise

    def _start(self) -> None:
        # under the lock
        self._threads += 1
        try:
            threading.Thread(
                target=self._work, name=f"{self._name}-{self._threads}", daemon=True
            ).start()
        except RuntimeError:  # no thread to be had: the ones there take the jobs
            self._threads -= 1
            raise

    def _work(self) -> None:
        ready, jobs = self._ready, self._jobs
        while True:
            with ready:
                while not jobs and not self._closed:
                    self._idle += 1
                    ready.wait()
                    self._idle -= 1
                self._waking = False
                if not jobs:
                    return  # closed
                job = jobs.popleft()
                if jobs:  # more queued: wake an idle thread (the chain goes on), or start one
                    if self._idle > 0:
                        self._waking = True
                        ready.notify()
                    elif self._threads < self._size:
                        with contextlib.suppress(RuntimeError):
                            self._start()
            try:
                job()
            except BaseException:  # a job reports its own outcome; this is a bug
                log.exception("a task thread's job failed")

    def shutdown(self) -> None:
        """Idle threads exit; busy ones finish their task (or die with the process)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()


class Executor:
    """Starts claimed runs and hands each outcome to ``commit`` (the committer). Everything
    but the sync tasks' own code runs on the worker's event loop."""

    def __init__(
        self, shared: Shared, commit: Callable[[Finished], None], die: Callable[[str], None]
    ) -> None:
        self._s = shared
        self._commit = commit
        self._die = die
        self._threads = TaskThreads(shared.config.concurrency, "jq-task")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stuck_since: float | None = None
        # Outcomes of sync runs, handed back from their threads: the loop takes them all at
        # one wake-up (a thread wakes it only when the list was empty).
        self._returned: list[Finished] = []
        self._returned_lock = threading.Lock()
        # per partition: ctx.fenced_write's and ctx.progress's calls
        self._writers: dict[PartitionKeys, tuple[Writer, Reporter]] = {}

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def shutdown(self) -> None:
        self._threads.shutdown()

    # -- starting (on the loop) ----------------------------------------------------------

    def start(self, run: ClaimedRun, keys: PartitionKeys, now_ms: int, sent: float) -> None:
        """``sent``: when the claim was sent (clock.monotonic()), from which its lease counts."""
        s = self._s
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
            s.clock.monotonic(),
            timeout_s,
            lease_ms,
            granted=sent,
            lease_deadline=sent + lease_ms / 1000,
        )
        s.table.add(entry)
        s.stats.claimed += 1
        if log.isEnabledFor(logging.DEBUG):  # run_fields costs a dict per run: only if shown
            log.debug(
                "claimed run_id=%s fence=%d attempt=%d",
                run.run_id,
                run.fence,
                run.attempt,
                extra=run_fields(run),
            )
        try:
            task = s.tasks.code_for(run.task)
            args, kwargs = decode_payload(run.payload)
        except UnknownTask as exc:
            # Another worker may have the task (a rolling deploy, two apps on one queue).
            self._finish(self._outcome(entry, None, _NoCode(str(exc))))
            return
        except Exception as exc:
            # Never retried: another attempt would meet the same bytes.
            if isinstance(exc, PayloadError):
                error = str(exc)
            elif isinstance(exc, RecursionError):
                error = "stored arguments are nested too deeply to decode"
            else:
                log.exception("starting run_id=%s failed", run.run_id)
                error = f"Fatal: could not start the run: {type(exc).__name__}: {exc}"
            self._finish(self._outcome(entry, None, _StartFailed(error)))
            return
        hooks = s.hooks
        if task.is_async:
            # The task's done-callback reports the outcome, so the slot frees only when the
            # coroutine has really ended (one that swallows CancelledError still holds it).
            t = asyncio.get_running_loop().create_task(_run_async(task, ctx, args, kwargs, hooks))
            entry.task = t
            t.add_done_callback(functools.partial(self._async_done, entry))
        else:
            try:
                self._threads.submit(lambda: self._run_in_thread(entry, task, args, kwargs))
            except RuntimeError as exc:  # no thread could be started for it
                error = f"Fatal: could not start the run: {type(exc).__name__}: {exc}"
                self._finish(self._outcome(entry, None, _StartFailed(error)))

    def _async_done(self, entry: InFlight, t: asyncio.Task[Any]) -> None:
        if t.cancelled():
            self._finish(self._outcome(entry, None, asyncio.CancelledError()))
            return
        error = t.exception()
        self._finish(self._outcome(entry, None if error is not None else t.result(), error))

    # -- sync runs (on a task thread) ----------------------------------------------------

    def _run_in_thread(
        self, entry: InFlight, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        value: Any
        error: BaseException | None
        if entry.ctx.cancelled.is_set():
            # told to stop before a thread took it (its lease lost, the worker shutting
            # down): its code never starts
            value, error = None, concurrent.futures.CancelledError()
        else:
            try:
                value, error = _run_sync(task, entry.ctx, args, kwargs, self._s.hooks), None
            except BaseException as exc:
                value, error = None, exc
        item = self._outcome(entry, value, error)  # (the result is encoded here, not on the loop)
        with self._returned_lock:
            self._returned.append(item)
            first = len(self._returned) == 1
        if first:
            loop = self._loop
            try:
                assert loop is not None
                loop.call_soon_threadsafe(self._take_returned)
            except RuntimeError:  # the loop is closed: the worker is gone, the lease expires
                pass

    def _take_returned(self) -> None:
        with self._returned_lock:
            items, self._returned = self._returned, []
        for item in items:
            try:
                self._finish(item)
            except Exception:  # one bad outcome must not strand the others of the batch
                log.exception("finishing run_id=%s failed", item.entry.run.run_id)

    # -- outcomes ------------------------------------------------------------------------

    def _finish(self, item: Finished) -> None:
        """On the loop: the run's code has returned (or could not start): free its slot and
        hand its outcome to the committer, unless the run timed out (the timeout's fail
        stands: a late success must not win over it) or was handed back at shutdown."""
        entry = item.entry
        item.duration_s = self._s.clock.monotonic() - entry.started
        if self._s.table.returned(entry):
            self._commit(item)

    def _outcome(self, entry: InFlight, value: Any, error: BaseException | None) -> Finished:
        try:
            item = self._judge(entry, value, error)
        except BaseException as exc:
            # The run must not stay in flight (heartbeated for ever, its slot taken).
            log.exception("finishing run_id=%s failed; failing it", entry.run.run_id)
            text = f"Fatal: finishing the run failed: {type(exc).__name__}: {exc}"
            item = Finished(entry, ok=False, error=text[:8000], retry=False)
        if not item.ok:
            # An exception's text may hold lone surrogates (undecodable bytes): not UTF-8,
            # so neither Redis nor a log line's consumer could take it.
            item.error = _utf8(item.error)
            item.traceback = _utf8(item.traceback)
        return item

    def _judge(self, entry: InFlight, value: Any, error: BaseException | None) -> Finished:
        if isinstance(error, _TaskExit):
            error = error.original
        if isinstance(error, _StartFailed):
            return Finished(entry, ok=False, error=str(error), retry=False)
        if isinstance(error, _NoCode):
            return Finished(entry, ok=False, error=str(error), retry=False, bounce=True)
        if isinstance(error, concurrent.futures.CancelledError | asyncio.CancelledError):
            # Stopped: its lease lost or ran out (self-fencing), or the run cancelled. Where
            # nobody took the run meanwhile the fence accepts this fail: the attempt counts
            # and the run is retried, as a claim taking back its expired lease would do (a
            # cancelled run's fail is refused: its record says cancelled).
            reason = entry.ctx.cancel_reason or "cancelled"
            return Finished(entry, ok=False, error=reason, retry=True)
        if isinstance(error, Fatal):
            tb = self._traceback(error)
            return Finished(entry, ok=False, error=f"Fatal: {error}", retry=False, traceback=tb)
        if error is not None:
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            tb = self._traceback(error)
            return Finished(entry, ok=False, error=text[:8000], retry=True, traceback=tb)
        try:
            result = encode_result(value, self._s.jq.settings.max_payload_bytes)
        except PayloadError as exc:
            return Finished(entry, ok=False, error=str(exc), retry=False)
        except Exception as exc:  # MemoryError, a custom Mapping's RuntimeError, ...
            text = f"the task result could not be encoded: {type(exc).__name__}: {exc}"
            return Finished(entry, ok=False, error=text[:8000], retry=False)
        return Finished(entry, ok=True, result_json=result)

    def _traceback(self, error: BaseException) -> str:
        settings = self._s.jq.settings
        return format_traceback(
            error, settings.traceback_max_frames, settings.traceback_max_bytes
        )

    # -- timeouts (on the loop, at the keeper's tick) ------------------------------------

    def enforce_timeouts(self, now: float) -> None:
        """Fail the runs whose code ran over its timeout (a retry per policy); their slots
        stay taken until the code returns."""
        expired, stuck = self._s.table.timed_out(now)
        self._check_stuck(now, stuck)
        for e in expired:
            self._s.stats.timeouts += 1
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
            e.stop_code(f"timed out after {e.timeout_s:g}s")

    def _check_stuck(self, now: float, stuck: int) -> None:
        """Timed-out code that never returns keeps its slot (a thread cannot be killed). When
        such code holds most slots for stuck_limit, this worker is of no use: it gives up so
        that a clean process replaces it."""
        concurrency, limit = self._s.config.concurrency, self._s.config.stuck_limit_s
        if stuck * 2 <= concurrency:
            self._stuck_since = None
            return
        if self._stuck_since is None:
            self._stuck_since = now
        elif now - self._stuck_since >= limit and not self._s.stopping.is_set():
            self._die(
                f"{stuck} of {concurrency} slots taken by timed-out task code that never "
                f"returned, for over {limit:g}s"
            )

    # -- fenced writes (the task's own calls, on its thread or the loop) -----------------

    def _writer_for(self, keys: PartitionKeys) -> Writer:
        jq, clock = self._s.jq, self._s.clock

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
        jq = self._s.jq
        made = jq.run_steps(add_to_flow_steps(jq, run_id, queue, steps, fence))
        return [rid for rid, _, _ in made]

    def _reporter_for(self, keys: PartitionKeys) -> Reporter:
        jq, clock = self._s.jq, self._s.clock

        def report(run_id: str, fence: int, progress: float, message: str) -> bool:
            # lone surrogates (undecodable bytes) are not UTF-8: the call could not be sent
            message = message.encode("utf-8", "replace").decode("utf-8")
            call = PROGRESS.call(keys, run_id, fence, progress, message, now=clock.now_ms())
            return PROGRESS.parse(jq.scripts.run(call)).accepted

        return report


def _utf8(text: str) -> str:
    return text if text.isascii() else text.encode("utf-8", "replace").decode("utf-8")


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
