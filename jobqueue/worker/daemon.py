"""The worker daemon: claims runs in batches, executes them, keeps their leases alive, and
commits each with its fence.

Threads, each with one job:
- the claim loop (the caller's thread): claims up to the free slots, else sleeps on the wake
  list until the next due time or lease expiry that the claim script reported;
- a thread pool for sync tasks, and one event loop thread for ``async def`` tasks;
- the committer: drains finished runs and commits them (complete / fail) in one pipeline;
- the keeper: heartbeats every in-flight lease in one pipeline every lease/3, enforces task
  timeouts, and refreshes this worker's entry in the registry.

A run whose heartbeat is refused (fenced out, cancelled) has ``ctx.cancelled`` set; its commit
is refused by the fence in any case, so a stalled worker can never overwrite a newer attempt.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import queue as queue_mod
import random
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import redis

from jobqueue.client.sync import JobQueue
from jobqueue.context import RunContext, Writer, bind, unbind
from jobqueue.errors import (
    ConnectionFailed,
    Fatal,
    JobQueueError,
    PayloadError,
    ServerRefused,
    UnknownTask,
)
from jobqueue.payload import decode_payload, encode_result
from jobqueue.policy.backoff import retry_delay_ms
from jobqueue.runtime.logs import run_fields
from jobqueue.runtime.metrics import NO_METRICS, Metrics
from jobqueue.runtime.signals import SignalRelay
from jobqueue.settings import to_ms
from jobqueue.store.keys import WORKERS_KEY, PartitionKeys
from jobqueue.store.runs import (
    CLAIM,
    COMPLETE,
    FAIL,
    FENCED_WRITE,
    HEARTBEAT,
    RELEASE,
    ClaimedRun,
    Outcome,
)
from jobqueue.store.scripts import Call
from jobqueue.tasks import Task
from jobqueue.worker.supervisor import DEFAULT_GRACE_S

log = logging.getLogger("jobqueue.worker")

MAX_CLAIM_BATCH = 500
DEFAULT_CONCURRENCY = 8
# Below the client's socket timeout, so a blocking wait never looks like a dead server.
MAX_IDLE_WAIT_S = 2.0
DRAIN_COMMIT_WAIT_S = 5.0
# The whole shutdown (drain, commits, release, unregister) ends this long after the grace
# period at the latest, even when Redis hangs; a daemon process then exits regardless.
SHUTDOWN_MARGIN_S = 6.0
STOPPED_BY_SECOND_SIGNAL = 1
# The worker cannot go on (its event loop thread died, stuck code holds its slots): it exits
# with this code so that the supervisor or the orchestrator starts a clean process.
EXIT_UNHEALTHY = 4  # not 3: the CLI says "Redis unreachable" with that
# rejected_commits keeps the most recent refusals only (a long-lived worker's list would
# otherwise grow with every fenced-out commit).
MAX_REJECTED_KEPT = 1000
# Stuck code (timed out, never returned) holding more than half the slots this long.
DEFAULT_STUCK_LIMIT_S = 60.0
# A partition whose claim failed (its master down, a slot migrating) is skipped this long,
# doubling up to the cap, while the others go on.
PARTITION_COOLDOWN_S = 0.5
PARTITION_COOLDOWN_CAP_S = 10.0


class _StartFailed(Exception):
    """A run that could not be started (unknown task, bad payload): failed, never retried."""


class _GiveUp(Exception):
    """A retried call abandoned because the worker is stopping."""


class _TaskExit(Exception):
    """An async task's SystemExit/KeyboardInterrupt, carried out of the event loop as an
    ordinary failure (raised inside the loop it would stop the loop thread itself)."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(str(original))
        self.original = original


