"""The claim loop: claims up to the free slots, round-robin over partitions, queues in priority
order, a queue's partitions in one pipelined round trip per master (not one claim after the
other), the slots shared out by what each partition gave last time. When nothing is due it
blocks on the wake lists (a token comes with every enqueue, retry and release) until the next
due time or lease expiry the claim scripts reported. Woken by one partition's token, it claims
from that partition alone (not from every partition: an idle worker serving P partitions
would send P claims per enqueue) until the partition has no more, then waits again; a wait
that ends with no token, and a busy worker, ask every partition, and so does every claim an
idle wait after the last such sweep. A partition whose claim fails (its master down, a slot
migrating) cools down while the others go on; while Redis refuses commits, nothing is
claimed."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from jobqueue.client.sync import JobQueue
from jobqueue.errors import JobQueueError
from jobqueue.policy.backoff import Backoff
from jobqueue.runtime.clock import Clock
from jobqueue.runtime.metrics import Metrics
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, ClaimedRun
from jobqueue.store.scripts import Call
from jobqueue.worker.runs import RunTable

log = logging.getLogger("jobqueue.worker")

MAX_CLAIM_BATCH = 500
# How long a busy claim loop waits for a batch's worth of free slots before claiming fewer.
BATCH_LINGER_S = 0.002
# Below the client's socket timeout, so a blocking wait never looks like a dead server.
MAX_IDLE_WAIT_S = 2.0
# A partition whose claim failed is skipped this long, doubling up to the cap, while the
# others go on.
PARTITION_COOLDOWN_S = 0.5
PARTITION_COOLDOWN_CAP_S = 10.0
# A claim loop iteration that failed as a whole is tried again after this, doubling.
RETRY_S = 0.1
RETRY_CAP_S = 5.0
# While Redis refuses commits, the claim loop looks again this often.
REFUSED_POLL_S = 0.2
# On a cluster, each blocking wait is on one wake list, this long at most.
CLUSTER_WAKE_S = 0.5
# Waiting on the wake lists failed (Redis down): wait this long instead.
WAKE_FAILED_S = 0.5


# Burst mode: how long to wait for a held run to finish before claiming again.
BURST_POLL_S = 0.05


class _Cooling:
    """A partition in cool-down after failed claims."""

    __slots__ = ("backoff", "until")

    def __init__(self) -> None:
        self.backoff = Backoff(PARTITION_COOLDOWN_S, PARTITION_COOLDOWN_CAP_S, jitter=False)
        self.until = 0.0


class Claimer:
    def __init__(
        self,
        jq: JobQueue,
        worker_id: str,
        queues: list[str],
        table: RunTable,
        start: Callable[[ClaimedRun, PartitionKeys, int, float], None],
        metrics: Metrics,
        clock: Clock,
        *,
        lease_ms: int,
        stopping: threading.Event,
        commits_refused: threading.Event,
        idle_wait: float = MAX_IDLE_WAIT_S,
        drained: Callable[[], None] | None = None,
        launch: Callable[[], None] = lambda: None,
        run_inline: Callable[[], bool] = lambda: True,
    ) -> None:
        """``start(run, keys, now_ms, sent)`` starts a claimed run (the executor);
        ``launch()``, called after each claim's runs are started, sends them on their way
        together (the executor hands async runs to its event loop in one go).
        ``run_inline()``, called after each claim, runs the short sync runs it started on
        this thread (the executor); False tells this thread to leave the loop, which
        ``take_over`` has started on another.
        ``drained``: burst mode, called once nothing is due and nothing is held."""
        self._jq = jq
        self._id = worker_id
        self._queues = queues
        self._table = table
        self._start = start
        self._metrics = metrics
        self._clock = clock
        self._lease_ms = lease_ms
        self._stopping = stopping
        self._commits_refused = commits_refused
        self._idle_wait = idle_wait
        self._drained = drained
        self._launch = launch
        self._run_inline = run_inline
        # The thread running the claim loop (see take_over); set when it has ended, and
        # what ended it if not a stop.
        self._owner: threading.Thread | None = None
        self._ended = threading.Event()
        self._crashed: BaseException | None = None
        self._partitions: list[PartitionKeys] = []
        self._rr = 0
        self._batch_floor = max(1, min(table.concurrency // 4, 64))
        self._cooling: dict[PartitionKeys, _Cooling] = {}
        # When each partition next has a run due or a lease expiring (clock.monotonic()), as
        # its last claim reported: what a wait must not sleep past while other partitions
        # are claimed alone.
        self._due: dict[PartitionKeys, float] = {}
        # When every partition was last asked: a worker woken again and again by one
        # partition still asks the others every idle wait (a run whose lease another worker
        # let expire after this one last asked brings no token).
        self._swept_at = 0.0
        # Partitions whose last claim got as many runs as it asked for: they may hold more,
        # so a round gives them the free slots the others' one-run claims leave.
        self._hot: set[PartitionKeys] = set()

    @property
    def own_wake_key(self) -> str:
        """A list only this worker waits on: stop() pushes to it to end an idle wait."""
        return f"jq:worker-wake:{self._id}"

    def set_partitions(self, partitions: list[PartitionKeys]) -> None:
        self._partitions = partitions

    def wake(self) -> None:
        """End an idle wait now (a Redis call: call it from a thread that may hang). Best
        effort: unwoken, the loop notices at its idle wait. The thread it runs on races the
        close of the client, and a connection closed under a pipeline raises what the client
        library happens to (AttributeError from redis-py 6.1's reader), not only RedisError."""
        try:
            pipe = self._jq.redis.pipeline(transaction=False)
            pipe.lpush(self.own_wake_key, "stop")
            pipe.pexpire(self.own_wake_key, 60_000)
            pipe.execute()
        except Exception as exc:
            log.debug("waking the claim loop failed (it notices at its idle wait): %r", exc)

    def run(self) -> None:
        """Claim until stopping, on a thread of its own ("jq-claim": short sync tasks run on
        it, see jobqueue.worker.inline); returns when the loop has ended, on whichever thread
        ran it last. Anything raised meanwhile here (KeyboardInterrupt) stops the loop too."""
        try:
            self.take_over()
            while not self._ended.wait(0.5):
                pass
        except BaseException:
            # The caller leaves (KeyboardInterrupt): the loop must not claim on, leasing runs
            # nobody heartbeats or commits. End its wait now (a Redis call: from a thread).
            self._stopping.set()
            self._table.wake()
            threading.Thread(target=self.wake, name="jq-stop", daemon=True).start()
            raise
        if self._crashed is not None:
            raise self._crashed

    def take_over(self) -> None:
        """Start the claim loop on a new thread; the one running it (stuck in an inline run,
        given up) leaves it when that run ends."""
        thread = threading.Thread(target=self._loop_guarded, name="jq-claim", daemon=True)
        self._owner = thread  # before it runs: a crash at once must be the owner's
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: the worker cannot claim on
            self._crashed = exc
            self._ended.set()

    def _loop_guarded(self) -> None:
        try:
            if not self._loop():
                return  # given up: the loop goes on in another thread
        except BaseException as exc:
            if self._owner is not threading.current_thread():
                log.exception("a claim loop thread given up failed")
                return
            self._crashed = exc  # raised by run(), on the caller's thread
        self._ended.set()

    def _loop(self) -> bool:
        """The claim loop; False when this thread was given up (see take_over)."""
        stopping, table, clock = self._stopping, self._table, self._clock
        backoff = Backoff(RETRY_S, RETRY_CAP_S)
        woken_by: str | None = None  # the wake list whose token ended the last wait
        while not stopping.is_set():
            if self._commits_refused.is_set():
                clock.wait(stopping, REFUSED_POLL_S)  # cleared once a commit lands
                continue
            # Busy: let a few more slots free up (a few ms at most) so that one claim fetches
            # a batch instead of one round trip per finished run.
            free = table.wait_for_room(stopping, self._batch_floor, BATCH_LINGER_S)
            if free <= 0 or self._commits_refused.is_set():
                # Stopping, commits refused meanwhile, or outcomes awaiting commit filled the
                # room. Never claim 0 and then sleep on the wake lists as if nothing were due.
                continue
            try:
                focus, woken_by = woken_by, None
                if focus is not None and clock.monotonic() - self._swept_at >= self._idle_wait:
                    focus = None
                # Burst mode: held before the claim, not after it. A run held then may have
                # finished meanwhile and, committing, made another due (a workflow's next
                # step) after this claim looked: only a claim that found nothing with
                # nothing held before it means drained.
                held_before = len(table)
                claimed, wait_s = self.claim(free, focus)
                backoff.reset()
            except (JobQueueError, redis.exceptions.RedisError) as exc:
                if not self._run_inline():  # what the failed call claimed before failing
                    return False
                pause = backoff.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, pause)
                clock.wait(stopping, pause)
                continue
            except Exception:
                # A surprise must not end the claim loop (the worker would idle forever, its
                # process alive); runs this call leased come back when their leases expire.
                if not self._run_inline():
                    return False
                pause = backoff.next()
                log.exception("claim loop iteration failed; retrying in %.1fs", pause)
                clock.wait(stopping, pause)
                continue
            if not self._run_inline():
                return False  # given up while a run was stuck: another thread claims now
            if claimed == 0 and self._drained is not None:
                # Burst mode never waits on the wake lists, so every claim here was a sweep
                # of all partitions (no focus).
                if held_before == 0 and len(table) == 0:
                    self._drained()  # nothing due, nothing held: what may come is later
                else:
                    table.wait_for_change(BURST_POLL_S)  # a held run may retry at once
            elif claimed == 0:
                woken_by = self._sleep_until_woken(wait_s)
            elif focus is not None and claimed < min(free, MAX_CLAIM_BATCH):
                # The woken partition gave all it had: wait again (a token of another
                # partition ends the wait at once) rather than ask every partition.
                woken_by = self._sleep_until_woken(wait_s)
        return True

    def claim(self, free: int, focus: str | None = None) -> tuple[int, float]:
        """Claim across this worker's partitions, queues in priority order; round-robin among
        partitions of equal priority so none starves; only from the partitions whose wake
        list is ``focus`` if given. Returns (claimed, seconds to sleep): claimed is 0 only
        when every partition asked was cooling down or had nothing (free > 0); the seconds
        run to the next due time any partition reported, asked now or before. A partition
        whose claim fails is cooled down and the others go on; only when every one failed is
        the error raised (the caller backs off)."""
        assert free > 0, "a claim for no slot would read as 'nothing due'"
        claimed = 0
        wait_ms: int | None = None
        if focus is None:
            self._swept_at = self._clock.monotonic()
            order = self._partitions[self._rr :] + self._partitions[: self._rr]
            self._rr = (self._rr + 1) % max(len(self._partitions), 1)
            order.sort(key=lambda k: self._queues.index(k.queue))  # stable: keeps the rotation
        else:
            order = [k for k in self._partitions if k.wake == focus]
        failure: Exception | None = None
        answered = 0
        clock = self._clock
        now = clock.monotonic()
        dead_retention_ms = self._jq.settings.dead_retention_ms
        asking: list[PartitionKeys] = []
        for keys in order:
            cooling = self._cooling.get(keys)
            if cooling is not None and cooling.until > now:
                gap = int((cooling.until - now) * 1000)
                wait_ms = gap if wait_ms is None else min(wait_ms, gap)
            else:
                asking.append(keys)
        # Rounds of claims, each in one round trip per master (not one per partition), a
        # queue's partitions before the next queue's; a round asks no more partitions than
        # there are free slots, so more rounds follow while slots remain.
        while asking and claimed < free:
            queue = asking[0].queue
            same = [k for k in asking if k.queue == queue]
            batch, wants = self._plan(same, free - claimed)
            asking = [k for k in asking if k not in batch]
            calls = [
                CLAIM.call(keys, want, self._id, self._lease_ms, dead_retention_ms,
                           now=clock.now_ms())
                for keys, want in zip(batch, wants, strict=True)
            ]
            sent = clock.monotonic()
            for keys, want, reply in zip(batch, wants, self._send_all(calls), strict=True):
                try:
                    if isinstance(reply, Exception):
                        raise reply
                    result = CLAIM.parse(reply)
                except (JobQueueError, redis.exceptions.RedisError) as exc:
                    failure = exc
                    self._hot.discard(keys)
                    self._cool_down(keys, exc)
                    continue
                answered += 1
                if keys in self._cooling:
                    del self._cooling[keys]
                    log.info("claims in %s work again", keys.prefix)
                self._metrics.claimed(keys.queue, result.runs, result.now_ms)
                try:
                    for run in result.runs:
                        try:
                            self._start(run, keys, result.now_ms, sent)
                        except Exception:
                            # One bad run must not keep the rest of the batch from starting
                            # (it is not in flight: its lease expires, it is claimed again).
                            log.exception("starting run_id=%s failed", run.run_id)
                finally:
                    self._launch()
                claimed += len(result.runs)
                if len(result.runs) >= want:
                    self._hot.add(keys)  # it may hold more
                else:
                    self._hot.discard(keys)
                if result.next_wake_ms is not None:
                    gap = max(result.next_wake_ms - result.now_ms, 0)
                    wait_ms = gap if wait_ms is None else min(wait_ms, gap)
                    self._due[keys] = sent + gap / 1000
                else:
                    self._due.pop(keys, None)
        if failure is not None and answered == 0:
            raise failure  # no partition answered: the caller's back-off applies
        if focus is not None:
            # The partitions not asked now: what they reported before still falls due.
            asked = set(order)
            for keys, due in self._due.items():
                if keys not in asked:
                    gap = max(int((due - now) * 1000), 0)
                    wait_ms = gap if wait_ms is None else min(wait_ms, gap)
        idle = self._idle_wait
        wait_s = idle if wait_ms is None else min(wait_ms / 1000, idle)
        return claimed, wait_s

    def _plan(self, same: list[PartitionKeys], room: int) -> tuple[list[PartitionKeys], list[int]]:
        """Which partitions of one queue a round asks, and for how many runs each: ``room``
        in all at most, in rotation order (so that none starves). When some partition's last
        claim got all it asked for (it may hold more), the others before it in the rotation
        are asked for one run each and it for the rest, as one claim after the other would
        have had it; when none did, the room is shared by as many as it allows."""
        if not any(k in self._hot for k in same):
            batch = same[:room]
            extra = room - len(batch)
            return batch, [
                min(MAX_CLAIM_BATCH, 1 + extra // len(batch) + (i < extra % len(batch)))
                for i in range(len(batch))
            ]
        batch, wants = [], []
        for keys in same:
            if room <= 0:
                break
            want = min(room, MAX_CLAIM_BATCH) if keys in self._hot else 1
            batch.append(keys)
            wants.append(want)
            room -= want
        return batch, wants

    def _send_all(self, calls: list[Call]) -> list[Any]:
        """Each call's reply or the error it met, as a value."""
        if len(calls) == 1 or self._jq.settings.durable:
            replies: list[Any] = []
            for call in calls:
                try:
                    replies.append(self._send(call))
                except (JobQueueError, redis.exceptions.RedisError) as exc:
                    replies.append(exc)
            return replies
        try:
            return self._jq.scripts.run_each(calls)
        except (JobQueueError, redis.exceptions.RedisError) as exc:
            return [exc] * len(calls)

    def _send(self, call: Call) -> Any:
        settings = self._jq.settings
        if not settings.durable:
            return self._jq.scripts.run(call)
        (reply,), durable = self._jq.scripts.run_durable(
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
        cooling = self._cooling.setdefault(keys, _Cooling())
        pause = cooling.backoff.next()
        cooling.until = self._clock.monotonic() + pause
        log.warning(
            "claim in %s failed (%s); skipping it for %.1fs, the other partitions go on",
            keys.prefix,
            exc,
            pause,
        )

    def _sleep_until_woken(self, wait_s: float) -> str | None:
        """Block on the wake lists (a token arrives with every enqueue) at most wait_s.
        Returns the partition wake list a token was taken from, or None (no token: every
        partition is to be asked)."""
        # In the queues' priority order: BLPOP takes its token from the first list holding
        # one, so a higher-priority queue's partition is claimed first.
        wake_keys = list(dict.fromkeys(k.wake for k in self._partitions))
        timeout = max(wait_s, 0.01)
        try:
            if isinstance(self._jq.redis, redis.cluster.RedisCluster):
                got = self._wait_on_cluster(wake_keys, timeout)
            else:
                got = self._jq.redis.blpop([*wake_keys, self.own_wake_key], timeout=timeout)
        # RedisClusterException (not a RedisError): a slot without a known master mid-failover.
        except (redis.exceptions.RedisError, redis.exceptions.RedisClusterException) as exc:
            log.warning("waiting for work failed (%s)", exc)
            self._clock.wait(self._stopping, WAKE_FAILED_S)
            return None
        if not got:
            return None
        woken = got[0].decode() if isinstance(got[0], bytes) else str(got[0])
        return woken if woken in wake_keys else None

    def _wait_on_cluster(self, wake_keys: list[str], timeout: float) -> Any:
        """One slot per blocking call in a cluster: wait on one list at a time, in turn,
        CLUSTER_WAKE_S each; after each, one pipelined look at every list's length (a round
        trip per master, not a claim per partition) finds a token pushed to another. Real
        time, like the blocking calls. Returns (list, token) like BLPOP, or None."""
        client = self._jq.redis
        end = time.monotonic() + timeout
        while True:
            key = wake_keys[self._rr % len(wake_keys)]
            self._rr = (self._rr + 1) % max(len(self._partitions), 1)
            left = end - time.monotonic()
            got = client.blpop([key], timeout=max(min(left, CLUSTER_WAKE_S), 0.01))
            if got:
                return got
            if self._stopping.is_set() or end - time.monotonic() <= 0:
                return None
            pipe = client.pipeline()
            for k in wake_keys:
                pipe.llen(k)
            for k, length in zip(wake_keys, pipe.execute(), strict=True):
                if length:
                    return (k, None)  # its token stays: a later wait takes it
