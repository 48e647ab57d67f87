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
claimed. It runs on the worker's event loop and never runs task code: a claimed run is handed
to the executor, which starts it as an asyncio task or on a task thread."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import redis

from jobqueue.errors import JobQueueError
from jobqueue.policy.backoff import Backoff
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import CLAIM, ClaimedRun
from jobqueue.store.scripts import Call
from jobqueue.worker.executing import Executor
from jobqueue.worker.permits import Permits
from jobqueue.worker.shared import Shared

log = logging.getLogger("jobqueue.worker")

MAX_CLAIM_BATCH = 500
# A busy claim loop waits this long at most for a batch's worth of free slots (a quarter of
# them, 64 at most) before claiming fewer: one claim per batch, not one per finished run.
BATCH_LINGER_S = 0.002
# A partition whose claim failed is skipped this long, doubling up to the cap, while the
# others go on.
PARTITION_COOLDOWN_S = 0.5
PARTITION_COOLDOWN_CAP_S = 10.0
# A claim loop iteration that failed as a whole is tried again after this, doubling.
RETRY_S = 0.1
RETRY_CAP_S = 5.0
# While Redis refuses commits, the claim loop looks again this often.
REFUSED_POLL_S = 0.2
# Waiting on the wake lists failed (Redis down): wait this long instead.
WAKE_FAILED_S = 0.5


# A queue at its exact limit is asked again this often (ms) for permits: one given back
# brings no wake token.
PERMIT_POLL_MS = 50

# Burst mode: how long to wait for a held run to finish before claiming again.
BURST_POLL_S = 0.05


class _Cooling:
    """A partition in cool-down after failed claims."""

    __slots__ = ("backoff", "until")

    def __init__(self) -> None:
        self.backoff = Backoff(PARTITION_COOLDOWN_S, PARTITION_COOLDOWN_CAP_S, jitter=False)
        self.until = 0.0


