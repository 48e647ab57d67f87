"""The inline lane: short sync tasks run on the claim loop's own thread, one after the other.

A sync task handed to the pool costs thread hand-offs: the claim loop wakes a pool thread,
which wakes the committer, which wakes the claim loop, and every I/O wait of the task passes
the GIL between them. For a task of a few hundred microseconds (one Redis or database call)
that costs more than the task: measured with one INCR per task, the pool's worker spent about
190 us of CPU per run where one thread doing claim, task and commit in turn spent 33 us.

So a sync task that is not clearly long in the pool (see PROBE_MAX_S) runs inline, and stays
there while its runs take less than INLINE_MAX_S and barely wait (a task that waits longer
runs faster in the pool, whose threads overlap the waits): the claim loop runs the runs it
just claimed itself, then claims again. Bounds:

* once a go of inline work has lasted INLINE_BUDGET_S (checked between runs), what is left
  goes to the pool;
* a task whose usual inline run reaches either bound goes back to the pool (it tries the
  lane again after RETRY_AFTER_RUNS runs there, more each time it leaves);
* a run stuck for TAKE_OVER_S (the keeper's tick sees it): the runs waiting behind it go to
  the pool and a new thread takes over the claim loop (``take_over``), so stuck code holds
  one slot, as in the pool, and never the worker's claims.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

# Measured in the pool, a run's wall time and CPU are inflated by the other threads (GIL
# waits, caches): they only sort out the tasks that are clearly long. A task runs inline once
# INLINE_AFTER runs are measured there and its usual run takes less than PROBE_MAX_S; inline,
# where its times are its own, it stays while its runs take less than INLINE_MAX_S and wait
# (wall time less the thread's CPU time) less than STAY_MAX_WAIT_S: a task that waits longer
# runs faster in the pool, whose threads overlap the waits.
INLINE_AFTER = 16
PROBE_MAX_S = 0.005
INLINE_MAX_S = 0.001
STAY_MAX_WAIT_S = 0.0005
# A task that left the lane tries it again after this many runs in the pool, doubled each
# time it leaves (up to the cap).
RETRY_AFTER_RUNS = 64
RETRY_AFTER_RUNS_CAP = 4096
_MOST_LEFT = (RETRY_AFTER_RUNS_CAP // RETRY_AFTER_RUNS).bit_length() - 1  # doublings to the cap
# Inline, a task's usual run time and wait are followed like the pool's (at once downwards,
# by _UP_INLINE upwards): a few long runs in a row are often the GIL held by the committer
# meanwhile, or the thread preempted by another process, not the task.
_UP_INLINE = 0.03
# One go of inline work, at most; the rest of the claimed runs go to the pool.
INLINE_BUDGET_S = 0.01
# An inline run this long is stuck for the claim loop: another thread takes the loop over.
TAKE_OVER_S = 0.1
# How a task's usual run time follows what is measured: at once downwards, slowly upwards.
# In the pool a run's wall time includes its waits for the GIL, longer the more threads
# there are; a low quantile is the time of a run that found the GIL free.
_DOWN = 0.5
_UP = 0.02

log = logging.getLogger("jobqueue.worker")

Job = tuple[Any, Callable[..., Any], tuple[Any, ...]]  # (token, fn, args), as the pool takes


class TaskSpeeds:
    """Per task name: its usual run time in the pool (a low quantile), whether it may run
    inline, and how its latest inline runs went."""

    def __init__(self) -> None:
        # runs measured in the pool since it (last) left the lane, usual wall time (s)
        self._seen: dict[str, tuple[int, float]] = {}
        self._inline: dict[str, tuple[float, float]] = {}  # usual inline wall, wait (s)
        self._left: dict[str, int] = {}  # times it left the lane

    def inline(self, task: str) -> bool:
        seen = self._seen.get(task)
        if seen is None or seen[1] >= PROBE_MAX_S:
            return False
        left = self._left.get(task, 0)
        wanted = INLINE_AFTER if not left else min(RETRY_AFTER_RUNS << left, RETRY_AFTER_RUNS_CAP)
        return seen[0] >= wanted

    def record(self, task: str, wall_s: float) -> None:
        """A run measured in the pool."""
        # Unlocked: a lost update among racing threads only skips one sample.
        n, usual = self._seen.get(task, (0, wall_s))
        usual += (wall_s - usual) * (_DOWN if wall_s < usual else _UP)
        self._seen[task] = (min(n + 1, RETRY_AFTER_RUNS_CAP), usual)

    def ran_inline(self, task: str, wall_s: float, wait_s: float) -> None:
        """A run measured inline. When its usual inline run reaches INLINE_MAX_S, or its
        usual wait STAY_MAX_WAIT_S, the task goes back to the pool."""
        # From 0 when it enters: its first inline runs meet the pool's last ones, still
        # running on the pool's threads, and wait for the GIL.
        wall, wait = self._inline.get(task, (0.0, 0.0))
        wall += (wall_s - wall) * (_DOWN if wall_s < wall else _UP_INLINE)
        wait += (wait_s - wait) * (_DOWN if wait_s < wait else _UP_INLINE)
        if wall >= INLINE_MAX_S or wait >= STAY_MAX_WAIT_S:
            self.leave(task, wall_s)
        else:
            self._inline[task] = (wall, wait)

    def leave(self, task: str, wall_s: float) -> None:
        """Back to the pool, to try the lane again after RETRY_AFTER_RUNS runs there (more
        each time)."""
        self._seen[task] = (0, wall_s)
        self._inline.pop(task, None)
        self._left[task] = min(self._left.get(task, 0) + 1, _MOST_LEFT)


class _Go:
    """One thread's go of inline work: the run in progress, and the outcomes not handed on."""

    __slots__ = ("given_up", "outcomes", "started", "task")

    def __init__(self) -> None:
        self.task = ""
        self.started: float | None = None  # time.perf_counter() when the run began
        self.outcomes: list[tuple[Any, Any, BaseException | None]] = []
        self.given_up = False


