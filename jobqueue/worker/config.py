"""The one source of a worker's defaults: ``WorkerConfig``. The ``Worker`` keyword arguments,
the ``jobqueue worker`` options and the supervisor all read it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

EventLoopChoice = Literal["auto", "asyncio", "uvloop"]

DEFAULT_CONCURRENCY = 8
# What in-flight runs get to finish on SIGTERM before they are handed back.
DEFAULT_GRACE_S = 30.0
# Stuck code (timed out, never returned) holding more than half the slots this long: the
# worker gives up so that a clean process replaces it.
DEFAULT_STUCK_LIMIT_S = 60.0
# The longest blocking wait for work; below the client's socket timeout, so that a wait never
# looks like a dead server.
MAX_IDLE_WAIT_S = 2.0
# The whole shutdown ends this long after the grace period at the latest, even when Redis
# hangs; a daemon process then exits regardless.
SHUTDOWN_MARGIN_S = 6.0


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How one worker runs.

    ``concurrency``: runs at once (sync tasks get that many threads at most; ``async def``
    tasks share the event loop). ``lease_s``: None takes the app's Settings.default_lease_s.
    ``burst``: run what is due, then stop. ``max_runs`` / ``max_memory_mb``: stop (and, under
    the supervisor, be replaced) after that many runs, or once the process's resident memory
    passes that many MiB. ``event_loop``: "auto" takes uvloop when it is installed."""

    concurrency: int = DEFAULT_CONCURRENCY
    lease_s: float | None = None
    grace_s: float = DEFAULT_GRACE_S
    stuck_limit_s: float = DEFAULT_STUCK_LIMIT_S
    idle_wait_s: float = MAX_IDLE_WAIT_S
    shutdown_margin_s: float = SHUTDOWN_MARGIN_S
    burst: bool = False
    max_runs: int | None = None
    max_memory_mb: float | None = None
    event_loop: EventLoopChoice = "auto"

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        if self.max_runs is not None and self.max_runs < 1:
            raise ValueError("max_runs must be at least 1")
        if self.max_memory_mb is not None and not self.max_memory_mb > 0:
            raise ValueError("max_memory_mb must be above 0")
        if self.event_loop not in ("auto", "asyncio", "uvloop"):
            raise ValueError("event_loop must be auto, asyncio or uvloop")

    def overridden(self, **given: Any) -> WorkerConfig:
        """This config with the given fields replaced, those given as None left as they are
        (the Worker's keyword arguments of the same names)."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})
