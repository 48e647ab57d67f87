"""The clients' public methods for the event logs (docs/events.md): following and reading
events, and each queue's log settings. ``EventMethods`` is a base of ``JobQueue`` and
``AsyncEventMethods`` of ``AsyncJobQueue``; the streams and steps are ``events``'."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import redis.asyncio.cluster
import redis.cluster

from jobqueue.anomalies import Listing
from jobqueue.client.drivers import AsyncDriver, SyncDriver
from jobqueue.client.events import (
    AsyncEventStream,
    EventSettings,
    EventStream,
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
from jobqueue.store.events import Event
from jobqueue.store.io import Steps


class EventMethods(SyncDriver):
    """JobQueue's event logs."""

    @property
    def on_cluster(self) -> bool:
        return isinstance(self.redis, redis.cluster.RedisCluster)

    def events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        since: Since = None,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
        follow: bool = True,
        block: float = 1.0,
    ) -> EventStream:
        """The events of ``queue`` (a name, names, or None: every queue), every partition,
        in the order written: ``for ev in jq.events("default"): ...``. ``since``: None for
        what comes next; ``ev.cursor`` (or ``stream.cursor``) to go on right after an event;
        an entry id; a ``datetime``; a ``timedelta`` (that long ago); ``0`` for all the log
        holds. ``run_id``: that run's events only (its partition alone is read); ``kinds``:
        those events only. ``follow=False`` stops once it has read up to now. ``block``: the
        longest single wait for more, in seconds (a follower checks ``close()`` then)."""
        chosen = check_kinds(kinds)
        start = reader_steps(self, queue_list(queue), since, run_id, chosen, self.on_cluster)
        again: Callable[[], Steps[Reader]] | None = None
        if queue is None and run_id is None:  # every queue: those made later too
            again = lambda: reader_steps(self, None, "0", None, chosen, self.on_cluster)  # noqa: E731
        return EventStream(self.run_steps, start, follow, block, again)

    def recent_events(
        self,
        queue: str | Sequence[str] | None = None,
        *,
        limit: int = 20,
        run_id: str | None = None,
        kinds: Iterable[str] | None = None,
    ) -> Listing[Event]:
        """The newest ``limit`` events (of ``queue``, every queue when None; of one run; of
        some kinds), oldest first; each event's ``cursor`` follows on right after it."""
        steps = recent_of_steps(self, queue_list(queue), limit, run_id, check_kinds(kinds))
        found: Listing[Event] = self.run_steps(steps)
        return found

    def set_queue_events(
        self,
        queue: str,
        *,
        enabled: bool = True,
        maxlen: int | None = None,
        max_age: float | None = None,
    ) -> EventSettings:
        """The event log of every partition of ``queue``: on or off (``enabled=False``: the
        scripts write no event; waits read the records instead), trimmed to about ``maxlen``
        entries (100 to 10,000,000; default 10,000) and to the last ``max_age`` seconds
        (1 s to 30 days; default a day). Returns the settings now."""
        maxlen, age_ms = check_event_settings(maxlen, max_age)
        count = self.run_steps(self._register_queue(queue))
        partitions = [self.partition_keys(queue, p) for p in range(count)]
        self.run_steps(set_events_steps(partitions, enabled, maxlen, age_ms))
        return self.queue_events(queue)

    def queue_events(self, queue: str) -> EventSettings:
        """``queue``'s event log settings and how many entries each partition holds."""
        partitions = self.run_steps(partitions_steps(self, [queue]))
        settings: EventSettings = self.run_steps(event_settings_steps(queue, partitions))
        return settings


class AsyncEventMethods(AsyncDriver):
    """AsyncJobQueue's event logs."""

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
        count = await self.run_steps(self._register_queue(queue))
        partitions = [self.partition_keys(queue, p) for p in range(count)]
        await self.run_steps(set_events_steps(partitions, enabled, maxlen, age_ms))
        return await self.queue_events(queue)

    async def queue_events(self, queue: str) -> EventSettings:
        """See :meth:`JobQueue.queue_events`."""
        partitions = await self.run_steps(partitions_steps(self, [queue]))
        settings: EventSettings = await self.run_steps(event_settings_steps(queue, partitions))
        return settings

