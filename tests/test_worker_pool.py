"""The sync task pool: as many threads as keep its jobs moving, never more than its size."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from jobqueue.worker.executing import MIN_THREADS, DaemonPool

WAIT_S = 30.0  # a bound for what must happen, never reached when it does


class Recorder:
    """The pool's done callback: counts finished jobs and their errors."""

    def __init__(self) -> None:
        self.finished = 0
        self.errors: list[BaseException] = []
        self.cond = threading.Condition()

    def __call__(self, token: Any, value: Any, error: BaseException | None) -> None:
        with self.cond:
            self.finished += 1
            if error is not None:
                self.errors.append(error)
            self.cond.notify_all()

    def wait_for(self, n: int) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: self.finished >= n, WAIT_S)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def make_pool(recorder: Recorder) -> Iterator[Callable[[int], DaemonPool]]:
    pools: list[DaemonPool] = []

    def make(size: int) -> DaemonPool:
        pools.append(DaemonPool(size, "test-pool", recorder))
        return pools[-1]

    yield make
    for pool in pools:
        pool.shutdown()


def _rounds(pool: DaemonPool, recorder: Recorder, job: Callable[[], Any], n: int) -> None:
    """n rounds of 30 jobs, the keeper's tick after each (it samples the CPU per job)."""
    for _ in range(n):
        target = recorder.finished + 30
        for i in range(30):
            pool.submit(i, job, ())
        recorder.wait_for(target)
        pool.tick()


def _compute() -> int:
    return sum(k * k for k in range(20_000))


def test_tasks_that_compute_run_on_the_fewest_threads(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    pool = make_pool(50)
    names: set[str] = set()

    def job() -> None:
        names.add(threading.current_thread().name)
        _compute()

    _rounds(pool, recorder, job, 10)
    assert (pool.threads, len(names), recorder.errors) == (MIN_THREADS, MIN_THREADS, [])


def test_tasks_that_mostly_wait_grow_the_pool_until_every_job_has_a_thread(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    pool = make_pool(20)
    _rounds(pool, recorder, lambda: time.sleep(0.002), 3)
    # 20 jobs that each wait for all 20 to be running at once
    barrier = threading.Barrier(20, timeout=WAIT_S)
    done = recorder.finished
    for i in range(20):
        pool.submit(i, barrier.wait, ())
    # The worker's keeper ticks every 50 ms: what the pool measured (the 2 ms waits) or, on a
    # machine too loaded to measure them, its rule for jobs that wait while nothing is taken.
    deadline = time.monotonic() + WAIT_S
    while recorder.finished < done + 20 and time.monotonic() < deadline:
        pool.tick()
        time.sleep(0.05)
    recorder.wait_for(done + 20)
    assert recorder.errors == []  # no barrier broken: the 20 ran at once


def test_the_pool_never_runs_more_jobs_at_once_than_its_size(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    pool = make_pool(6)
    _rounds(pool, recorder, lambda: time.sleep(0.002), 3)
    release = threading.Event()
    lock = threading.Lock()
    running = [0, 0]  # now, most ever

    def job() -> None:
        with lock:
            running[0] += 1
            running[1] = max(running)
        release.wait(WAIT_S)
        with lock:
            running[0] -= 1

    done = recorder.finished
    for i in range(20):
        pool.submit(i, job, ())
    deadline = time.monotonic() + WAIT_S
    while running[0] < 6 and time.monotonic() < deadline:
        pool.tick()
        time.sleep(0.01)
    pool.tick()
    release.set()
    recorder.wait_for(done + 20)
    assert (running[1], pool.threads) == (6, 6)


def test_jobs_waiting_behind_threads_all_held_by_long_tasks_get_threads_of_their_own(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    """Before anything is measured the pool runs MIN_THREADS threads: held by stuck code,
    the keeper's tick starts threads for what waits."""
    pool = make_pool(MIN_THREADS + 2)
    release = threading.Event()
    for i in range(MIN_THREADS):
        pool.submit(i, release.wait, (WAIT_S,))
    ran = threading.Event()
    pool.submit("late", ran.set, ())
    pool.submit("late", ran.wait, (WAIT_S,))
    deadline = time.monotonic() + WAIT_S
    while not ran.is_set() and time.monotonic() < deadline:
        pool.tick()
        time.sleep(0.02)
    recorder.wait_for(2)  # both late jobs finished while the stuck ones still run
    release.set()
    recorder.wait_for(MIN_THREADS + 2)
    assert (pool.threads, recorder.errors) == (MIN_THREADS + 2, [])


def test_a_thread_hands_on_the_outcomes_it_holds_before_it_waits_for_a_job(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    pool = make_pool(1)
    gate = threading.Event()
    pool.submit("gate", gate.wait, (WAIT_S,))
    for i in range(5):
        pool.submit(i, lambda: None, ())  # waiting while the gate runs: their outcomes are held
    gate.set()
    recorder.wait_for(6)  # no job follows: the thread handed them on before waiting
    assert recorder.errors == []


def test_outcomes_held_while_the_next_job_runs_long_are_handed_on_by_the_tick(
    make_pool: Callable[[int], DaemonPool], recorder: Recorder
) -> None:
    """A finished run's commit never waits for the code its thread runs next."""
    pool = make_pool(1)
    gate, release = threading.Event(), threading.Event()
    pool.submit("gate", gate.wait, (WAIT_S,))
    pool.submit("quick", lambda: None, ())
    pool.submit("long", release.wait, (WAIT_S,))
    gate.set()
    deadline = time.monotonic() + WAIT_S
    while recorder.finished < 2 and time.monotonic() < deadline:
        pool.tick()  # the keeper's, every 50 ms
        time.sleep(0.01)
    finished_while_the_long_job_ran = recorder.finished
    release.set()
    recorder.wait_for(3)
    assert finished_while_the_long_job_ran == 2
