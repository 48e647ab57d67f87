"""Committing outcomes, on the worker's event loop: what finished while the last commit was on
its way goes out together, one batched ``complete`` call per partition plus the ``fail``
calls, in one round trip (one per master on a cluster), each checked against its run's fence
in Redis. Commits Redis did not take (a master down, a refusal) wait and are sent again with
back-off, alone, while every other commit goes on: one master down holds back its own runs
only. The workflow relays and audits (jobqueue.worker.outboxes) use the sync client, on a
thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass

from jobqueue.client.relay import Committed, relay_committed_steps
from jobqueue.errors import ConnectionFailed, ServerRefused
from jobqueue.policy.backoff import Backoff
from jobqueue.policy.timeutil import abs_time
from jobqueue.runtime.logs import log_with_traceback, run_fields
from jobqueue.settings import to_ms
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import BOUNCE, COMPLETE, FAIL, Bounced, Outcome
from jobqueue.store.scripts import Call
from jobqueue.worker.outboxes import OutboxUpkeep
from jobqueue.worker.relaying import CommitRelay
from jobqueue.worker.runs import Finished, run_event
from jobqueue.worker.shared import Shared, in_thread

log = logging.getLogger("jobqueue.worker")

MAX_COMMIT_BATCH = 500
# Commits sent again: first after about this long, doubling up to the cap.
RESEND_S = 0.1
RESEND_CAP_S = 5.0


@dataclass(slots=True)
class _Deferred:
    """Outcomes of one commit call that Redis did not take yet, waiting to be sent again."""

    items: list[Finished]
    resent: bool = False  # sent before and the connection was lost: it may have run
    backoff: Backoff | None = None
    not_before: float = 0.0
    reason: Exception | None = None

    def again(self, reason: Exception, now: float) -> _Deferred:
        if self.backoff is None:
            self.backoff = Backoff(RESEND_S, RESEND_CAP_S)
        self.not_before = now + self.backoff.next()
        self.reason = reason
        return self


def _log_finished(item: Finished, status: str) -> None:
    """The one line of a run whose outcome was accepted: 'done' at INFO; 'failed' with the
    outcome and the attempt's traceback, at WARNING when it will be retried ('retry', or
    'landed': a resent fail found its first copy had made the run pending again) and at
    ERROR when it is dead, the lines people alert on."""
    run, queue = item.entry.run, item.entry.keys.queue
    ms = round(item.duration_s * 1000, 3)
    fields = {**run_fields(run), "task": run.task, "queue": queue, "duration_ms": ms}
    if item.ok:
        log.info(
            "done run_id=%s fence=%d attempt=%d task=%s queue=%s in %.3fs",
            run.run_id, run.fence, run.attempt, run.task, queue, item.duration_s,
            extra={**fields, "outcome": "done"},
        )
        return
    log_with_traceback(
        log,
        logging.ERROR if status == "dead" else logging.WARNING,
        "failed run_id=%s fence=%d attempt=%d task=%s queue=%s in %.3fs -> %s: %s",
        run.run_id, run.fence, run.attempt, run.task, queue, item.duration_s, status,
        item.error.splitlines()[-1][:300] if item.error else "",
        traceback=item.traceback,
        extra={**fields, "outcome": status},
    )


def _bounced(b: Bounced) -> Outcome:
    """bounce.lua's answer as a commit's Outcome ('bounced' due again at retry_at_ms, 'dead',
    or the refusal)."""
    return Outcome(b.accepted, b.status, current_fence=b.current_fence, retry_at_ms=b.due_ms)


def _log_handed_back(item: Finished, outcome: Outcome) -> None:
    """A run handed back for want of its task's code: a WARNING at each hand-back (the
    deploy is not complete, or a worker serves a queue it should not), an ERROR when the
    window is over and the run is dead."""
    run, queue = item.entry.run, item.entry.keys.queue
    fields = {**run_fields(run), "task": run.task, "queue": queue, "outcome": outcome.status}
    if outcome.status == "dead":
        log.error(
            "dead run_id=%s task=%s queue=%s: %s, and no worker that has it took the run "
            "within Settings.unknown_task_window_s",
            run.run_id, run.task, queue, item.error, extra=fields,
        )
        return
    when = ""
    if outcome.retry_at_ms is not None:
        when = f" at {abs_time(outcome.retry_at_ms)} UTC"
    log.warning(
        "handed back run_id=%s task=%s queue=%s: %s; due again%s for a worker that has "
        "the task (attempt not counted)",
        run.run_id, run.task, queue, item.error, when, extra=fields,
    )


class Committer:
    def __init__(
        self,
        shared: Shared,
        shutdown_left: Callable[[], float],
        on_answered: Callable[[int], None] | None = None,
    ) -> None:
        """``on_answered(n)``: after each batch of commits answered, with the number of runs
        answered, before their slots are freed (the worker's recycling check)."""
        self._s = shared
        self._on_answered = on_answered
        self._jq = shared.jq
        self._hooks = shared.hooks
        self._stats = shared.stats
        self._metrics = shared.metrics
        self._shutdown_left = shutdown_left
        self._items: list[Finished] = []
        self._ready = asyncio.Event()
        self._closing = False
        self._carry = CommitRelay(shared.jq)
        self._outboxes = OutboxUpkeep(shared.jq, shared.clock)

    def set_partitions(self, partitions: list[PartitionKeys]) -> None:
        """The partitions the worker serves: their outboxes are relayed every RELAY_SWEEP_S
        (runs buried by a claim, handed back to death, or left by a relay that failed)."""
        self._outboxes.partitions = list(partitions)

    def put(self, item: Finished) -> None:
        self._items.append(item)
        self._ready.set()

    def close(self) -> None:
        """Commit what is queued, then end (see run)."""
        self._closing = True
        self._ready.set()

    async def run(self) -> None:
        """Commit what finished, batch after batch, until closed (and, closing, until what
        waits to be sent again is sent or the shutdown deadline passes)."""
        clock = self._s.clock
        later: list[_Deferred] = []
        while True:
            if not self._items and not self._closing:
                wait = None
                if later:
                    wait = max(min(d.not_before for d in later) - clock.monotonic(), 0.0)
                until_sweep = self._outboxes.until_due()
                if until_sweep is not None:
                    wait = until_sweep if wait is None else min(wait, until_sweep)
                self._ready.clear()
                if wait is None:
                    await self._ready.wait()
                elif wait > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._ready.wait(), wait)
            if self._closing and not self._items and (not later or self._shutdown_left() <= 0):
                await self._flush_relay(clearing=True)  # (what was committed is told)
                return  # what is left in `later` expires and is claimed again
            batch, self._items = self._items[:MAX_COMMIT_BATCH], self._items[MAX_COMMIT_BATCH:]
            now = clock.monotonic()
            due = [d for d in later if d.not_before <= now]
            later = [d for d in later if d.not_before > now]
            if self._closing and not batch and not due and later:
                # closing, waiting only for resends: wait for the first (a stop does not end
                # this wait: the worker is stopping already), never spin
                await self._s.sleep(min(d.not_before for d in later) - now)
                continue
            answered: list[Finished] = []
            settled = answered  # (the commits Redis answered: their permits go back)
            try:
                later += await self._commit(batch, due, answered)
            except Exception:
                # Not a connection problem (those wait in `later`): the outcome is unknown.
                # Stop heartbeating these runs and free their slots; their leases expire and
                # they are claimed again, so nothing is lost and nothing stays leased forever.
                done = {id(i) for i in answered}
                settled = list(answered)
                items = batch + [i for d in due for i in d.items]
                lost = [i for i in items if id(i) not in done]
                log.exception("commit of %d runs failed; their leases will expire", len(lost))
                self._abandon(lost)
                answered = items
            if answered and self._on_answered is not None:
                # (before their slots free: a worker that recycles claims none into them)
                try:
                    self._on_answered(len(answered))
                except Exception:
                    log.exception("the check after %d committed runs failed", len(answered))
            try:
                self._s.table.answered(answered)
                if self._s.permits is not None and self._s.permits.limited:
                    self._s.permits.give_back(item.entry for item in settled)
            except Exception:  # the commit loop commits every run: it must not die of a bug
                log.exception("forgetting %d committed runs failed", len(answered))
            if self._outboxes.due():
                await self._flush_relay(clearing=True)  # (before the sweep reads the outboxes)
                await in_thread(self._outboxes.sweep)

    async def _flush_relay(self, *, clearing: bool) -> None:
        """The carried deliveries (and with ``clearing`` the clearings of the outbox entries
        delivered), sent now unless more commits are queued: they ride along with those."""
        if not self._carry.pending or self._items:
            return
        try:
            await in_thread(lambda: self._carry.flush(clearing=clearing))
        except Exception as exc:
            log.warning("relaying completions failed for now: %s", exc)

    def _abandon(self, items: list[Finished]) -> None:
        for item in items:
            self._stats.rejected(item.entry.run.run_id, item.entry.run.fence, "error")

    async def _commit(
        self, batch: list[Finished], retries: list[_Deferred], answered: list[Finished]
    ) -> list[_Deferred]:
        """One complete call per partition for the successes (one script call for many runs
        is most of a no-op run's cost), one fail call per failure, all in one round trip (one
        per master on a cluster). Returns the commits Redis did not take, to send again
        later: refused for now (OOM, READONLY, TRYLATER: they did not run) or lost with their
        connection (they may have run: see _settle); their runs stay heartbeated meanwhile.
        Appends the items it answered to ``answered`` (the caller forgets them)."""
        groups: list[_Deferred] = []
        done: dict[PartitionKeys, list[Finished]] = {}
        for item in batch:
            if item.ok:
                done.setdefault(item.entry.keys, []).append(item)
            else:
                groups.append(_Deferred([item]))
        groups = [_Deferred(items) for items in done.values()] + groups + retries
        if not groups:
            await self._flush_relay(clearing=True)
            return []
        settings = self._jq.settings
        retention = settings.done_retention_ms
        now_ms = self._s.clock.now_ms()
        calls = [
            COMPLETE.call(
                g.items[0].entry.keys,
                [(i.entry.run.run_id, i.entry.run.fence, i.result_json) for i in g.items],
                retention,
                now=now_ms,
                dead_retention_ms=settings.dead_retention_ms,
                max_bytes=settings.max_results_bytes,
            )
            if g.items[0].ok
            else bounce_call(self._s, g.items[0])
            if g.items[0].bounce
            else fail_call(self._s, g.items[0])
            for g in groups
        ]
        carried = self._carry.calls() if self._carry.pending else []
        replies = await self._s.io.run_each(calls + carried)
        if carried:
            replies, carried_replies = replies[: len(calls)], replies[len(calls):]
            try:  # (rarely, an answer relays the slow way: sync calls, on a thread)
                await in_thread(self._carry.answer, carried_replies)
            except Exception as exc:  # (their outbox entries stay: the sweep relays them)
                log.warning("relaying completions failed for now: %s", exc)
        relay: dict[PartitionKeys, None] = {}
        committed: list[Committed] = []  # completions others wait on: the fast path
        later: list[_Deferred] = []
        refused = None
        now = self._s.clock.monotonic()
        for group, reply in zip(groups, replies, strict=True):
            if isinstance(reply, ConnectionFailed):  # ServerRefused included
                if isinstance(reply, ServerRefused):
                    refused = reply
                else:
                    group.resent = True  # it may have run: see _settle
                later.append(group.again(reply, now))
                continue
            if isinstance(reply, Exception):
                log.error(
                    "commit of %d runs failed (%s); their leases will expire",
                    len(group.items),
                    reply,
                )
                self._abandon(group.items)
                answered += group.items
                continue
            first = group.items[0]
            outcomes = (
                COMPLETE.parse(reply)
                if first.ok
                else [_bounced(BOUNCE.parse(reply))]
                if first.bounce
                else [FAIL.parse(reply)]
            )
            for item, outcome in zip(group.items, outcomes, strict=True):
                self._settle(item, outcome, group.resent)
                answered.append(item)
                if outcome.relay and outcome.parents and outcome.outbox_version is not None:
                    committed.append(Committed(item.entry.keys, item.entry.run.run_id,
                                               item.result_json or "null", outcome.parents,
                                               outcome.outbox_version))
                elif outcome.relay:
                    relay[item.entry.keys] = None
        # Runs waiting on these hear of them before the table is told: in the next commit's
        # round trip when more commits are queued, else now (jobqueue.worker.relaying).
        if committed:
            try:
                if settings.durable:  # (deliveries WAIT for the replicas first)
                    await in_thread(
                        self._jq.run_steps, relay_committed_steps(self._jq, committed)
                    )
                else:
                    await in_thread(self._carry.add, committed)
            except Exception as exc:  # (their outbox entries stay: the sweep relays them)
                log.warning("relaying %d completions failed for now: %s", len(committed), exc)
        await self._flush_relay(clearing=False)
        for keys in relay:
            await in_thread(self._outboxes.relay, keys)
        if refused is not None:
            self._s.commits_refused = True  # no new claims until commits land again
        elif answered:
            self._s.commits_refused = False
        if later:
            log.warning(
                "%d commits not taken (%s); sending them again in %.1fs at the latest, the "
                "others go on",
                sum(len(g.items) for g in later),
                later[0].reason,
                max(g.not_before for g in later) - now,
            )
        return later

    def _settle(self, item: Finished, outcome: Outcome, resent: bool = False) -> None:
        """Record the outcome of one commit.

        A commit sent again after a lost connection may be refused by its own first copy,
        which landed: refused as finished (or, for a retry or a hand-back, not running) with
        the run still at this attempt's fence. That is this commit's success, not a
        fenced-out one: 'done', 'dead' (a failure or a hand-back that buried the run) or
        'landed' (one that made it pending again)."""
        run = item.entry.run
        if (
            resent
            and not outcome.accepted
            and outcome.current_fence == run.fence
            and outcome.status in ("finished", "not-running")
        ):
            landed = "dead" if outcome.status == "finished" else "landed"
            outcome = Outcome(True, "done" if item.ok else landed)
        if item.bounce and outcome.accepted and outcome.status != "dead":
            self._metrics.handed_back(item.entry.keys.queue, run.task)
        else:
            self._metrics.committed(
                item.entry.keys.queue, item.ok, outcome.accepted, outcome.status, run.task,
                item.duration_s,
            )
        if outcome.accepted:
            if item.ok:
                self._stats.completed += 1
            elif item.bounce and outcome.status != "dead":
                self._stats.handed_back += 1
            else:
                self._stats.failed += 1
            if item.bounce:
                _log_handed_back(item, outcome)
            elif not item.ok or log.isEnabledFor(logging.INFO):
                _log_finished(item, outcome.status)
            if self._hooks is not None and outcome.status in ("retry", "dead"):
                self._hooks.event(
                    run_event(
                        item.entry, outcome.status, error=item.error,
                        traceback=item.traceback, retry_at_ms=outcome.retry_at_ms,
                    )
                )
        else:
            self._stats.fenced_out += 1
            self._stats.rejected(run.run_id, run.fence, outcome.status)
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
            if self._hooks is not None and not item.entry.lost_reported:
                item.entry.lost_reported = True
                what = "cancelled" if outcome.status == "cancelled" else "lease-lost"
                self._hooks.event(run_event(item.entry, what, reason=outcome.status))


