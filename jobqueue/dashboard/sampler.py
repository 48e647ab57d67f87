"""The dashboard's background sampler: every ``every_s`` seconds it looks whether the current
minute has its point of the queues' gauges in Redis yet, and if no dashboard took that minute,
reads ``queries.stats`` and writes it (``jobqueue.ops.gauges``).

It must not depend on the host's lifespan: an app mounted in another (Starlette's ``Mount``,
FastAPI's ``app.mount``, a Django ASGI router) never gets its lifespan run. So the app starts
it on its first request (``ensure_running``, from a middleware), and also at its lifespan's
startup when one runs; a lifespan shutdown stops it.

Why an asyncio task on the serving loop rather than a thread: the task ends with its loop, so
nothing outlives the server that served the app (a thread would go on writing after a test's
or a reloaded server's loop is gone); the blocking Redis calls run in the loop's thread pool.
A task whose loop stopped is replaced by one on the loop of the next request (a TestClient
runs a loop per request), and each task checks at every look that it is still its sampler's
current one: at most one samples per app, whatever the loops. The task holds its sampler
only by a weak reference between looks, so an app dropped by its host is not kept alive: its
task ends at its next look.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import weakref

from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from jobqueue.client.sync import JobQueue
from jobqueue.ops import gauges, queries
from jobqueue.runtime.clock import REAL_CLOCK, Clock

# Seconds between looks unless `jobqueue dashboard --sample-every` says otherwise. A look
# costs one TIME (and one SET NX per minute); only the dashboard that takes a minute reads
# the queues' stats.
DEFAULT_SAMPLE_EVERY_S = 10.0
# The name of the sampler's asyncio task (asyncio.all_tasks() shows it on the serving loop).
TASK_NAME = "jobqueue-dashboard-sampler"


class Sampler:
    def __init__(
        self, jq: JobQueue, every_s: float = DEFAULT_SAMPLE_EVERY_S, clock: Clock = REAL_CLOCK
    ) -> None:
        self.jq = jq
        self.every_s = every_s
        self.clock = clock  # whose now_ms() None means the server's time (tests: a fake one)
        self._lock = threading.Lock()  # loops in several threads may serve one app
        self._task: asyncio.Task[None] | None = None
        self._minute_seen: int | None = None  # the last minute this one tried to take

    @property
    def running(self) -> bool:
        task = self._task
        return task is not None and not task.done() and task.get_loop().is_running()

    def ensure_running(self) -> None:
        """Start the sampler on the running loop unless one runs already (on any loop)."""
        with self._lock:
            if self.running:
                return
            self._task = asyncio.get_running_loop().create_task(
                _loop(weakref.ref(self)), name=TASK_NAME
            )

    async def stop(self) -> None:
        """Stop it (a lifespan's shutdown); the next request starts it again."""
        with self._lock:
            task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # A task on another loop sees at its next look that it is no longer the current one.

    def is_current(self, task: asyncio.Task[None] | None) -> bool:
        return task is not None and task is self._task

    def sample(self) -> bool:
        """One look (blocking): take the current minute if no dashboard did, and write its
        point of every queue. True if this call wrote."""
        now = self.clock.now_ms()
        if now is None:
            now = self.jq.server_time_ms()
        minute = now // gauges.MINUTE_MS
        if minute == self._minute_seen:
            return False
        taken = gauges.claim_minute(self.jq, now)
        self._minute_seen = minute
        if not taken:
            return False
        gauges.record(self.jq, now, queries.queue_totals(queries.stats(self.jq)))
        return True


async def _loop(ref: weakref.ref[Sampler]) -> None:
    me = asyncio.current_task()
    while True:
        sampler = ref()
        if sampler is None or not sampler.is_current(me):
            return
        every = sampler.every_s
        del sampler  # only the weak reference is kept between looks
        await run_in_threadpool(_look, ref)
        await asyncio.sleep(every)


def _look(ref: weakref.ref[Sampler]) -> None:
    """One look, in a worker thread. The thread is given the weak reference, not the sampler:
    an idle worker keeps the last function it ran (and its exception) until its next job,
    which would keep a dropped app's sampler alive."""
    sampler = ref()
    if sampler is None:
        return
    try:
        sampler.sample()
    except Exception:  # Redis down, or refusing: the pages say so; the next look tries again
        return


class StartsSampler:
    """ASGI middleware: each request makes sure the app's sampler runs (the hook that does
    not need the host to run the app's lifespan)."""

    def __init__(self, app: ASGIApp, sampler: Sampler) -> None:
        self.app, self.sampler = app, sampler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            self.sampler.ensure_running()
        await self.app(scope, receive, send)
