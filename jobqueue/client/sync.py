"""The app-facing client: register tasks, enqueue runs (idempotent by run id), look runs up.
Every operation is ``jobqueue.client.core``'s, driven here on a sync connection. Its public
methods come by concern from its bases (``queue_methods``, ``run_methods``,
``workflow_methods``, ``event_methods``, ``schedule_methods``); this module holds the
connection."""

from __future__ import annotations

import threading
from typing import Any, TypeVar

from jobqueue.client.base import ClientBase
from jobqueue.client.event_methods import EventMethods
from jobqueue.client.queue_methods import QueueMethods
from jobqueue.client.run_methods import RunMethods
from jobqueue.client.schedule_methods import ScheduleMethods
from jobqueue.client.waits import SyncWaits
from jobqueue.client.workflow_methods import WorkflowMethods
from jobqueue.errors import ConfigError
from jobqueue.recurring.sync import Recurring
from jobqueue.settings import Settings
from jobqueue.store.connection import check, redact, sync_client
from jobqueue.store.embedded import configured_url, resolve_url
from jobqueue.store.io import Steps, run_steps
from jobqueue.store.scripts import ScriptRunner

T = TypeVar("T")


class JobQueue(
    QueueMethods, RunMethods, WorkflowMethods, EventMethods, ScheduleMethods
):
    """``JobQueue.from_url(url)`` or ``JobQueue(redis_client)``."""

    recurring: Recurring

    def __init__(
        self,
        client: Any = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        url: str | None = None,
        tasks: ClientBase | None = None,
    ) -> None:
        """With a client, use it; else connect lazily, at first use, to ``url`` (else
        $JOBQUEUE_REDIS_URL, else an embedded server). Lazy, so that an app module can create
        its JobQueue at import time and a worker or CLI can still point it elsewhere."""
        super().__init__(settings=settings, partitions=partitions, tasks=tasks)
        if url is not None:
            configured_url(url)  # an empty URL is refused now, not at first use
        self._client = client
        self._scripts = ScriptRunner(client) if client is not None else None
        self.url = url
        self._connect_lock = threading.Lock()
        self._waits: SyncWaits | None = None
        self.recurring = Recurring(self)  # the definitions store, on this connection

    @classmethod
    def from_url(
        cls,
        url: str | None = None,
        *,
        settings: Settings | None = None,
        partitions: dict[str, int] | None = None,
        tasks: ClientBase | None = None,
    ) -> JobQueue:
        """A JobQueue for ``url`` (redis://, rediss://, unix://, redis+cluster://); with no
        URL, $JOBQUEUE_REDIS_URL, else a private embedded server. Connects at first use.
        ``tasks``: a client whose registered tasks this one shares."""
        return cls(settings=settings, partitions=partitions, url=url, tasks=tasks)

    def use_url(self, url: str) -> None:
        """Point a not-yet-connected JobQueue elsewhere (the CLI's --redis-url)."""
        if self._client is not None:
            raise ConfigError("this JobQueue is already connected; set the URL before first use")
        self.url = configured_url(url)

    def connect(self) -> None:
        """Connect now and check the server answers (a clear error if not)."""
        with self._connect_lock:
            if self._client is not None:
                return
            resolved = resolve_url(self.url)
            client = sync_client(resolved)
            try:
                check(client, resolved)
            except BaseException:
                client.close()  # its pool's sockets; a caller may try again (the daemons do)
                raise
            self.url, self._client, self._scripts = resolved, client, ScriptRunner(client)

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def redis(self) -> Any:
        if self._client is None:
            self.connect()
        return self._client

    @property
    def scripts(self) -> ScriptRunner:
        if self._scripts is None:
            self.connect()
        assert self._scripts is not None
        return self._scripts

    def close(self) -> None:
        if self._waits is not None:
            self._waits.close()
        if self._client is not None:
            self._client.close()

    def __repr__(self) -> str:
        if self.url:
            return f"JobQueue({redact(self.url)})"
        # A client given directly (JobQueue(redis_client)), or one not yet connected.
        if self._client is not None:
            return f"JobQueue(a {type(self._client).__name__} client)"
        return "JobQueue(not connected)"

    def run_steps(self, steps: Steps[T]) -> T:
        """Drive I/O-free steps (``jobqueue.store.io``) on this client's connection."""
        return run_steps(steps, self.redis, self.scripts)
