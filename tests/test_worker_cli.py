"""The worker command's process count: ``--processes auto`` is one process per CPU."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from jobqueue.cli import main
from jobqueue.store.embedded import EmbeddedServer
from jobqueue.worker import supervisor

DOCKER = Path(__file__).resolve().parent.parent / "docker"  # example_app.py


def _supervised(
    monkeypatch: pytest.MonkeyPatch, url: str, cpus: int, *args: str
) -> tuple[int, list[int]]:
    """Runs ``jobqueue worker`` with ``cpus`` CPUs; the supervisor records how many
    processes it was asked to start instead of starting them."""
    asked: list[int] = []

    def supervise(processes: int, argv: list[str], url: str, **kwargs: Any) -> int:
        asked.append(processes)
        return 0

    monkeypatch.syspath_prepend(str(DOCKER))
    # a fresh app per command: the module's JobQueue takes its URL once
    monkeypatch.delitem(sys.modules, "example_app", raising=False)
    monkeypatch.setattr(supervisor, "cpu_count", lambda: cpus)
    monkeypatch.setattr(supervisor, "supervise", supervise)
    monkeypatch.delenv(supervisor.SUPERVISED_ENV, raising=False)
    try:
        result = CliRunner().invoke(
            main, ["--redis-url", url, "worker", "--app", "example_app:jq", *args]
        )
    finally:
        sys.modules.pop("example_app", None)  # monkeypatch puts back one imported before
    return result.exit_code, asked


def test_processes_auto_starts_one_worker_process_per_cpu(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, asked = _supervised(monkeypatch, real_server.url, 3, "--processes", "auto")
    assert (code, asked) == (0, [3])


def test_processes_given_as_a_number_ignores_the_cpu_count(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, asked = _supervised(monkeypatch, real_server.url, 3, "--processes", "2")
    assert (code, asked) == (0, [2])


def test_processes_auto_with_burst_on_several_cpus_is_refused(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, asked = _supervised(monkeypatch, real_server.url, 2, "--processes", "auto", "--burst")
    assert (code, asked) == (2, [])


def test_processes_neither_a_number_nor_auto_is_a_usage_error() -> None:
    result = CliRunner().invoke(main, ["worker", "--app", "example_app:jq", "--processes", "x"])
    assert result.exit_code == 2
    assert "'x' is not a valid integer" in result.output


def test_the_cpu_count_is_the_cpus_this_process_may_run_on() -> None:
    assert supervisor.cpu_count() == len(os.sched_getaffinity(0))
