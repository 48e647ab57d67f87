"""The asyncio flavour of the client, for FastAPI-style apps: ``await jq.enqueue(...)``.

Every operation is ``jobqueue.client.core``'s, the same steps the sync client drives (request
planning and validation, script calls and reply parsing, foreign data); here they are driven
on a ``redis.asyncio`` connection. Each public method of ``JobQueue`` has a twin here with the
same parameters (``tests/test_client_parity.py`` holds them to it).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

import redis.asyncio.cluster

from jobqueue.anomalies import Listing
from jobqueue.client.base import (
    ClientBase,
    QueueTable,
    Request,
    not_found,
)
from jobqueue.client.core import ClientCore, Created, RunState
from jobqueue.client.events import (
    AsyncEventStream,
    EventSettings,
    Reader,
    Since,
    check_event_settings,
    check_kinds,
    event_settings_steps,
    partitions_steps,
    queue_list,
    reader_steps,
    recent_of_steps,
    set_events_steps,
)
from jobqueue.client.flows import create_flow, dependencies_steps
from jobqueue.client.groups import read_fair, read_groups, set_groups
from jobqueue.client.registration import AioTaskDecorator, TaskRef
from jobqueue.client.relay import purge_dead_steps, relay_cascade_steps
from jobqueue.client.waits import RETRY_FIRST_S, RETRY_MAX_S, AsyncWaits, retriable
from jobqueue.context import RunContext
from jobqueue.errors import JobQueueError
from jobqueue.handles import DEFAULT_POLL_S, AsyncFlowHandle, AsyncRunHandle, timed_out
from jobqueue.models import DependencyState, QueueLimits, Run
from jobqueue.policy.timeutil import Instant
from jobqueue.recurring.definitions import DEFAULT_MISFIRE, DEFAULT_OVERLAP, DEFAULT_TZ
from jobqueue.recurring.info import ScheduleInfo
from jobqueue.recurring.steps import RecurringSteps
from jobqueue.settings import Settings
from jobqueue.store.connection import (
    async_client,
    exhausted,
    is_cluster_url,
    pool_bound,
    redact,
)
from jobqueue.store.embedded import resolve_url
from jobqueue.store.events import Event
from jobqueue.store.groups import GroupInfo
from jobqueue.store.io import Steps, run_steps_async, server_time_steps
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.scripts import AsyncScriptRunner
from jobqueue.tasks import AioAsyncTask, AioTask, Task
from jobqueue.workflows.canvas import (
    Graph,
    Signature,
    batch_graph,
    chain_graph,
    chord_graph,
    group_graph,
    workflow_graph,
)

T = TypeVar("T")
log = logging.getLogger("jobqueue.client")

P = ParamSpec("P")
R = TypeVar("R")


class AsyncJobQueue(ClientCore):
    """``AsyncJobQueue.from_url(url)`` or ``AsyncJobQueue(redis.asyncio client)``."""

    def __init__(
        self,
        client: Any,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        url: str | None = None,
        tasks: ClientBase | None = None,
    ) -> None:
        super().__init__(settings=settings, partitions=partitions, tasks=tasks)
        self.redis = client
        self.url = url
        self.scripts = AsyncScriptRunner(client)
        self.recurring = RecurringSteps(client=client)
        # redis-py's asyncio cluster nodes raise at once when their pool is full: calls wait
        # for a free connection here instead (a single server's pool blocks by itself).
        self._gated = url is not None and is_cluster_url(url)
        self._gate_size, self._gate_wait = (0, 0.0)
        if url is not None and self._gated:
            self._gate_size, self._gate_wait = pool_bound(url)
        # made in the event loop it is first used from (an asyncio primitive is bound to
        # one, as is the redis.asyncio client itself)
        self._gate: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None
        self._register_locks: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, asyncio.Lock]
        ] = weakref.WeakKeyDictionary()
        self._waits: AsyncWaits | None = None  # made in the loop it is first used from

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        tasks: ClientBase | None = None,
    ) -> AsyncJobQueue:
        """Like ``JobQueue.from_url``; the connection opens at first use. ``tasks=jq``: the
        app's JobQueue, whose registered tasks this client enqueues (by function or name)."""
        resolved = resolve_url(url)
        return cls(
            async_client(resolved),
            settings=settings,
            partitions=partitions,
            url=resolved,
            tasks=tasks,
        )

    # -- tasks: awaited to enqueue -----------------------------------------------------------

    task_classes = (AioTask, AioAsyncTask)

    @overload
    def task(
        self, func: Callable[Concatenate[RunContext, P], Coroutine[Any, Any, R]], /
    ) -> AioAsyncTask[P, R]: ...

    @overload
    def task(self, func: Callable[Concatenate[RunContext, P], R], /) -> AioTask[P, R]: ...

    @overload
    def task(self, func: Callable[P, Coroutine[Any, Any, R]], /) -> AioAsyncTask[P, R]: ...

    @overload
    def task(self, func: Callable[P, R], /) -> AioTask[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
        cron: str | None = None,
        every: float | None = None,
        tz: str | None = None,
        misfire: str | None = None,
        jitter: float | None = None,
        overlap: str | None = None,
        schedules: Sequence[dict[str, Any]] | None = None,
    ) -> AioTaskDecorator: ...

    def task(  # type: ignore[misc]  # as ClientBase.task
        self,
        func: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
        backoff: float | None = None,
        backoff_cap: float | None = None,
        cron: str | None = None,
        every: float | None = None,
        tz: str | None = None,
        misfire: str | None = None,
        jitter: float | None = None,
        overlap: str | None = None,
        schedules: Sequence[dict[str, Any]] | None = None,
    ) -> Any:
        """As :meth:`JobQueue.task`; ``await task.enqueue(...)`` enqueues with this client."""
        options: dict[str, Any] = {
            "name": name, "queue": queue, "max_attempts": max_attempts, "timeout": timeout,
            "lease": lease, "backoff": backoff, "backoff_cap": backoff_cap, "cron": cron,
            "every": every, "tz": tz, "misfire": misfire, "jitter": jitter,
            "overlap": overlap, "schedules": schedules,
        }
        decorate = super().task(**options)
        return decorate if func is None else decorate(func)

    def declare_task(
        self,
        name: str,
        *,
        queue: str | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        lease: float | None = None,
    ) -> AioTask[Any, Any]:
        """As :meth:`JobQueue.declare_task`."""
        task = super().declare_task(
            name, queue=queue, max_attempts=max_attempts, timeout=timeout, lease=lease
        )
        assert isinstance(task, AioTask)
        return task

    async def close(self) -> None:
        if self._waits is not None:
            self._waits.close()
        await self.redis.aclose()

    def __repr__(self) -> str:
        return f"AsyncJobQueue({redact(self.url or repr(self.redis))})"

    async def run_steps(self, steps: Steps[T]) -> T:
        """Drive I/O-free steps (``jobqueue.store.io``) on this client's connection."""
        if not self._gated:
            return await run_steps_async(steps, self.redis, self.scripts)
        loop = asyncio.get_running_loop()
        if self._gate is None or self._gate[0] is not loop:
            self._gate = (loop, asyncio.Semaphore(self._gate_size))
        gate = self._gate[1]
        try:
            if self._gate_wait <= 0:  # no wait: refused only when every connection is busy
                if gate.locked():
                    raise TimeoutError
                await gate.acquire()
            else:
                # (asyncio.timeout, not wait_for: a cancellation racing a release is never
                # swallowed, so a cancelled call is never sent)
                async with asyncio.timeout(self._gate_wait):
                    await gate.acquire()
        except TimeoutError:
            steps.close()
            raise exhausted(f"a call on a pool of {self._gate_size}") from None
        try:
            return await run_steps_async(steps, self.redis, self.scripts)
        finally:
            gate.release()

    def _handle(self, created: Created) -> AsyncRunHandle[Any]:
        return AsyncRunHandle(
            self, created.run_id, created.queue, created.created, created.outcome
        )

    # -- queues ----------------------------------------------------------------------------

    async def register_queue(self, queue: str) -> int:
        return await self.run_steps(self._register_queue(queue))

    async def _register_once(self, queue: str) -> None:
        """One registration in flight per queue and event loop: a burst of first enqueues
        (5,000 gathered at start-up) waits on it instead of sending 5,000 registrations
        that hold the pool's connections as long as the enqueues themselves."""
        locks = self._register_locks.setdefault(asyncio.get_running_loop(), {})
        lock = locks.get(queue) or locks.setdefault(queue, asyncio.Lock())
        async with lock:
            if queue not in self._registered_queues:
                await self.register_queue(queue)

    async def queues(self) -> dict[str, int]:
        """Every usable queue recorded in Redis (see :meth:`queue_table`)."""
        return await self.run_steps(self._queues())

    async def queue_table(self) -> QueueTable:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        return await self.run_steps(self._queue_table())

    async def pause_queue(self, queue: str) -> bool:
        """See :meth:`JobQueue.pause_queue`."""
        return await self.run_steps(self._pause(queue, True))

    async def resume_queue(self, queue: str) -> bool:
        """See :meth:`JobQueue.resume_queue`."""
        return await self.run_steps(self._pause(queue, False))

    async def set_queue_concurrency(
        self,
        queue: str,
        limit: int | None,
        *,
        per_key: bool = False,
        task: str | None = None,
        exact: bool = False,
    ) -> bool:
        """See :meth:`JobQueue.set_queue_concurrency`."""
        return await self.run_steps(self._set_concurrency(queue, limit, per_key, task, exact))

    # -- fair shares between groups ------------------------------------------------------

    async def set_fair_shares(self, queue: str, on: bool = True) -> bool:
        """See :meth:`JobQueue.set_fair_shares`."""
        return await self.run_steps(set_groups(self, queue, fair=on))

    async def set_group(
        self, queue: str, group: str, *, weight: int | None = None, max_size: int | None = None
    ) -> bool:
        """See :meth:`JobQueue.set_group`."""
        return await self.run_steps(
            set_groups(self, queue, group=group, weight=weight, max_size=max_size)
        )

    async def pause_group(self, queue: str, group: str) -> bool:
        """See :meth:`JobQueue.pause_group`."""
        return await self.run_steps(set_groups(self, queue, group=group, paused=True))

    async def resume_group(self, queue: str, group: str) -> bool:
        """See :meth:`JobQueue.resume_group`."""
        return await self.run_steps(set_groups(self, queue, group=group, paused=False))

    async def groups(self, queue: str) -> Listing[GroupInfo]:
        """See :meth:`JobQueue.groups`."""
        return (await self.run_steps(read_groups(self, queue)))[1]

    async def fair_shares(self, queue: str) -> bool:
        """See :meth:`JobQueue.fair_shares`."""
        return (await self.run_steps(read_fair(self, queue)))[0]

    async def set_queue_rate(
        self,
        queue: str,
        limit: int | None,
        per: float = 1.0,
        *,
        per_key: bool = False,
        margin: float = 0.0,
        exact: bool = False,
    ) -> bool:
        """See :meth:`JobQueue.set_queue_rate`."""
        return await self.run_steps(self._set_rate(queue, limit, per, per_key, margin, exact))

    async def queue_limits(self, queue: str) -> QueueLimits:
        """See :meth:`JobQueue.queue_limits`."""
        return await self.run_steps(self._queue_limits(queue))

    async def queue_paused(self, queue: str) -> bool:
        """See :meth:`JobQueue.queue_paused`."""
        return await self.run_steps(self._queue_paused(queue))

    # -- enqueue ---------------------------------------------------------------------------

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
        found, kwargs, opts = self.split_run_options(task, kwargs)
        if opts.depends_on:  # a waiting run: a workflow of one step
            flow = await self._create_flow(group_graph([found.waiting_step(args, kwargs)]), None)
            return flow.runs[0]
        options = getattr(found, "options", None)  # (None for a task named by a string)
        queue = opts.queue if opts.queue is not None else getattr(options, "queue", None)
        if isinstance(queue, str) and queue not in self._registered_queues:
            await self._register_once(queue)
        steps = self._enqueue(
            found, args, kwargs, opts.run_id, opts.delay, opts.at, opts.queue, opts.priority,
            opts.dedupe, opts.limit_key,
        )
        return self._handle(await self.run_steps(steps))

    async def enqueue_many(self, requests: Iterable[Request]) -> list[AsyncRunHandle[Any]]:
        return [self._handle(c) for c in await self.run_steps(self._enqueue_many(requests))]

    # -- look-ups --------------------------------------------------------------------------

    async def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        return await self.run_steps(self._locate(run_id, queue))

    async def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        return await self.run_steps(self._find_run(run_id, queue))

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

    async def get_run(self, run_id: str, queue: str | None = None) -> Run:
        return await self.run_steps(self._get_run(run_id, queue))

    # -- events (docs/events.md) -----------------------------------------------------------

    @property
    def on_cluster(self) -> bool:
        return isinstance(self.redis, redis.asyncio.cluster.RedisCluster)

    def events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        since: Since = None,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
        follow: bool = True,
        block: float = 1.0,
    ) -> AsyncEventStream:
        """``async for ev in ajq.events("default"): ...`` (see :meth:`JobQueue.events`)."""
        chosen = check_kinds(kinds)
        start = reader_steps(self, queue_list(queue), since, run_id, chosen, self.on_cluster)
        again: Callable[[], Steps[Reader]] | None = None
        if queue is None and run_id is None:  # every queue: those made later too
            again = lambda: reader_steps(self, None, "0", None, chosen, self.on_cluster)  # noqa: E731
        return AsyncEventStream(self.run_steps, start, follow, block, again)

    async def recent_events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        limit: int = 20,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Listing[Event]:
        """See :meth:`JobQueue.recent_events`."""
        steps = recent_of_steps(self, queue_list(queue), limit, run_id, check_kinds(kinds))
        found: Listing[Event] = await self.run_steps(steps)
        return found

    async def set_queue_events(
        self,
        queue: str,
        *,
        enabled: bool = True,
        maxlen: int | None = None,
        max_age: float | None = None,
    ) -> EventSettings:
        """See :meth:`JobQueue.set_queue_events`."""
        maxlen, age_ms = check_event_settings(maxlen, max_age)
        count = await self.register_queue(queue)
        partitions = [self.partition_keys(queue, p) for p in range(count)]
        await self.run_steps(set_events_steps(partitions, enabled, maxlen, age_ms))
        return await self.queue_events(queue)

    async def queue_events(self, queue: str) -> EventSettings:
        """See :meth:`JobQueue.queue_events`."""
        partitions = await self.run_steps(partitions_steps(self, [queue]))
        settings: EventSettings = await self.run_steps(event_settings_steps(queue, partitions))
        return settings

    # -- workflows (docs/workflows.md) -----------------------------------------------------

    @overload
    async def chain(
        self,
        s1: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self,
        s1: Signature[Any],
        s2: Signature[Any],
        s3: Signature[Any],
        s4: Signature[Any],
        s5: Signature[Any],
        s6: Signature[R],
        /,
        *,
        on_failure: str = ...,
        flow_id: str | None = ...,
    ) -> AsyncFlowHandle[R]: ...

    @overload
    async def chain(
        self, *steps: Signature[Any], on_failure: str = ..., flow_id: str | None = ...
    ) -> AsyncFlowHandle[Any]: ...

    async def chain(
        self, *steps: Signature[Any], on_failure: str = "fail", flow_id: str | None = None
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.chain`."""
        return await self._create_flow(chain_graph(steps, on_failure), flow_id)

    async def group(
        self, steps: Sequence[Signature[R]], *, flow_id: str | None = None
    ) -> AsyncFlowHandle[R]:
        """See :meth:`JobQueue.group`."""
        return await self._create_flow(group_graph(steps), flow_id)

    async def chord(
        self,
        header: Sequence[Signature[Any]],
        callback: Signature[R],
        *,
        on_failure: str = "fail",
        flow_id: str | None = None,
    ) -> AsyncFlowHandle[R]:
        """See :meth:`JobQueue.chord`."""
        return await self._create_flow(chord_graph(header, callback, on_failure), flow_id)

    async def workflow(
        self, steps: Mapping[str, Signature[Any]], *, flow_id: str | None = None
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.workflow`."""
        return await self._create_flow(workflow_graph(steps), flow_id)

    async def batch(
        self,
        children: Sequence[Signature[Any]],
        *,
        on_success: Signature[Any] | None = None,
        on_dead: Signature[Any] | None = None,
        on_complete: Signature[Any] | None = None,
        batch_id: str | None = None,
    ) -> AsyncFlowHandle[Any]:
        """See :meth:`JobQueue.batch`."""
        callbacks = {"on_success": on_success, "on_dead": on_dead, "on_complete": on_complete}
        return await self._create_flow(batch_graph(children, callbacks), batch_id)

    async def _create_flow(self, graph: Graph, flow_id: str | None) -> AsyncFlowHandle[Any]:
        made = await self.run_steps(create_flow(self, graph, flow_id))
        runs: list[AsyncRunHandle[Any]] = [
            AsyncRunHandle(self, rid, q, created) for rid, q, created in made.runs
        ]
        return AsyncFlowHandle(made.flow_id, [n.name for n in graph.nodes], runs)

    async def dependencies(
        self, run_id: str, queue: str | None = None
    ) -> list[DependencyState]:
        """See :meth:`JobQueue.dependencies`."""
        return await self.run_steps(dependencies_steps(self, run_id, queue))

    async def relay(self, queue: str) -> int:
        """See :meth:`JobQueue.relay`."""
        await self.register_queue(queue)
        total = 0
        for keys in self.all_partition_keys(queue):
            total += await self.run_steps(relay_cascade_steps(self, keys))
        return total

    async def run_states(
        self, run_ids: Iterable[str], queue: str | None = None
    ) -> list[RunState]:
        return await self.run_steps(self._run_states(run_ids, queue))

    # -- steering --------------------------------------------------------------------------

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

    # -- recurring jobs --------------------------------------------------------------------

    async def schedule(
        self,
        job_id: str,
        task: TaskRef,
        *,
        cron: str | None = None,
        every: float | None = None,
        tz: str = DEFAULT_TZ,
        args: Iterable[Any] = (),
        kwargs: dict[str, Any] | None = None,
        misfire: str = DEFAULT_MISFIRE,
        jitter: float | None = None,
        overlap: str = DEFAULT_OVERLAP,
        queue: str | None = None,
        start_at: Instant | None = None,
        end_at: Instant | None = None,
        max_attempts: int | None = None,
        now: int | None = None,
    ) -> ScheduleInfo:
        return await self.run_steps(
            self._schedule(
                job_id,
                task,
                cron=cron,
                every=every,
                tz=tz,
                args=args,
                kwargs=kwargs,
                misfire=misfire,
                jitter=jitter,
                overlap=overlap,
                queue=queue,
                start_at=start_at,
                end_at=end_at,
                max_attempts=max_attempts,
                now=now,
            )
        )

    async def unschedule(self, job_id: str) -> bool:
        return await self.run_steps(self.recurring.unschedule_steps(job_id))

    async def pause_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return await self.run_steps(self.recurring.pause_steps(job_id, now))

    async def resume_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return await self.run_steps(self.recurring.resume_steps(job_id, now))

    async def trigger(self, job_id: str, now: int | None = None) -> AsyncRunHandle[Any]:
        return self._handle(await self.run_steps(self._trigger(job_id, now)))

    async def backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None = None
    ) -> list[AsyncRunHandle[Any]]:
        created = await self.run_steps(self._backfill(job_id, start, end, now))
        return [self._handle(c) for c in created]

    async def get_schedule(self, job_id: str) -> ScheduleInfo | None:
        return await self.run_steps(self.recurring.get_steps(job_id))

    async def list_schedules(self, limit: int | None = None) -> Listing[ScheduleInfo]:
        return await self.run_steps(self._list_schedules(limit))