class Claimer:
    def __init__(self, shared: Shared, executor: Executor) -> None:
        """Claimed runs go to ``executor.start``; in burst mode (config.burst) the claim
        loop ends once nothing is due and nothing is held. A queue with exact limits is
        claimed from only with permits taken first (jobqueue.worker.permits)."""
        self._s = shared
        self._permits = Permits(shared)
        shared.permits = self._permits
        self._jq = shared.jq
        self._start = executor.start
        self._partitions: list[PartitionKeys] = []
        self._rr = 0
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
        self._waiting: asyncio.Task[Any] | None = None  # the blocking wait for work
        self._batch = max(1, min(shared.config.concurrency // 4, 64))

    def set_partitions(self, partitions: list[PartitionKeys]) -> None:
        self._partitions = partitions

    def wake(self) -> None:
        """On the loop: end a blocking wait for work now (stop)."""
        if self._waiting is not None:
            self._waiting.cancel()

    async def run(self) -> None:
        """The claim loop, until stopping (or, in burst mode, drained)."""
        s, table, clock = self._s, self._s.table, self._s.clock
        stopping = s.stop_event.is_set
        backoff = Backoff(RETRY_S, RETRY_CAP_S)
        woken_by: str | None = None  # the wake list whose token ended the last wait
        idle_wait = s.config.idle_wait_s
        while not stopping():
            if s.commits_refused:
                await s.pause(REFUSED_POLL_S)  # cleared once a commit lands
                continue
            free = await table.wait_for_room(stopping, self._batch, BATCH_LINGER_S)
            if free <= 0 or s.commits_refused:
                continue
            try:
                focus, woken_by = woken_by, None
                if focus is not None and clock.monotonic() - self._swept_at >= idle_wait:
                    focus = None
                # Burst mode: held before the claim, not after it. A run held then may have
                # finished meanwhile and, committing, made another due (a workflow's next
                # step) after this claim looked: only a claim that found nothing with
                # nothing held before it means drained.
                held_before = len(table)
                claimed, wait_s = await self.claim(free, focus)
                backoff.reset()
            except (JobQueueError, redis.exceptions.RedisError) as exc:
                pause = backoff.next()
                log.warning("claim failed (%s); retrying in %.1fs", exc, pause)
                await s.pause(pause)
                continue
            except Exception:
                # A surprise must not end the claim loop (the worker would idle forever, its
                # process alive); runs this call leased come back when their leases expire.
                pause = backoff.next()
                log.exception("claim loop iteration failed; retrying in %.1fs", pause)
                await s.pause(pause)
                continue
            if claimed == 0 and s.config.burst:
                # Burst mode never waits on the wake lists, so every claim here was a sweep
                # of all partitions (no focus).
                if held_before == 0 and len(table) == 0:
                    return  # nothing due, nothing held: what may come is later
                await table.wait_for_change(BURST_POLL_S)  # a held run may retry at once
            elif claimed == 0:
                woken_by = await self._sleep_until_woken(wait_s)
            elif focus is not None and claimed < min(free, MAX_CLAIM_BATCH):
                # The woken partition gave all it had: wait again (a token of another
                # partition ends the wait at once) rather than ask every partition.
                woken_by = await self._sleep_until_woken(wait_s)

    async def claim(self, free: int, focus: str | None = None) -> tuple[int, float]:
        """Claim across this worker's partitions, queues in priority order; round-robin among
        partitions of equal priority so none starves; only from the partitions whose wake
        list is ``focus`` if given. Returns (claimed, seconds to sleep): claimed is 0 only
        when every partition asked was cooling down or had nothing (free > 0); the seconds
        run to the next due time any partition reported, asked now or before. A partition
        whose claim fails is cooled down and the others go on; only when every one failed is
        the error raised (the caller backs off)."""
        assert free > 0, "a claim for no slot would read as 'nothing due'"
        s = self._s
        queues = s.queues
        claimed = 0
        wait_ms: int | None = None
        if focus is None:
            self._swept_at = s.clock.monotonic()
            order = self._partitions[self._rr :] + self._partitions[: self._rr]
            self._rr = (self._rr + 1) % max(len(self._partitions), 1)
            order.sort(key=lambda k: queues.index(k.queue))  # stable: keeps the rotation
        else:
            order = [k for k in self._partitions if k.wake == focus]
        failure: Exception | None = None
        answered = 0
        clock = s.clock
        now = clock.monotonic()
        dead_retention_ms = self._jq.settings.dead_retention_ms
        asking: list[PartitionKeys] = []
        try:
            await self._permits.refresh()
        except (JobQueueError, redis.exceptions.RedisError) as exc:
            log.warning("reading the queues' exact limits failed (%s)", exc)
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
            token, granted = "", 0
            if queue in self._permits.limited:
                wanted = sum(wants)
                token, granted, free_in = await self._permits.take(queue, wanted)
                batch, wants = _within(batch, wants, granted)  # (token '': no limit)
                if granted < wanted:
                    # A permit given back brings no wake token: look again soon.
                    poll = PERMIT_POLL_MS if free_in is None else min(free_in, PERMIT_POLL_MS)
                    wait_ms = poll if wait_ms is None else min(wait_ms, poll)
                if not batch:
                    continue
            calls = [
                CLAIM.call(keys, want, s.worker_id, s.lease_ms, dead_retention_ms,
                           now=clock.now_ms())
                for keys, want in zip(batch, wants, strict=True)
            ]
            sent = clock.monotonic()
            to_start: list[tuple[PartitionKeys, ClaimedRun, int]] = []
            for keys, want, reply in zip(batch, wants, await self._send_all(calls), strict=True):
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
                s.metrics.claimed(keys.queue, result.runs, result.now_ms)
                to_start += [(keys, run, result.now_ms) for run in result.runs]
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
            refused: set[str] = set()
            if token:
                refused = await self._permits.bind(
                    queue, token, granted, [(k, r) for k, r, _ in to_start]
                )
            for keys, run, now_ms in to_start:
                if run.run_id in refused:
                    continue  # no permit: its lease expires, a claim with one takes it
                try:
                    self._start(run, keys, now_ms, sent)
                except Exception:
                    # One bad run must not keep the rest of the batch from starting (it is
                    # not in flight: its lease expires, it is claimed again).
                    log.exception("starting run_id=%s failed", run.run_id)
        if failure is not None and answered == 0:
            raise failure  # no partition answered: the caller's back-off applies
        if focus is not None:
            # The partitions not asked now: what they reported before still falls due.
            asked = set(order)
            for keys, due in self._due.items():
                if keys not in asked:
                    gap = max(int((due - now) * 1000), 0)
                    wait_ms = gap if wait_ms is None else min(wait_ms, gap)
        idle = s.config.idle_wait_s
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

    async def _send_all(self, calls: list[Call]) -> list[Any]:
        """Each call's reply or the error it met, as a value."""
        settings = self._jq.settings
        if not settings.durable:
            return await self._s.io.run_each(calls)
        replies: list[Any] = []
        for call in calls:
            try:
                replies.append(await self._send_durable(call))
            except (JobQueueError, redis.exceptions.RedisError) as exc:
                replies.append(exc)
        return replies

    async def _send_durable(self, call: Call) -> Any:
        settings = self._jq.settings
        (reply,), durable = await self._s.io.run_durable(
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
        cooling.until = self._s.clock.monotonic() + pause
        log.warning(
            "claim in %s failed (%s); skipping it for %.1fs, the other partitions go on",
            keys.prefix,
            exc,
            pause,
        )

    async def _sleep_until_woken(self, wait_s: float) -> str | None:
        """Block on the wake lists (a token arrives with every enqueue) at most wait_s, or
        until stop() cancels the wait. Returns the partition wake list a token was taken
        from, or None (no token: every partition is to be asked)."""
        # In the queues' priority order: BLPOP takes its token from the first list holding
        # one, so a higher-priority queue's partition is claimed first.
        wake_keys = list(dict.fromkeys(k.wake for k in self._partitions))
        if self._s.stop_event.is_set():
            return None
        self._waiting = asyncio.ensure_future(
            self._s.io.wait_on_lists(wake_keys, max(wait_s, 0.01))
        )
        try:
            woken = await self._waiting
        except asyncio.CancelledError:
            if not self._s.stop_event.is_set():
                raise  # the loop itself is being cancelled
            return None
        # RedisClusterException (not a RedisError): a slot without a known master mid-failover.
        except (
            JobQueueError, redis.exceptions.RedisError, redis.exceptions.RedisClusterException
        ) as exc:
            log.warning("waiting for work failed (%s)", exc)
            await self._s.pause(WAKE_FAILED_S)
            return None
        except Exception:  # a surprise must not end the claim loop
            log.exception("waiting for work failed")
            await self._s.pause(WAKE_FAILED_S)
            return None
        finally:
            self._waiting = None
        return woken if woken in wake_keys else None


def _within(
    batch: list[PartitionKeys], wants: list[int], granted: int
) -> tuple[list[PartitionKeys], list[int]]:
    """The round cut down to ``granted`` runs in all (the first partitions keep theirs)."""
    out_batch, out_wants = [], []
    for keys, want in zip(batch, wants, strict=True):
        if granted <= 0:
            break
        take = min(want, granted)
        out_batch.append(keys)
        out_wants.append(take)
        granted -= take
    return out_batch, out_wants
