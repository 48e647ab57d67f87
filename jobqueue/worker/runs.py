"""The runs a worker holds, from claim until their code has returned and their commit has been
answered: each run's phase (one explicit state, moved only along the transitions listed here),
and the table of them, with the slot and commit counts.

A slot is taken while a run's code runs (a pool thread, a task on the event loop) and frees
when the code returns, so claiming overlaps committing. Outcomes not committed yet are bounded
too (backpressure when Redis is slow). Every move happens on the worker's event loop, so the
table needs no lock; ``views`` may be read from any thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from jobqueue.context import RunContext
from jobqueue.hooks import RunEvent
from jobqueue.store.keys import PartitionKeys
from jobqueue.store.runs import ClaimedRun

# rejected_commits keeps the most recent refusals only (a long-lived worker's list would
# otherwise grow with every fenced-out commit).
MAX_REJECTED_KEPT = 1000


class RunPhase(enum.Enum):
    """Where a claimed run is. Its code runs in the first four phases (it holds a slot)."""

    RUNNING = "running"  # lease held: heartbeated; its timeout and lease deadline watched
    LEASE_LOST = "lease-lost"  # heartbeat refused, or lease ran out unrenewed: told to stop
    TIMED_OUT = "timed-out"  # ran over its timeout: its fail is queued; the code keeps its slot
    OVERRUN = "overrun"  # timed out and its fail answered; the code has still not returned
    RELEASED = "released"  # handed back at shutdown: whatever the code returns is discarded
    COMMITTING = "committing"  # returned: its outcome waits for the committer; still heartbeated
    COMMITTING_UNLEASED = "committing-unleased"  # the same without heartbeats (lease lost, or
    # the fail of its timeout on its way): the fence decides
    DONE = "done"  # returned and answered: out of the table

    @property
    def holds_slot(self) -> bool:
        return self in _CODE_RUNS


RUNNING = RunPhase.RUNNING
LEASE_LOST = RunPhase.LEASE_LOST
TIMED_OUT = RunPhase.TIMED_OUT
OVERRUN = RunPhase.OVERRUN
RELEASED = RunPhase.RELEASED
COMMITTING = RunPhase.COMMITTING
COMMITTING_UNLEASED = RunPhase.COMMITTING_UNLEASED
DONE = RunPhase.DONE

_CODE_RUNS = frozenset({RUNNING, LEASE_LOST, TIMED_OUT, OVERRUN, RELEASED})

# Every move a run may make; anything else is a bug and raises PhaseError.
TRANSITIONS: dict[RunPhase, tuple[RunPhase, ...]] = {
    RUNNING: (COMMITTING, LEASE_LOST, TIMED_OUT, RELEASED),
    LEASE_LOST: (COMMITTING_UNLEASED, TIMED_OUT, RELEASED),
    TIMED_OUT: (OVERRUN, COMMITTING_UNLEASED),  # the fail answered / the code returned
    OVERRUN: (DONE,),  # the code returned: its late outcome is dropped
    RELEASED: (DONE,),  # likewise
    COMMITTING: (DONE, COMMITTING_UNLEASED),
    COMMITTING_UNLEASED: (DONE,),
    DONE: (),
}

# What a heartbeat round renews.
HEARTBEATED = (RUNNING, COMMITTING)
# What a timeout may still stop, and what shutdown hands back: code running, no outcome yet.
UNFINISHED = (RUNNING, LEASE_LOST)


class PhaseError(RuntimeError):
    """A run asked to move where its phase does not lead (a bug in the worker)."""


@dataclass(slots=True)
class InFlight:
    """One claimed run. Its phase changes under the table's lock only."""

    run: ClaimedRun
    keys: PartitionKeys
    ctx: RunContext
    started: float  # clock.monotonic(), for the timeout only
    timeout_s: float | None
    lease_ms: int
    # clock.monotonic() at which Redis last granted the lease (the claim or heartbeat was
    # sent), and at which that lease runs out: past it without a renewal, another worker may
    # hold the run (self-fencing).
    granted: float = 0.0
    lease_deadline: float = 0.0
    phase: RunPhase = RUNNING
    task: asyncio.Task[Any] | None = None  # an async run's task, on the worker's loop
    lost_reported: bool = False  # on_cancelled / on_lease_lost told already (by the heartbeat)

    def stop_code(self, reason: str) -> None:
        """Tell the run's code to stop: ``ctx.cancelled`` for any run, and an async run's task
        is cancelled (a sync run's thread cannot be)."""
        self.ctx.cancel(reason)
        if self.task is not None:
            self.task.cancel()

    def move(self, to: RunPhase) -> None:
        if to not in TRANSITIONS[self.phase]:
            raise PhaseError(
                f"run {self.run.run_id} fence {self.run.fence}: {self.phase.value} -> {to.value}"
            )
        self.phase = to


