"""What the public methods of each client build on: ``SyncDriver`` (a base of ``JobQueue``)
and ``AsyncDriver`` (of ``AsyncJobQueue``) drive ``ClientCore``'s steps on their connection
and turn what they created into handles. The methods themselves are grouped by concern, each
module holding a concern's sync and async halves side by side: ``queue_methods``,
``run_methods``, ``workflow_methods``, ``event_methods``, ``schedule_methods``."""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, TypeVar, cast

from jobqueue.client.core import ClientCore, Created
from jobqueue.client.flows import create_flow
from jobqueue.handles import (
    AsyncFlowHandle,
    AsyncRunHandle,
    AsyncRunReader,
    FlowHandle,
    RunHandle,
    RunReader,
)
from jobqueue.store.io import Steps
from jobqueue.workflows.canvas import Graph

T = TypeVar("T")


class SyncDriver(ClientCore):
    """The sync client's steps driver and handles; ``JobQueue`` gives the connection."""

    @property
    def redis(self) -> Any:
        raise NotImplementedError  # JobQueue.redis: its connection, made at first use

    def run_steps(self, steps: Steps[T]) -> T:
        raise NotImplementedError  # JobQueue.run_steps: on its connection

    @property
    def _reader(self) -> RunReader:
        # What a handle reads its run with: JobQueue has it all (RunMethods, WorkflowMethods).
        return cast(RunReader, self)

    def _handle(self, created: Created) -> RunHandle[Any]:
        return RunHandle(
            self._reader, created.run_id, created.queue, created.created, created.outcome
        )

    def _create_flow(self, graph: Graph, flow_id: str | None) -> FlowHandle[Any]:
        made = self.run_steps(create_flow(self, graph, flow_id))
        runs: list[RunHandle[Any]] = [
            RunHandle(self._reader, rid, q, created) for rid, q, created in made.runs
        ]
        return FlowHandle(made.flow_id, [n.name for n in graph.nodes], runs)


class AsyncDriver(ClientCore):
    """The asyncio client's steps driver and handles; ``AsyncJobQueue`` gives the
    connection."""

    redis: Any  # AsyncJobQueue's redis.asyncio client
    # per event loop, one lock per queue (see _register_once); set by AsyncJobQueue
    _register_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, asyncio.Lock]]

    async def run_steps(self, steps: Steps[T]) -> T:
        raise NotImplementedError  # AsyncJobQueue.run_steps: on its connection

    @property
    def _reader(self) -> AsyncRunReader:
        # As SyncDriver._reader: AsyncJobQueue has it all.
        return cast(AsyncRunReader, self)

    def _handle(self, created: Created) -> AsyncRunHandle[Any]:
        return AsyncRunHandle(
            self._reader, created.run_id, created.queue, created.created, created.outcome
        )

    async def _create_flow(self, graph: Graph, flow_id: str | None) -> AsyncFlowHandle[Any]:
        made = await self.run_steps(create_flow(self, graph, flow_id))
        runs: list[AsyncRunHandle[Any]] = [
            AsyncRunHandle(self._reader, rid, q, created) for rid, q, created in made.runs
        ]
        return AsyncFlowHandle(made.flow_id, [n.name for n in graph.nodes], runs)

    async def _register_once(self, queue: str) -> None:
        """One registration in flight per queue and event loop: a burst of first enqueues
        (5,000 gathered at start-up) waits on it instead of sending 5,000 registrations
        that hold the pool's connections as long as the enqueues themselves."""
        locks = self._register_locks.setdefault(asyncio.get_running_loop(), {})
        lock = locks.get(queue) or locks.setdefault(queue, asyncio.Lock())
        async with lock:
            if queue not in self._registered_queues:
                await self.run_steps(self._register_queue(queue))
