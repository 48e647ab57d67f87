"""The clients' public methods for queues: recording a queue, pausing and resuming it, its
flow limits (concurrency, rates, per-key and per-task caps), and fair shares between its groups
(weights, sizes, pausing a group). ``QueueMethods`` is a base of ``JobQueue`` and
``AsyncQueueMethods`` of ``AsyncJobQueue``; the steps are ``queue_steps``' and ``groups``'."""

from __future__ import annotations

from jobqueue.anomalies import Listing
from jobqueue.client.base import QueueTable
from jobqueue.client.drivers import AsyncDriver, SyncDriver
from jobqueue.client.groups import read_fair, read_groups, set_groups
from jobqueue.models import QueueLimits
from jobqueue.store.groups import GroupInfo


class QueueMethods(SyncDriver):
    """JobQueue's queues, their limits and groups."""

    def register_queue(self, queue: str) -> int:
        """Record the queue and its partition count in Redis once; a process that disagrees
        with the recorded count is refused (runs would be looked for in the wrong slots)."""
        return self.run_steps(self._register_queue(queue))

    def queues(self) -> dict[str, int]:
        """Every usable queue recorded in Redis, with its partition count (entries that are
        not usable are left out: see :meth:`queue_table`)."""
        return self.run_steps(self._queues())

    def queue_table(self) -> QueueTable:
        """``jq:queues`` as read, with the entries no command can use as anomalies."""
        return self.run_steps(self._queue_table())

    def pause_queue(self, queue: str) -> bool:
        """Stop claims from ``queue`` on every partition: workers take none of its runs (not
        even those whose lease expires) until :meth:`resume_queue`; enqueues, heartbeats and
        commits go on. True when this call paused it, False when it already was paused."""
        return self.run_steps(self._pause(queue, True))

    def resume_queue(self, queue: str) -> bool:
        """Let workers claim from ``queue`` again; idle workers are woken at once. True when
        this call resumed it, False when it was not paused."""
        return self.run_steps(self._pause(queue, False))

    def set_queue_concurrency(
        self,
        queue: str,
        limit: int | None,
        *,
        per_key: bool = False,
        task: str | None = None,
        exact: bool = False,
    ) -> bool:
        """At most ``limit`` runs of ``queue`` running at once in each of its partitions
        (exact for a queue of one partition, the default), enforced by the claim script: a
        run takes a slot from its claim until the commit, the cancel or the lease's expiry.
        With ``per_key=True``: at most ``limit`` runs of each limit_key at once (up to
        10,000); with ``task="name"``: at most ``limit`` runs of that task at once (up to
        10,000); a run over the cap waits, parked, without holding up the rest of the queue.
        ``None`` removes the limit. True when this call changed it.

        With ``exact=True``: at most ``limit`` runs of the whole queue at once across all
        its partitions and masters, through permits leased from the limit's own slot
        (docs/concepts.md#exact-limits); it adds a permit round trip to each claim and
        commit of the queue, and workers see a new exact limit within 5 s."""
        return self.run_steps(self._set_concurrency(queue, limit, per_key, task, exact))

    def set_fair_shares(self, queue: str, on: bool = True) -> bool:
        """Turn fair shares on (or off) for ``queue``: claims then serve its groups (a run's
        group is its limit_key; runs without one form the group '') in weighted turns,
        priority first within a group (docs/concepts.md#groups-and-fair-shares). True when
        this call changed it."""
        return self.run_steps(set_groups(self, queue, fair=on))

    def set_group(
        self, queue: str, group: str, *, weight: int | None = None, max_size: int | None = None
    ) -> bool:
        """A group's ``weight`` (1 to 1,000, default 1: its share of claims against the
        other groups with due runs) and ``max_size`` (the most runs waiting in it: an enqueue
        past it raises GroupFull; 0 removes the limit); None leaves a setting as it is. True
        when this call changed one."""
        return self.run_steps(
            set_groups(self, queue, group=group, weight=weight, max_size=max_size)
        )

    def pause_group(self, queue: str, group: str) -> bool:
        """Stop claims of ``group``'s runs (enqueues go on; its runs wait in line). True
        when this call paused it."""
        return self.run_steps(set_groups(self, queue, group=group, paused=True))

    def resume_group(self, queue: str, group: str) -> bool:
        """Claims of ``group``'s runs go on. True when this call resumed it."""
        return self.run_steps(set_groups(self, queue, group=group, paused=False))

    def groups(self, queue: str) -> Listing[GroupInfo]:
        """The groups of ``queue`` (with settings, runs in line or runs served), summed over
        its partitions: weight, max_size, paused, waiting, running and served. Foreign data
        met is in the listing's ``anomalies`` and its rows'."""
        return self.run_steps(read_groups(self, queue))[1]

    def fair_shares(self, queue: str) -> bool:
        """Whether fair shares are on for ``queue``."""
        return self.run_steps(read_fair(self, queue))[0]

    def set_queue_rate(
        self,
        queue: str,
        limit: int | None,
        per: float = 1.0,
        *,
        per_key: bool = False,
        margin: float = 0.0,
        exact: bool = False,
    ) -> bool:
        """At most ``limit`` claims of ``queue`` (with ``per_key=True``: of each limit_key)
        in any ``per`` seconds, in each of its partitions (exact for a queue of one
        partition, the default), enforced by the claim script across all workers (the
        server's clock; an expired lease taken back counts as a claim of the queue's rate).
        A run over the limit stays pending. ``None`` removes the limit. True when this call
        changed it.

        What is counted is claims; a task's code starts a little after its claim (within a
        batch, behind the runs claimed with it). ``margin`` (seconds) widens the window to
        ``per + margin``: when no start lags its claim by more than the margin, at most
        ``limit`` starts fall in any ``per`` seconds too (docs/operations.md, "Rate
        limits").

        With ``exact=True``: at most ``limit`` claims of the whole queue in any ``per``
        seconds across all its partitions and masters, through permits (see
        set_queue_concurrency); not with ``per_key``."""
        return self.run_steps(self._set_rate(queue, limit, per, per_key, margin, exact))

    def queue_limits(self, queue: str) -> QueueLimits:
        """``queue``'s flow limits (concurrency, rate as (count, window in ms), and per key
        and per task), None where it has none."""
        return self.run_steps(self._queue_limits(queue))

    def queue_paused(self, queue: str) -> bool:
        """Whether ``queue`` is paused (any of its partitions)."""
        return self.run_steps(self._queue_paused(queue))


class AsyncQueueMethods(AsyncDriver):
    """AsyncJobQueue's queues, their limits and groups."""

    async def register_queue(self, queue: str) -> int:
        return await self.run_steps(self._register_queue(queue))

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

