"""The worker daemon: claims runs in batches, executes them, keeps their leases alive, and
commits each with its fence. ``Worker`` wires its collaborators, each with one job:

- ``claiming.Claimer``, the claim loop, its thread ("jq-claim", which also runs short sync
  tasks: ``inline.InlineLane``; the caller's thread waits for it);
- ``executing.Executor``, the pool of task threads, the event loop thread for ``async def``
  tasks, and the timeouts;
- ``committing.Committer``, its thread: complete/fail commits in one round trip per master;
- ``leases.LeaseKeeper``, its thread: heartbeats, self-fencing, the registry entry;
- ``runs.RunTable``, what they share: every run held, in its ``RunPhase``, and the slots.

A run whose heartbeat is refused (fenced out, cancelled) has ``ctx.cancelled`` set; its commit
is refused by the fence in any case, so a stalled worker can never overwrite a newer attempt.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket
import threading
import uuid
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any, Literal

import redis

from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConnectionFailed, JobQueueError, ServerRefused
from jobqueue.hooks import Middleware
from jobqueue.policy.backoff import Backoff
from jobqueue.runtime.clock import REAL_CLOCK, Clock
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.runtime.signals import SignalRelay
from jobqueue.settings import to_ms
from jobqueue.worker.claiming import MAX_IDLE_WAIT_S, Claimer
from jobqueue.worker.committing import Committer
from jobqueue.worker.executing import Executor
from jobqueue.worker.leases import LeaseKeeper, Presence
from jobqueue.worker.recycling import EXIT_RECYCLED, MB, Recycling
from jobqueue.worker.registry import WorkerTasks
from jobqueue.worker.runs import MAX_REJECTED_KEPT, RunTable, RunView, WorkerStats
from jobqueue.worker.supervisor import DEFAULT_GRACE_S

__all__ = [
    "DEFAULT_STUCK_LIMIT_S",
    "EXIT_RECYCLED",
    "EXIT_UNHEALTHY",
    "MAX_IDLE_WAIT_S",
    "MAX_REJECTED_KEPT",
    "SHUTDOWN_MARGIN_S",
    "Worker",
    "WorkerState",
    "WorkerStats",
    "until_redis_answers",
]

log = logging.getLogger("jobqueue.worker")

DEFAULT_CONCURRENCY = 8

DRAIN_COMMIT_WAIT_S = 5.0
# The whole shutdown (drain, commits, release, unregister) ends this long after the grace
# period at the latest, even when Redis hangs; a daemon process then exits regardless.
SHUTDOWN_MARGIN_S = 6.0
STOPPED_BY_SECOND_SIGNAL = 1
# The worker cannot go on (its event loop thread died, stuck code holds its slots): it exits
# with this code so that the supervisor or the orchestrator starts a clean process.
EXIT_UNHEALTHY = 4  # not 3: the CLI says "Redis unreachable" with that
# Stuck code (timed out, never returned) holding more than half the slots this long.
DEFAULT_STUCK_LIMIT_S = 60.0
# Calls retried until Redis answers (startup): the first pause, doubling up to the cap.
REDIS_RETRY_S = 0.1
REDIS_RETRY_CAP_S = 5.0

WorkerState = Literal["new", "starting", "running", "stopping", "stopped"]

# What a passing outage raises: a lost connection, a cluster failing over (CLUSTERDOWN, or
# a slot with no known master yet).
_OUTAGES = (
    ConnectionFailed,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


class GaveUp(Exception):
    """A call retried until Redis answers, abandoned because the worker is stopping."""


def until_redis_answers(
    fn: Callable[[], Any],
    *,
    clock: Clock = REAL_CLOCK,
    give_up: threading.Event | None = None,
) -> Any:
    """Call ``fn`` until Redis answers it (startup, reconnects): back-off with jitter between
    tries, never a crash on an outage. Raises GaveUp once ``give_up`` is set."""
    backoff = Backoff(REDIS_RETRY_S, REDIS_RETRY_CAP_S)
    never = threading.Event()
    while True:
        if give_up is not None and give_up.is_set():
            raise GaveUp
        try:
            return fn()
        except _OUTAGES as exc:
            if isinstance(exc, ServerRefused) and exc.replies is not None:
                raise  # some calls of a pipeline ran: the caller re-sends only the others
            pause = backoff.next()
            log.warning("Redis unavailable (%s); retrying in %.1fs", exc, pause)
            clock.wait(give_up or never, pause)


class Worker:
    """Runs the tasks registered on ``jq`` for the runs of ``queues`` (default: the queues
    those tasks name; the default queue when they name none) until stopped. A run of a task
    it has no code for is handed back for a worker that has (see Settings.unknown_task_*).

    To watch one run in-process (tests, embedding): ``stats`` (counters), ``in_flight()``
    (the runs held and their phases), ``state`` and ``unhealthy``. ``clock`` is the time
    it measures leases, heartbeats, timeouts and back-off by (a fake one in tests)."""

    def __init__(
        self,
        jq: JobQueue,
        queues: Iterable[str] | None = None,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        lease: float | None = None,
        grace: float = DEFAULT_GRACE_S,
        worker_id: str | None = None,
        install_signal_handlers: bool = True,
        metrics: Metrics = NO_METRICS,
        stuck_limit: float = DEFAULT_STUCK_LIMIT_S,
        clock: Clock = REAL_CLOCK,
        idle_wait: float = MAX_IDLE_WAIT_S,
        shutdown_margin: float = SHUTDOWN_MARGIN_S,
        burst: bool = False,
        middleware: Iterable[Middleware] = (),
        max_runs: int | None = None,
        max_memory_mb: float | None = None,
    ) -> None:
        """``burst``: run what is due, then stop (``run()`` returns 0) once nothing is due
        and no run is held (``jobqueue worker --burst``, tests). ``max_runs`` /
        ``max_memory_mb``: once that many runs are answered, or the process's resident
        memory is over that many MB after runs finished, stop claiming, drain, and have
        ``run()`` return EXIT_RECYCLED (``--max-runs-per-child`` and
        ``--max-memory-per-child``: the supervisor starts a replacement)."""
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self._recycling: Recycling | None = None
        if max_runs is not None or max_memory_mb is not None:
            self._recycling = Recycling(
                max_runs, None if max_memory_mb is None else round(max_memory_mb * MB)
            )
        self.jq = jq
        tasks = WorkerTasks(jq)
        # With no queues given, those the app's tasks name: a worker of one app never claims
        # another app's runs from a queue it has no task for.
        given = list(queues or [])
        self.queues = given or tasks.queues() or [jq.settings.default_queue]
        self._queues_chosen = (
            "given" if given else "named by its tasks" if tasks.queues() else "the default"
        )
        self.concurrency = concurrency
        self.lease_ms = to_ms(lease or jq.settings.default_lease_s)
        self.grace = grace
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.install_signal_handlers = install_signal_handlers
        self.stats = WorkerStats()
        self.metrics = metrics
        self.stuck_limit = stuck_limit
        self.clock = clock
        self.shutdown_margin = shutdown_margin

        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._running = threading.Event()  # claiming has begun
        self._run_called = False
        self._signals = 0
        # The signal handler only notifies it (no locks there); its thread logs and stops.
        self._signal_relay = SignalRelay(self._signalled, "jq-signals")
        # clock.monotonic() of the stop request: the grace period counts from it.
        self._stop_at: float | None = None
        self._unhealthy: str | None = None
        self._recycled: str | None = None
        self._owns_process = False  # run() installed the signal handlers: a daemon process

        self._table = RunTable(concurrency)
        # the queue's middleware, then this worker's own (jobqueue.hooks)
        self.hooks = jq.hooks.plus(middleware)
        self._committer = Committer(
            jq, tasks, self._table, self.stats, metrics, clock, self._stopped,
            self._shutdown_left, self.hooks, worker_id=self.id,
            on_answered=self._answered if self._recycling is not None else None,
        )
        self._executor = Executor(
            jq, tasks, self._table, self.stats, clock, self._committer.put, self._die,
            self._stopping, concurrency=concurrency, stuck_limit=stuck_limit, hooks=self.hooks,
        )
        self._presence = Presence(
            jq, self.id, self.queues, concurrency, self.lease_ms, self._table, self._stopping,
            tasks=tasks.names(),
        )
        self._task_names = tasks.names()
        self._keeper = LeaseKeeper(
            jq, self._table, self.stats, metrics, clock, self._presence,
            lease_ms=self.lease_ms, stopped=self._stopped,
            on_tick=self._executor.enforce_timeouts, stop_code=self._executor.cancel_async,
            hooks=self.hooks,
        )
        self._claimer = Claimer(
            jq, self.id, self.queues, self._table, self._executor.start, metrics, clock,
            lease_ms=self.lease_ms, stopping=self._stopping,
            commits_refused=self._committer.refused, idle_wait=idle_wait,
            drained=self._burst_done if burst else None,
            launch=self._executor.launch_started, run_inline=self._executor.run_inline,
        )
        self._executor.watch_inline(self._claimer.take_over)

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

    def in_flight(self) -> list[RunView]:
        """The runs this worker holds now, each with its phase: claimed and not yet both
        returned by its code and answered by Redis."""
        return self._table.views()

    # -- running and stopping ------------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (SIGTERM/SIGINT or ``stop()``); returns the exit code: 0,
        EXIT_UNHEALTHY when the worker gave up (see the log for why), or EXIT_RECYCLED when
        it stopped for ``max_runs`` or ``max_memory_mb`` (``recycled`` says which)."""
        self._run_called = True
        self._signal_relay.start()
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self.on_signal)
            signal.signal(signal.SIGINT, self.on_signal)
            self._owns_process = True
        threads: list[threading.Thread] = []
        try:
            try:
                self._prepare()
            except GaveUp:
                log.info("worker %s stopped before it could start", self.id)
                return 0
            threads = [
                threading.Thread(target=self._committer.run, name="jq-commit", daemon=True),
                threading.Thread(target=self._keeper.run, name="jq-keeper", daemon=True),
            ]
            for t in threads:
                t.start()
            log.info(
                "worker %s started: queues=%s (%s) tasks=%s concurrency=%d lease=%.1fs",
                self.id,
                ",".join(self.queues),
                self._queues_chosen,
                ",".join(self._task_names) or "none",
                self.concurrency,
                self.lease_ms / 1000,
            )
            self._running.set()
            self._claimer.run()
            self._drain()
        finally:
            self._stopped.set()
            self._committer.close()
            for t in threads:
                t.join(timeout=max(0.1, min(5.0, self._shutdown_left())))
            self._executor.shutdown()
            if threads:
                self._bounded(
                    functools.partial(self._presence.withdraw, self._claimer.own_wake_key),
                    "unregistering",
                )
            self._signal_relay.close()
        log.info(
            "worker %s stopped: claimed=%d completed=%d failed=%d released=%d fenced_out=%d",
            self.id,
            self.stats.claimed,
            self.stats.completed,
            self.stats.failed,
            self.stats.released,
            self.stats.fenced_out,
        )
        if self._unhealthy is not None:
            log.error("worker %s exits with %d: %s", self.id, EXIT_UNHEALTHY, self._unhealthy)
            return EXIT_UNHEALTHY
        if self._recycled is not None:
            return EXIT_RECYCLED
        return 0

    def _burst_done(self) -> None:
        log.info(
            "worker %s: nothing claimable and nothing held (burst): stopping (runs held back "
            "by a paused queue or a limit stay pending)",
            self.id,
        )
        self.stop()

    def stop(self) -> None:
        """Graceful: stop claiming, let in-flight runs finish within the grace period."""
        first = not self._stopping.is_set()
        if self._stop_at is None:
            self._stop_at = self.clock.monotonic()
        self._stopping.set()
        self._table.wake()
        if first:
            # Wake the claim loop from its blocking wait at once (not up to the idle wait
            # later). From a thread: the wake is a Redis call, which may hang.
            threading.Thread(target=self._claimer.wake, name="jq-stop", daemon=True).start()
            if self._owns_process:
                # A daemon process always ends: past grace + margin it exits whatever hangs
                # (its leases expire and other workers reclaim the runs).
                threading.Thread(target=self._watchdog, name="jq-watchdog", daemon=True).start()

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        """The SIGTERM/SIGINT handler run() installs: the first signal drains, a second one
        exits at once. Async-signal-safe: no lock, no logging, no Redis (see
        jobqueue.runtime.signals); the work happens on the relay's thread."""
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now; our leases expire and other workers reclaim the runs.
            os.write(2, b"second signal: exiting at once, in-flight runs will be reclaimed\n")
            os._exit(STOPPED_BY_SECOND_SIGNAL)
        if self._stop_at is None:
            self._stop_at = self.clock.monotonic()  # the grace period counts from the signal
        self._signal_relay.notify(signum)

    def _signalled(self, signum: int) -> None:
        log.info(
            "signal %s: draining (grace %.0fs); a second signal exits at once", signum, self.grace
        )
        self.stop()

    def _answered(self, n: int) -> None:
        """The committer's thread, after each batch of ``n`` runs answered: recycle (stop
        claiming, drain, exit EXIT_RECYCLED) once Recycling says why. Not a worker already
        stopping for another reason (a signal, stop(), giving up): it exits as it would."""
        if self._recycling is None or self._stopping.is_set():
            return
        reason = self._recycling.answered(n)
        if reason is not None:
            self._recycled = reason
            log.info("worker %s recycles: %s; stops claiming and drains", self.id, reason)
            self.stop()

    def _die(self, reason: str) -> None:
        """Give up: log why, stop claiming, exit EXIT_UNHEALTHY after the drain."""
        if self._unhealthy is None:
            self._unhealthy = reason
            log.error("worker %s cannot go on: %s; stopping", self.id, reason)
        self.stop()

    def _prepare(self) -> None:
        retry = functools.partial(until_redis_answers, clock=self.clock, give_up=self._stopping)
        for q in self.queues:
            retry(functools.partial(self.jq.register_queue, q))
        served = [k for q in self.queues for k in self.jq.all_partition_keys(q)]
        self._claimer.set_partitions(served)
        self._committer.set_partitions(served)
        self._presence.started_ms = retry(self.jq.server_time_ms)
        self._executor.start_loop(self._stopped)

    # -- shutting down -------------------------------------------------------------------

    def _shutdown_deadline(self) -> float:
        start = self._stop_at if self._stop_at is not None else self.clock.monotonic()
        return start + self.grace + self.shutdown_margin

    def _shutdown_left(self) -> float:
        return self._shutdown_deadline() - self.clock.monotonic()

    def _watchdog(self) -> None:
        if self.clock.wait(self._stopped, max(self._shutdown_left(), 0.0) + 0.5):
            return
        log.error(
            "worker %s: shutdown still not done %.0fs after the grace period (Redis not "
            "answering?); exiting now, in-flight runs will be reclaimed",
            self.id,
            self.shutdown_margin,
        )
        logging.shutdown()
        os._exit(STOPPED_BY_SECOND_SIGNAL)

    def _bounded(self, fn: Callable[[], Any], what: str) -> None:
        """Run a shutdown call, waiting for it until the shutdown deadline at most (Redis may
        hang; the call then goes on in a daemon thread that dies with the process)."""
        t = threading.Thread(target=fn, name=f"jq-{what}", daemon=True)
        t.start()
        t.join(max(self._shutdown_left(), 0.1))
        if t.is_alive():
            log.warning("%s did not finish before the shutdown deadline; giving up", what)

    def _drain(self) -> None:
        """Let in-flight runs finish within the grace period, let their commits land, then
        hand the rest back."""
        clock, table = self.clock, self._table
        if self._stop_at is None:
            self._stop_at = clock.monotonic()
        # The grace period counts from the stop request (the claim loop may have taken a
        # while to notice it: a claim call waiting on a slow Redis).
        deadline = self._stop_at + self.grace
        shutdown_deadline = self._shutdown_deadline()
        table.wait_until(table.idle, deadline, clock.monotonic)
        # Finished runs' commits take a round trip; a Redis outage must not hold the
        # shutdown forever (their leases expire and other workers reclaim them).
        commit_deadline = min(
            max(deadline, clock.monotonic() + DRAIN_COMMIT_WAIT_S), shutdown_deadline - 2.0
        )
        table.wait_until(table.committed, commit_deadline, clock.monotonic)
        leftover = table.release_unfinished()
        if not leftover:
            return
        for e in leftover:
            e.ctx.cancel("worker shutting down")
        if clock.monotonic() >= shutdown_deadline - 1.0:
            log.warning(
                "no time left to release %d runs; their leases will expire", len(leftover)
            )
            return
        calls = self._keeper.release_calls(leftover)
        got: list[list[Any]] = []

        def release() -> None:
            try:
                got.append(self.jq.scripts.run_many(calls))
            except JobQueueError as exc:
                log.warning("release failed (%s); the leases will expire and be reclaimed", exc)

        self._bounded(release, "release")
        if got:
            self._keeper.report_released(leftover, got[0])
