"""jobqueue.worker.recycling: when a worker child recycles (--max-runs-per-child,
--max-memory-per-child), and the supervisor's pipe for its reason (no Redis); the Worker's
hook (Worker(max_runs=, max_memory_mb=), in-process, both backends)."""

from __future__ import annotations

import logging
import os
import threading

import pytest
from helpers import Exited, make_worker, running, wait_for

from jobqueue.client.sync import JobQueue
from jobqueue.worker import recycling
from jobqueue.worker.recycling import EXIT_RECYCLED, MB, Recycling, rss_bytes


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rss:
    """A fake resident size, and how many times it was read."""

    def __init__(self, value: int) -> None:
        self.value = value
        self.reads = 0

    def __call__(self) -> int:
        self.reads += 1
        return self.value


def test_the_exit_code_is_neither_redis_unreachable_nor_unhealthy() -> None:
    from jobqueue.worker.daemon import EXIT_UNHEALTHY

    assert EXIT_RECYCLED not in (0, 1, 2, 3, EXIT_UNHEALTHY)


def test_max_runs_recycles_once_that_many_runs_are_answered_and_says_so_once() -> None:
    r = Recycling(max_runs=10, rss=Rss(50 * MB))
    assert r.answered(4) is None
    assert r.answered(5) is None
    reason = r.answered(3)  # answered in batches: 12 >= 10
    assert reason == "12 runs done (max 10 per child); RSS 50.0 MB"
    assert r.reason == reason
    assert r.answered(1) is None  # draining: said once
    assert r.runs == 13


def test_max_runs_of_one_recycles_after_the_first_run() -> None:
    assert Recycling(max_runs=1, rss=Rss(0)).answered(1) is not None


def test_max_memory_recycles_once_rss_is_over_it_after_runs() -> None:
    rss, clock = Rss(90 * MB), Clock()
    r = Recycling(max_memory_bytes=100 * MB, rss=rss, monotonic=clock)
    assert r.answered(1) is None
    rss.value = 101 * MB
    clock.now += 0.1
    assert r.answered(2) == "RSS 101.0 MB over the max of 100 MB per child; 3 runs done"
    assert r.answered(1) is None


def test_rss_is_read_at_most_every_check_period_whatever_the_run_rate() -> None:
    rss, clock = Rss(10 * MB), Clock()
    r = Recycling(max_memory_bytes=100 * MB, rss=rss, monotonic=clock, check_every_s=0.1)
    for _ in range(450):  # 450 batches in 0.45 s
        assert r.answered(1) is None
        clock.now += 0.001
    assert rss.reads == 5  # at about 0, 0.1, 0.2, 0.3 and 0.4 s
    rss.value = 200 * MB
    assert r.answered(1) is None  # not yet: the period since the last read has not passed
    clock.now += 0.1
    assert r.answered(1) is not None


def test_neither_limit_never_recycles_and_never_reads_rss() -> None:
    rss = Rss(10**12)
    r = Recycling(rss=rss)
    assert all(r.answered(100) is None for _ in range(100))
    assert rss.reads == 0


def test_max_runs_does_not_read_rss_before_it_is_reached() -> None:
    rss = Rss(10**12)
    r = Recycling(max_runs=1000, rss=rss)
    assert all(r.answered(1) is None for _ in range(999))
    assert rss.reads == 0
    assert r.answered(1) is not None and rss.reads == 1  # once, for the log line


@pytest.mark.parametrize(("runs", "memory"), [(0, None), (-1, None), (None, 0), (None, -5)])
def test_limits_must_be_positive(runs: int | None, memory: int | None) -> None:
    with pytest.raises(ValueError):
        Recycling(runs, memory)


def test_rss_is_this_process_s_resident_memory_and_grows_with_what_it_keeps() -> None:
    before = rss_bytes()
    kept = b"\x01" * (64 * MB)
    after = rss_bytes()
    assert 10 * MB < before < 10_000 * MB
    assert after - before > 48 * MB
    del kept


