"""What every part of one worker reads (``Shared``), and the event-loop helpers they share:
a wait on the worker's clock that a stop ends early, and a call handed to a thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from jobqueue.client.sync import JobQueue
from jobqueue.hooks import Hooks
from jobqueue.runtime.clock import Clock, RealClock
from jobqueue.runtime.metrics import Metrics
from jobqueue.worker.config import WorkerConfig
from jobqueue.worker.redis_io import RedisIO
from jobqueue.worker.registry import WorkerTasks
from jobqueue.worker.runs import InFlight, RunTable, WorkerStats

T = TypeVar("T")

# A fake clock's time is looked at this often (real time) by a wait on it.
_FAKE_CLOCK_POLL_S = 0.005


class ExactPermits(Protocol):
    """What the keeper and the committer use of jobqueue.worker.permits.Permits (named
    here, not imported: it builds on Shared)."""

    limited: set[str]

    async def extend(self, entries: Iterable[InFlight]) -> None: ...

    def give_back(self, entries: Iterable[InFlight]) -> None: ...

    async def give_back_now(self, entries: Iterable[InFlight]) -> None: ...


@dataclass(eq=False)
class Shared:
    """One worker's state and settings, given to each of its parts (claims, execution,
    commits, leases) instead of a long list of arguments. ``jq`` is the app's sync client
    (rare calls, made on a thread: start-up, the registry, workflow relays); ``io`` is the
    asyncio side every claim, heartbeat and commit goes through."""

    jq: JobQueue
    io: RedisIO
    config: WorkerConfig
    worker_id: str
    queues: list[str]
    lease_ms: int
    tasks: WorkerTasks
    table: RunTable
    stats: WorkerStats
    metrics: Metrics
    clock: Clock
    hooks: Hooks | None
    # Set from any thread (stop(), a signal); the loop's own view is stop_event.
    stopping: threading.Event = field(default_factory=threading.Event)
    stop_event: asyncio.Event = field(default_factory=asyncio.Event)
    # Redis refuses commits for now (OOM, READONLY): nothing is claimed until one lands.
    commits_refused: bool = False
    # The permits of the queues' exact limits (set by the claimer; jobqueue.worker.permits).
    permits: ExactPermits | None = None

    async def sleep(self, seconds: float, until: asyncio.Event | None = None) -> None:
        """Wait ``seconds`` of the worker's clock, or until ``until`` is set (a stop does
        not end it)."""
        if isinstance(self.clock, RealClock):
            if until is None or seconds <= 0 or until.is_set():
                await asyncio.sleep(max(seconds, 0.0))
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(until.wait(), seconds)
            return
        deadline = self.clock.monotonic() + seconds
        await asyncio.sleep(0)  # (a wait already over still lets the loop run others)
        while self.clock.monotonic() < deadline and not (until and until.is_set()):
            await asyncio.sleep(_FAKE_CLOCK_POLL_S)

    async def pause(self, seconds: float) -> bool:
        """Wait ``seconds`` of the worker's clock, or until the worker stops (True)."""
        await asyncio.sleep(0)  # (a wait already over still lets the loop run others)
        if isinstance(self.clock, RealClock):
            if seconds > 0 and not self.stop_event.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stop_event.wait(), seconds)
            return self.stop_event.is_set()
        deadline = self.clock.monotonic() + seconds
        while not self.stop_event.is_set() and self.clock.monotonic() < deadline:
            await asyncio.sleep(_FAKE_CLOCK_POLL_S)
        return self.stop_event.is_set()


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on a daemon thread of its own: the sync client's rare calls must not
    block the loop, and one that hangs (Redis not answering) must not keep the process from
    exiting at the shutdown deadline (asyncio's default executor joins its threads)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[T] = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(value)

    def call() -> None:
        try:
            value, error = fn(*args), None
        except BaseException as exc:
            value, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits
            loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=call, name="jq-call", daemon=True).start()
    return await done
