"""``jobqueue --help`` and ``--version`` answer without importing redis-py, the clients or the
daemons (each subcommand's module is imported when it runs), so they start at once; the root
listing's one-line help of each command is the command's own."""

from __future__ import annotations

import subprocess
import sys

import click
import pytest

from jobqueue.cli.root import COMMANDS, HIDDEN, main

PROBE = """
import sys
from jobqueue.cli import main
try:
    main([{args}])
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules
               if m == "redis" or m.startswith(("jobqueue.client", "jobqueue.worker",
                                                "jobqueue.scheduler", "jobqueue.recurring",
                                                "jobqueue.store")))
print("HEAVY", heavy)
"""


@pytest.mark.parametrize("args", ["'--help'", "'--version'"])
def test_help_and_version_import_neither_redis_nor_the_clients(args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(args=args)], capture_output=True, text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "HEAVY []"


def test_import_jobqueue_loads_no_client_until_a_name_is_used() -> None:
    probe = (
        "import sys, jobqueue\n"
        "print('redis' in sys.modules)\n"
        "jobqueue.JobQueue\n"
        "print('redis' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.split() == ["False", "True"], done.stderr


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_listed_command_is_the_command_of_that_name(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert isinstance(command, click.Command)
    assert command.name in (name, "schedules")  # `schedule` is the old name of schedules


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_the_root_listing_shows_each_commands_own_one_line_help(name: str) -> None:
    command = main.get_command(click.Context(main), name)
    assert command is not None
    assert COMMANDS[name][2] == command.get_short_help_str(45)


def test_the_root_help_lists_every_command_but_the_hidden_ones() -> None:
    from click.testing import CliRunner

    listed = CliRunner().invoke(main, ["--help"]).stdout
    for name in COMMANDS:
        assert (f"  {name} " in listed) == (name not in HIDDEN), name
