"""What an enqueue returns: a handle on one run, to look at it, wait for it and get its result.

``RunHandle`` for the sync client, ``AsyncRunHandle`` (every method awaited) for the asyncio
one. ``R`` is what the task returns, so ``handle.result()`` is typed by the task's function.
"""

from __future__ import annotations

import time
from typing import Any, Generic, Protocol, TypeVar

from jobqueue.errors import RunCancelled, RunFailed, RunTimeout
from jobqueue.models import DependencyState, Run

R = TypeVar("R")

# Where a queue's event log is off, the longest pause between two reads of a run waited on
# (the first is 5 ms, doubling up to it).
DEFAULT_POLL_S = 0.2


class RunReader(Protocol):
    """The calls a handle needs of its client."""

    def get_run(self, run_id: str, queue: str | None = None) -> Run[Any]: ...

    def wait_run(
        self, run_id: str, queue: str | None = None, timeout: float | None = None,
        poll: float = DEFAULT_POLL_S,
    ) -> Run[Any]: ...

    def dependencies(self, run_id: str, queue: str | None = None) -> list[DependencyState]: ...


class AsyncRunReader(Protocol):
    async def get_run(self, run_id: str, queue: str | None = None) -> Run[Any]: ...

    async def wait_run(
        self, run_id: str, queue: str | None = None, timeout: float | None = None,
        poll: float = DEFAULT_POLL_S,
    ) -> Run[Any]: ...

    async def dependencies(
        self, run_id: str, queue: str | None = None
    ) -> list[DependencyState]: ...


def outcome_of(run: Run[R]) -> R:
    """A finished run's result; RunFailed for a dead one, RunCancelled for a cancelled one."""
    if run.state == "dead":
        raise RunFailed(run)
    if run.state == "cancelled":
        raise RunCancelled(run)
    return run.result


def timed_out(run_id: str, state: str, timeout: float | None) -> RunTimeout:
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
        after ``timeout`` seconds. Woken by the run's finishing event, not by polling (see
        docs/events.md); ``poll`` is the longest pause between two reads of the record
        where its queue's event log is off."""
        run: Run[R] = self.jq.wait_run(self.run_id, self.queue, timeout, poll)
        return run

    def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        """Wait for the run and return what its task returned. A dead run raises RunFailed
        (its last error and traceback), a cancelled one RunCancelled; RunTimeout after
        ``timeout`` seconds."""
        return outcome_of(self.wait(timeout, poll))

    # -- workflows (see docs/workflows.md) ------------------------------------------------

    def dependencies(self) -> list[DependencyState]:
        """The runs this one waits on (a workflow step's dependencies), in the order given,
        each with what this run heard of it: empty for a run that waits on none."""
        found: list[DependencyState] = self.jq.dependencies(self.run_id, queue=self.queue)
        return found

    def children(self) -> list[RunHandle[Any]]:
        """Handles on the runs this one waits on (a chord callback's header runs)."""
        return [RunHandle(self.jq, d.run_id, d.queue, False) for d in self.dependencies()]

    def children_results(self) -> list[Any]:
        """The results of the runs this one waits on, in order, as it heard of them (None for
        one unfinished or failed)."""
        return [d.result for d in self.dependencies()]

    def failed_children(self) -> list[DependencyState]:
        """The runs this one waits on that died or were cancelled, with their errors."""
        return [d for d in self.dependencies() if d.failed]


class FlowHandle(Generic[R]):
    """What ``jq.chain``, ``jq.group``, ``jq.chord`` and ``jq.workflow`` return: the
    workflow's id, a handle per step (``runs``, in order; ``flow["name"]`` by step name),
    whether this call created them, and ``last``: the step that ends it (a chain's last step,
    a chord's callback; for a group or a workflow the last step given). ``R``: what ``last``
    returns."""

    def __init__(self, flow_id: str, names: list[str], runs: list[RunHandle[Any]]) -> None:
        self.flow_id, self.runs = flow_id, runs
        self._by_name = dict(zip(names, runs, strict=True))

    def __repr__(self) -> str:
        return f"FlowHandle({self.flow_id!r}, {len(self.runs)} runs)"

    def __getitem__(self, name: str) -> RunHandle[Any]:
        return self._by_name[name]

    @property
    def created(self) -> bool:
        """True when this call created any of its runs (False: all existed already)."""
        return any(r.created for r in self.runs)

    @property
    def last(self) -> RunHandle[R]:
        last: RunHandle[R] = self.runs[-1]
        return last

    def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        """``last.result(...)``: the workflow's outcome."""
        return self.last.result(timeout, poll)

    def results(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> list[Any]:
        """Every step's result, in order (RunFailed or RunCancelled for the first that did not
        succeed), waiting at most ``timeout`` seconds in all."""
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for run in self.runs:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            out.append(run.result(left, poll))
        return out


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
        run: Run[R] = await self.jq.wait_run(self.run_id, self.queue, timeout, poll)
        return run

    async def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        """See :meth:`RunHandle.result`."""
        return outcome_of(await self.wait(timeout, poll))

    async def dependencies(self) -> list[DependencyState]:
        """See :meth:`RunHandle.dependencies`."""
        found: list[DependencyState] = await self.jq.dependencies(self.run_id, queue=self.queue)
        return found

    async def children(self) -> list[AsyncRunHandle[Any]]:
        """See :meth:`RunHandle.children`."""
        return [
            AsyncRunHandle(self.jq, d.run_id, d.queue, False) for d in await self.dependencies()
        ]

    async def children_results(self) -> list[Any]:
        """See :meth:`RunHandle.children_results`."""
        return [d.result for d in await self.dependencies()]

    async def failed_children(self) -> list[DependencyState]:
        """See :meth:`RunHandle.failed_children`."""
        return [d for d in await self.dependencies() if d.failed]


class AsyncFlowHandle(Generic[R]):
    """What the asyncio client's ``chain``, ``group``, ``chord`` and ``workflow`` return (see
    :class:`FlowHandle`; every wait awaited)."""

    def __init__(self, flow_id: str, names: list[str], runs: list[AsyncRunHandle[Any]]) -> None:
        self.flow_id, self.runs = flow_id, runs
        self._by_name = dict(zip(names, runs, strict=True))

    def __repr__(self) -> str:
        return f"AsyncFlowHandle({self.flow_id!r}, {len(self.runs)} runs)"

    def __getitem__(self, name: str) -> AsyncRunHandle[Any]:
        return self._by_name[name]

    @property
    def created(self) -> bool:
        return any(r.created for r in self.runs)

    @property
    def last(self) -> AsyncRunHandle[R]:
        last: AsyncRunHandle[R] = self.runs[-1]
        return last

    async def result(self, timeout: float | None = None, poll: float = DEFAULT_POLL_S) -> R:
        return await self.last.result(timeout, poll)

    async def results(
        self, timeout: float | None = None, poll: float = DEFAULT_POLL_S
    ) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        out = []
        for run in self.runs:
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            out.append(await run.result(left, poll))
        return out