def test_without_proc_the_peak_from_getrusage_stands_in(monkeypatch: pytest.MonkeyPatch) -> None:
    current = rss_bytes()
    monkeypatch.setattr(recycling, "_statm_rss", lambda: None)
    peak = rss_bytes()
    assert peak >= current * 0.9  # the peak so far (ru_maxrss: KiB, rounded)


def test_a_recycled_child_reports_its_reason_on_the_supervisor_s_pipe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read_fd, write_fd = os.pipe()
    try:
        monkeypatch.setenv(recycling.REPORT_FD_ENV, str(write_fd))
        recycling.report_to_supervisor("12 runs done\nsecond line")
        assert os.read(read_fd, 4096) == f"{os.getpid()} 12 runs done second line\n".encode()
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_without_a_supervisor_s_pipe_the_report_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(recycling.REPORT_FD_ENV, raising=False)
    recycling.report_to_supervisor("anything")  # no error


# -- the Worker's hook -----------------------------------------------------------------------

WAIT_S = 20.0


def test_a_worker_with_max_runs_drains_what_it_holds_and_returns_exit_recycled(
    fast_jq: JobQueue, caplog: pytest.LogCaptureFixture
) -> None:
    """max_runs=5, concurrency 3: once 5 runs are answered it stops claiming; the runs it
    holds then finish and commit (none released), the rest stay pending for the next child."""
    gate = threading.Event()

    @fast_jq.task
    def step(i: int) -> int:
        if i >= 4:
            gate.wait(WAIT_S)  # held while the fifth commit is answered
        return i

    handles = [fast_jq.enqueue(step, i) for i in range(20)]
    worker = make_worker(fast_jq, concurrency=3, max_runs=5)
    with caplog.at_level(logging.INFO, logger="jobqueue.worker"):
        exited = Exited(worker)
        try:
            wait_for(lambda: worker.stats.completed >= 4, WAIT_S, "four runs done")
            gate.set()
            code = exited.join(WAIT_S)
        finally:
            gate.set()
            exited.close()
    assert code == recycling.EXIT_RECYCLED
    assert worker.recycled is not None and "runs done (max 5 per child)" in worker.recycled
    states = [fast_jq.get_run(h.run_id) for h in handles]
    done = [r for r in states if r.state == "done"]
    # What it held when it reached 5 finished too: running, or awaiting its commit (up to
    # twice the concurrency).
    assert 5 <= len(done) <= 5 + 3 * 3
    assert {r.state for r in states} == {"done", "pending"}
    assert all(r.attempt == 1 for r in done) and worker.stats.released == 0
    assert any(f"worker {worker.id} recycles: " in m for m in caplog.messages)


def test_a_worker_over_max_memory_recycles(fast_jq: JobQueue) -> None:
    @fast_jq.task
    def nothing() -> None:
        return None

    # RSS is surely above 1 MB: the first run answered recycles the worker.
    worker = make_worker(fast_jq, concurrency=1, max_memory_mb=1)
    exited = Exited(worker)
    try:
        fast_jq.enqueue(nothing)
        code = exited.join(WAIT_S)
    finally:
        exited.close()
    assert code == recycling.EXIT_RECYCLED
    assert worker.recycled is not None and "over the max of 1 MB per child" in worker.recycled


def test_a_worker_stopped_for_another_reason_is_not_recycled(fast_jq: JobQueue) -> None:
    @fast_jq.task
    def nothing() -> None:
        return None

    worker = make_worker(fast_jq, concurrency=1, max_runs=1000)
    with running(worker):
        h = fast_jq.enqueue(nothing)
        wait_for(lambda: fast_jq.get_run(h.run_id).state == "done", WAIT_S, "the run done")
    assert worker.recycled is None  # stopped by stop(): run() returned 0