class InlineLane:
    """Runs queued jobs on the thread that calls ``run`` (the claim loop's); ``done(token,
    value, error)`` gets each outcome, ``to_pool(token, fn, args)`` what the lane gives up,
    ``ran(n)`` the number of jobs each go ran (the pool's CPU per job counts them)."""

    def __init__(
        self,
        done: Callable[[Any, Any, BaseException | None], None],
        to_pool: Callable[[Any, Callable[..., Any], tuple[Any, ...]], None],
        speeds: TaskSpeeds,
        ran: Callable[[int], None] = lambda n: None,
    ) -> None:
        self._done = done
        self._to_pool = to_pool
        self._speeds = speeds
        self._ran = ran
        self._jobs: collections.deque[tuple[str, Job]] = collections.deque()
        # Each thread's go in progress. The lock keeps a go's run, outcomes and given_up
        # together: the keeper gives a thread up only while its run goes on, and takes the
        # outcomes it has not handed on yet.
        self._goes: dict[threading.Thread, _Go] = {}
        self._lock = threading.Lock()

    def add(self, task: str, job: Job) -> None:
        self._jobs.append((task, job))

    def run(self) -> bool:
        """Run the queued jobs in turn; past INLINE_BUDGET_S (checked between runs) the rest
        go to the pool. False when the keeper gave this thread up meanwhile (a run was
        stuck): the caller must leave the claim loop, which another thread now runs."""
        if not self._jobs:
            return True
        me = threading.current_thread()
        jobs, clock, speeds, lock = self._jobs, time.perf_counter, self._speeds, self._lock
        cpu = time.thread_time
        go = _Go()
        with lock:
            self._goes[me] = go
        start = clock()
        ran = 0
        try:
            while jobs:
                if clock() - start >= INLINE_BUDGET_S:
                    self.spill()
                    break
                try:
                    task, (token, fn, args) = jobs.popleft()
                except IndexError:  # the keeper spilled them meanwhile
                    break
                if not speeds.inline(task):  # it left the lane since it was claimed
                    self._to_pool(token, fn, args)
                    continue
                with lock:
                    go.task = task
                    began = go.started = clock()
                cpu0 = cpu()
                try:
                    value = fn(*args)
                except BaseException as exc:
                    error: BaseException | None = exc
                    value = None
                else:
                    error = None
                ran += 1
                took = clock() - began
                speeds.ran_inline(task, took, max(took - (cpu() - cpu0), 0.0))
                with lock:
                    go.started = None
                    go.outcomes.append((token, value, error))
                    if go.given_up:
                        break
        finally:
            with lock:
                del self._goes[me]
                outcomes, go.outcomes = go.outcomes, []
            self._ran(ran)
            self._hand_on(outcomes)
        return not go.given_up

    def spill(self) -> None:
        """Every queued job to the pool."""
        while True:
            try:
                _, job = self._jobs.popleft()
            except IndexError:
                return
            self._to_pool(*job)

    def stuck(self) -> bool:
        """From the keeper: True once per stuck run, when an inline run has gone on for
        TAKE_OVER_S. Then the outcomes its go holds are handed on, the jobs queued behind it
        go to the pool, its task runs there from now on, and its thread is given up (its
        run() returns False once the run ends)."""
        now = time.perf_counter()
        with self._lock:
            for go in self._goes.values():
                if go.given_up or go.started is None or now - go.started < TAKE_OVER_S:
                    continue
                go.given_up = True
                self._speeds.leave(go.task, now - go.started)
                outcomes, go.outcomes = go.outcomes, []
                break
            else:
                return False
        self._hand_on(outcomes)
        self.spill()
        return True

    def _hand_on(self, outcomes: list[tuple[Any, Any, BaseException | None]]) -> None:
        for token, value, error in outcomes:
            try:
                self._done(token, value, error)
            except Exception:  # one outcome failing must not strand the others
                log.exception("finishing a run failed")
