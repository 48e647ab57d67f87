"""The CLI's options default to the app's Settings and to the daemons' own defaults: one
source for every default, so what an app configures holds under `jobqueue worker` too."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.recurring.config import DEFAULT_BATCH, DEFAULT_LOOKAHEAD_MS
from jobqueue.recurring.daemon import Scheduler
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.worker.daemon import DEFAULT_CONCURRENCY, Worker
from jobqueue.worker.supervisor import DEFAULT_GRACE_S

APP = """
from jobqueue import JobQueue, Settings

jq = JobQueue(settings=Settings(default_lease_s=7))
"""


@pytest.fixture
def started(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Worker]]:
    """The Workers `jobqueue worker` builds (their run() returns at once), for an app whose
    Settings say default_lease_s=7."""
    (tmp_path / "seven_second_app.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "seven_second_app", raising=False)
    made: list[Worker] = []

    class Built(Worker):
        def run(self) -> int:
            made.append(self)
            return 0

    monkeypatch.setattr("jobqueue.worker.daemon.Worker", Built)
    handler = signal.getsignal(signal.SIGTERM)
    yield made
    signal.signal(signal.SIGTERM, handler)  # the command installs its own
    sys.modules.pop("seven_second_app", None)


def run_worker(server: EmbeddedServer, *options: str) -> None:
    result = CliRunner().invoke(
        main, ["--redis-url", server.url, "worker", "--app", "seven_second_app:jq", *options]
    )
    assert result.exit_code == 0, result.output


def test_worker_without_lease_uses_the_apps_settings(
    real_server: EmbeddedServer, started: list[Worker]
) -> None:
    run_worker(real_server)
    assert [w.lease_ms for w in started] == [7000]


def test_explicit_lease_wins_over_the_apps_settings(
    real_server: EmbeddedServer, started: list[Worker]
) -> None:
    run_worker(real_server, "--lease", "12")
    assert [w.lease_ms for w in started] == [12000]


def test_lease_is_rounded_to_ms_as_settings_rounds(
    real_server: EmbeddedServer, started: list[Worker]
) -> None:
    run_worker(real_server, "--lease", "2.0006")  # 2000.6 ms: int() would say 2000
    assert [w.lease_ms for w in started] == [2001]


def test_worker_options_default_to_the_workers_defaults(
    real_server: EmbeddedServer, started: list[Worker]
) -> None:
    run_worker(real_server)
    assert [(w.concurrency, w.grace) for w in started] == [(DEFAULT_CONCURRENCY, DEFAULT_GRACE_S)]


def test_scheduler_options_default_to_the_schedulers_defaults(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[Scheduler] = []

    class Built(Scheduler):
        def run(self, max_ticks: int | None = None) -> int:
            made.append(self)
            return 0

    monkeypatch.setattr("jobqueue.recurring.daemon.Scheduler", Built)
    handler = signal.getsignal(signal.SIGTERM)
    result = CliRunner().invoke(main, ["--redis-url", real_server.url, "scheduler"])
    signal.signal(signal.SIGTERM, handler)
    assert result.exit_code == 0, result.output
    plain = Scheduler(made[0].jq, install_signal_handlers=False)
    assert [(s.lookahead_ms, s.interval, s.misfire_grace_ms, s.batch) for s in made] == [
        (DEFAULT_LOOKAHEAD_MS, plain.interval, plain.misfire_grace_ms, DEFAULT_BATCH)
    ]
