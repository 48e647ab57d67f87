"""The asyncio flavour of the client, for FastAPI-style apps: ``await jq.enqueue(...)``.

Every operation is ``jobqueue.client.core``'s, the same steps the sync client drives (request
planning and validation, script calls and reply parsing, foreign data); here they are driven
on a ``redis.asyncio`` connection. Each public method of ``JobQueue`` has a twin here with the
same parameters (``tests/test_client_parity.py`` holds them to it), from the async half of the
same concern's module (``queue_methods``, ``run_methods``, ``workflow_methods``,
``event_methods``, ``schedule_methods``); this module holds the connection and the task
decorator's typing.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Concatenate, ParamSpec, TypeVar, overload

from jobqueue.client.base import ClientBase
from jobqueue.client.event_methods import AsyncEventMethods
from jobqueue.client.queue_methods import AsyncQueueMethods
from jobqueue.client.registration import AioTaskDecorator
from jobqueue.client.run_methods import AsyncRunMethods
from jobqueue.client.schedule_methods import AsyncScheduleMethods
from jobqueue.client.waits import AsyncWaits
from jobqueue.client.workflow_methods import AsyncWorkflowMethods
from jobqueue.context import RunContext
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
from jobqueue.store.io import Steps, run_steps_async
from jobqueue.store.scripts import AsyncScriptRunner
from jobqueue.tasks import AioAsyncTask, AioTask

T = TypeVar("T")

P = ParamSpec("P")
R = TypeVar("R")


class AsyncJobQueue(
    AsyncQueueMethods,
    AsyncRunMethods,
    AsyncWorkflowMethods,
    AsyncEventMethods,
    AsyncScheduleMethods,
):
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
