"""A worker's side of exact limits (jobqueue.store.exact): which of its queues have them, and
the permits it takes before claiming from them, binds to the runs it claimed, extends with
its heartbeats and gives back once their commits are answered. Everything here runs on the
worker's event loop; a permit call that fails costs nothing but time: a permit not given
back expires by itself a margin after its run's lease."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from jobqueue.errors import JobQueueError
from jobqueue.store.exact import (
    PERMIT_MARGIN_MS,
    PERMIT_SETTLE,
    PERMIT_TAKE,
    ExactKeys,
    run_permit,
)
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import ClaimedRun
from jobqueue.worker.runs import InFlight
from jobqueue.worker.shared import Shared

log = logging.getLogger("jobqueue.worker")

# How often a worker looks again at which of its queues have exact limits.
EXACT_REFRESH_S = 5.0


class Permits:
    def __init__(self, shared: Shared) -> None:
        self._s = shared
        self._keys = {q: ExactKeys(q) for q in shared.queues}
        # Until a look says otherwise, every queue may have exact limits: a worker whose
        # first look failed must not claim without permits (a take where there is no limit
        # grants all it asks for, and says so).
        self.limited: set[str] = set(shared.queues)
        self._seen_limited: set[str] = set()  # (a look found the limits: logged once)
        self._refreshed_at: float | None = None
        self._pending: set[asyncio.Task[Any]] = set()

    async def refresh(self) -> None:
        """Every EXACT_REFRESH_S: which queues have exact limits (a take of none tells)."""
        at = self._s.clock.monotonic()
        if self._refreshed_at is not None and at - self._refreshed_at < EXACT_REFRESH_S:
            return
        self._refreshed_at = at
        now = self._s.clock.now_ms()
        calls = [PERMIT_TAKE.call(self._keys[q], 0, 1, "probe", now) for q in self._s.queues]
        replies = await self._s.io.run_each(calls)
        for queue, reply in zip(self._s.queues, replies, strict=True):
            if isinstance(reply, Exception):
                continue  # as it was: a failed probe changes nothing
            if PERMIT_TAKE.parse(reply).limited:
                if queue not in self._seen_limited:
                    log.info("queue %s has exact limits: claims take permits", queue)
                    self._seen_limited.add(queue)
                self.limited.add(queue)
            else:
                self._seen_limited.discard(queue)
                self.limited.discard(queue)

    async def take(self, queue: str, want: int) -> tuple[str, int, int | None]:
        """(token, permits granted, when one may free in ms from now or None)."""
        token = uuid.uuid4().hex
        hold = self._s.lease_ms + PERMIT_MARGIN_MS
        (reply,) = await self._s.io.run_each(
            [PERMIT_TAKE.call(self._keys[queue], want, hold, token, self._s.clock.now_ms())]
        )
        if isinstance(reply, Exception):
            raise reply
        taken = PERMIT_TAKE.parse(reply)
        if not taken.limited:
            self.limited.discard(queue)  # (no exact limit: nothing to bind)
            self._seen_limited.discard(queue)
            return "", taken.granted, None
        wait = None if taken.next_ms is None else max(taken.next_ms - taken.now_ms, 0)
        return token, taken.granted, wait

    async def bind(
        self,
        queue: str,
        token: str,
        granted: int,
        claimed: Sequence[tuple[PartitionKeys, ClaimedRun]],
    ) -> set[str]:
        """Bind a permit to each claimed run, drop the rest; the run ids whose bind was
        refused (their permit expired before the claim answered: they must not run)."""
        binds = [
            (f"{token}:{i + 1}", run_permit(keys.prefix, run.run_id, run.fence))
            for i, (keys, run) in enumerate(claimed)
        ]
        unused = [f"{token}:{i}" for i in range(len(claimed) + 1, granted + 1)]
        call = PERMIT_SETTLE.call(
            self._keys[queue], self._live_ms(), binds, unused, now=self._s.clock.now_ms()
        )
        (reply,) = await self._s.io.run_each([call])
        if isinstance(reply, Exception):
            # Not known bound: running them could exceed the limit. They stay leased here,
            # unstarted, until their leases expire and a claim with a permit takes them.
            log.warning("binding permits of queue %s failed (%s); %d runs wait for their "
                        "leases to expire", queue, reply, len(claimed))
            return {run.run_id for _, run in claimed}
        refused = PERMIT_SETTLE.parse(reply).refused
        return {member.split("|")[1] for member in refused}

    async def extend(self, entries: Iterable[InFlight]) -> None:
        """With a heartbeat round: the permits of the runs still held live on."""
        await self._settle(entries, extend=True)

    def give_back(self, entries: Iterable[InFlight]) -> None:
        """Once their commits are answered (or they are handed back): in the background."""
        task = asyncio.ensure_future(self._settle(entries, extend=False))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def give_back_now(self, entries: Iterable[InFlight]) -> None:
        """give_back, awaited (the worker is shutting down: no background task outlives it)."""
        await self._settle(entries, extend=False)

    async def _settle(self, entries: Iterable[InFlight], extend: bool) -> None:
        by_queue: dict[str, list[str]] = {}
        for e in entries:
            if e.keys.queue in self.limited:
                by_queue.setdefault(e.keys.queue, []).append(
                    run_permit(e.keys.prefix, e.run.run_id, e.run.fence)
                )
        if not by_queue:
            return
        calls = [
            PERMIT_SETTLE.call(
                self._keys[q], self._live_ms(), (), (), members if extend else (),
                () if extend else members, now=self._s.clock.now_ms(),
            )
            for q, members in by_queue.items()
        ]
        try:
            replies = await self._s.io.run_each(calls)
        except (JobQueueError, OSError) as exc:
            replies = [exc]
        for reply in replies:
            if isinstance(reply, Exception):
                log.warning("permits %s failed (%s); they expire by themselves",
                            "extend" if extend else "return", reply)

    def _live_ms(self) -> int:
        return self._s.lease_ms + PERMIT_MARGIN_MS
