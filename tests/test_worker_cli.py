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


# -- --max-runs-per-child, --max-memory-per-child ----------------------------------------------


def test_a_recycling_option_without_processes_supervises_one_child(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    for option in (["--max-runs-per-child", "100"], ["--max-memory-per-child", "512"]):
        assert _supervised(monkeypatch, real_server.url, 3, *option) == (0, [1])


def test_a_recycling_option_with_processes_supervises_that_many(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, asked = _supervised(
        monkeypatch, real_server.url, 3, "--processes", "2", "--max-runs-per-child", "1",
        "--max-memory-per-child", "0.5",
    )
    assert (code, asked) == (0, [2])


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("--max-runs-per-child", "0", "0 is not in the range x>=1"),
        ("--max-runs-per-child", "-3", "-3 is not in the range x>=1"),
        ("--max-runs-per-child", "1.5", "'1.5' is not a valid integer"),
        ("--max-memory-per-child", "0", "0 is not in the range x>0"),
        ("--max-memory-per-child", "-1", "-1.0 is not in the range x>0"),
        ("--max-memory-per-child", "nan", "'nan' is not a finite number"),
        ("--max-memory-per-child", "inf", "'inf' is not a finite number"),
        ("--max-memory-per-child", "lots", "'lots' is not a valid finite float"),
    ],
)
def test_recycling_options_refuse_values_that_are_not_positive(
    option: str, value: str, says: str
) -> None:
    result = CliRunner().invoke(main, ["worker", "--app", "example_app:jq", option, value])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output
    assert says in result.output


@pytest.mark.parametrize("option", ["--max-runs-per-child", "--max-memory-per-child"])
def test_recycling_options_are_refused_with_burst(
    real_server: EmbeddedServer, monkeypatch: pytest.MonkeyPatch, option: str
) -> None:
    code, asked = _supervised(monkeypatch, real_server.url, 1, option, "10", "--burst")
    assert (code, asked) == (2, [])
    result = CliRunner().invoke(
        main, ["worker", "--app", "example_app:jq", option, "10", "--burst"]
    )
    assert result.exit_code == 2
    assert (
        f"error: {option} recycles the supervised processes of a worker that runs until "
        "stopped; --burst exits once nothing is due: not both"
    ) in result.output
