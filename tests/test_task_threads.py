"""The threads sync tasks run on (jobqueue.worker.executing.TaskThreads): as many runs at
once as there are slots, never more threads than that, and a short job run by a thread
already awake."""

from __future__ import annotations

import threading

from jobqueue.worker.executing import TaskThreads


def _all_run_at_once(pool: TaskThreads, n: int) -> bool:
    """Submit ``n`` jobs that each wait for all ``n``: they end only if ``n`` threads run
    them at once."""
    barrier = threading.Barrier(n, timeout=10)
    ended = threading.Semaphore(0)

    def job() -> None:
        barrier.wait()
        ended.release()

    for _ in range(n):
        pool.submit(job)
    return all(ended.acquire(timeout=10) for _ in range(n))


def test_as_many_jobs_as_slots_run_at_once() -> None:
    pool = TaskThreads(8, "t")
    assert _all_run_at_once(pool, 8)
    assert pool.threads == 8
    pool.shutdown()


def test_no_more_threads_than_slots_however_many_jobs_wait() -> None:
    pool = TaskThreads(3, "t")
    release, done = threading.Event(), threading.Semaphore(0)

    def job() -> None:
        release.wait(10)
        done.release()

    for _ in range(10):
        pool.submit(job)
    assert pool.threads == 3
    release.set()
    assert all(done.acquire(timeout=10) for _ in range(10))
    pool.shutdown()


def test_jobs_one_after_the_other_are_run_by_the_thread_already_started() -> None:
    pool = TaskThreads(8, "t")
    names: list[str] = []
    for _ in range(50):
        ran = threading.Event()
        pool.submit(lambda ran=ran: (names.append(threading.current_thread().name), ran.set()))
        assert ran.wait(10)
    assert pool.threads == 1 and len(set(names)) == 1
    pool.shutdown()


def test_a_job_that_raises_does_not_end_its_thread() -> None:
    pool = TaskThreads(1, "t")
    ran = threading.Event()

    def bad() -> None:
        raise RuntimeError("a bug in a job")

    pool.submit(bad)
    pool.submit(ran.set)
    assert ran.wait(10)
    assert pool.threads == 1
    pool.shutdown()


def test_jobs_submitted_while_a_woken_thread_has_not_started_each_get_a_thread() -> None:
    """One idle thread, being woken, and eight long jobs: all eight run at once (a pool that
    only chained wake-ups through idle threads ran them one after the other)."""
    pool = TaskThreads(8, "t")
    warm = threading.Event()
    pool.submit(warm.set)
    assert warm.wait(10)
    assert _all_run_at_once(pool, 8)
    pool.shutdown()
