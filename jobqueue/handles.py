"""What an enqueue returns: a handle on one run, to look at it, wait for it and get its result.

``RunHandle`` for the sync client, ``AsyncRunHandle`` (every method awaited) for the asyncio
one. ``R`` is what the task returns, so ``handle.result()`` is typed by the task's function.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Generic, Protocol, TypeVar

from jobqueue.errors import RunCancelled, RunFailed, RunTimeout
from jobqueue.models import Run

R = TypeVar("R")

# The first pause between two reads of a run that is not finished, doubling up to ``poll``.
FIRST_POLL_S = 0.005
DEFAULT_POLL_S = 0.2


class RunReader(Protocol):
    """The one call a handle needs of its client."""

    def get_run(self, run_id: str, queue: str | None = None) -> Run[Any]: ...


class AsyncRunReader(Protocol):
    async def get_run(self, run_id: str, queue: str | None = None) -> Run[Any]: ...


def outcome_of(run: Run[R]) -> R:
    """A finished run's result; RunFailed for a dead one, RunCancelled for a cancelled one."""
    if run.state == "dead":
        raise RunFailed(run)
    if run.state == "cancelled":
        raise RunCancelled(run)
    return run.result


def _timed_out(run_id: str, state: str, timeout: float | None) -> RunTimeout:
    return RunTimeout(f"run {run_id} still {state} after {timeout} s")


class RunHandle(Generic[R]):
    """What enqueue returns: the run id, whether this call created the run, and ways to wait
    for it (``R``: what the task returns)."""

    def __init__(
        self, jq: RunReader, run_id: str, queue: str, created: bool, outcome: str = ""
    ) -> None:
        self.jq, self.run_id, self.queue, self.created = jq, run_id, queue, created
        # 'created', 'existed' (the run id was taken), or under a deduplication key
        # 'deduplicated' / 'replaced' (run_id is then the run holding the key)
        self.outcome = outcome or ("created" if created else "existed")

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, queue={self.queue!r}, outcome={self.outcome!r})"

    def refresh(self) -> Run[R]:
        """The run as it is now."""
        run: Run[R] = self.jq.get_run(self.run_id, queue=self.queue)
        return run

    @property
    def state(self) -> str:
        return self.refresh().state

    def wait(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> Run[R]:
        """Block until the run finishes (done, dead or cancelled) and return it; RunTimeout
        after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = FIRST_POLL_S
        while True:
            run = self.refresh()
            if run.finished:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(self.run_id, run.state, timeout)
            time.sleep(pause)
            pause = min(pause * 2, poll)

    def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        """Wait for the run and return what its task returned. A dead run raises RunFailed
        (its last error and traceback), a cancelled one RunCancelled; RunTimeout after
        ``timeout`` seconds."""
        return outcome_of(self.wait(timeout, poll))


class AsyncRunHandle(Generic[R]):
    """What ``await ajq.enqueue(...)`` returns (``R``: what the task returns)."""

    def __init__(
        self, jq: AsyncRunReader, run_id: str, queue: str, created: bool, outcome: str = ""
    ) -> None:
        self.jq, self.run_id, self.queue, self.created = jq, run_id, queue, created
        # as RunHandle.outcome
        self.outcome = outcome or ("created" if created else "existed")

    def __repr__(self) -> str:
        return (
            f"AsyncRunHandle({self.run_id!r}, queue={self.queue!r}, outcome={self.outcome!r})"
        )

    async def refresh(self) -> Run[R]:
        run: Run[R] = await self.jq.get_run(self.run_id, queue=self.queue)
        return run

    async def wait(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> Run[R]:
        """See :meth:`RunHandle.wait`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = FIRST_POLL_S
        while True:
            run = await self.refresh()
            if run.finished:
                return run
            if deadline is not None and time.monotonic() >= deadline:
                raise _timed_out(self.run_id, run.state, timeout)
            await asyncio.sleep(pause)
            pause = min(pause * 2, poll)

    async def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        """See :meth:`RunHandle.result`."""
        return outcome_of(await self.wait(timeout, poll))
