"""The inline lane: short sync tasks run on the claim loop's own thread, one after the other.

A sync task handed to the pool costs thread hand-offs: the claim loop wakes a pool thread,
which wakes the committer, which wakes the claim loop, and every I/O wait of the task passes
the GIL between them. For a task of a few hundred microseconds (one Redis or database call)
that costs more than the task: measured with one INCR per task, the pool's worker spent about
190 us of CPU per run where one thread doing claim, task and commit in turn spent 33 us.

So a sync task whose usual run (measured in the pool, INLINE_AFTER runs at least) takes less
than INLINE_MAX_S runs inline: the claim loop runs the runs it just claimed itself, then
claims again. Bounds:

* one go of inline work lasts INLINE_BUDGET_S at most; what is left goes to the pool;
* an inline run that takes INLINE_MAX_S or longer sends its task back to the pool (measured
  there again, it may come back);
* a run stuck for TAKE_OVER_S (the keeper's tick sees it): the runs waiting behind it go to
  the pool and a new thread takes over the claim loop (``take_over``), so stuck code holds
  one slot, as in the pool, and never the worker's claims.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

# A task runs inline once INLINE_AFTER runs are measured and its usual run takes less than
# INLINE_MAX_S.
INLINE_AFTER = 16
INLINE_MAX_S = 0.001
# One go of inline work, at most; the rest of the claimed runs go to the pool.
INLINE_BUDGET_S = 0.01
# An inline run this long is stuck for the claim loop: another thread takes the loop over.
TAKE_OVER_S = 0.1
# How a task's usual run time follows what is measured: at once downwards, slowly upwards.
# In the pool a run's wall time includes its waits for the GIL, longer the more threads
# there are; a low quantile is the time of a run that found the GIL free.
_DOWN = 0.5
_UP = 0.02

Job = tuple[Any, Callable[..., Any], tuple[Any, ...]]  # (token, fn, args), as the pool takes


class TaskSpeeds:
    """Per task name: how long its usual run takes (a low quantile of its wall times)."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, float]] = {}  # runs measured, usual time (s)

    def inline(self, task: str) -> bool:
        seen = self._seen.get(task)
        return seen is not None and seen[0] >= INLINE_AFTER and seen[1] < INLINE_MAX_S

    def record(self, task: str, wall_s: float) -> None:
        """A run measured in the pool."""
        # Unlocked: a lost update among racing threads only skips one sample.
        n, usual = self._seen.get(task, (0, wall_s))
        usual += (wall_s - usual) * (_DOWN if wall_s < usual else _UP)
        self._seen[task] = (min(n + 1, INLINE_AFTER), usual)

    def slow(self, task: str, wall_s: float) -> None:
        """A run that took INLINE_MAX_S or more inline (no GIL waits there: it is that long):
        the task goes back to the pool, to be measured again."""
        self._seen[task] = (0, wall_s)


class InlineLane:
    """Runs queued jobs on the thread that calls ``run`` (the claim loop's); ``done(token,
    value, error)`` gets each outcome, ``to_pool(token, fn, args)`` what the lane gives up."""

    def __init__(
        self,
        done: Callable[[Any, Any, BaseException | None], None],
        to_pool: Callable[[Any, Callable[..., Any], tuple[Any, ...]], None],
        speeds: TaskSpeeds,
    ) -> None:
        self._done = done
        self._to_pool = to_pool
        self._speeds = speeds
        self._jobs: collections.deque[tuple[str, Job]] = collections.deque()
        # The run in progress: when it started (time.perf_counter()), its task and thread.
        self._started: float | None = None
        self._task = ""
        self._thread: threading.Thread | None = None
        self._given_up: set[threading.Thread] = set()
        # Guards _started and _given_up together: the keeper gives a thread up only while
        # its run is still going on, never once it is back in the claim loop.
        self._lock = threading.Lock()

    def add(self, task: str, job: Job) -> None:
        self._jobs.append((task, job))

    def run(self) -> bool:
        """Run the queued jobs in turn, for INLINE_BUDGET_S at most (the rest go to the
        pool). False when the keeper gave this thread up meanwhile (a run was stuck): the
        caller must leave the claim loop, which another thread now runs."""
        me = threading.current_thread()
        jobs, clock, speeds, lock = self._jobs, time.perf_counter, self._speeds, self._lock
        outcomes: list[tuple[Any, Any, BaseException | None]] = []
        start = clock()
        try:
            while jobs:
                if clock() - start >= INLINE_BUDGET_S:
                    self.spill()
                    break
                try:
                    task, (token, fn, args) = jobs.popleft()
                except IndexError:  # the keeper spilled them meanwhile
                    break
                with lock:
                    self._task, self._thread = task, me
                    began = self._started = clock()
                try:
                    value = fn(*args)
                except BaseException as exc:
                    error: BaseException | None = exc
                    value = None
                else:
                    error = None
                with lock:
                    self._started = None
                    given_up = me in self._given_up
                took = clock() - began
                if took >= INLINE_MAX_S:
                    speeds.slow(task, took)
                outcomes.append((token, value, error))
                if given_up:
                    break
        finally:
            with lock:
                self._started = None
            for token, value, error in outcomes:
                self._done(token, value, error)
        with lock:
            if me in self._given_up:
                self._given_up.discard(me)
                return False
        return True

    def spill(self) -> None:
        """Every queued job to the pool."""
        while True:
            try:
                _, job = self._jobs.popleft()
            except IndexError:
                return
            self._to_pool(*job)

    def stuck(self) -> bool:
        """From the keeper: True once when an inline run has gone on for TAKE_OVER_S; the
        jobs behind it are then in the pool, its task runs there from now on, and its thread
        is given up (its run() returns False once the run ends)."""
        with self._lock:
            started, thread = self._started, self._thread
            if started is None or thread is None or thread in self._given_up:
                return False
            if time.perf_counter() - started < TAKE_OVER_S:
                return False
            self._speeds.slow(self._task, TAKE_OVER_S)
            self._given_up.add(thread)
        self.spill()
        return True
