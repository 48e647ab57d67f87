"""The app bench/worker.py and bench/vs_bullmq.py run their worker processes with.

* ``noop``: does nothing, so what is measured is the queue's own cost per run;
* ``incr`` / ``aincr``: one ``INCR`` on the task's own Redis connection (sync, and ``async def``
  on redis.asyncio), the I/O a real task does; the server is $BENCH_TASK_URL;
* ``cpu``: about a millisecond of pure-Python work, holding the GIL.

$BENCH_HOOKS picks the middleware (jobqueue.hooks) the worker runs with: ``none`` (the
default), ``empty`` (one Middleware overriding nothing: the chain's own cost) or ``otel``
(OpenTelemetryMiddleware on an SDK TracerProvider without exporter: spans made, not sent).
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
import redis.asyncio

from jobqueue import JobQueue

COUNTER = "bench:count"
jq = JobQueue()


def _use_hooks(kind: str) -> None:
    if kind == "empty":
        from jobqueue.hooks import Middleware

        jq.use(Middleware())
    elif kind == "otel":
        from opentelemetry.sdk.trace import TracerProvider

        from jobqueue.integrations.otel import OpenTelemetryMiddleware

        jq.use(OpenTelemetryMiddleware(TracerProvider()))
    elif kind != "none":
        raise SystemExit(f"BENCH_HOOKS={kind!r}: none, empty or otel")


_use_hooks(os.environ.get("BENCH_HOOKS", "none"))
_sync: redis.Redis | None = None
_async: Any = None  # redis.asyncio.Redis, made on the worker's event loop at first use


def _task_url() -> str:
    return os.environ.get("BENCH_TASK_URL") or os.environ.get("JOBQUEUE_REDIS_URL", "")


@jq.task
def noop(i: int = 0) -> None:
    """Does nothing: what is measured is the queue's own cost per run."""


@jq.task
def incr(i: int = 0) -> None:
    global _sync
    if _sync is None:
        _sync = redis.Redis.from_url(_task_url())  # thread-safe: a pool per client
    _sync.incr(COUNTER)


@jq.task
async def aincr(i: int = 0) -> None:
    global _async
    if _async is None:
        _async = redis.asyncio.Redis.from_url(_task_url())
    await _async.incr(COUNTER)


@jq.task
def cpu(i: int = 0) -> int:
    return sum(k * k for k in range(34_000))


@jq.task
def stamp(i: int = 0) -> float:
    """Returns when it started (the wall clock, seconds): vs_bullmq.py's idle-start latency."""
    return time.time()