def run_event(entry: InFlight, outcome: str, **fields: Any) -> RunEvent:
    """The middleware's view of an event of this run (see jobqueue.hooks.RunEvent)."""
    run, ctx = entry.run, entry.ctx
    return RunEvent(
        run.run_id, run.task, ctx.queue, run.fence, run.attempt, run.max_attempts, outcome,
        ctx.meta, **fields,
    )


@dataclass(slots=True)
class Finished:
    """What the committer must write for one run."""

    entry: InFlight
    ok: bool
    result_json: str = "null"
    error: str = ""
    retry: bool = True
    # the failed attempt's bounded traceback ('' for none), kept with its history entry
    traceback: str = ""
    # no code for the run's task here: handed back (bounce.lua), not failed
    bounce: bool = False
    # seconds from the start to the end of the run's code (or to its timeout)
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RunView:
    """A run as ``Worker.in_flight()`` shows it."""

    run_id: str
    fence: int
    attempt: int
    phase: RunPhase
    # The worker clock's monotonic() at which the lease last granted (claim or heartbeat)
    # runs out.
    lease_expires: float


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    fenced_out: int = 0
    released: int = 0
    timeouts: int = 0
    # runs of a task this worker has no code for, handed back (not counted as attempts)
    handed_back: int = 0
    # The most recent refused commits (run id, fence, status), at most MAX_REJECTED_KEPT;
    # fenced_out counts them all.
    rejected_commits: list[tuple[str, int, str]] = field(default_factory=list)

    def rejected(self, run_id: str, fence: int, status: str) -> None:
        self.rejected_commits.append((run_id, fence, status))
        if len(self.rejected_commits) > 2 * MAX_REJECTED_KEPT:  # amortised: trim in bulk
            del self.rejected_commits[:-MAX_REJECTED_KEPT]


