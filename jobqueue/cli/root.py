"""The ``jobqueue`` command itself: its global options, and its subcommands by name, each
imported the first time it is run. ``jobqueue --help`` and ``--version`` import click and
nothing of jobqueue's clients, redis-py or the daemons, so they answer at once.

A command's one-line help for the root listing is kept here (``COMMANDS``), so that listing
them imports none; tests/test_cli_startup.py holds it to each command's own.

The commands' modules, by noun: ``daemons`` (worker, scheduler), ``enqueue``, ``show``,
``changes`` (cancel, requeue), ``runs`` (the run listing, its options shared with ``dead``),
``leases``, ``queues`` (queues, stats, queue ...), ``dead``, ``workers``,
``checks`` (check, capacity, jitter), ``schedules``, ``groups``, ``flows``, ``events``, ``top``,
``dashboard``, ``repartition`` (repartition, repair).

Exit codes: 0 ok, 1 operation refused (or not found), 2 bad input or usage error, 3 Redis
unreachable or credentials refused, 130 interrupted. A user's mistake is one line on stderr,
never a traceback."""

from __future__ import annotations

import importlib
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import click

from jobqueue import __version__

# name -> (module, attribute, the one-line help the root listing shows)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "cancel": ("jobqueue.cli.changes", "cancel", "Cancel a pending or running run (a running..."),
    "capacity": ("jobqueue.cli.checks", "capacity", "The capacity model for N recurring jobs..."),
    "check": ("jobqueue.cli.checks", "check", "Is Redis set up as jobqueue's guarantees..."),
    "dashboard": (
        "jobqueue.cli.dashboard", "dashboard", "Serve the web dashboard: queues with...",
    ),
    "dead": ("jobqueue.cli.dead", "dead", "Dead runs: list, retry (requeue), purge."),
    "enqueue": ("jobqueue.cli.enqueue", "enqueue", "Enqueue one run of TASK (or one per line..."),
    "events": ("jobqueue.cli.events", "events", "What happened to runs, from the queues'..."),
    "flows": ("jobqueue.cli.flows", "flows", "Workflows and batches, newest first, with..."),
    "groups": ("jobqueue.cli.groups", "groups", "Fair shares between a queue's groups:..."),
    "jitter": ("jobqueue.cli.checks", "jitter", "How a herd of JOBS job ids (<prefix>N)..."),
    "leases": ("jobqueue.cli.leases", "leases", "Which worker holds which run, and for how..."),
    "queue": ("jobqueue.cli.queues", "queue", "Pause or resume a queue's claims; limit..."),
    "queues": ("jobqueue.cli.queues", "queues", "Per queue and partition: due now, later,..."),
    "repair": (
        "jobqueue.cli.repartition", "repair", "Put every run back in the index its state...",
    ),
    "repartition": (
        "jobqueue.cli.repartition", "repartition", "Change QUEUE's partition count: move every...",
    ),
    "requeue": ("jobqueue.cli.changes", "requeue", "Put a dead or cancelled run back to..."),
    "runs": ("jobqueue.cli.runs", "runs", "Runs by state and filters, a page at a time."),
    "schedule": (
        "jobqueue.cli.schedules", "schedule", "Recurring jobs: list (the default), show,...",
    ),
    "scheduler": (
        "jobqueue.cli.daemons", "scheduler", "Run a scheduler: turn recurring jobs into...",
    ),
    "schedules": (
        "jobqueue.cli.schedules", "schedules", "Recurring jobs: list (the default), show,...",
    ),
    "show": ("jobqueue.cli.show", "show", "Everything about one run, with its history..."),
    "stats": ("jobqueue.cli.queues", "stats", "Same as `queues`."),
    "top": ("jobqueue.cli.top", "top", "A live view of queues, throughput,..."),
    "worker": ("jobqueue.cli.daemons", "worker", "Run a worker: claim runs, execute them,..."),
    "workers": ("jobqueue.cli.workers", "workers", "The worker registry (the default: list..."),
}


def _interrupted_while_starting(signum: int, frame: object) -> None:
    raise SystemExit(130)  # a Ctrl-C before the command is ready: no traceback of the imports


@contextmanager
def _quiet_ctrl_c() -> Iterator[None]:
    """While a command's module imports (redis-py and the rest take a few hundred ms), a Ctrl-C
    exits 130 quietly; the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, _interrupted_while_starting)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


# Older names, still run but not listed.
HIDDEN = frozenset({"schedule"})


class Root(click.Group):
    """The root group: subcommands from ``COMMANDS``, imported when first needed; jobqueue's
    typed errors turned into one line and an exit code (``common.invoke_translating``)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        found = COMMANDS.get(cmd_name)
        if found is None:
            return None
        with _quiet_ctrl_c():
            command: click.Command = getattr(importlib.import_module(found[0]), found[1])
        return command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, help_text)
            for name, (_, _, help_text) in sorted(COMMANDS.items())
            if name not in HIDDEN
        ]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as exc:
            from jobqueue.cli.common import one_line_usage

            raise one_line_usage(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        from jobqueue.cli.common import invoke_translating

        return invoke_translating(ctx, lambda: super(Root, self).invoke(ctx))


@click.group(cls=Root, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--redis-url",
    envvar="JOBQUEUE_REDIS_URL",
    help="redis://, rediss://, unix:// or redis+cluster:// URL (env JOBQUEUE_REDIS_URL). "
    "Required by commands that change data; without one, reading commands and daemons warn "
    "and use a private throwaway server.",
)
@click.option(
    "--embedded",
    is_flag=True,
    help="With no URL, use a private throwaway server on purpose (nothing persists): "
    "allows every command and silences the warning.",
)
@click.option(
    "--log-level",
    default="INFO",
    show_default=True,
    type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False),
)
@click.option(
    "--log-format",
    envvar="JOBQUEUE_LOG_FORMAT",
    default="text",
    show_default=True,
    type=click.Choice(["text", "json"]),
    help="json: one object per line (ts, level, logger, msg; run_id, fence, attempt on runs).",
)
@click.version_option(__version__, prog_name="jobqueue")
@click.pass_context
def main(
    ctx: click.Context, redis_url: str | None, embedded: bool, log_level: str, log_format: str
) -> None:
    """jobqueue: a Redis-backed distributed job scheduler and task queue."""
    from jobqueue.cli.common import State
    from jobqueue.runtime import logs

    logs.configure(log_level, "json" if log_format == "json" else "text")
    if embedded and redis_url is not None:
        raise click.UsageError("--embedded is for when no URL is given; drop one of them")
    if not isinstance(ctx.obj, State):
        ctx.obj = State(redis_url, embedded=embedded)
