"""The tasks a worker runs: only those registered, with code, in the app it was given (a name
read from Redis is never imported), and the retry back-off each one asks for."""

from __future__ import annotations

from typing import Any

from jobqueue.client.sync import JobQueue
from jobqueue.errors import UnknownTask
from jobqueue.policy.backoff import retry_delay_ms
from jobqueue.tasks import Task


class WorkerTasks:
    def __init__(self, jq: JobQueue) -> None:
        self._jq = jq

    @property
    def any_async(self) -> bool:
        """Whether an event loop is needed (``async def`` tasks)."""
        return any(t.is_async for t in self._jq.registry.all())

    def names(self) -> list[str]:
        """The tasks this worker has code for, sorted."""
        return sorted(t.name for t in self._jq.registry.all() if t.func is not None)

    def queues(self) -> list[str]:
        """The queues these tasks name, in the order they were registered."""
        out: list[str] = []
        for t in self._jq.registry.all():
            if t.func is not None and t.options.queue not in out:
                out.append(t.options.queue)
        return out

    def code_for(self, name: str) -> Task[Any, Any]:
        """The task to run for a claimed run; UnknownTask when this worker has no code for
        that name (the run is handed back for a worker that has)."""
        task = self._jq.registry.get(name) if name in self._jq.registry else None
        if task is None or task.func is None:
            mine = ", ".join(self.names()) or "none"
            if len(mine) > 200:
                mine = mine[:200] + ", ..."
            raise UnknownTask(f"no code for task {name!r} in this worker (its tasks: {mine})")
        return task

    def retry_delay_ms(self, name: str, attempt: int) -> int:
        """How long a failed attempt waits before the next: the task's back-off, else the
        settings' (a name this worker does not know takes the settings')."""
        registry, settings = self._jq.registry, self._jq.settings
        task = registry.get(name) if name in registry else None
        base = (task and task.options.backoff_base_ms) or settings.backoff_base_ms
        cap = (task and task.options.backoff_cap_ms) or settings.backoff_cap_ms
        return retry_delay_ms(attempt, base, cap)
