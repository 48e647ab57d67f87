"""The worker daemon: one asyncio event loop owns claiming, heartbeats, commits and timeouts;
``async def`` tasks run on that loop, sync tasks on at most ``concurrency`` threads that hand
their outcomes back to it. ``Worker`` wires its parts, each with one job and one ``Shared``:

- ``claiming.Claimer``: claims up to the free slots, a round trip per master, and waits on
  the wake lists when nothing is due;
- ``executing.Executor``: starts each claimed run, turns what its code returned or raised
  into the outcome to commit, and enforces task timeouts;
- ``committing.Committer``: commits what finished while the last commit was on its way,
  together, each outcome fenced;
- ``leases.LeaseKeeper``: heartbeats, self-fencing, the registry entry;
- ``runs.RunTable``: every run held, in its ``RunPhase``, and the slots.

A run whose heartbeat is refused (fenced out, cancelled) has ``ctx.cancelled`` set (an async
run's task is cancelled); its commit is refused by the fence in any case, so a stalled worker
can never overwrite a newer attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Iterable
from types import FrameType
from typing import Any, Literal

from jobqueue.client.sync import JobQueue
from jobqueue.hooks import Middleware
from jobqueue.runtime.clock import REAL_CLOCK, Clock
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.runtime.signals import SignalRelay
from jobqueue.settings import to_ms
from jobqueue.worker.claiming import Claimer
from jobqueue.worker.committing import Committer
from jobqueue.worker.config import (
    DEFAULT_CONCURRENCY,
    DEFAULT_STUCK_LIMIT_S,
    MAX_IDLE_WAIT_S,
    SHUTDOWN_MARGIN_S,
    WorkerConfig,
)
from jobqueue.worker.executing import Executor
from jobqueue.worker.leases import LeaseKeeper, Presence
from jobqueue.worker.recycling import EXIT_RECYCLED, MB, Recycling
from jobqueue.worker.redis_io import RedisIO
from jobqueue.worker.registry import WorkerTasks
from jobqueue.worker.runs import MAX_REJECTED_KEPT, RunTable, RunView, WorkerStats
from jobqueue.worker.shared import Shared
from jobqueue.worker.shutdown import STOPPED_BY_SECOND_SIGNAL, Shutdown
from jobqueue.worker.startup import (
    GaveUp,
    LoopThread,
    _new_loop,
    prepare,
    until_redis_answers,
)

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_STUCK_LIMIT_S",
    "EXIT_RECYCLED",
    "EXIT_UNHEALTHY",
    "MAX_IDLE_WAIT_S",
    "MAX_REJECTED_KEPT",
    "SHUTDOWN_MARGIN_S",
    "Worker",
    "WorkerConfig",
    "WorkerState",
    "WorkerStats",
    "until_redis_answers",
]

log = logging.getLogger("jobqueue.worker")

# The worker cannot go on (stuck code holds its slots): it exits with this code so that the
# supervisor or the orchestrator starts a clean process.
EXIT_UNHEALTHY = 4  # not 3: the CLI says "Redis unreachable" with that

WorkerState = Literal["new", "starting", "running", "stopping", "stopped"]

class Worker:
    """Runs the tasks registered on ``jq`` for the runs of ``queues`` (default: the queues
    those tasks name; the default queue when they name none) until stopped. A run of a task
    it has no code for is handed back for a worker that has (see Settings.unknown_task_*).

    Settings come from ``config`` (a WorkerConfig), or from the keyword arguments of the
    same names. To watch one run in-process (tests, embedding): ``stats`` (counters),
    ``in_flight()`` (the runs held and their phases), ``state`` and ``unhealthy``. ``clock``
    is the time it measures leases, heartbeats, timeouts and back-off by (a fake one in
    tests)."""

    def __init__(
        self,
        jq: JobQueue,
        queues: Iterable[str] | None = None,
        *,
        config: WorkerConfig | None = None,
        concurrency: int | None = None,
        lease: float | None = None,
        grace: float | None = None,
        stuck_limit: float | None = None,
        idle_wait: float | None = None,
        shutdown_margin: float | None = None,
        burst: bool | None = None,
        max_runs: int | None = None,
        max_memory_mb: float | None = None,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        metrics: Metrics = NO_METRICS,
        clock: Clock = REAL_CLOCK,
        middleware: Iterable[Middleware] = (),
    ) -> None:
        """``burst``: run what is due, then stop (``run()`` returns 0) once nothing is due
        and no run is held (``jobqueue worker --burst``, tests)."""
        cfg = (config or WorkerConfig()).overridden(
            concurrency=concurrency, lease_s=lease, grace_s=grace, stuck_limit_s=stuck_limit,
            idle_wait_s=idle_wait, shutdown_margin_s=shutdown_margin, burst=burst,
            max_runs=max_runs, max_memory_mb=max_memory_mb,
        )
        self.config = cfg
        self._recycling: Recycling | None = None
        if cfg.max_runs is not None or cfg.max_memory_mb is not None:
            memory = None if cfg.max_memory_mb is None else round(cfg.max_memory_mb * MB)
            self._recycling = Recycling(cfg.max_runs, memory)
        self._recycled: str | None = None
        self.jq = jq
        tasks = WorkerTasks(jq)
        # With no queues given, those the app's tasks name: a worker of one app never claims
        # another app's runs from a queue it has no task for.
        chosen = list(queues or [])
        self.queues = chosen or tasks.queues() or [jq.settings.default_queue]
        self._queues_chosen = (
            "given" if chosen else "named by its tasks" if tasks.queues() else "the default"
        )
        self.concurrency = cfg.concurrency
        self.lease_ms = to_ms(cfg.lease_s or jq.settings.default_lease_s)
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.install_signal_handlers = install_signal_handlers
        self.stats = WorkerStats()
        self.metrics = metrics
        self.clock = clock
        # the queue's middleware, then this worker's own (jobqueue.hooks)
        self.hooks = jq.hooks.plus(middleware)
        self._tasks = tasks
        self._shared: Shared | None = None  # made on the loop, by run()

        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._running = threading.Event()  # claiming has begun
        self._run_called = False
        self._signals = 0
        # The signal handler only notifies it (no locks there); its thread logs and stops.
        self._signal_relay = SignalRelay(self._signalled, "jq-signals")
        self._shutdown = Shutdown(self.id, cfg.grace_s, cfg.shutdown_margin_s, clock)
        self._unhealthy: str | None = None
        self._owns_process = False  # run() installed the signal handlers: a daemon process
        self._loop: asyncio.AbstractEventLoop | None = None
        self._table = RunTable(cfg.concurrency)

    # -- what can be watched -------------------------------------------------------------

    @property
    def state(self) -> WorkerState:
        """new (run() not called), starting (registering its queues), running (claiming),
        stopping (draining), stopped (run() has returned or is about to)."""
        if self._stopped.is_set():
            return "stopped"
        if self._stopping.is_set():
            return "stopping"
        if self._running.is_set():
            return "running"
        return "starting" if self._run_called else "new"

    @property
    def unhealthy(self) -> str | None:
        """Why the worker gave up (it then exits EXIT_UNHEALTHY), or None."""
        return self._unhealthy

    @property
    def recycled(self) -> str | None:
        """Why the worker recycles (max_runs or max_memory_mb reached: it then exits
        EXIT_RECYCLED), or None."""
        return self._recycled

    @property
    def grace(self) -> float:  # seconds in-flight runs get to finish once a stop is asked for
        return self._shutdown.grace_s

    def in_flight(self) -> list[RunView]:
        """The runs this worker holds now, each with its phase: claimed and not yet both
        returned by its code and answered by Redis."""
        return self._table.views()

    # -- running and stopping ------------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (SIGTERM/SIGINT or ``stop()``); returns the exit code: 0,
        EXIT_UNHEALTHY when the worker gave up (see the log for why), or EXIT_RECYCLED when
        it stopped for ``max_runs`` or ``max_memory_mb`` (``recycled`` says which). Blocks;
        the worker's event loop runs on a thread of its own, "jq-async" (see ``serve`` to
        run the worker on an event loop of yours)."""
        self._run_called = True
        self._signal_relay.start()
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
            self._owns_process = True
        loop = LoopThread(self.serve, _new_loop(self.config.event_loop))  # (a ConfigError)
        try:
            loop.run()
        except BaseException:
            # The caller leaves (KeyboardInterrupt): the loop must not claim on, leasing runs
            # nobody heartbeats or commits; the drain gets until the shutdown deadline.
            self.stop()
            loop.join(max(self._shutdown.left(), 0.0))
            raise
        finally:
            self._stopped.set()
            self._shutdown.exited.set()
            self._signal_relay.close()
        if loop.result is not None:
            return loop.result
        # The loop itself died (SystemExit from a callback of task code, a bug): nothing can
        # drain on it. The leases expire and other workers reclaim the runs; a clean process
        # is what this one's supervisor or orchestrator starts next.
        self._unhealthy = self._unhealthy or "the asyncio event loop thread died"
        log.critical("worker %s: the asyncio event loop thread died: %r", self.id,
                     loop.failure, exc_info=loop.failure)
        return EXIT_UNHEALTHY

    async def serve(self) -> int:
        """The worker on the running event loop, until stopped; the exit code, as run()."""
        self._run_called = True
        self._loop = asyncio.get_running_loop()
        s = self._shared = Shared(
            jq=self.jq, io=RedisIO(self.jq.redis), config=self.config, worker_id=self.id,
            queues=self.queues, lease_ms=self.lease_ms, tasks=self._tasks, table=self._table,
            stats=self.stats, metrics=self.metrics, clock=self.clock,
            hooks=self.hooks if self.hooks else None, stopping=self._stopping,
        )
        if self._stopping.is_set():
            s.stop_event.set()
        committer = Committer(
            s, self._shutdown.left, self._answered if self._recycling is not None else None
        )
        executor = Executor(s, committer.put, self._die)
        executor.bind_loop(self._loop)
        presence = Presence(s)
        keeper = LeaseKeeper(s, executor, presence)
        claimer = Claimer(s, executor)
        self._claimer = claimer
        background: list[asyncio.Task[Any]] = []
        started = False
        try:
            try:
                await prepare(self.jq, self.queues, self.clock, self._stopping,
                              (claimer, committer), presence)
            except GaveUp:
                log.info("worker %s stopped before it could start", self.id)
                return 0
            started = True
            background = [
                asyncio.ensure_future(committer.run()),
                asyncio.ensure_future(keeper.run()),
            ]
            for part, name in zip(background, ("committer", "keeper"), strict=True):
                part.add_done_callback(functools.partial(self._part_ended, name))
            _log_started(self)
            self._running.set()
            try:
                await claimer.run()
            except Exception as exc:  # a bug: still drain what is held, then exit unhealthy
                log.exception("the claim loop failed")
                self._die(f"the claim loop failed: {exc!r}")
            if self.config.burst and not self._stopping.is_set():
                log.info("worker %s: nothing claimable and nothing held (burst): stopping (runs "
                         "kept waiting by a paused queue or a limit stay pending)", self.id)
                self.stop()
            await self._shutdown.drain(self._table, s, keeper)
        finally:
            self._stopped.set()
            committer.close()
            if background:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        asyncio.shield(background[0]),
                        max(0.1, min(5.0, self._shutdown.left())),
                    )
            for t in background:
                t.cancel()
            executor.shutdown()
            if started:
                await self._shutdown.bounded(presence.withdraw, "unregistering")
            await s.io.aclose()
            self._shutdown.exited.set()
        _log_stopped(self)
        if self._unhealthy is not None:
            log.error("worker %s exits with %d: %s", self.id, EXIT_UNHEALTHY, self._unhealthy)
            return EXIT_UNHEALTHY
        if self._recycled is not None:
            return EXIT_RECYCLED
        return 0

    def _answered(self, n: int) -> None:
        """On the loop, after each batch of ``n`` runs answered: recycle (stop claiming,
        drain, exit EXIT_RECYCLED) once Recycling says why. Not a worker already stopping for
        another reason (a signal, stop(), giving up): it exits as it would."""
        if self._recycling is None or self._stopping.is_set():
            return
        reason = self._recycling.answered(n)
        if reason is not None:
            self._recycled = reason
            log.info("worker %s recycles: %s; stops claiming and drains", self.id, reason)
            self.stop()

    def _part_ended(self, name: str, part: asyncio.Task[Any]) -> None:
        """The committer or the keeper ended before the worker stopped (a bug): its leases
        would no longer be renewed or its outcomes committed, so the worker gives up."""
        if part.cancelled() or self._stopped.is_set():
            return
        error = part.exception()
        if error is None and name == "committer" and self._stopping.is_set():
            return  # (closed by the drain)
        log.critical("the worker's %s ended: %r", name, error, exc_info=error)
        self._die(f"the worker's {name} ended: {error!r}")

    def stop(self) -> None:
        """Graceful: stop claiming, let in-flight runs finish within the grace period. From
        any thread."""
        first = not self._stopping.is_set()
        self._shutdown.requested()
        self._stopping.set()
        loop = self._loop
        if loop is not None:
            try:
                here = asyncio.get_running_loop()
            except RuntimeError:
                here = None
            if here is loop:  # (at once: nothing is claimed after a stop from the loop)
                self._stop_on_loop()
            else:
                with contextlib.suppress(RuntimeError):  # the loop has closed: nothing to wake
                    loop.call_soon_threadsafe(self._stop_on_loop)
        if first and self._owns_process:
            # A daemon process always ends: past grace + margin it exits whatever hangs
            # (its leases expire and other workers reclaim the runs).
            self._shutdown.start_watchdog()

    def _stop_on_loop(self) -> None:
        if self._shared is not None:
            self._shared.stop_event.set()
        self._table.wake()
        claimer = getattr(self, "_claimer", None)
        if claimer is not None:
            claimer.wake()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM/SIGINT handler run() installs: the first signal drains, a second one
        exits at once. Async-signal-safe: no lock, no logging, no Redis (see
        jobqueue.runtime.signals); the work happens on the relay's thread."""
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now; our leases expire and other workers reclaim the runs.
            os.write(2, b"second signal: exiting at once, in-flight runs will be reclaimed\n")
            os._exit(STOPPED_BY_SECOND_SIGNAL)
        self._shutdown.requested()  # the grace period counts from the signal
        self._signal_relay.notify(signum)

    def _signalled(self, signum: int) -> None:
        log.info(
            "signal %s: draining (grace %.0fs); a second signal exits at once", signum, self.grace
        )
        self.stop()

    def _die(self, reason: str) -> None:
        """Give up: log why, stop claiming, exit EXIT_UNHEALTHY after the drain."""
        if self._unhealthy is None:
            self._unhealthy = reason
            log.error("worker %s cannot go on: %s; stopping", self.id, reason)
        self.stop()


def _log_started(w: Worker) -> None:
    log.info(
        "worker %s started: queues=%s (%s) tasks=%s concurrency=%d lease=%.1fs",
        w.id,
        ",".join(w.queues),
        w._queues_chosen,
        ",".join(w._tasks.names()) or "none",
        w.concurrency,
        w.lease_ms / 1000,
    )


def _log_stopped(w: Worker) -> None:
    log.info(
        "worker %s stopped: claimed=%d completed=%d failed=%d released=%d fenced_out=%d",
        w.id,
        w.stats.claimed,
        w.stats.completed,
        w.stats.failed,
        w.stats.released,
        w.stats.fenced_out,
    )