class RunTable:
    """Every run the worker holds, keyed by (run id, fence): after a stall this worker may hold
    a stale attempt of a run and, having reclaimed it, the current one; both need heartbeats
    (the stale one to learn it was fenced out and stop) and both hold a slot.

    ``_changed`` is set whenever slots free up, commits are answered, and on stop: what the
    claim loop and the drain wait on."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._runs: dict[tuple[str, int], InFlight] = {}
        self._busy = 0
        self._pending = 0
        # Room for one batch being committed while the next one runs: claiming then overlaps
        # committing on the server too.
        self._max_pending = 2 * concurrency
        self._changed = asyncio.Event()

    # -- reading -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._runs)

    def views(self) -> list[RunView]:
        # list() of a dict's values is one step under the GIL: safe from another thread
        return [
            RunView(e.run.run_id, e.run.fence, e.run.attempt, e.phase, e.lease_deadline)
            for e in list(self._runs.values())
        ]

    def in_phase(self, phases: Iterable[RunPhase]) -> list[InFlight]:
        wanted = tuple(phases)
        return [e for e in self._runs.values() if e.phase in wanted]

    def renewal_due(self, since: float) -> float | None:
        """When the first lease granted at ``since`` or later needs renewing: a third of it
        after it was granted (so two heartbeats may be lost before it expires)."""
        return min(
            (
                e.granted + e.lease_ms / 3000
                for e in self._runs.values()
                if e.granted >= since and e.phase in HEARTBEATED
            ),
            default=None,
        )

    def shortest_lease_ms(self) -> int | None:
        return min((e.lease_ms for e in self._runs.values()), default=None)

    @property
    def busy(self) -> int:
        """Slots taken: runs whose code has not returned."""
        return self._busy

    def free_slots(self) -> int:
        """Slots free, or 0 while outcomes awaiting commit fill the room."""
        if self._pending >= self._max_pending:
            return 0
        return self.concurrency - self._busy

    def idle(self) -> bool:
        return self._busy == 0

    def committed(self) -> bool:
        return self._pending == 0

    # -- waiting (on the loop) -----------------------------------------------------------

    def wake(self) -> None:
        self._changed.set()

    async def wait_for_change(self, seconds: float | None = None) -> None:
        """Until the next change (or ``seconds`` of real time)."""
        self._changed.clear()
        if seconds is None:
            await self._changed.wait()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._changed.wait(), seconds)

    async def wait_for_room(
        self, stopping: Callable[[], bool], batch: int = 1, linger: float = 0.0
    ) -> int:
        """Until a slot is free (or stopping: 0); then, while fewer than ``batch`` are free
        and runs still run, up to ``linger`` seconds more, so that one claim fetches a batch
        instead of one round trip per finished run. The free slots."""
        while not stopping():
            free = self.free_slots()
            if free > 0:
                break
            await self.wait_for_change()
        else:
            return 0
        if linger > 0 and self._busy > 0 and self.free_slots() < batch:
            deadline = asyncio.get_running_loop().time() + linger
            while not stopping() and self._busy > 0 and self.free_slots() < batch:
                left = deadline - asyncio.get_running_loop().time()
                if left <= 0:
                    break
                await self.wait_for_change(left)
        return 0 if stopping() else self.free_slots()

    async def wait_until(
        self, done: Callable[[], bool], deadline: float, now: Callable[[], float]
    ) -> None:
        """Until ``done()`` or ``now()`` passes ``deadline`` (a fake clock's time is looked
        at every 0.1 s of real time at most)."""
        while not done() and now() < deadline:
            await self.wait_for_change(min(0.1, max(deadline - now(), 0.001)))

    # -- moves ---------------------------------------------------------------------------

    def add(self, entry: InFlight) -> None:
        self._runs[(entry.run.run_id, entry.run.fence)] = entry
        self._busy += 1

    def returned(self, entry: InFlight) -> bool:
        """The run's code has returned: its slot frees. True when its outcome is to be
        committed; False when it is discarded (timed out: the timeout's fail stands;
        handed back at shutdown)."""
        phase = entry.phase
        if not phase.holds_slot:
            raise PhaseError(f"run {entry.run.run_id} returned twice ({phase.value})")
        self._busy -= 1
        self._changed.set()
        if phase is RUNNING:
            entry.move(COMMITTING)
        elif phase is LEASE_LOST:
            entry.move(COMMITTING_UNLEASED)
        elif phase is TIMED_OUT:
            entry.move(COMMITTING_UNLEASED)  # its fail has not been answered yet
            return False
        else:  # OVERRUN, RELEASED
            entry.move(DONE)
            del self._runs[(entry.run.run_id, entry.run.fence)]
            return False
        self._pending += 1
        return True

    def timed_out(self, now: float) -> tuple[list[InFlight], int]:
        """Runs whose code has run over its timeout, now TIMED_OUT (their fails are counted
        as pending commits: the caller queues them); and how many slots timed-out code
        holds."""
        expired = [
            e
            for e in self._runs.values()
            if e.timeout_s is not None and e.phase in UNFINISHED and now - e.started > e.timeout_s
        ]
        for e in expired:
            e.move(TIMED_OUT)  # an outcome arriving from now on is dropped (returned())
        self._pending += len(expired)
        stuck = sum(1 for e in self._runs.values() if e.phase in (TIMED_OUT, OVERRUN))
        return expired, stuck

    def lease_ran_out(self, now: float) -> list[InFlight]:
        """RUNNING runs whose lease deadline has passed, now LEASE_LOST. Runs whose code has
        returned are left to their commit, which the fence judges."""
        passed = [e for e in self._runs.values() if e.phase is RUNNING and e.lease_deadline < now]
        for e in passed:
            e.move(LEASE_LOST)
        return passed

    def lost(self, entry: InFlight, reason: str) -> bool:
        """A heartbeat of the run was refused for ``reason``. True when that is news: the run
        now stops being heartbeated and its code must be told."""
        if entry.phase is RUNNING:
            entry.move(LEASE_LOST)
            return True
        if entry.phase is COMMITTING and reason not in ("finished", "not-running"):
            # ("finished", "not-running": our own commit landed between this heartbeat's
            # read of the table and its reply: nothing was lost.)
            entry.move(COMMITTING_UNLEASED)
            return True
        return False

    def answered(self, items: Iterable[Finished]) -> None:
        """Commits answered (accepted, refused or given up on). A timed-out run's entry stays
        until its code returns."""
        count = 0
        for item in items:
            count += 1
            entry = item.entry
            if entry.phase is TIMED_OUT:
                entry.move(OVERRUN)
                continue
            entry.move(DONE)
            del self._runs[(entry.run.run_id, entry.run.fence)]
        self._pending -= count
        self._changed.set()

    def release_unfinished(self) -> list[InFlight]:
        """Runs whose code still runs with no outcome yet, now RELEASED (to hand back). A run
        whose outcome waits for the committer is not handed back: its commit would then be
        refused."""
        leftover = [e for e in self._runs.values() if e.phase in UNFINISHED]
        for e in leftover:
            e.move(RELEASED)
        return leftover