class _DaemonPool:
    """A fixed pool of daemon threads running sync tasks.

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
    ) -> None:
        self._done = done
        self._jobs: queue_mod.SimpleQueue[tuple[Any, Callable[..., Any], tuple[Any, ...]] | None]
        self._jobs = queue_mod.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def submit(self, token: Any, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        self._jobs.put((token, fn, args))

    def _work(self) -> None:
        get, done = self._jobs.get, self._done
        while True:
            job = get()
            if job is None:
                return
            token, fn, args = job
            try:
                value = fn(*args)
            except BaseException as exc:
                error: BaseException | None = exc
                value = None
            else:
                error = None
            try:
                done(token, value, error)
            except BaseException:  # the pool thread must survive a failing callback
                log.exception("finishing a run failed")

    def shutdown(self) -> None:
        """Idle threads exit; busy ones finish their task (or die with the process)."""
        for _ in self._threads:
            self._jobs.put(None)


@dataclass(slots=True)
class InFlight:
    """One claimed run from claim to commit."""

    run: ClaimedRun
    keys: PartitionKeys
    ctx: RunContext
    started: float  # monotonic, for the timeout only
    timeout_s: float | None
    lease_ms: int
    # Monotonic time at which the lease Redis last granted runs out (claim or heartbeat, as
    # sent): past it without a renewal, another worker may hold the run (self-fencing).
    lease_deadline: float = 0.0
    task: asyncio.Task[Any] | None = None  # an async run's task, on the worker's loop
    cancel_requested: bool = False  # cancel the async task as soon as it exists
    is_async: bool = False
    timed_out: bool = False
    settled: bool = False  # a commit (or release) has been accepted or refused
    released: bool = False  # handed back at shutdown: a late result is discarded
    lease_lost: bool = False
    result_queued: bool = False  # an outcome waits for the committer


@dataclass(slots=True)
class Finished:
    """What the committer must write for one run."""

    entry: InFlight
    ok: bool
    result_json: str = "null"
    error: str = ""
    retry: bool = True
    # The run's code has returned: its slot frees now, its entry goes at commit. False for a
    # timeout's fail, sent while the stuck code still holds the slot.
    frees_slot: bool = True


@dataclass(slots=True)
class _Deferred:
    """Outcomes of one commit call that Redis did not take yet, waiting to be sent again."""

    items: list[Finished]
    resent: bool = False  # sent before and the connection was lost: it may have run
    delay: float = 0.05
    not_before: float = 0.0
    reason: Exception | None = None

    def again(self, reason: Exception) -> _Deferred:
        self.delay = min(self.delay * 2, 5.0)
        self.not_before = time.monotonic() + self.delay * (0.5 + random.random() / 2)
        self.reason = reason
        return self


# The committer woke up to send deferred commits again, with nothing new to commit.
_NOTHING: Any = object()


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    fenced_out: int = 0
    released: int = 0
    timeouts: int = 0
    # The most recent refused commits (run id, fence, status), at most MAX_REJECTED_KEPT;
    # fenced_out counts them all.
    rejected_commits: list[tuple[str, int, str]] = field(default_factory=list)

    def rejected(self, run_id: str, fence: int, status: str) -> None:
        self.rejected_commits.append((run_id, fence, status))
        if len(self.rejected_commits) > 2 * MAX_REJECTED_KEPT:  # amortised: trim in bulk
            del self.rejected_commits[:-MAX_REJECTED_KEPT]


class Worker:
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
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.jq = jq
        self.queues = list(queues or [jq.settings.default_queue])
        self.concurrency = concurrency
        self.lease_ms = to_ms(lease or jq.settings.default_lease_s)
        self.grace = grace
        self.id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.install_signal_handlers = install_signal_handlers
        self.stats = WorkerStats()
        self.metrics = metrics
        self.stuck_limit = stuck_limit

        self._lock = threading.Lock()
        # Keyed by (run id, fence): after a stall this worker may hold a stale attempt of a
        # run and, having reclaimed it, the current one; both need heartbeats (the stale one
        # to learn it was fenced out and stop) and both hold a slot.
        self._in_flight: dict[tuple[str, int], InFlight] = {}
        # A slot is a run whose code holds it (a pool thread, a task on the loop); it frees
        # when the outcome is handed to the committer, so claiming overlaps committing.
        # Outcomes not yet committed are bounded too (backpressure when Redis is slow).
        self._busy_slots = 0
        self._pending_commits = 0
        # Room for one batch being committed while the next one runs: claiming then overlaps
        # committing on the server too.
        self._max_pending = 2 * concurrency
        self._slot_freed = threading.Condition(self._lock)
        self._finished: queue_mod.SimpleQueue[Finished | None] = queue_mod.SimpleQueue()
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._signals = 0
        # The signal handler only notifies it (no locks there); its thread logs and stops.
        self._signal_relay = SignalRelay(self._signalled, "jq-signals")
        # Monotonic time of the stop request: the grace period counts from it.
        self._stop_at: float | None = None
        self._unhealthy: str | None = None  # why the worker gave up (exit EXIT_UNHEALTHY)
        self._stuck_since: float | None = None
        self._loop_thread: threading.Thread | None = None
        self._owns_process = False  # run() installed the signal handlers: a daemon process
        self._pool = _DaemonPool(concurrency, "jq-task", self._on_outcome)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._partitions: list[PartitionKeys] = []
        self._rr = 0
        self._writers: dict[PartitionKeys, Writer] = {}
        self._batch_floor = max(1, min(concurrency // 4, 64))
        self._started_ms = 0
        # Partitions in cool-down after a failed claim: keys -> (until, consecutive failures).
        self._cooldown: dict[PartitionKeys, tuple[float, int]] = {}
        # Redis refuses commits for now (OOM, READONLY): no new claims until one goes through,
        # or the worker would lease runs whose outcomes it cannot write.
        self._commits_refused = threading.Event()

    # -- public ----------------------------------------------------------------------------

    def run(self) -> int:
        """Work until stopped (SIGTERM/SIGINT or ``stop()``); returns the exit code: 0, or
        EXIT_UNHEALTHY when the worker gave up (see the log for why)."""
        self._signal_relay.start()
        if self.install_signal_handlers and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_signal)
            signal.signal(signal.SIGINT, self._on_signal)
            self._owns_process = True
        threads: list[threading.Thread] = []
        try:
            try:
                self._prepare()
            except _GiveUp:
                log.info("worker %s stopped before it could start", self.id)
                return 0
            threads = [
                threading.Thread(target=self._committer, name="jq-commit", daemon=True),
                threading.Thread(target=self._keeper, name="jq-keeper", daemon=True),
            ]
            for t in threads:
                t.start()
            log.info(
                "worker %s started: queues=%s concurrency=%d lease=%.1fs",
                self.id,
                ",".join(self.queues),
                self.concurrency,
                self.lease_ms / 1000,
            )
            self._claim_loop()
            self._drain()
        finally:
            self._stopped.set()
            self._finished.put(None)
            for t in threads:
                t.join(timeout=max(0.1, min(5.0, self._shutdown_left())))
            self._pool.shutdown()
            if self._loop is not None:
                with contextlib.suppress(RuntimeError):  # a loop already closed
                    self._loop.call_soon_threadsafe(self._loop.stop)
            if threads:
                self._bounded(self._unregister, "unregistering")
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
        return 0

    def stop(self) -> None:
        """Graceful: stop claiming, let in-flight runs finish within the grace period."""
        first = not self._stopping.is_set()
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        self._stopping.set()
        with self._lock:
            self._slot_freed.notify_all()
        if first:
            # Wake the claim loop from its blocking wait at once (not up to MAX_IDLE_WAIT_S
            # later). From a thread: the wake is a Redis call, which may hang.
            threading.Thread(target=self._wake_self, name="jq-stop", daemon=True).start()
            if self._owns_process:
                # A daemon process always ends: past grace + margin it exits whatever hangs
                # (its leases expire and other workers reclaim the runs).
                threading.Thread(target=self._watchdog, name="jq-watchdog", daemon=True).start()

    def _shutdown_deadline(self) -> float:
        start = self._stop_at if self._stop_at is not None else time.monotonic()
        return start + self.grace + SHUTDOWN_MARGIN_S

    def _shutdown_left(self) -> float:
        return self._shutdown_deadline() - time.monotonic()

    def _watchdog(self) -> None:
        if self._stopped.wait(max(self._shutdown_left(), 0.0) + 0.5):
            return
        log.error(
            "worker %s: shutdown still not done %.0fs after the grace period (Redis not "
            "answering?); exiting now, in-flight runs will be reclaimed",
            self.id,
            SHUTDOWN_MARGIN_S,
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

    def _die(self, reason: str) -> None:
        """Give up: log why, stop claiming, exit EXIT_UNHEALTHY after the drain."""
        if self._unhealthy is None:
            self._unhealthy = reason
            log.error("worker %s cannot go on: %s; stopping", self.id, reason)
        self.stop()

    @property
    def _own_wake_key(self) -> str:
        return f"jq:worker-wake:{self.id}"

    def _wake_self(self) -> None:
        with contextlib.suppress(redis.exceptions.RedisError, JobQueueError):
            pipe = self.jq.redis.pipeline(transaction=False)
            pipe.lpush(self._own_wake_key, "stop")
            pipe.pexpire(self._own_wake_key, 60_000)
            pipe.execute()

    # -- signals ---------------------------------------------------------------------------

    def _signalled(self, signum: int) -> None:
        log.info(
            "signal %s: draining (grace %.0fs); a second signal exits at once", signum, self.grace
        )
        self.stop()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # No locks, no logging, no Redis here (see jobqueue.runtime.signals).
        self._signals += 1
        if self._signals > 1:
            # Second signal: leave now; our leases expire and other workers reclaim the runs.
            os.write(2, b"second signal: exiting at once, in-flight runs will be reclaimed\n")
            os._exit(STOPPED_BY_SECOND_SIGNAL)
        if self._stop_at is None:
            self._stop_at = time.monotonic()  # the grace period counts from the signal
        self._signal_relay.notify(signum)

    # -- setup -----------------------------------------------------------------------------

    def _prepare(self) -> None:
        for q in self.queues:
            self._retrying(functools.partial(self.jq.register_queue, q), self._stopping)
        self._partitions = [k for q in self.queues for k in self.jq.all_partition_keys(q)]
        self._started_ms = self._retrying(self.jq.server_time_ms, self._stopping)
        if any(t.is_async for t in self.jq.registry.all()):
            self._loop = asyncio.new_event_loop()
            self._loop_thread = threading.Thread(
                target=self._run_loop, args=(self._loop,), name="jq-async", daemon=True
            )
            self._loop_thread.start()

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_forever()
        except BaseException as exc:
            log.critical("the asyncio event loop thread died: %r", exc, exc_info=True)
        if not self._stopped.is_set():
            # Every async run would hang: not a worker that should look alive.
            self._die("the asyncio event loop thread died")

    def _retrying(self, fn: Callable[[], Any], give_up: threading.Event | None = None) -> Any:
        """Call fn until Redis answers (startup and reconnects): backoff with jitter, no crash.
        Raises _GiveUp once ``give_up`` is set (the worker is stopping)."""
        delay = 0.1
        while True:
            if give_up is not None and give_up.is_set():
                raise _GiveUp
            try:
                return fn()
            except (
                ConnectionFailed,
                redis.exceptions.ConnectionError,
                redis.exceptions.TimeoutError,
                # A cluster failing over: CLUSTERDOWN, or a slot with no known master yet.
                redis.exceptions.ClusterError,
                redis.exceptions.RedisClusterException,
            ) as exc:
                if isinstance(exc, ServerRefused) and exc.replies is not None:
                    raise  # some calls of a pipeline ran: the caller re-sends only the others
                log.warning("Redis unavailable (%s); retrying in %.1fs", exc, delay)
                pause = delay * (0.5 + random.random() / 2)
                if give_up is not None:
                    give_up.wait(pause)
                else:
                    time.sleep(pause)
                delay = min(delay * 2, 5.0)

    # -- claiming --------------------------------------------------------------------------

    def _free_slots(self) -> int:
        with self._lock:
            if self._pending_commits >= self._max_pending:
                return 0
            return self.concurrency - self._busy_slots

    def _full(self) -> bool:
        # under self._lock
        return self._busy_slots >= self.concurrency or self._pending_commits >= self._max_pending

    def _claim_loop(self) -> None:
        delay = 0.1
        while not self._stopping.is_set():
            if self._commits_refused.is_set():
                self._stopping.wait(0.2)  # the committer clears it once a commit lands
                continue
            free = self._free_slots()
            if free <= 0:
                with self._lock:
                    while self._full() and not self._stopping.is_set():
                        self._slot_freed.wait(1.0)
                continue
            if free < self._batch_floor and free < self.concurrency:
                # Busy: let a few more slots free up (a few ms at most) so that one claim
                # fetches a batch instead of one round trip per finished run.
                with self._lock:
                    self._slot_freed.wait(0.002)
                free = self._free_slots()
                if free <= 0:
                    # Outcomes awaiting commit filled the room meanwhile: wait for a slot.
                    # Never claim 0 and then sleep on the wake lists as if nothing were due.
                    continue
            try:
                claimed, wait_s = self._claim(free)
                delay = 0.1
            except (JobQueueError, redis.exceptions.RedisError) as exc:
                log.warning("claim failed (%s); retrying in %.1fs", exc, delay)
                self._stopping.wait(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, 5.0)
                continue
            except Exception:
                # A surprise must not end the claim loop (the worker would idle forever, its
                # process alive); runs this call leased come back when their leases expire.
                log.exception("claim loop iteration failed; retrying in %.1fs", delay)
                self._stopping.wait(delay * (0.5 + random.random() / 2))
                delay = min(delay * 2, 5.0)
                continue
            if claimed == 0:
                self._sleep_until_woken(wait_s)

    def _claim(self, free: int) -> tuple[int, float]:
        """Claim across this worker's partitions, queues in priority order; round-robin among
        partitions of equal priority so none starves. Returns (claimed, seconds to sleep):
        claimed is 0 only when every partition was asked, or is cooling down, and had nothing
        (free > 0). A partition whose claim fails is cooled down and the others go on; only
        when every one failed is the error raised (the caller backs off)."""
        assert free > 0, "a claim for no slot would read as 'nothing due'"
        claimed = 0
        wait_ms: int | None = None
        order = self._partitions[self._rr :] + self._partitions[: self._rr]
        self._rr = (self._rr + 1) % max(len(self._partitions), 1)
        order.sort(key=lambda k: self.queues.index(k.queue))  # stable: keeps the rotation
        failure: Exception | None = None
        answered = 0
        now = time.monotonic()
        for keys in order:
            want = min(free - claimed, MAX_CLAIM_BATCH)
            if want <= 0:
                break
            cooling = self._cooldown.get(keys)
            if cooling is not None and cooling[0] > now:
                gap = int((cooling[0] - now) * 1000)
                wait_ms = gap if wait_ms is None else min(wait_ms, gap)
                continue
            call = CLAIM.call(
                keys, want, self.id, self.lease_ms, self.jq.settings.dead_retention_ms
            )
            sent = time.monotonic()
            try:
                result = CLAIM.parse(self._send_claim(call))
            except (JobQueueError, redis.exceptions.RedisError) as exc:
                failure = exc
                self._cool_down(keys, exc)
                continue
            answered += 1
            if cooling is not None:
                del self._cooldown[keys]
                log.info("claims in %s work again", keys.prefix)
            self.metrics.claimed(keys.queue, result.runs, result.now_ms)
            for run in result.runs:
                try:
                    self._start(run, keys, result.now_ms, sent)
                except Exception:
                    # One bad run must not keep the rest of the batch from starting (it is
                    # not in flight: its lease expires and it is claimed again).
                    log.exception("starting run_id=%s failed", run.run_id)
            claimed += len(result.runs)
            if result.next_wake_ms is not None:
                gap = max(result.next_wake_ms - result.now_ms, 0)
                wait_ms = gap if wait_ms is None else min(wait_ms, gap)
        if failure is not None and answered == 0:
            raise failure  # no partition answered: the caller's back-off applies
        wait_s = MAX_IDLE_WAIT_S if wait_ms is None else min(wait_ms / 1000, MAX_IDLE_WAIT_S)
        return claimed, wait_s

    def _send_claim(self, call: Call) -> Any:
        settings = self.jq.settings
        if not settings.durable:
            return self.jq.scripts.run(call)
        (reply,), durable = self.jq.scripts.run_durable(
            [call], settings.durable_replicas, settings.durable_fsync,
            settings.durable_timeout_ms,
        )
        if not durable:
            # Run anyway: the runs are leased to this worker on the master. If it fails over
            # before the replicas catch up, they are claimed again (with greater fences) and
            # run twice; this worker's commits are then refused. At least once, as always.
            log.warning(
                "a claim was not acknowledged by %d replica(s) within %gs; running its runs "
                "anyway (a failover now would run them again)",
                settings.durable_replicas,
                settings.durable_timeout_s,
            )
        return reply

    def _cool_down(self, keys: PartitionKeys, exc: Exception) -> None:
        _, failures = self._cooldown.get(keys, (0.0, 0))
        pause = min(PARTITION_COOLDOWN_S * 2**failures, PARTITION_COOLDOWN_CAP_S)
        self._cooldown[keys] = (time.monotonic() + pause, failures + 1)
        log.warning(
            "claim in %s failed (%s); skipping it for %.1fs, the other partitions go on",
            keys.prefix,
            exc,
            pause,
        )

    def _sleep_until_woken(self, wait_s: float) -> None:
        """Block on the wake lists (a token arrives with every enqueue) at most wait_s."""
        wake_keys = sorted({k.wake for k in self._partitions})
        timeout = max(wait_s, 0.01)
        try:
            if self._is_cluster():
                # One slot per blocking call in a cluster: wait on one list, in turn.
                key = wake_keys[self._rr % len(wake_keys)]
                self.jq.redis.blpop([key], timeout=min(timeout, 0.5))
            else:
                self.jq.redis.blpop([*wake_keys, self._own_wake_key], timeout=timeout)
        # RedisClusterException (not a RedisError): a slot without a known master mid-failover.
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            log.warning("waiting for work failed (%s)", exc)
            self._stopping.wait(0.5)

    def _is_cluster(self) -> bool:
        return isinstance(self.jq.redis, redis.cluster.RedisCluster)

    # -- executing -------------------------------------------------------------------------

    def _start(
        self, run: ClaimedRun, keys: PartitionKeys, now_ms: int, sent: float
    ) -> None:
        """``sent``: when the claim was sent (monotonic), from which its lease counts."""
        ctx = RunContext(
            run_id=run.run_id,
            fence=run.fence,
            attempt=run.attempt,
            max_attempts=run.max_attempts,
            task=run.task,
            queue=keys.queue,
            job_id=run.job_id,
            scheduled_for_ms=run.scheduled_for_ms,
            _writer=self._writers.get(keys)
            or self._writers.setdefault(keys, self._writer_for(keys)),
        )
        timeout_s = run.timeout_ms / 1000 if run.timeout_ms > 0 else None
        entry = InFlight(
            run,
            keys,
            ctx,
            time.monotonic(),
            timeout_s,
            lease_ms=max(run.lease_until_ms - now_ms, 1),
        )
        entry.lease_deadline = sent + entry.lease_ms / 1000
        with self._lock:
            self._in_flight[(run.run_id, run.fence)] = entry
            self._busy_slots += 1
        self.stats.claimed += 1
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
        except Exception as exc:
            # Never retried: another attempt would meet the same name or bytes.
            if isinstance(exc, UnknownTask | PayloadError):
                error = str(exc)
            elif isinstance(exc, RecursionError):
                error = "stored arguments are nested too deeply to decode"
            else:
                log.exception("starting run_id=%s failed", run.run_id)
                error = f"Fatal: could not start the run: {type(exc).__name__}: {exc}"
            self._on_outcome(entry, None, _StartFailed(error))

    def _launch(self, entry: InFlight) -> None:
        run, ctx = entry.run, entry.ctx
        task = self._task_for(run.task)
        args, kwargs = decode_payload(run.payload)
        entry.is_async = task.is_async
        if task.is_async:
            loop = self._loop
            assert loop is not None
            loop.call_soon_threadsafe(self._spawn_async, entry, task, args, kwargs)
        else:
            self._pool.submit(entry, self._run_sync, (task, ctx, args, kwargs))

    def _spawn_async(
        self, entry: InFlight, task: Task[Any, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """On the loop: start the run's asyncio Task. Its own done-callback reports the
        outcome, so the slot frees only when the coroutine has really ended (a coroutine
        that swallows CancelledError still holds it)."""
        try:
            coro = self._run_async(task, entry.ctx, args, kwargs)
            t = asyncio.get_running_loop().create_task(coro)
        except Exception as exc:
            self._on_outcome(entry, None, exc)
            return
        entry.task = t
        t.add_done_callback(functools.partial(self._on_task_done, entry))
        if entry.cancel_requested:
            t.cancel()

    def _task_for(self, name: str) -> Task[Any, Any]:
        task = self.jq.registry.get(name)
        if task.func is None:
            raise UnknownTask(f"task {name!r} is declared but this worker has no code for it")
        return task

    @staticmethod
    def _call_args(task: Task[Any, Any], ctx: RunContext, kwargs: dict[str, Any]) -> dict[str, Any]:
        return {**kwargs, "ctx": ctx} if task.wants_ctx else kwargs

    def _run_sync(
        self, task: Task[Any, Any], ctx: RunContext, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        token = bind(ctx)
        try:
            return task(*args, **self._call_args(task, ctx, kwargs))
        finally:
            unbind(token)

    async def _run_async(
        self, task: Task[Any, Any], ctx: RunContext, args: list[Any], kwargs: dict[str, Any]
    ) -> Any:
        token = bind(ctx)
        try:
            return await task(*args, **self._call_args(task, ctx, kwargs))
        except (SystemExit, KeyboardInterrupt) as exc:
            # Raised out of a Task these stop the event loop itself (its thread dies, and with
            # it every async run): here they fail this run, like any other exception.
            raise _TaskExit(exc) from exc
        finally:
            unbind(token)

    def _on_task_done(self, entry: InFlight, t: asyncio.Task[Any]) -> None:
        if t.cancelled():
            self._on_outcome(entry, None, asyncio.CancelledError())
            return
        error = t.exception()
        self._on_outcome(entry, None if error is not None else t.result(), error)

    def _on_outcome(self, entry: InFlight, value: Any, error: BaseException | None) -> None:
        try:
            self._outcome(entry, value, error)
        except BaseException as exc:
            # The run must not stay in flight (heartbeated for ever, its slot taken).
            log.exception("finishing run_id=%s failed; failing it", entry.run.run_id)
            if not entry.result_queued:
                text = f"Fatal: finishing the run failed: {type(exc).__name__}: {exc}"
                self._finish(Finished(entry, ok=False, error=text[:8000], retry=False))

    def _outcome(self, entry: InFlight, value: Any, error: BaseException | None) -> None:
        with self._lock:
            # A run handed back at shutdown, or one whose timeout already queued its fail:
            # the late outcome is discarded (a late success must not win over the timeout's
            # fail) and only the slot the code held is freed.
            drop = entry.released or entry.timed_out
            if drop:
                self._in_flight.pop((entry.run.run_id, entry.run.fence), None)
                self._busy_slots -= 1
                self._slot_freed.notify_all()
            else:
                entry.result_queued = True  # from now on a timeout leaves this run alone
        if drop:
            return
        if isinstance(error, _TaskExit):
            error = error.original
        if isinstance(error, _StartFailed):
            self._finish(Finished(entry, ok=False, error=str(error), retry=False))
            return
        if isinstance(error, concurrent.futures.CancelledError | asyncio.CancelledError):
            reason = entry.ctx.cancel_reason or "cancelled"
            self._finish(Finished(entry, ok=False, error=reason, retry=not entry.lease_lost))
            return
        if isinstance(error, Fatal):
            self._finish(Finished(entry, ok=False, error=f"Fatal: {error}", retry=False))
            return
        if error is not None:
            text = "".join(traceback.format_exception_only(type(error), error)).strip()
            self._finish(Finished(entry, ok=False, error=text[:8000], retry=True))
            return
        try:
            result = encode_result(value, self.jq.settings.max_payload_bytes)
        except PayloadError as exc:
            self._finish(Finished(entry, ok=False, error=str(exc), retry=False))
            return
        except Exception as exc:  # MemoryError, a custom Mapping's RuntimeError, ...
            text = f"the task result could not be encoded: {type(exc).__name__}: {exc}"
            self._finish(Finished(entry, ok=False, error=text[:8000], retry=False))
            return
        self._finish(Finished(entry, ok=True, result_json=result))

    def _finish(self, item: Finished) -> None:
        item.entry.result_queued = True
        with self._lock:
            if item.frees_slot:
                self._busy_slots -= 1
            self._pending_commits += 1
            self._slot_freed.notify_all()
        self._finished.put(item)

    # -- committing ------------------------------------------------------------------------

    def _committer(self) -> None:
        """Commit what finished, batch after batch. Commits Redis did not take (a master down,
        a refusal) wait in ``later`` and are sent again with back-off, alone, while every
        other commit goes on: one master down holds back its own runs only."""
        later: list[_Deferred] = []
        while True:
            wait = None
            if later:
                wait = max(min(d.not_before for d in later) - time.monotonic(), 0.0)
            try:
                item = self._finished.get(timeout=wait)
            except queue_mod.Empty:
                item = None if self._stopped.is_set() and not later else _NOTHING
            if item is None:
                return
            batch = [] if item is _NOTHING else [item]
            while len(batch) < 500:
                try:
                    nxt = self._finished.get_nowait()
                except queue_mod.Empty:
                    break
                if nxt is None:
                    self._finished.put(None)
                    break
                batch.append(nxt)
            now = time.monotonic()
            due = [d for d in later if d.not_before <= now]
            later = [d for d in later if d.not_before > now]
            try:
                later += self._commit(batch, due)
            except Exception:
                # Not a connection problem (those wait in `later`): the outcome is unknown.
                # Stop heartbeating these runs and free their slots; their leases expire and
                # they are claimed again, so nothing is lost and nothing stays leased forever.
                items = batch + [i for d in due for i in d.items]
                log.exception("commit of %d runs failed; their leases will expire", len(items))
                for it in items:
                    self._abandon(it)
                self._committed(items)
            if self._stopped.is_set() and later and self._shutdown_left() <= 0:
                return  # their leases expire and the runs are claimed again

    def _abandon(self, item: Finished) -> None:
        entry = item.entry
        if not entry.settled:
            entry.lease_lost = True
            entry.settled = True
            self.stats.rejected(entry.run.run_id, entry.run.fence, "error")

    def _fail_call(self, item: Finished) -> Call:
        run, keys, settings = item.entry.run, item.entry.keys, self.jq.settings
        delay = None
        if item.retry:
            task = self.jq.registry.get(run.task) if run.task in self.jq.registry else None
            base = (task and task.options.backoff_base_ms) or settings.backoff_base_ms
            cap = (task and task.options.backoff_cap_ms) or settings.backoff_cap_ms
            delay = retry_delay_ms(run.attempt, base, cap)
        # An exception's text may hold lone surrogates (undecodable bytes): not UTF-8, so it
        # could not be sent, and the whole commit batch would fail with it.
        error = item.error.encode("utf-8", "replace").decode("utf-8")
        return FAIL.call(keys, run.run_id, run.fence, error, delay, settings.dead_retention_ms)

    def _commit(self, batch: list[Finished], retries: list[_Deferred]) -> list[_Deferred]:
        """One complete call per partition for the successes (one script call for many runs
        is most of a no-op run's cost), one fail call per failure, all in one round trip (one
        per master on a cluster). Returns the commits Redis did not take, to send again
        later: refused for now (OOM, READONLY, TRYLATER: they did not run) or lost with their
        connection (they may have run: see _settle); their runs stay heartbeated meanwhile."""
        groups: list[_Deferred] = []
        done: dict[PartitionKeys, list[Finished]] = {}
        for item in batch:
            if item.ok:
                done.setdefault(item.entry.keys, []).append(item)
            else:
                groups.append(_Deferred([item]))
        groups = [_Deferred(items) for items in done.values()] + groups + retries
        if not groups:
            return []
        retention = self.jq.settings.done_retention_ms
        calls = [
            COMPLETE.call(
                g.items[0].entry.keys,
                [(i.entry.run.run_id, i.entry.run.fence, i.result_json) for i in g.items],
                retention,
            )
            if g.items[0].ok
            else self._fail_call(g.items[0])
            for g in groups
        ]
        replies = self.jq.scripts.run_each(calls)
        later: list[_Deferred] = []
        settled: list[Finished] = []
        refused = None
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, ConnectionFailed):  # ServerRefused included
                if isinstance(reply, ServerRefused):
                    refused = reply
                else:
                    group.resent = True  # it may have run: see _settle
                later.append(group.again(reply))
                continue
            settled += group.items
            if isinstance(reply, Exception):
                log.error(
                    "commit of %d runs failed (%s); their leases will expire",
                    len(group.items),
                    reply,
                )
                for item in group.items:
                    self._abandon(item)
                continue
            outcomes = (
                COMPLETE.parse(reply) if group.items[0].ok else [FAIL.parse(reply)]
            )
            for item, outcome in zip(group.items, outcomes, strict=True):
                self._settle(item, outcome, group.resent)
        if refused is not None:
            self._commits_refused.set()  # no new claims until commits land again
        elif settled:
            self._commits_refused.clear()
        if later:
            log.warning(
                "%d commits not taken (%s); sending them again in %.1fs at the latest, the "
                "others go on",
                sum(len(g.items) for g in later),
                later[0].reason,
                max(g.delay for g in later),
            )
        self._committed(settled)
        return later

    def _settle(self, item: Finished, outcome: Outcome, resent: bool = False) -> None:
        """Record the outcome of one commit; the caller frees the slot (see _committed).

        A commit sent again after a lost connection may be refused by its own first copy,
        which landed: refused as finished (or, for a retry, not running) with the run still
        at this attempt's fence. That is this commit's success, not a fenced-out one."""
        run = item.entry.run
        if (
            resent
            and not outcome.accepted
            and outcome.current_fence == run.fence
            and outcome.status in ("finished", "not-running")
        ):
            outcome = Outcome(True, "done" if item.ok else "landed")
        self.metrics.committed(item.entry.keys.queue, item.ok, outcome.accepted, outcome.status)
        if outcome.accepted:
            if item.ok:
                self.stats.completed += 1
                if log.isEnabledFor(logging.DEBUG):
                    log.debug(
                        "done run_id=%s fence=%d attempt=%d",
                        run.run_id,
                        run.fence,
                        run.attempt,
                        extra=run_fields(run),
                    )
            else:
                self.stats.failed += 1
                log.info(
                    "failed run_id=%s fence=%d attempt=%d -> %s: %s",
                    run.run_id,
                    run.fence,
                    run.attempt,
                    outcome.status,
                    item.error.splitlines()[-1][:300] if item.error else "",
                    extra=run_fields(run),
                )
        else:
            self.stats.fenced_out += 1
            self.stats.rejected(run.run_id, run.fence, outcome.status)
            log.warning(
                "fenced out: commit of run_id=%s fence=%d attempt=%d refused (%s, "
                "current fence %s); result discarded",
                run.run_id,
                run.fence,
                run.attempt,
                outcome.status,
                outcome.current_fence,
                extra=run_fields(run),
            )
        item.entry.settled = True

    def _committed(self, items: list[Finished]) -> None:
        """Forget a committed batch: one lock and one wake-up for all of it. A timed-out run's
        entry stays until its stuck code returns (that outcome has frees_slot)."""
        with self._lock:
            for item in items:
                if item.frees_slot:
                    self._in_flight.pop((item.entry.run.run_id, item.entry.run.fence), None)
            self._pending_commits -= len(items)
            self._slot_freed.notify_all()

    # -- keeping leases --------------------------------------------------------------------

    def _beat_interval(self) -> float:
        """A third of the shortest lease held: two heartbeats may be lost before it expires."""
        with self._lock:
            shortest = min((e.lease_ms for e in self._in_flight.values()), default=self.lease_ms)
        return min(shortest, self.lease_ms) / 3000

    def _keeper(self) -> None:
        next_beat = 0.0
        while not self._stopped.is_set():
            now = time.monotonic()
            interval = self._beat_interval()
            # A run just claimed with a shorter lease than any before needs its first beat
            # within a third of that lease, not at the beat planned for the longer ones.
            next_beat = min(next_beat, now + interval)
            try:
                self._enforce_timeouts(now)
                self._enforce_leases(now)
                if now >= next_beat:
                    try:
                        self._heartbeat()
                        next_beat = now + interval
                    except (JobQueueError, redis.exceptions.RedisError) as exc:
                        log.warning("heartbeat failed (%s); retrying", exc)
                        next_beat = now + min(interval, 1.0)
            except Exception:
                # This thread keeps every lease alive: it must not die of a surprise.
                log.exception("keeper iteration failed; carrying on")
                next_beat = now + min(interval, 1.0)
            self._stopped.wait(min(0.05, interval))

    def _heartbeat(self) -> None:
        """Extend every lease held, one call per partition, one round trip per master: a
        master that does not answer holds back its own leases only (their runs are
        self-fenced when the lease passes, see _enforce_leases)."""
        with self._lock:
            entries = [
                e
                for e in self._in_flight.values()
                if not e.settled and not e.lease_lost and not e.timed_out
            ]
        groups: dict[PartitionKeys, list[InFlight]] = {}
        for e in entries:
            groups.setdefault(e.keys, []).append(e)
        calls = [
            HEARTBEAT.call(k, [(e.run.run_id, e.run.fence) for e in es], self.lease_ms)
            for k, es in groups.items()
        ]
        server_now = None
        sent = time.monotonic()
        started = time.perf_counter()
        replies = self.jq.scripts.run_each(calls)
        if calls:
            self.metrics.heartbeat(time.perf_counter() - started)
        failures: list[Exception] = []
        for es, reply in zip(groups.values(), replies, strict=True):
            if isinstance(reply, Exception):
                failures.append(reply)
                continue
            beats = HEARTBEAT.parse(reply)
            server_now = beats.now_ms
            for e, answer in zip(es, beats.answers, strict=True):
                if isinstance(answer, str):
                    self._lost(e, answer)
                else:
                    e.lease_deadline = sent + (answer - server_now) / 1000
        if failures:
            if len(failures) == len(calls):
                raise failures[0]
            log.warning(
                "heartbeats of %d of %d partitions failed (%s); their leases run out unless "
                "a later beat lands",
                len(failures),
                len(calls),
                failures[0],
            )
        self._register(server_now)

    def _lost(self, entry: InFlight, reason: str) -> None:
        if entry.settled:
            return
        if entry.result_queued and reason in ("finished", "not-running"):
            # Our own commit (same fence) landed between this heartbeat's read of the
            # in-flight set and its reply: nothing was lost.
            return
        entry.lease_lost = True
        self.metrics.lease_lost(entry.keys.queue, reason)
        run = entry.run
        log.warning(
            "fenced out: heartbeat of run_id=%s fence=%d attempt=%d refused (%s); "
            "stopping the work, its commit will be refused",
            run.run_id,
            run.fence,
            run.attempt,
            reason,
            extra=run_fields(run),
        )
        entry.ctx.cancel(f"lease lost: {reason}")
        self._cancel_async(entry)

    def _cancel_async(self, entry: InFlight) -> None:
        if entry.is_async and self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self._loop.call_soon_threadsafe(self._cancel_task, entry)

    @staticmethod
    def _cancel_task(entry: InFlight) -> None:
        # On the loop. Its task may not exist yet: _spawn_async then cancels it at birth.
        entry.cancel_requested = True
        if entry.task is not None:
            entry.task.cancel()

    def _enforce_leases(self, now: float) -> None:
        """Self-fencing: a run whose lease ran out without a heartbeat reaching Redis (its
        master down, a partition) may be another worker's by now. Its code is told to stop
        (ctx.cancelled) now rather than when Redis answers again; its commit, if any, is
        judged by the fence as always."""
        with self._lock:
            passed = [
                e
                for e in self._in_flight.values()
                if not e.settled
                and not e.lease_lost
                and not e.timed_out
                and not e.result_queued  # its code has returned: the commit decides
                and e.lease_deadline < now
            ]
        for e in passed:
            e.lease_lost = True
            self.metrics.lease_lost(e.keys.queue, "expired")
            log.warning(
                "lease of run_id=%s fence=%d attempt=%d ran out without a heartbeat reaching "
                "Redis; stopping the work (another worker may hold the run now)",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                extra=run_fields(e.run),
            )
            e.ctx.cancel("lease expired: no heartbeat reached Redis")
            self._cancel_async(e)

    def _enforce_timeouts(self, now: float) -> None:
        with self._lock:
            expired = [
                e
                for e in self._in_flight.values()
                if e.timeout_s is not None
                and not e.timed_out
                and not e.settled
                and not e.result_queued  # its code returned in time: its outcome stands
                and now - e.started > e.timeout_s
            ]
            for e in expired:
                # Under the lock: an outcome arriving from now on is dropped (_outcome).
                e.timed_out = True
            stuck = sum(1 for e in self._in_flight.values() if e.timed_out)
        self._check_stuck(now, stuck)
        for e in expired:
            self.stats.timeouts += 1
            e.ctx.cancel(f"timed out after {e.timeout_s:g}s")
            log.warning(
                "timeout: run_id=%s fence=%d attempt=%d ran over %gs; failing it",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                e.timeout_s,
                extra=run_fields(e.run),
            )
            # Fail now (a retry per policy); the slot stays taken until the code returns.
            self._finish(
                Finished(
                    e,
                    ok=False,
                    error=f"timed out after {e.timeout_s:g}s",
                    retry=True,
                    frees_slot=False,
                )
            )
            self._cancel_async(e)

    def _check_stuck(self, now: float, stuck: int) -> None:
        """Timed-out code that never returns keeps its slot (a thread cannot be killed). When
        such code holds most slots for stuck_limit, this worker is of no use: it stops
        claiming and exits EXIT_UNHEALTHY so that a clean process replaces it."""
        if stuck * 2 <= self.concurrency:
            self._stuck_since = None
            return
        if self._stuck_since is None:
            self._stuck_since = now
        elif now - self._stuck_since >= self.stuck_limit and not self._stopping.is_set():
            self._die(
                f"{stuck} of {self.concurrency} slots held by timed-out task code that never "
                f"returned, for over {self.stuck_limit:g}s"
            )

    # -- registry --------------------------------------------------------------------------

    def _register(self, server_now_ms: int | None) -> None:
        if server_now_ms is None:
            server_now_ms = self.jq.server_time_ms()
        with self._lock:
            in_flight = len(self._in_flight)
        info = {
            "id": self.id,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "queues": self.queues,
            "concurrency": self.concurrency,
            "started_ms": self._started_ms,
            "last_seen_ms": server_now_ms,
            "in_flight": in_flight,
            "lease_ms": self.lease_ms,
            "stopping": self._stopping.is_set(),
        }
        self.jq.redis.hset(WORKERS_KEY, self.id, json.dumps(info))

    def _unregister(self) -> None:
        # If Redis is gone the entry stays; the CLI flags it stale by its last_seen.
        with contextlib.suppress(redis.exceptions.RedisError):
            self.jq.redis.hdel(WORKERS_KEY, self.id)
            self.jq.redis.delete(self._own_wake_key)

    # -- fenced writes ---------------------------------------------------------------------

    def _writer_for(self, keys: PartitionKeys) -> Writer:
        def write(resource: str, value: str, fence: int, run_id: str, ttl: float | None) -> bool:
            ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
            call = FENCED_WRITE.call(keys, resource, fence, value, run_id, ttl_ms)
            ok, _ = FENCED_WRITE.parse(self.jq.scripts.run(call))
            return ok

        return write

    # -- shutting down ---------------------------------------------------------------------

    def _drain(self) -> None:
        """Let in-flight runs finish within the grace period, let their commits land, then
        hand the rest back."""
        if self._stop_at is None:
            self._stop_at = time.monotonic()
        # The grace period counts from the stop request (the claim loop may have taken a
        # while to notice it: a claim call waiting on a slow Redis).
        deadline = self._stop_at + self.grace
        shutdown_deadline = self._shutdown_deadline()
        with self._lock:
            while self._busy_slots > 0 and time.monotonic() < deadline:
                self._slot_freed.wait(min(0.1, max(deadline - time.monotonic(), 0.001)))
            # Finished runs' commits take a round trip; a Redis outage must not hold the
            # shutdown forever (their leases expire and other workers reclaim them).
            commit_deadline = min(
                max(deadline, time.monotonic() + DRAIN_COMMIT_WAIT_S), shutdown_deadline - 2.0
            )
            while self._pending_commits > 0 and time.monotonic() < commit_deadline:
                self._slot_freed.wait(min(0.1, max(commit_deadline - time.monotonic(), 0.001)))
            # A run whose outcome waits for the committer is not handed back: its commit
            # (still queued, sent before the committer stops) would then be refused.
            leftover = [
                e for e in self._in_flight.values() if not e.settled and not e.result_queued
            ]
        if not leftover:
            return
        calls = [RELEASE.call(e.keys, e.run.run_id, e.run.fence) for e in leftover]
        for e in leftover:
            e.released = True  # a late result must not be committed after the release
            e.ctx.cancel("worker shutting down")
        if time.monotonic() >= shutdown_deadline - 1.0:
            log.warning("no time left to release %d runs; their leases will expire", len(calls))
            return
        got: list[list[Any]] = []

        def release() -> None:
            try:
                got.append(self.jq.scripts.run_many(calls))
            except JobQueueError as exc:
                log.warning("release failed (%s); the leases will expire and be reclaimed", exc)

        self._bounded(release, "release")
        if not got:
            return
        replies = got[0]
        for e, reply in zip(leftover, replies, strict=True):
            outcome = RELEASE.parse(reply)
            if outcome.accepted:
                self.stats.released += 1
            # The attempt is handed back uncounted (show says attempt N-1): say so, once.
            log.info(
                "released run_id=%s fence=%d attempt=%d: %s",
                e.run.run_id,
                e.run.fence,
                e.run.attempt,
                "not counted" if outcome.accepted else f"refused ({outcome.status})",
                extra=run_fields(e.run),
            )
