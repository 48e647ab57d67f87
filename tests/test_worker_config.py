"""WorkerConfig is the one source of a worker's defaults; Worker's keyword arguments override
it; the event loop is asyncio's unless uvloop is asked for (or installed, with "auto"); and a
worker can run on an event loop of the caller's (``serve``)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from helpers import finished, make_worker, wait_for

from jobqueue.client.sync import JobQueue
from jobqueue.errors import ConfigError
from jobqueue.worker import Worker
from jobqueue.worker.config import DEFAULT_CONCURRENCY, DEFAULT_GRACE_S, WorkerConfig
from jobqueue.worker.daemon import _new_loop


def test_a_worker_takes_its_defaults_from_worker_config(fast_jq: JobQueue) -> None:
    worker = Worker(fast_jq, install_signal_handlers=False)
    assert worker.config == WorkerConfig()
    assert (worker.concurrency, worker.grace) == (DEFAULT_CONCURRENCY, DEFAULT_GRACE_S)


def test_keyword_arguments_override_the_config_given(fast_jq: JobQueue) -> None:
    config = WorkerConfig(concurrency=3, grace_s=7.0, burst=True)
    worker = Worker(fast_jq, config=config, concurrency=5, install_signal_handlers=False)
    assert (worker.config.concurrency, worker.config.grace_s, worker.config.burst) == (5, 7.0, True)


@pytest.mark.parametrize(
    "bad",
    [
        {"concurrency": 0},
        {"max_runs": 0},
        {"max_memory_mb": 0.0},
        {"event_loop": "trio"},
    ],
)
def test_a_config_out_of_range_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        WorkerConfig(**bad)  # type: ignore[arg-type]


def test_asyncio_is_the_loop_when_asked_for() -> None:
    loop = _new_loop("asyncio")()
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_uvloop_asked_for_but_not_installed_is_a_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # an import of it raises ImportError
    with pytest.raises(ConfigError, match="uvloop"):
        _new_loop("uvloop")
    loop = _new_loop("auto")()  # "auto" without uvloop: asyncio's
    try:
        assert type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()


def test_a_worker_serves_on_an_event_loop_of_the_callers(fast_jq: JobQueue) -> None:
    @fast_jq.task
    async def double(x: int) -> int:
        await asyncio.sleep(0)  # kept: a coroutine that suspends
        return 2 * x

    handle = fast_jq.enqueue(double, 21)
    worker = make_worker(fast_jq)

    async def app() -> int:
        serving = asyncio.ensure_future(worker.serve())
        await asyncio.to_thread(wait_for, lambda: worker.stats.completed == 1, 10.0, "the run")
        worker.stop()
        return await asyncio.wait_for(serving, 30)

    assert asyncio.run(app()) == 0
    assert finished(fast_jq, handle.run_id).result == 42
