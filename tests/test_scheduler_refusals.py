"""A scheduler whose Redis refuses writes (maxmemory reached under noeviction: OOM; a replica
after a failover: READONLY) keeps retrying with one warning line per attempt, from its very
start-up on, and carries on once the writes are accepted; a stop ends the back-off at once.
Each test has its own real server (its configuration is changed)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from helpers import wait_for

from jobqueue.client.sync import JobQueue
from jobqueue.recurring import daemon as scheduler_mod
from jobqueue.recurring.config import SchedulerConfig
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.embedded import EmbeddedServer, find_server_binary

WAIT_S = 10.0  # bound on every wait (the first retry comes after 1 s)


def refuse_writes(admin: Any, fault: str) -> Callable[[], None]:
    """Make the server refuse writes; return what makes it accept them again."""
    if fault == "OOM":
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", "1")
        return lambda: admin.config_set("maxmemory", "0")
    # A replica of a master that is not there: reads are served, writes are READONLY.
    admin.execute_command("REPLICAOF", "127.0.0.1", "1")
    return lambda: admin.execute_command("REPLICAOF", "NO", "ONE")


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(find_server_binary()).start()
    yield srv
    srv.stop()


def app(server: EmbeddedServer) -> JobQueue:
    jq = JobQueue(redis.Redis.from_url(server.url, decode_responses=True))
    jq.declare_task("report")
    jq.declare_schedule("hourly", "report", every=3600)
    return jq


class Running:
    """``daemon.run(max_ticks=1)`` on a thread, its outcome kept."""

    def __init__(self, daemon: Scheduler) -> None:
        self.outcome: list[Any] = []
        self.thread = threading.Thread(target=self._run, args=(daemon,), daemon=True)
        self.thread.start()

    def _run(self, daemon: Scheduler) -> None:
        try:
            self.outcome.append(daemon.run(max_ticks=1))
        except BaseException as exc:  # the test reports it
            self.outcome.append(exc)

    def join(self) -> Any:
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "the scheduler did not finish"
        return self.outcome[0]


def wait_for_warning(
    caplog: pytest.LogCaptureFixture, running: Running, text: str
) -> logging.LogRecord:
    def warned() -> logging.LogRecord | None:
        assert not running.outcome, f"the scheduler ended instead of retrying: {running.outcome}"
        for record in list(caplog.records):
            if record.levelno == logging.WARNING and text in record.getMessage():
                return record
        return None

    record: logging.LogRecord = wait_for(
        warned, WAIT_S, f"a warning containing {text!r}", interval=0.02
    )
    return record


@pytest.mark.parametrize("fault", ["OOM", "READONLY"])
def test_scheduler_started_while_redis_refuses_writes_retries_until_they_are_accepted(
    server: EmbeddedServer, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    accept = refuse_writes(admin, fault)
    jq = app(server)
    daemon = Scheduler(jq, SchedulerConfig(interval=0.01), install_signal_handlers=False)
    with caplog.at_level(logging.INFO, logger="jobqueue.scheduler"):
        running = Running(daemon)
        warning = wait_for_warning(caplog, running, "start-up failed")
        accept()
        assert running.join() == 0
    assert "\n" not in warning.getMessage() and "retrying in" in warning.getMessage()
    assert jq.get_schedule("hourly") is not None
    assert "scheduler stopped after 1 ticks" in caplog.text


@pytest.mark.parametrize("fault", ["OOM", "READONLY"])
def test_declared_schedules_sync_refused_by_redis_is_retried_not_fatal(
    server: EmbeddedServer, fault: str, caplog: pytest.LogCaptureFixture
) -> None:
    jq = app(server)
    jq.recurring.sync(jq.declared_schedules)  # stored: the next sync only marks it declared
    daemon = Scheduler(jq, SchedulerConfig(interval=0.01), install_signal_handlers=False)
    assert daemon.store.partitions == 1  # known before the fault: the sync meets it first
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    accept = refuse_writes(admin, fault)
    with caplog.at_level(logging.INFO, logger="jobqueue.scheduler"):
        running = Running(daemon)
        wait_for_warning(caplog, running, "start-up failed")
        accept()
        assert running.join() == 0
    assert "declared schedules synced: 0 created, 0 updated, 1 unchanged" in caplog.text


def test_stop_ends_the_back_off_of_a_scheduler_retrying_at_once(
    server: EmbeddedServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    admin = redis.Redis.from_url(server.url, decode_responses=True)
    refuse_writes(admin, "OOM")
    # A back-off far longer than the test's bound: only a stop that interrupts it can end it.
    monkeypatch.setattr(scheduler_mod, "retry_delay", lambda failures: 3600.0)
    daemon = Scheduler(app(server), SchedulerConfig(interval=0.01), install_signal_handlers=False)
    with caplog.at_level(logging.INFO, logger="jobqueue.scheduler"):
        running = Running(daemon)
        wait_for_warning(caplog, running, "OutOfMemoryError")
        daemon.stop()
        assert running.join() == 0
    assert "scheduler stopped after 0 ticks" in caplog.text
