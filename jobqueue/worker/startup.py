"""What a worker runs on and starts with: the event loop (uvloop's when chosen or
installed), the thread that loop runs on, and Redis calls retried until Redis answers (a
daemon started before Redis, or during an outage)."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

import redis

from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError, ConnectionFailed, ServerRefused
from jobqueue.policy.backoff import Backoff
from jobqueue.runtime.clock import REAL_CLOCK, Clock
from jobqueue.store.keys import PartitionKeys
from jobqueue.worker.leases import Presence
from jobqueue.worker.shared import in_thread

log = logging.getLogger("jobqueue.worker")

# Calls retried until Redis answers (startup): the first pause, doubling up to the cap.
REDIS_RETRY_S = 0.1
REDIS_RETRY_CAP_S = 5.0

# What a passing outage raises: a lost connection, a cluster failing over (CLUSTERDOWN, or
# a slot with no known master yet).
_OUTAGES = (
    ConnectionFailed,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterError,
    redis.exceptions.RedisClusterException,
)


class GaveUp(Exception):
    """A call retried until Redis answers, abandoned because the worker is stopping."""


def until_redis_answers(
    fn: Callable[[], Any],
    *,
    clock: Clock = REAL_CLOCK,
    give_up: threading.Event | None = None,
) -> Any:
    """Call ``fn`` until Redis answers it (startup, reconnects): back-off with jitter between
    tries, never a crash on an outage. Raises GaveUp once ``give_up`` is set."""
    backoff = Backoff(REDIS_RETRY_S, REDIS_RETRY_CAP_S)
    never = threading.Event()
    while True:
        if give_up is not None and give_up.is_set():
            raise GaveUp
        try:
            return fn()
        except _OUTAGES as exc:
            if isinstance(exc, ServerRefused) and exc.replies is not None:
                raise  # some calls of a pipeline ran: the caller re-sends only the others
            pause = backoff.next()
            log.warning("Redis unavailable (%s); retrying in %.1fs", exc, pause)
            clock.wait(give_up or never, pause)


def _new_loop(choice: str) -> Callable[[], asyncio.AbstractEventLoop]:
    """The event loop factory: uvloop's when asked for or ("auto") installed."""
    if choice != "asyncio":
        try:
            import uvloop  # type: ignore[import-not-found]
        except ImportError:
            if choice == "uvloop":
                raise ConfigError("event_loop='uvloop' needs uvloop: pip install uvloop") from None
        else:
            return uvloop.new_event_loop  # type: ignore[no-any-return]
    return asyncio.new_event_loop


class LoopThread:
    """``main()`` on a new event loop, on a daemon thread named "jq-async". ``run`` blocks
    until it ends, waking every half second so that a signal or Ctrl-C reaches the caller;
    then ``result`` holds what it returned, or ``failure`` what killed the loop."""

    def __init__(
        self,
        main: Callable[[], Coroutine[Any, Any, int]],
        new_loop: Callable[[], asyncio.AbstractEventLoop],
    ) -> None:
        self.result: int | None = None
        self.failure: BaseException | None = None
        self._main, self._new_loop = main, new_loop
        self._thread = threading.Thread(target=self._target, name="jq-async", daemon=True)

    def _target(self) -> None:
        try:
            with asyncio.Runner(loop_factory=self._new_loop) as runner:
                self.result = runner.run(self._main())
        except BaseException as exc:
            self.failure = exc

    def run(self) -> None:
        self._thread.start()
        while self._thread.is_alive():
            self._thread.join(0.5)

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)


class _ServesPartitions(Protocol):
    def set_partitions(self, partitions: list[PartitionKeys]) -> None: ...


async def prepare(
    jq: JobQueue,
    queues: list[str],
    clock: Clock,
    stopping: threading.Event,
    parts: Iterable[_ServesPartitions],
    presence: Presence,
) -> None:
    """Before the first claim, each retried until Redis answers (or the worker stops: GaveUp):
    register the queues, tell ``parts`` the partitions served, note the server's time."""
    retry = functools.partial(until_redis_answers, clock=clock, give_up=stopping)
    for q in queues:
        await in_thread(retry, functools.partial(jq.register_queue, q))
    served = [k for q in queues for k in jq.all_partition_keys(q)]
    for part in parts:
        part.set_partitions(served)
    presence.started_ms = await in_thread(retry, jq.server_time_ms)
