"""How a worker stops: the grace period and the shutdown deadline it counts to, the drain
(runs finish, their commits land, the rest are handed back), calls bounded by the deadline,
and the watchdog that ends a daemon process whatever hangs."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from jobqueue.runtime.clock import Clock
from jobqueue.worker.leases import LeaseKeeper
from jobqueue.worker.runs import RunTable
from jobqueue.worker.shared import Shared

log = logging.getLogger("jobqueue.worker")

DRAIN_COMMIT_WAIT_S = 5.0
STOPPED_BY_SECOND_SIGNAL = 1


class Shutdown:
    """The timing of one worker's stop. ``stop_at`` is clock.monotonic() of the stop request
    (the first signal or stop()): the grace period counts from it, and the shutdown deadline
    is grace + margin after it."""

    def __init__(self, worker_id: str, grace_s: float, margin_s: float, clock: Clock) -> None:
        self.worker_id = worker_id
        self.grace_s = grace_s
        self.margin_s = margin_s
        self.clock = clock
        self.stop_at: float | None = None
        self.exited = threading.Event()  # the whole shutdown is over (the watchdog's end)

    def requested(self) -> None:
        """Note the stop request's time, once (later requests do not move it)."""
        if self.stop_at is None:
            self.stop_at = self.clock.monotonic()

    def deadline(self) -> float:
        start = self.stop_at if self.stop_at is not None else self.clock.monotonic()
        return start + self.grace_s + self.margin_s

    def left(self) -> float:
        return self.deadline() - self.clock.monotonic()

    def start_watchdog(self) -> None:
        threading.Thread(target=self._watchdog, name="jq-watchdog", daemon=True).start()

    def _watchdog(self) -> None:
        if self.clock.wait(self.exited, max(self.left(), 0.0) + 0.5):
            return
        log.error(
            "worker %s: shutdown still not done %.0fs after the grace period (Redis not "
            "answering?); exiting now, in-flight runs will be reclaimed",
            self.worker_id,
            self.margin_s,
        )
        logging.shutdown()
        os._exit(STOPPED_BY_SECOND_SIGNAL)

    async def bounded(self, fn: Callable[[], Any], what: str) -> None:
        """Run a sync shutdown call on a thread, waiting for it until the shutdown deadline
        at most (Redis may hang; the call then goes on in a thread that dies with the
        process)."""
        done = threading.Event()

        def call() -> None:
            try:
                fn()
            finally:
                done.set()

        threading.Thread(target=call, name=f"jq-{what}", daemon=True).start()
        deadline = max(self.left(), 0.1)
        waited = 0.0
        while not done.is_set() and waited < deadline:
            await asyncio.sleep(0.01)
            waited += 0.01
        if not done.is_set():
            log.warning("%s did not finish before the shutdown deadline; giving up", what)

    async def awaited(self, coro: Coroutine[Any, Any, Any], what: str) -> Any:
        """``coro``, given up at the shutdown deadline."""
        try:
            return await asyncio.wait_for(coro, max(self.left(), 0.1))
        except TimeoutError:
            log.warning("%s did not finish before the shutdown deadline; giving up", what)
            return None

    async def drain(self, table: RunTable, shared: Shared, keeper: LeaseKeeper) -> None:
        """Let in-flight runs finish within the grace period, let their commits land, then
        hand the rest back."""
        clock = self.clock
        self.requested()
        assert self.stop_at is not None
        # The grace period counts from the stop request (the claim loop may have taken a
        # while to notice it: a claim call waiting on a slow Redis).
        deadline = self.stop_at + self.grace_s
        shutdown_deadline = self.deadline()
        await table.wait_until(table.idle, deadline, clock.monotonic)
        # Finished runs' commits take a round trip; a Redis outage must not hold the
        # shutdown forever (their leases expire and other workers reclaim them).
        commit_deadline = min(
            max(deadline, clock.monotonic() + DRAIN_COMMIT_WAIT_S), shutdown_deadline - 2.0
        )
        await table.wait_until(table.committed, commit_deadline, clock.monotonic)
        leftover = table.release_unfinished()
        if not leftover:
            return
        for e in leftover:
            e.stop_code("worker shutting down")
        if clock.monotonic() >= shutdown_deadline - 1.0:
            log.warning(
                "no time left to release %d runs; their leases will expire", len(leftover)
            )
            return
        replies = await self.awaited(shared.io.run_each(keeper.release_calls(leftover)), "release")
        if replies is not None:
            keeper.report_released(leftover, replies)
            permits = shared.permits
            if permits is not None and permits.limited:
                await self.awaited(permits.give_back_now(leftover), "returning permits")