def fail_call(s: Shared, item: Finished) -> Call:
    run, keys, settings = item.entry.run, item.entry.keys, s.jq.settings
    delay = s.tasks.retry_delay_ms(run.task, run.attempt) if item.retry else None
    # An exception's text may hold lone surrogates (undecodable bytes): not UTF-8, so it
    # could not be sent, and the whole commit batch would fail with it.
    error = item.error.encode("utf-8", "replace").decode("utf-8")
    return FAIL.call(
        keys,
        run.run_id,
        run.fence,
        error,
        delay,
        settings.dead_retention_ms,
        now=s.clock.now_ms(),
        traceback=item.traceback,
    )

def bounce_call(s: Shared, item: Finished) -> Call:
    """Hand a run whose task this worker has no code for back (see lua/bounce.lua)."""
    run, keys, settings = item.entry.run, item.entry.keys, s.jq.settings
    return BOUNCE.call(
        keys,
        run.run_id,
        run.fence,
        s.worker_id,
        item.error.encode("utf-8", "replace").decode("utf-8"),
        delay_ms=to_ms(settings.unknown_task_delay_s),
        delay_cap_ms=to_ms(settings.unknown_task_delay_cap_s),
        window_ms=settings.unknown_task_window_ms,
        dead_retention_ms=settings.dead_retention_ms,
        min_hand_backs=settings.unknown_task_min_hand_backs,
        now=s.clock.now_ms(),
    )
