"""The clients' public methods for recurring jobs: creating, pausing, triggering and
backfilling them, and reading their definitions. The definitions store is
``jobqueue.recurring.steps``; the daemon is ``jobqueue.recurring.daemon.Scheduler``. ``now``
(ms) is for tests; the server clock otherwise. ``ScheduleMethods`` is a base of ``JobQueue``
and ``AsyncScheduleMethods`` of ``AsyncJobQueue``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from jobqueue.anomalies import Listing
from jobqueue.client.drivers import AsyncDriver, SyncDriver
from jobqueue.client.registration import TaskRef
from jobqueue.handles import (
    AsyncRunHandle,
    RunHandle,
)
from jobqueue.policy.timeutil import Instant
from jobqueue.recurring.definitions import DEFAULT_MISFIRE, DEFAULT_OVERLAP, DEFAULT_TZ
from jobqueue.recurring.info import ScheduleInfo


class ScheduleMethods(SyncDriver):
    """JobQueue's recurring jobs."""

    def schedule(
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
        """Create or update a recurring job (upsert). Everything is validated first: a bad
        cron, time zone, jitter (>= the period) or policy raises and writes nothing."""
        return self.run_steps(
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

    def unschedule(self, job_id: str) -> bool:
        return self.run_steps(self.recurring.unschedule_steps(job_id))

    def pause_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run_steps(self.recurring.pause_steps(job_id, now))

    def resume_schedule(self, job_id: str, now: int | None = None) -> ScheduleInfo:
        return self.run_steps(self.recurring.resume_steps(job_id, now))

    def trigger(self, job_id: str, now: int | None = None) -> RunHandle[Any]:
        return self._handle(self.run_steps(self._trigger(job_id, now)))

    def backfill(
        self, job_id: str, start: Instant, end: Instant, now: int | None = None
    ) -> list[RunHandle[Any]]:
        return [self._handle(c) for c in self.run_steps(self._backfill(job_id, start, end, now))]

    def get_schedule(self, job_id: str) -> ScheduleInfo | None:
        return self.run_steps(self.recurring.get_steps(job_id))

    def list_schedules(self, limit: int | None = None) -> Listing[ScheduleInfo]:
        """Every recurring job (at most ``limit``), sorted, read page by page; a definition
        that cannot be used is left out, logged and kept in the listing's ``anomalies``."""
        return self.run_steps(self._list_schedules(limit))


class AsyncScheduleMethods(AsyncDriver):
    """AsyncJobQueue's recurring jobs."""

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

