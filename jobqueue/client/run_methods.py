"""The clients' public methods for runs: enqueueing them, looking them up, waiting for them
to finish, and steering them (cancel, requeue, purge). ``RunMethods`` is a base of
``JobQueue`` and ``AsyncRunMethods`` of ``AsyncJobQueue``; the steps are ``core``'s, and
waiting is ``waits``'."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Iterable
from typing import Any, ParamSpec, TypeVar, overload

from jobqueue.client.base import Request, not_found
from jobqueue.client.core import RunState
from jobqueue.client.drivers import AsyncDriver, SyncDriver
from jobqueue.client.registration import TaskRef
from jobqueue.client.relay import purge_dead_steps, relay_cascade_steps, relay_until_quiet
from jobqueue.client.waits import RETRY_FIRST_S, RETRY_MAX_S, AsyncWaits, SyncWaits, retriable
from jobqueue.errors import JobQueueError
from jobqueue.handles import (
    DEFAULT_POLL_S,
    AsyncRunHandle,
    RunHandle,
    timed_out,
)
from jobqueue.models import Run
from jobqueue.store.io import server_time_steps
from jobqueue.store.keys import PartitionKeys
from jobqueue.tasks import Task
from jobqueue.workflows.canvas import (
    group_graph,
)

P = ParamSpec("P")
R = TypeVar("R")
log = logging.getLogger("jobqueue.client")


class RunMethods(SyncDriver):
    """JobQueue's runs: enqueue, look up, wait, steer."""

    _connect_lock: threading.Lock  # JobQueue's: guards the wait hub too
    _waits: SyncWaits | None

    @overload
    def enqueue(
        self, task: Task[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> RunHandle[R]: ...

    @overload
    def enqueue(
        self, task: str, /, *args: Any, **kwargs: Any
    ) -> RunHandle[Any]: ...

    def enqueue(self, task: TaskRef, /, *args: Any, **kwargs: Any) -> RunHandle[Any]:
        """Create one run of ``task`` with these arguments; with a run id that already
        exists, nothing is written and the handle says ``created=False``. Run options (run
        id, delay, at, queue, priority, dedupe, limit_key) come with the task:
        ``jq.enqueue(task.with_options(...), ...)``."""
        found, opts = self._enqueue_options(task, kwargs)
        if opts.depends_on:  # a waiting run: a workflow of one step
            step = found.waiting_step(args, kwargs)
            flow = self._create_flow(group_graph([step]), None)
            return flow.runs[0]
        return self._handle(self.run_steps(self._enqueue(found, args, kwargs, opts)))

    def enqueue_many(self, requests: Iterable[Request]) -> list[RunHandle[Any]]:
        """Validate all, then create all in one pipelined round trip (one script call per
        partition and chunk)."""
        return [self._handle(c) for c in self.run_steps(self._enqueue_many(requests))]

    def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        """The partition holding a run: in ``queue`` if given, else in any known queue."""
        return self.run_steps(self._locate(run_id, queue))

    def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        return self.run_steps(self._find_run(run_id, queue))

    def get_run(self, run_id: str, queue: str | None = None) -> Run:
        return self.run_steps(self._get_run(run_id, queue))

    def wait_run(
        self,
        run_id: str,
        queue: str | None = None,
        timeout: float | None = None,
        poll: float = DEFAULT_POLL_S,
    ) -> Run:
        """Block until the run finishes (done, dead or cancelled) and return it, woken by its
        partition's event log (see ``jobqueue.client.waits``; ``poll``: the longest pause
        between two reads where the log is off); RunTimeout after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        keys = self.run_steps(self._wait_keys(run_id, queue))
        waits = self._wait_hub()
        try:
            watch = waits.watch(keys, run_id, poll, deadline)
        except TimeoutError:
            raise timed_out(run_id, "unfinished", timeout) from None
        state, pause, registered = "unfinished", RETRY_FIRST_S, True
        try:
            while True:
                watch.woken.clear()  # before the read: a wake-up during it is kept
                try:
                    if waits.closed or not registered:  # close() (it marks the hub, then
                        waits.unwatch(keys, watch)      # wakes every waiter): the client
                        registered = False              # goes on, with new listeners
                        waits = self._wait_hub()
                        watch = waits.watch(keys, run_id, poll, deadline)
                        registered = True
                    handed: Run | None = watch.run
                    watch.run = None
                    if handed is not None and handed.finished:  # (read by its listener)
                        return handed
                    run = self.run_steps(self._read(keys, run_id))
                except TimeoutError:  # (registering again, past the deadline)
                    raise timed_out(run_id, state, timeout) from None
                except Exception as exc:  # a failover, Redis restarting: read again
                    left = None if deadline is None else deadline - time.monotonic()
                    if not retriable(exc) or (left is not None and left <= pause):
                        raise
                    time.sleep(pause)
                    pause = min(pause * 2, RETRY_MAX_S)
                    continue
                pause = RETRY_FIRST_S
                if run is None:
                    raise not_found(run_id, queue)
                if run.finished:
                    return run
                state = run.state
                left = None if deadline is None else deadline - time.monotonic()
                if (left is not None and left <= 0) or not watch.woken.wait(left):
                    raise timed_out(run_id, state, timeout)
        finally:
            waits.unwatch(keys, watch)

    def _wait_hub(self) -> SyncWaits:
        waits = self._waits
        if waits is None or waits.pid != os.getpid() or waits.closed:  # none yet, forked (its
            with self._connect_lock:         # threads stayed in the parent), or closed
                waits = self._waits
                if waits is None or waits.pid != os.getpid() or waits.closed:
                    waits = self._waits = SyncWaits(self.run_steps)
        return waits

    def run_states(self, run_ids: Iterable[str], queue: str | None = None) -> list[RunState]:
        """Where each run lives and its state ('missing' if not found), in few round trips."""
        return self.run_steps(self._run_states(run_ids, queue))

    def cancel(self, run_id: str, queue: str | None = None, reason: str = "cancelled") -> str:
        """Cancel a pending, waiting or running run; returns the state it was in. A running
        worker is fenced out at its next heartbeat. Refused (OperationRefused) if already
        finished. A workflow hears of it at once: the runs waiting on it (by their policy),
        and, for a waiting run, its unfinished dependencies (cancelled too)."""
        state = self.run_steps(self._cancel(run_id, queue, reason))
        try:
            relay_until_quiet(self, self.run_steps(self._located(run_id, queue)))
        except JobQueueError as exc:  # the workers' relay carries it soon
            log.warning("cancelled %s; telling its workflow failed for now: %s", run_id, exc)
        return state

    def purge_dead(self, run_ids: Iterable[str], queue: str | None = None) -> int:
        """Delete dead runs for good (record, history, dead-index entry), one purge call per
        partition in one round trip. Runs no longer dead (requeued meanwhile) or not found are
        left alone. Returns how many were purged. An outcome the runs' workflows have not
        heard of yet is delivered first."""
        return self.run_steps(purge_dead_steps(self, run_ids, queue))

    def requeue(self, run_id: str, queue: str | None = None, *, force: bool = False) -> str:
        """Put a dead or cancelled run (a done one with ``force=True``: it runs again) back to
        pending with its attempts reset; returns the state it was in. The record shows the
        new life only; its history keeps how the earlier attempts ended."""
        return self.run_steps(self._requeue(run_id, queue, force))

    def requeue_located(self, runs: list[tuple[str, PartitionKeys]]) -> list[tuple[bool, str]]:
        """Requeue runs already located (``run_states``) in one round trip: for each,
        whether it changed and the state it was in."""
        return self.run_steps(self._requeue_located(runs))

    def server_time_ms(self) -> int:
        return self.run_steps(server_time_steps())


class AsyncRunMethods(AsyncDriver):
    """AsyncJobQueue's runs: enqueue, look up, wait, steer."""

    _waits: AsyncWaits | None  # made in the loop it is first used from

    @overload
    async def enqueue(
        self, task: Task[P, R], /, *args: P.args, **kwargs: P.kwargs
    ) -> AsyncRunHandle[R]: ...

    @overload
    async def enqueue(
        self, task: str, /, *args: Any, **kwargs: Any
    ) -> AsyncRunHandle[Any]: ...

    async def enqueue(self, task: TaskRef, /, *args: Any, **kwargs: Any) -> AsyncRunHandle[Any]:
        """Create one run of ``task`` with these arguments; with a run id that already
        exists, nothing is written and the handle says ``created=False``. Run options (run
        id, delay, at, queue, priority, dedupe, limit_key) come with the task:
        ``jq.enqueue(task.with_options(...), ...)``."""
        found, opts = self._enqueue_options(task, kwargs)
        if opts.depends_on:  # a waiting run: a workflow of one step
            flow = await self._create_flow(group_graph([found.waiting_step(args, kwargs)]), None)
            return flow.runs[0]
        queue, spec = self._plan_enqueue(found, args, kwargs, opts)
        if queue not in self._registered_queues:  # validated first: a refusal writes nothing
            await self._register_once(queue)
        steps = self._enqueue_planned(queue, spec, opts.dedupe)
        return self._handle(await self.run_steps(steps))

    async def enqueue_many(self, requests: Iterable[Request]) -> list[AsyncRunHandle[Any]]:
        return [self._handle(c) for c in await self.run_steps(self._enqueue_many(requests))]

    async def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        return await self.run_steps(self._locate(run_id, queue))

    async def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        return await self.run_steps(self._find_run(run_id, queue))

    async def get_run(self, run_id: str, queue: str | None = None) -> Run:
        return await self.run_steps(self._get_run(run_id, queue))

    async def wait_run(
        self,
        run_id: str,
        queue: str | None = None,
        timeout: float | None = None,
        poll: float = DEFAULT_POLL_S,
    ) -> Run:
        """See :meth:`JobQueue.wait_run`."""
        state = "unfinished"
        try:
            async with asyncio.timeout(timeout):
                keys = await self.run_steps(self._wait_keys(run_id, queue))
                waits = self._wait_hub()
                watch = await waits.watch(keys, run_id, poll)
                pause, registered = RETRY_FIRST_S, True
                try:
                    while True:
                        watch.woken.clear()
                        try:
                            if waits.closed or not registered:  # close(): the client goes
                                waits.unwatch(keys, watch)      # on, with new listeners
                                registered = False
                                waits = self._wait_hub()
                                watch = await waits.watch(keys, run_id, poll)
                                registered = True
                            handed: Run | None = watch.run
                            watch.run = None
                            if handed is not None and handed.finished:  # (read by its
                                return handed                           # listener)
                            run = await self.run_steps(self._read(keys, run_id))
                        except Exception as exc:  # a failover, Redis restarting: read again
                            if not retriable(exc):
                                raise
                            await asyncio.sleep(pause)
                            pause = min(pause * 2, RETRY_MAX_S)
                            continue
                        pause = RETRY_FIRST_S
                        if run is None:
                            raise not_found(run_id, queue)
                        if run.finished:
                            return run
                        state = run.state
                        await watch.woken.wait()
                finally:
                    waits.unwatch(keys, watch)
        except TimeoutError:
            raise timed_out(run_id, state, timeout) from None

    def _wait_hub(self) -> AsyncWaits:
        loop = asyncio.get_running_loop()
        waits = self._waits
        if waits is None or waits.loop is not loop or waits.closed:
            waits = self._waits = AsyncWaits(self.run_steps)
        return waits

    async def run_states(
        self, run_ids: Iterable[str], queue: str | None = None
    ) -> list[RunState]:
        return await self.run_steps(self._run_states(run_ids, queue))

    async def cancel(self, run_id: str, queue: str | None = None, reason: str = "cancelled") -> str:
        """See :meth:`JobQueue.cancel`."""
        state = await self.run_steps(self._cancel(run_id, queue, reason))
        try:
            keys = await self.run_steps(self._located(run_id, queue))
            await self.run_steps(relay_cascade_steps(self, keys))
        except JobQueueError as exc:  # the workers' relay carries it soon
            log.warning("cancelled %s; telling its workflow failed for now: %s", run_id, exc)
        return state

    async def purge_dead(self, run_ids: Iterable[str], queue: str | None = None) -> int:
        return await self.run_steps(purge_dead_steps(self, run_ids, queue))

    async def requeue(self, run_id: str, queue: str | None = None, *, force: bool = False) -> str:
        return await self.run_steps(self._requeue(run_id, queue, force))

    async def requeue_located(
        self, runs: list[tuple[str, PartitionKeys]]
    ) -> list[tuple[bool, str]]:
        return await self.run_steps(self._requeue_located(runs))

    async def server_time_ms(self) -> int:
        return await self.run_steps(server_time_steps())

