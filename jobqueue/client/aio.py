"""The asyncio flavour of the client, for FastAPI-style apps: ``await jq.enqueue(...)``.

It shares everything but the I/O with the sync client: request planning and validation
(``ClientBase``), script calls and reply parsing (``ops``), NOSCRIPT recovery (``scripts``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

import redis

from jobqueue.anomalies import Anomaly, is_wrong_type
from jobqueue.client.base import (
    ClientBase,
    Planned,
    QueueTable,
    Request,
    TaskRef,
    cancel_refused,
    create_batches,
    created_flags,
    not_found,
    pick_located,
    queue_table,
    read_run,
)
from jobqueue.errors import ConnectionFailed, RunTimeout
from jobqueue.models import Run
from jobqueue.policy.timeutil import Delay, Instant
from jobqueue.settings import Settings
from jobqueue.store import ops
from jobqueue.store.connection import async_client, redact
from jobqueue.store.embedded import resolve_url
from jobqueue.store.keys import QUEUES_KEY, PartitionKeys
from jobqueue.store.scripts import AsyncScriptRunner


class AsyncRunHandle:
    def __init__(self, jq: AsyncJobQueue, run_id: str, queue: str, created: bool) -> None:
        self.jq, self.run_id, self.queue, self.created = jq, run_id, queue, created

    def __repr__(self) -> str:
        return f"AsyncRunHandle({self.run_id!r}, queue={self.queue!r}, created={self.created})"

    async def refresh(self) -> Run:
        return await self.jq.get_run(self.run_id, queue=self.queue)

    async def wait(self, timeout: float | None = None, poll: float = 0.2) -> Run:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            run = await self.refresh()
            if run.finished:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise RunTimeout(f"run {self.run_id} still {run.state} after {timeout} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, poll)


class AsyncJobQueue(ClientBase):
    """``AsyncJobQueue.from_url(url)`` or ``AsyncJobQueue(redis.asyncio client)``."""

    def __init__(
        self,
        client: Any,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(settings=settings, partitions=partitions)
        self.redis = client
        self.url = url
        self.scripts = AsyncScriptRunner(client)
        self._registered_queues: set[str] = set()

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
    ) -> AsyncJobQueue:
        """Like ``JobQueue.from_url``; the connection opens at first use."""
        resolved = resolve_url(url)
        return cls(async_client(resolved), settings=settings, partitions=partitions, url=resolved)

    async def close(self) -> None:
        await self.redis.aclose()

    def __repr__(self) -> str:
        return f"AsyncJobQueue({redact(self.url or repr(self.redis))})"

    async def register_queue(self, queue: str) -> int:
        if queue in self._registered_queues:
            return self.partitions_of(queue)
        try:
            pipe = self.redis.pipeline(transaction=False)
            pipe.hsetnx(QUEUES_KEY, queue, self.registration(queue))
            pipe.hget(QUEUES_KEY, queue)
            written, stored = await pipe.execute(raise_on_error=False)
            if isinstance(written, Exception) and not is_wrong_type(written):
                raise written  # refused by the server (OOM, READONLY): not the data's fault
        except redis.exceptions.RedisError as exc:
            raise ConnectionFailed(f"cannot register queue {queue!r}: {exc}") from None
        count = self.adopt_partition_count(queue, stored)
        self._registered_queues.add(queue)
        return count

    async def queues(self) -> dict[str, int]:
        """Every usable queue recorded in Redis (see :meth:`queue_table`)."""
        return (await self.queue_table()).counts

    async def queue_table(self) -> QueueTable:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        try:
            reply = await self.redis.hgetall(QUEUES_KEY)
        except redis.exceptions.ResponseError as exc:
            if not is_wrong_type(exc):
                raise
            reply = exc
        return queue_table(reply)

    async def enqueue(
        self,
        task: TaskRef,
        *args: Any,
        run_id: str | None = None,
        delay: Delay | None = None,
        at: Instant | None = None,
        queue: str | None = None,
        **kwargs: Any,
    ) -> AsyncRunHandle:
        req = Request(task, args, kwargs, run_id=run_id, delay=delay, at=at, queue=queue)
        return (await self.enqueue_many([req]))[0]

    async def enqueue_many(self, requests: Iterable[Request]) -> list[AsyncRunHandle]:
        prepared = [self.prepare(r) for r in requests]
        for queue in {q for q, _ in prepared}:
            await self.register_queue(queue)
        planned: list[Planned] = self.place(prepared)
        batches = create_batches(planned)
        replies = await self.scripts.run_many([call for call, _ in batches])
        created = created_flags(len(planned), batches, replies)
        return [
            AsyncRunHandle(self, p.spec.run_id, p.keys.queue, c)
            for p, c in zip(planned, created, strict=True)
        ]

    async def locate(self, run_id: str, queue: str | None = None) -> PartitionKeys | None:
        return (await self._search(run_id, queue))[0]

    async def _search(
        self, run_id: str, queue: str | None
    ) -> tuple[PartitionKeys | None, list[Anomaly]]:
        """The partition holding a run, and the queues that could not be searched."""
        table = await self.queue_table()
        keys = self.lookup_candidates(run_id, queue, table)
        skipped = [] if queue else table.anomalies
        if not keys:
            return None, skipped
        pipe = self.redis.pipeline(transaction=False)
        for k in keys:
            pipe.exists(k.run(run_id))
        found = await pipe.execute()
        return pick_located(run_id, [k for k, n in zip(keys, found, strict=True) if n]), skipped

    async def find_run(self, run_id: str, queue: str | None = None) -> Run | None:
        keys = await self.locate(run_id, queue)
        return None if keys is None else await self._read(keys, run_id)

    async def _read(self, keys: PartitionKeys, run_id: str) -> Run | None:
        pipe = self.redis.pipeline(transaction=False)
        pipe.hgetall(keys.run(run_id))
        pipe.lrange(keys.history(run_id), 0, -1)
        fields, history = await pipe.execute(raise_on_error=False)
        return read_run(keys, run_id, fields, history)

    async def get_run(self, run_id: str, queue: str | None = None) -> Run:
        keys, skipped = await self._search(run_id, queue)
        if keys is None:
            raise not_found(run_id, queue, skipped)
        run = await self._read(keys, run_id)
        if run is None:  # expired between the look-up and the read
            raise not_found(run_id, queue)
        return run

    async def cancel(self, run_id: str, queue: str | None = None, reason: str = "cancelled") -> str:
        keys, skipped = await self._search(run_id, queue)
        if keys is None:
            raise not_found(run_id, queue, skipped)
        call = ops.cancel_call(keys, run_id, self.settings.done_retention_ms, reason)
        changed, state = ops.parse_state_change(await self.scripts.run(call))
        if not changed:
            raise cancel_refused(run_id, state)
        return state
